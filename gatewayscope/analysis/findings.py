"""The findings of a Snapshot, computed in one place for every view.

:func:`findings` turns a :class:`~gatewayscope.snapshot.Snapshot` and the policy of a
:class:`~gatewayscope.config.Config` into a :class:`Findings`: per target (:class:`TargetFindings`) the
orphan sessions, the orphans by task and the guard of an rLLM trace store, or the classified records,
the per-kind pools, the boot estimate, the posture drift and the unreachable records of a Bifrost
gateway, with the target's up/error state and warnings; and the same frames over all targets, each
with a leading ``target`` column.

Every view reads these: the scan report (``gatewayscope scan``, text, JSON and HTML), the exporter's
collectors, the notebook controllers and :func:`gatewayscope.remediate.plan.build_plan`. None of them
runs an analysis function itself, so they cannot disagree about what a finding is.

Pure: frames in, frames out, no I/O and no clock (``now`` is the snapshot's ``taken_at``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gatewayscope._text import terminal_safe
from gatewayscope.analysis.memory import BootMemory, boot_memory
from gatewayscope.analysis.orphans import ORPHANS_SCHEMA, find_orphans, orphans_by_task, trace_store_summary
from gatewayscope.analysis.pools import (
    BootEstimate,
    bifrost_figures,
    boot_estimate,
    classify_records,
    per_kind,
    unreachable_records,
)
from gatewayscope.analysis.posture import SAFE_POSTURE, posture_drift
from gatewayscope.config import DEFAULT_MEMORY_LIMIT_BYTES, Config, Policy
from gatewayscope.errors import GatewayscopeError
from gatewayscope.orphan_rule import delete_fences
from gatewayscope.snapshot import (
    REACHABILITY_SCHEMA,
    RECORDS_SCHEMA,
    GuardStats,
    Snapshot,
    TargetSnapshot,
    empty_frame,
)

#: the orphans by task of one target (see :func:`gatewayscope.analysis.orphans.orphans_by_task`)
ORPHAN_TASKS_SCHEMA: dict[str, Any] = {"task": pl.String, "orphans": pl.UInt32, "confirmed": pl.UInt32,
                                       "prompt_tokens": pl.Int64}
#: the per-kind pools of one Bifrost target: :func:`~gatewayscope.analysis.pools.per_kind` plus the boot stacks
#: of each kind and its pool policy
POOLS_SCHEMA: dict[str, Any] = {"kind": pl.String, "records": pl.Int64, "parked_workers": pl.Int64,
                                "queue_slots": pl.Int64, "over_pool": pl.Int64, "stack_bytes_low": pl.Int64,
                                "stack_bytes_high": pl.Int64, "pool_policy": pl.Int64}
#: the unreachable records of one Bifrost target (see :func:`~gatewayscope.analysis.pools.unreachable_records`)
UNREACHABLE_SCHEMA: dict[str, Any] = {"name": pl.String, "base_url": pl.String, "host": pl.String,
                                      "provider_status": pl.String, "reason": pl.String}
BOOT_SCHEMA: dict[str, Any] = {"target": pl.String, "records": pl.Int64, "parked_workers": pl.Int64,
                               "stack_bytes_low": pl.Int64, "stack_bytes_high": pl.Int64,
                               "memory_limit_bytes": pl.Int64, "survives_restart": pl.String,
                               "records_to_limit_low": pl.Int64, "records_to_limit_high": pl.Int64}
#: per Bifrost target: the boot-memory prediction of the model used, with the measured figures beside it
MEMORY_SCHEMA: dict[str, Any] = {"target": pl.String, "model": pl.String, "predicted_bytes": pl.Int64,
                                 "memory_limit_bytes": pl.Int64, "survives_restart": pl.String,
                                 "records_to_limit": pl.Int64, "goroutines": pl.Int64,
                                 "resident_memory_bytes": pl.Int64, "stack_bytes_per_goroutine": pl.Float64,
                                 "baseline_bytes": pl.Int64, "calibration_error_ratio": pl.Float64,
                                 "trusted": pl.Boolean, "reason": pl.String}
POSTURE_SCHEMA: dict[str, Any] = {"target": pl.String, "setting": pl.String, "reported": pl.String,
                                  "safe": pl.String, "drifted": pl.Boolean}
GUARD_SCHEMA: dict[str, Any] = {"target": pl.String, "access": pl.String, "guarded": pl.Boolean,
                                "tombstones": pl.Int64, "capacity": pl.Int64, "dropped_writes": pl.Int64,
                                "evicted": pl.Int64}


@dataclass(frozen=True, eq=False)
class TargetFindings:
    """What is wrong with one target, as of its read.

    The state of the read: ``name``, ``kind`` (``"rllm"`` or ``"bifrost"``), ``address``, ``up``, ``error``
    and ``error_kind`` (a sentence and its category when the read failed), ``duration_seconds``, ``warnings``.
    ``snapshot`` is the read itself.

    An rLLM trace store that answered has ``orphans`` (one row per orphan session:
    :data:`~gatewayscope.analysis.orphans.ORPHANS_SCHEMA`, with confidence, idle time, weight lag and task),
    ``orphans_by_task`` (most first) and ``guard`` (the tombstone guard's figures, None without a guard).

    A Bifrost gateway that answered has ``records`` (every provider record classified against the policy:
    kind, target pool and queue, over pool, parked workers, queue slots, stack bytes, plus ``unreachable``
    and ``unreachable_reason``), ``pools`` (per kind), ``boot`` (stack memory at boot against
    ``memory_limit_bytes``), ``memory`` (the boot-memory prediction from the gateway's runtime metrics, or
    the band with the reason: :mod:`gatewayscope.analysis.memory`), ``posture_drift`` (the settings away
    from the safe posture) and ``unreachable`` (the records judged unreachable, with a reason each).

    What does not apply to the target (or was not read) is None, and ``posture_drift`` empty.
    ``summary`` holds the target's figures in the shape of ``gatewayscope scan --format json``
    (empty when the read failed).
    """

    name: str
    kind: str
    address: str
    up: bool
    error: str | None
    error_kind: str | None
    duration_seconds: float
    warnings: tuple[str, ...]
    snapshot: TargetSnapshot = field(repr=False)
    orphans: pl.DataFrame | None = field(default=None, repr=False)
    orphans_by_task: pl.DataFrame | None = field(default=None, repr=False)
    guard: GuardStats | None = None
    records: pl.DataFrame | None = field(default=None, repr=False)
    pools: pl.DataFrame | None = field(default=None, repr=False)
    boot: BootEstimate | None = None
    memory: BootMemory | None = None
    memory_limit_bytes: int | None = None
    posture_drift: tuple[str, ...] = ()
    unreachable: pl.DataFrame | None = field(default=None, repr=False)
    summary: dict[str, Any] = field(default_factory=dict, repr=False)


def _records_findings(records: pl.DataFrame, reachability: pl.DataFrame,
                      policy: Policy) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(classified records with ``unreachable`` and ``unreachable_reason``, the unreachable records)."""
    classified = classify_records(records, policy)
    unreachable = unreachable_records(records, reachability)
    flags = unreachable.select("name", pl.lit(True).alias("unreachable"), pl.col("reason").alias("unreachable_reason"))
    joined = (classified.join(flags.unique(subset="name", keep="first"), on="name", how="left", maintain_order="left")
              .with_columns(pl.col("unreachable").fill_null(False)))
    return joined, unreachable


def _pools(classified: pl.DataFrame, policy: Policy) -> pl.DataFrame:
    """Per kind: records, parked workers, queue slots, records over pool, boot stacks, and the pool policy."""
    stacks = classified.group_by("kind").agg(pl.col("stack_bytes_low").sum(), pl.col("stack_bytes_high").sum())
    return (
        per_kind(classified).join(stacks, on="kind", how="left", maintain_order="left")
        .with_columns(pl.col("stack_bytes_low", "stack_bytes_high").fill_null(0).cast(pl.Int64),
                      pl.when(pl.col("kind") == "custom").then(pl.lit(policy.custom_pool))
                      .otherwise(pl.lit(policy.standard_pool)).cast(pl.Int64).alias("pool_policy"))
        .select(list(POOLS_SCHEMA))
    )


def target_findings(snap: TargetSnapshot, policy: Policy, *, now: float,
                    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
                    deleted_ids: Mapping[str, Any] | None = None) -> TargetFindings:
    """The findings of one target's read, as of ``now``.

    ``memory_limit_bytes`` is the Bifrost gateway's memory limit (the target's ``memory_limit_bytes``);
    ``deleted_ids`` maps session ids known to have been deleted before to the moment of that delete, for
    every target or per target name (see :func:`gatewayscope.orphan_rule.delete_fences`): they confirm an
    orphan whose traces were all dispatched before it.
    The exporter calls this once per read; :func:`findings` once per target of a snapshot.
    """
    state: dict[str, Any] = {
        "name": snap.name, "kind": snap.kind, "address": snap.address, "up": snap.up, "error": snap.error,
        "error_kind": snap.error_kind, "duration_seconds": snap.duration_seconds,
        "warnings": tuple(snap.warnings), "snapshot": snap,
    }
    if snap.trace_store is not None:
        data = snap.trace_store
        orphans = find_orphans(data, policy, now, deleted_ids=delete_fences(deleted_ids, snap.name))
        by_task = orphans_by_task(orphans)
        return TargetFindings(**state, orphans=orphans, orphans_by_task=by_task, guard=data.guard,
                              summary=trace_store_summary(data, orphans, now, by_task=by_task))
    if snap.bifrost is not None:
        bifrost = snap.bifrost
        records, unreachable = _records_findings(bifrost.records, bifrost.reachability, policy)
        pools = _pools(records, policy)
        boot = boot_estimate(records, memory_limit_bytes)
        memory = boot_memory(boot, bifrost.runtime, bifrost.runtime_error)
        drift = tuple(posture_drift(bifrost.client_config))
        return TargetFindings(**state, records=records, pools=pools, boot=boot, memory=memory,
                              memory_limit_bytes=int(memory_limit_bytes), posture_drift=drift,
                              unreachable=unreachable,
                              summary=bifrost_figures(pools, boot, list(drift), unreachable.height, policy, memory))
    return TargetFindings(**state)


def _with_target(name: str, frame: pl.DataFrame) -> pl.DataFrame:
    return frame.select(pl.lit(name, dtype=pl.String).alias("target"), pl.all())


def _concat(frames: list[pl.DataFrame], schema: Mapping[str, Any]) -> pl.DataFrame:
    """The frames one after the other; a frame of ``schema`` when there are none (or all are empty)."""
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame(schema=dict(schema))
    return pl.concat(frames, how="diagonal_relaxed")


@dataclass(frozen=True, eq=False)
class Findings:
    """What is wrong with every target of a snapshot: made by :func:`findings`, read by every view.

    ``targets`` holds each target's :class:`TargetFindings` in the snapshot's order; the frames below are
    the same findings over all targets, each with a leading ``target`` column (empty frames, with their
    columns, when no target has any):

    * ``orphans``: every orphan session (``target`` + ``ORPHANS_SCHEMA``: session_id, task, confidence,
      trace_count, last_trace_at, idle_seconds, weight_version, weight_lag, prompt_tokens, prompt_chars,
      reason);
    * ``orphans_by_task``: orphans grouped by target and task, most first;
    * ``records``: every Bifrost record classified against the policy, with ``unreachable`` and its reason;
    * ``pools``: per Bifrost target and record kind: records, parked workers, queue slots, records over
      pool, boot stacks at 2 and 8 KiB per worker, and the pool policy;
    * ``boot``: per Bifrost target: stack memory at boot against its limit, and whether it survives a restart;
    * ``memory``: per Bifrost target: the boot-memory prediction of the model used (measured or band), the
      measured figures (goroutines, resident memory, stack per goroutine, baseline, calibration error, trusted)
      and why the band was used;
    * ``posture``: per Bifrost target and posture setting: reported, safe, drifted;
    * ``unreachable``: the Bifrost records judged unreachable, with a reason each;
    * ``guard``: per rLLM target: the tombstone guard's figures (null where none is installed).

    ``taken_at`` is the snapshot's time (every idle age is measured from it), ``policy`` the policy the
    findings were judged by, ``deleted_ids`` the ids given as deleted before, ``snapshot`` the reads.
    """

    taken_at: float
    policy: Policy
    targets: tuple[TargetFindings, ...]
    orphans: pl.DataFrame = field(repr=False)
    orphans_by_task: pl.DataFrame = field(repr=False)
    records: pl.DataFrame = field(repr=False)
    pools: pl.DataFrame = field(repr=False)
    boot: pl.DataFrame = field(repr=False)
    memory: pl.DataFrame = field(repr=False)
    posture: pl.DataFrame = field(repr=False)
    unreachable: pl.DataFrame = field(repr=False)
    guard: pl.DataFrame = field(repr=False)
    snapshot: Snapshot = field(repr=False)
    deleted_ids: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def target(self, name: str) -> TargetFindings:
        """One target's findings, by name (KeyError naming the known targets otherwise)."""
        for found in self.targets:
            if found.name == name:
                return found
        raise KeyError(f"no target named {name!r} (the findings have: "
                       f"{', '.join(t.name for t in self.targets) or 'none'})")

    @property
    def up(self) -> bool:
        """Whether every target answered."""
        return all(t.up for t in self.targets)

    @property
    def counts(self) -> dict[str, int]:
        """Headline numbers: orphans, confirmed orphans, records over pool, drifted settings, unreachable
        records, and targets down."""
        out = {"orphans": 0, "confirmed_orphans": 0, "records_over_pool": 0, "posture_drift": 0,
               "unreachable_records": 0, "targets_down": 0}
        for found in self.targets:
            if not found.up:
                out["targets_down"] += 1
            elif found.orphans is not None:
                out["orphans"] += found.orphans.height
                out["confirmed_orphans"] += int((found.orphans["confidence"] == "confirmed").sum())
            elif found.records is not None:
                out["records_over_pool"] += int(found.records["over_pool"].sum())
                out["posture_drift"] += len(found.posture_drift)
                out["unreachable_records"] += 0 if found.unreachable is None else found.unreachable.height
        return out


def _posture_rows(found: TargetFindings) -> list[dict[str, Any]]:
    assert found.snapshot.bifrost is not None
    client_config = found.snapshot.bifrost.client_config
    rows = []
    for setting, safe in SAFE_POSTURE.items():
        value = client_config.get(setting)
        rows.append({"target": found.name, "setting": setting,
                     "reported": None if value is None else str(value).lower(),
                     "safe": str(safe).lower(), "drifted": setting in found.posture_drift})
    return rows


def _memory_row(found: TargetFindings) -> dict[str, Any]:
    assert found.memory is not None
    memory, measured = found.memory, found.memory.measured
    return {"target": found.name, "model": memory.model, "predicted_bytes": memory.predicted_bytes,
            "memory_limit_bytes": memory.memory_limit_bytes, "survives_restart": memory.survives_restart,
            "records_to_limit": memory.records_to_limit,
            "goroutines": measured.goroutines if measured else None,
            "resident_memory_bytes": measured.resident_memory_bytes if measured else None,
            "stack_bytes_per_goroutine": measured.stack_bytes_per_goroutine if measured else None,
            "baseline_bytes": measured.baseline_bytes if measured else None,
            "calibration_error_ratio": measured.calibration_error_ratio if measured else None,
            "trusted": measured.trusted if measured else None, "reason": memory.reason}


def _check_index_reads(snapshot: Snapshot, deleted: Mapping[str, Any]) -> None:
    """A session given as deleted before is an orphan only when its traces were all dispatched before that delete,
    so its traces must have been read: a read reads them for the ids it is asked to (``also_sessions``), beside
    its candidates (a read from the guard's orphan index, or a SQLite file aggregated inside SQLite, does not even
    list the other sessions). Raises GatewayscopeError saying so, rather than confirm fewer orphans than there
    are."""
    if not deleted:
        return
    for snap in snapshot.targets:
        data = snap.trace_store
        if data is None:
            continue
        unread = sorted(sid for sid in delete_fences(deleted, snap.name) if sid not in data.also_read)
        if unread:
            raise GatewayscopeError(
                f"{terminal_safe(snap.name)} was read without {len(unread):,} of the session ids given as deleted "
                f"(such as {terminal_safe(repr(unread[0]))}), so when their traces were dispatched is unknown: take "
                "the snapshot with them, so their sessions are read (take_snapshot(config, also_sessions="
                "deleted_ids); gatewayscope plan --deleted-from does).")


def findings(snapshot: Snapshot, config: Config, *, deleted_ids: Mapping[str, Any] | None = None) -> Findings:
    """The findings of every target of ``snapshot`` under ``config``'s policy, as of ``snapshot.taken_at``.

    ``config`` gives the policy and each Bifrost target's memory limit (a target the config does not name,
    as in a snapshot loaded from elsewhere, is judged against the default limit). ``deleted_ids`` maps
    session ids known to have been deleted before to the moment of that delete (``{id: epoch seconds}`` for
    every target, or ``{target: {id: epoch seconds}}``, as :func:`gatewayscope.remediate.journal.deleted_sessions`
    reads them from an apply journal): such a session
    whose traces were all dispatched before that moment is a confirmed orphan; one used again since is not.

    >>> from gatewayscope.config import Config, Policy, Target
    >>> from gatewayscope.snapshot import (CANDIDATE_TRACES_SCHEMA, SESSIONS_SCHEMA, Snapshot, TargetSnapshot,
    ...                                    TraceStoreData, frame_from_rows)
    >>> now = 1_000_000.0
    >>> data = TraceStoreData(
    ...     sessions=frame_from_rows([("task:0", 1, now - 9000, None), ("task:1", 3, now - 60, now - 5)],
    ...                              SESSIONS_SCHEMA),
    ...     candidate_traces=frame_from_rows([("task:0", "t0", now - 9000, None, 120, 480, "m", now - 9001)],
    ...                                      CANDIDATE_TRACES_SCHEMA))
    >>> snapshot = Snapshot(taken_at=now, targets=[TargetSnapshot(
    ...     name="rl", kind="rllm", address="http://rl:9090", up=True, started_at=now, duration_seconds=0.1,
    ...     trace_store=data)])
    >>> config = Config(targets=[Target(name="rl", kind="rllm", url="http://rl:9090")], policy=Policy())
    >>> found = findings(snapshot, config)
    >>> found.orphans.select("target", "session_id", "confidence", "idle_seconds").rows()
    [('rl', 'task:0', 'suspected', 9000.0)]
    >>> found.counts["orphans"], found.target("rl").summary["sessions"]
    (1, 2)
    """
    policy = dataclasses.replace(config.policy, warnings=list(config.policy.warnings))
    delete_fences(deleted_ids)  # refuses ids without the time of their delete, before anything is judged
    deleted: Mapping[str, Any] = dict(deleted_ids or {})
    _check_index_reads(snapshot, deleted)
    limits = {t.name: t.memory_limit_bytes for t in config.targets}
    now = snapshot.taken_at
    targets = tuple(
        target_findings(snap, policy, now=now, memory_limit_bytes=limits.get(snap.name, DEFAULT_MEMORY_LIMIT_BYTES),
                        deleted_ids=deleted)
        for snap in snapshot.targets
    )
    rllm = [t for t in targets if t.orphans is not None]
    bifrost = [t for t in targets if t.records is not None]
    empty_records, _ = _records_findings(empty_frame(RECORDS_SCHEMA), empty_frame(REACHABILITY_SCHEMA), policy)
    tasks = _concat([_with_target(t.name, t.orphans_by_task) for t in rllm if t.orphans_by_task is not None],
                    {"target": pl.String, **ORPHAN_TASKS_SCHEMA})
    return Findings(
        taken_at=now,
        policy=policy,
        targets=targets,
        snapshot=snapshot,
        deleted_ids=deleted,
        orphans=_concat([_with_target(t.name, t.orphans) for t in rllm if t.orphans is not None],
                        {"target": pl.String, **ORPHANS_SCHEMA}),
        orphans_by_task=tasks.sort(["orphans", "target", "task"], descending=[True, False, False]),
        records=_concat([_with_target(t.name, t.records) for t in bifrost if t.records is not None],
                        {"target": pl.String, **empty_records.schema}),
        pools=_concat([_with_target(t.name, t.pools) for t in bifrost if t.pools is not None],
                      {"target": pl.String, **POOLS_SCHEMA}),
        boot=pl.DataFrame([{"target": t.name, **dataclasses.asdict(t.boot)} for t in bifrost if t.boot is not None],
                          schema=BOOT_SCHEMA),
        memory=pl.DataFrame([_memory_row(t) for t in bifrost if t.memory is not None], schema=MEMORY_SCHEMA),
        posture=pl.DataFrame([row for t in bifrost for row in _posture_rows(t)], schema=POSTURE_SCHEMA),
        unreachable=_concat([_with_target(t.name, t.unreachable) for t in bifrost if t.unreachable is not None],
                            {"target": pl.String, **UNREACHABLE_SCHEMA}),
        guard=pl.DataFrame([
            {"target": t.name, "access": t.snapshot.trace_store.access if t.snapshot.trace_store else None,
             "guarded": t.guard is not None,
             "tombstones": t.guard.tombstones if t.guard else None,
             "capacity": t.guard.capacity if t.guard else None,
             "dropped_writes": t.guard.dropped_writes if t.guard else None,
             "evicted": t.guard.evicted if t.guard else None}
            for t in rllm], schema=GUARD_SCHEMA),
    )
