"""Remediation plans: pure data computed from a Snapshot, serialised to JSON with a content hash.

A plan lists Actions; each names its target, subject, the state before and after, a one-line reason
and the fingerprint of the state it was planned against. :mod:`gatewayscope.remediate.apply` executes
exactly these actions and nothing else. A plan never holds a secret: targets are named, and their
credentials are read from the config when the plan is applied.

Action kinds, in the order apply runs them:

* ``tombstone_backfill``: record tombstones (guarded stores only) BEFORE the deletes, so a straggler
  arriving between tombstone and delete is dropped;
* ``session_delete``: delete a confirmed orphan session (suspected ones only when asked);
* ``posture_fix``: set drifted client-config settings back in one read-modify-write;
* ``pool_shrink``: write a Bifrost record over its kind's pool back with that pool;
* ``record_delete``: delete a Bifrost record that cannot be resized (only when asked).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from gatewayscope import __version__
from gatewayscope.analysis.orphans import find_orphans
from gatewayscope.analysis.pools import classify_records, unreachable_records
from gatewayscope.analysis.posture import SAFE_POSTURE, posture_drift
from gatewayscope.config import Config
from gatewayscope.errors import PlanError
from gatewayscope.render import human_seconds
from gatewayscope.snapshot import Snapshot, TargetSnapshot

SCHEMA_VERSION = 1
STACK_LOW_BYTES = 2 * 1024
STACK_HIGH_BYTES = 8 * 1024

ACTION_KINDS = ("tombstone_backfill", "session_delete", "posture_fix", "pool_shrink", "record_delete")
DESTRUCTIVE_KINDS = frozenset({"session_delete", "record_delete"})
#: a pace that keeps a 0.1.0 memory gateway's event loop free for real traffic (see README, Performance)
DEFAULT_DELETES_PER_SECOND = 20.0
#: without --rate, apply runs one session delete (or batch) at a time per target and pauses after each for
#: a third of its duration: deletes take at most this share of the gateway's time, whatever they cost there
DELETE_DUTY = 0.75
#: what one delete costs the 0.1.0 memory store per session and trace it holds (it scans them all, on the
#: event loop): about 0.4 us in bench/session_delete.py (36 ms at 45,000 one-trace sessions, 2 cores); a
#: range around it, not a promise (the machine and the store's heap move it)
MEMORY_DELETE_SECONDS_PER_ITEM = (0.2e-6, 0.6e-6)


@dataclass
class Action:
    """One change to one subject of one target."""

    id: str
    kind: str
    target: str
    subject: str
    before: dict[str, Any]
    after: dict[str, Any]
    reason: str
    fingerprint: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def destructive(self) -> bool:
        return self.kind in DESTRUCTIVE_KINDS

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["destructive"] = self.destructive
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Action:
        fields = {k: data[k] for k in ("id", "kind", "target", "subject", "before", "after", "reason",
                                       "fingerprint")}
        return cls(**fields, details=dict(data.get("details") or {}))


@dataclass
class Plan:
    """A reviewable, single-use list of actions."""

    created_at: float
    targets: list[dict[str, Any]]
    actions: list[Action]
    policy: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    tool_version: str = __version__
    schema_version: int = SCHEMA_VERSION
    id: str = ""

    def content(self) -> dict[str, Any]:
        """Everything but the id, in a stable form: what the id hashes."""
        return {
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "tool_version": self.tool_version,
            "targets": self.targets,
            "policy": self.policy,
            "warnings": self.warnings,
            "actions": [a.to_dict() for a in self.actions],
        }

    def compute_id(self) -> str:
        payload = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id or self.compute_id(), **self.content()}

    def save(self, path: str | Path) -> Path:
        out = Path(path)
        out.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return out

    def target(self, name: str) -> dict[str, Any]:
        for entry in self.targets:
            if entry["name"] == name:
                return entry
        raise PlanError(f"The plan names no target {name!r}.")

    def target_index(self) -> dict[str, dict[str, Any]]:
        """Each target's entry by name."""
        return {entry["name"]: entry for entry in self.targets}


def load_plan(path: str | Path) -> Plan:
    """Read a plan file and check its id against its content (a hand-edited plan is refused)."""
    source = Path(path)
    try:
        data = json.loads(source.read_text())
    except FileNotFoundError:
        raise PlanError(f"{source}: no such plan file; make one with 'gatewayscope plan --out {source}'.") from None
    except (OSError, ValueError) as err:
        raise PlanError(f"{source} is not a readable plan file: {err}") from None
    if not isinstance(data, dict) or "actions" not in data:
        raise PlanError(f"{source} is not a gatewayscope plan (no actions).")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise PlanError(f"{source} has plan schema {data.get('schema_version')!r}; this gatewayscope reads "
                        f"schema {SCHEMA_VERSION}. Make a new plan.")
    try:
        plan = Plan(
            created_at=float(data["created_at"]),
            targets=list(data["targets"]),
            actions=[Action.from_dict(a) for a in data["actions"]],
            policy=dict(data.get("policy") or {}),
            warnings=list(data.get("warnings") or []),
            tool_version=str(data.get("tool_version", "")),
            schema_version=int(data["schema_version"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise PlanError(f"{source} is not a well-formed plan ({type(err).__name__}: {err}).") from None
    plan.id = plan.compute_id()
    if data.get("id") != plan.id:
        raise PlanError(f"{source} was changed after it was made (its id does not match its content); "
                        "make a new plan instead of editing one.")
    return plan


# -- building -----------------------------------------------------------------------------------------

def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def session_fingerprint(trace_count: int, trace_ids: Iterable[str] | None) -> str:
    """What a session-delete was planned against: its trace count and, when the scan read them, its trace ids.

    ``trace_ids=None`` means the scan did not read the session's traces (the sources read them only for
    one-trace sessions idle past the threshold and for tombstoned ones; an orphan confirmed by an earlier
    delete can be neither), so only the count is compared.

    >>> session_fingerprint(1, ["t1"]) == session_fingerprint(1, ["t2"])
    False
    >>> session_fingerprint(1, None) == session_fingerprint(1, ["t1"])
    False
    """
    if trace_ids is None:
        return _hash({"trace_count": int(trace_count)})
    return _hash({"trace_count": int(trace_count), "trace_ids": sorted(trace_ids)})


def posture_fingerprint(client_config: dict[str, Any]) -> str:
    """The client config apart from the posture settings a fix changes."""
    return _hash({k: v for k, v in client_config.items() if k not in SAFE_POSTURE})


def _rllm_actions(snap: TargetSnapshot, config: Config, now: float, *, include_suspected: bool,
                  tombstone_ids: Collection[str], deleted_ids: Collection[str],
                  warnings: list[str]) -> list[Action]:
    data = snap.trace_store
    assert data is not None
    orphans = find_orphans(data, config.policy, now, deleted_ids=deleted_ids)
    chosen = orphans if include_suspected else orphans.filter(pl.col("confidence") == "confirmed")
    skipped = orphans.height - chosen.height
    if skipped:
        warnings.append(f"{snap.name}: {skipped} suspected orphan session(s) left out; --include-suspected "
                        "plans their deletion too (check first that none is a live session).")
    elif include_suspected and (orphans["confidence"] == "suspected").any():
        warnings.append(f"{snap.name}: the plan deletes suspected orphans: sessions with one idle trace that "
                        "nothing proves deleted. Review them before applying.")
    traces = data.candidate_traces.group_by("session_id").agg(pl.col("trace_id"))
    trace_ids = {row[0]: row[1] for row in traces.iter_rows()}
    changing = data.candidate_traces.group_by("session_id").len().join(
        data.sessions.select("session_id", "trace_count"), on="session_id").filter(
        pl.col("len") != pl.col("trace_count"))
    if changing.height:
        warnings.append(f"{snap.name}: the store changed while it was read ({changing.height} session(s) "
                        "gained or lost traces during the scan); apply re-reads every session first.")

    actions: list[Action] = []
    guarded = data.guard is not None and data.guard.enabled
    delete_ids = chosen["session_id"].to_list()
    backfill_ids = sorted(set(delete_ids) | set(tombstone_ids))
    if backfill_ids and guarded:
        actions.append(Action(
            id="", kind="tombstone_backfill", target=snap.name, subject="tombstones",
            before={"tombstones": data.guard.tombstones if data.guard else 0},
            after={"session_ids": backfill_ids},
            reason=(f"tombstone {len(backfill_ids)} deleted session id(s) before deleting, so a late write "
                    "cannot bring them back"),
            fingerprint=_hash({"session_ids": backfill_ids}),
        ))
    elif backfill_ids and data.guard is not None:  # a guard that is there but does not work
        how = (f"re-run 'gatewayscope guard install {snap.address}' (its triggers are missing or altered)"
               if data.access == "sqlite" else "restart the gateway with --max-tombstones above 0")
        warnings.append(f"{snap.name}: the tombstone guard is disabled, so no tombstones are planned and a "
                        f"straggler can bring a deleted session back; to stop that: {how}.")
    elif backfill_ids:
        how = (f"gatewayscope guard install {snap.address}" if data.access == "sqlite"
               else "run the gateway with 'gatewayscope gateway' instead of 'rllm-model-gateway'")
        warnings.append(f"{snap.name}: no tombstone guard, so no tombstones are planned and a straggler can "
                        f"bring a deleted session back; to stop that: {how}.")
    for row in chosen.iter_rows(named=True):
        sid = row["session_id"]
        ids = trace_ids.get(sid)  # None: the scan did not read this session's traces
        actions.append(Action(
            id="", kind="session_delete", target=snap.name, subject=sid,
            before={"trace_count": row["trace_count"]}, after={"trace_count": 0},
            reason=f"{row['confidence']} orphan: {row['reason']}",
            fingerprint=session_fingerprint(row["trace_count"], ids),
            details={"confidence": row["confidence"], "task": row["task"], "prompt_tokens": row["prompt_tokens"],
                     "trace_ids": sorted(ids) if ids is not None else None},
        ))
    if delete_ids:
        # what apply does: one at a time (or one batch at a time), deletes taking at most DELETE_DUTY of the
        # gateway's time, unless --rate sets a pace
        pace = (f"so that deletes take at most {DELETE_DUTY:.0%} of the gateway's time and its traffic waits "
                "behind one delete at most")
        if data.access == "sqlite":
            how, when = "with the gateway's own delete statements on its SQLite file, one at a time", ""
        elif data.capabilities.get("batch_delete"):
            how, when = "through the gateway's batch delete (POST /sessions/batch_delete), one batch at a time", ""
        else:
            how = "through the gateway's own delete, one at a time"
            when = "; the 0.1.0 memory store scans every session on each delete: " + _memory_delete_time(
                data.sessions.height, int(data.sessions["trace_count"].sum() or 0), chosen)
        warnings.append(f"{snap.name}: deletes {len(delete_ids)} session(s) {how}, {pace}{when} "
                        "(apply --rate sets a fixed pace instead).")
    return actions


def _memory_delete_time(sessions: int, traces: int, chosen: pl.DataFrame) -> str:
    """How long apply's deletes of ``chosen`` take on a 0.1.0 memory store of that size, as a range."""
    items = sessions + traces
    removed = chosen.height + int(chosen["trace_count"].sum() or 0)
    # each delete scans what is left; the store shrinks by one session and its traces per delete
    scanned = chosen.height * (items - removed / 2)
    low, high = (scanned * cost / DELETE_DUTY for cost in MEMORY_DELETE_SECONDS_PER_ITEM)
    if high < 1:
        return "under a second"
    return f"about {human_seconds(low)} to {human_seconds(high)} at this store's size"


def _bifrost_actions(snap: TargetSnapshot, config: Config, *, include_deletes: bool,
                     warnings: list[str]) -> list[Action]:
    data = snap.bifrost
    assert data is not None
    if data.records["fingerprint"].null_count():
        # safety: apply writes a record only while it still matches what was planned, which needs these
        raise PlanError(f"{snap.name}: the records were read without plan fingerprints (a report-only read, "
                        "like the exporter's or a scan that saved no snapshot); plan from a fresh read "
                        "('gatewayscope plan') or a snapshot saved with 'gatewayscope scan --save-snapshot'.")
    policy = config.policy
    classified = classify_records(data.records, policy)
    unreachable = unreachable_records(data.records, data.reachability)
    unreachable_reason = dict(zip(unreachable["name"].to_list(), unreachable["reason"].to_list(), strict=True))
    actions: list[Action] = []

    drift = posture_drift(data.client_config)
    if drift:
        actions.append(Action(
            id="", kind="posture_fix", target=snap.name, subject="client_config",
            before={s: bool(data.client_config.get(s, False)) for s in drift},
            after={s: SAFE_POSTURE[s] for s in drift},
            reason="client config drifted from the safe posture: " + ", ".join(drift),
            fingerprint=posture_fingerprint(data.client_config),
        ))

    blocked = 0
    for row in classified.sort("name").iter_rows(named=True):
        name = row["name"]
        if name in unreachable_reason:
            if include_deletes:
                actions.append(Action(
                    id="", kind="record_delete", target=snap.name, subject=name,
                    before={"concurrency": row["concurrency"], "buffer_size": row["buffer_size"],
                            "base_url": row["base_url"]},
                    after={"exists": False},
                    reason=(f"cannot be resized ({unreachable_reason[name]}); a provision still in use "
                            "sets it up again"),
                    fingerprint=row["fingerprint"],
                    details={"record_kind": row["kind"], "frees_workers": row["parked_workers"],
                             "frees_bytes": {"low": row["parked_workers"] * STACK_LOW_BYTES,
                                             "high": row["parked_workers"] * STACK_HIGH_BYTES}},
                ))
            elif row["over_pool"]:
                blocked += 1
            continue
        if not row["over_pool"]:
            continue
        pool = int(row["target_pool"])
        queue = int(row["target_queue"])
        freed = int(row["concurrency"]) - pool
        actions.append(Action(
            id="", kind="pool_shrink", target=snap.name, subject=name,
            before={"concurrency": row["concurrency"], "buffer_size": row["buffer_size"]},
            after={"concurrency": pool, "buffer_size": queue},
            reason=f"{row['kind']} record parks {row['concurrency']:,} workers; its kind's pool is {pool}",
            fingerprint=row["fingerprint"],
            details={"record_kind": row["kind"], "has_base_url": row["base_url"] is not None,
                     "frees_workers": freed,
                     "frees_bytes": {"low": freed * STACK_LOW_BYTES, "high": freed * STACK_HIGH_BYTES}},
        ))
    if blocked:
        warnings.append(f"{snap.name}: {blocked} record(s) over their pool cannot be resized (base URL does not "
                        "resolve, or status error): the gateway would refuse the write. --include-deletes plans "
                        "their deletion; a provision still in use sets such a record up again.")
    return actions


def build_plan(
    snapshot: Snapshot,
    config: Config,
    *,
    only: Collection[str] = (),
    include_suspected: bool = False,
    include_deletes: bool = False,
    tombstone_ids: Collection[str] = (),
    deleted_ids: Collection[str] = (),
    created_at: float | None = None,
) -> Plan:
    """The plan for ``snapshot`` under ``config``'s policy. Pure: no I/O, no clock unless ``created_at`` is None.

    ``only`` restricts the action kinds; ``tombstone_ids`` adds ids to backfill on guarded stores;
    ``deleted_ids`` are ids known to have been deleted before (they confirm an orphan).
    """
    unknown = set(only) - set(ACTION_KINDS)
    if unknown:
        raise PlanError(f"Unknown action kind(s) {', '.join(sorted(unknown))}; choose from {', '.join(ACTION_KINDS)}.")
    warnings: list[str] = []
    actions: list[Action] = []
    targets: list[dict[str, Any]] = []
    now = snapshot.taken_at
    for snap in snapshot.targets:
        entry: dict[str, Any] = {"name": snap.name, "kind": snap.kind, "address": snap.address}
        if not snap.up:
            warnings.append(f"{snap.name}: not planned, it did not answer ({snap.error}).")
            entry["skipped"] = True
            targets.append(entry)
            continue
        if snap.trace_store is not None:
            entry["access"] = snap.trace_store.access
            entry["capabilities"] = dict(snap.trace_store.capabilities)
            entry["guarded"] = snap.trace_store.guard is not None
            actions += _rllm_actions(snap, config, now, include_suspected=include_suspected,
                                     tombstone_ids=tombstone_ids, deleted_ids=deleted_ids, warnings=warnings)
        elif snap.bifrost is not None:
            actions += _bifrost_actions(snap, config, include_deletes=include_deletes, warnings=warnings)
        targets.append(entry)
    if only:
        actions = [a for a in actions if a.kind in only]
    actions.sort(key=lambda a: (ACTION_KINDS.index(a.kind), a.target, a.subject))
    seen: set[tuple[str, str]] = set()
    for index, action in enumerate(actions, start=1):
        key = (action.target, action.subject)
        if key in seen:  # safety rule 8: never two actions on one subject
            raise PlanError(f"internal: two actions on {action.target}/{action.subject}")
        seen.add(key)
        action.id = f"a{index:05d}"
    if any(a.destructive for a in actions):
        warnings.insert(0, "This plan deletes things: apply needs --allow-delete (or the delete confirmation in "
                           "the notebook) to run the deletes.")
    plan = Plan(
        created_at=time.time() if created_at is None else created_at,
        targets=targets,
        actions=actions,
        policy={
            "orphan_idle_seconds": config.policy.orphan_idle_seconds,
            "max_weight_lag": config.policy.max_weight_lag,
            "standard_pool": config.policy.standard_pool,
            "custom_pool": config.policy.custom_pool,
            "queue_per_worker": config.policy.queue_per_worker,
            "include_suspected": include_suspected,
            "include_deletes": include_deletes,
        },
        warnings=warnings,
    )
    plan.id = plan.compute_id()
    return plan


def plan_summary(plan: Plan) -> dict[str, Any]:
    """Counts by kind and target, and the memory the shrinks and record deletes free (low/high bytes)."""
    by_kind: dict[str, int] = {kind: 0 for kind in ACTION_KINDS}
    by_target: dict[str, dict[str, int]] = {}
    frees = {"low": 0, "high": 0}
    workers = 0
    for action in plan.actions:
        by_kind[action.kind] += 1
        by_target.setdefault(action.target, {}).setdefault(action.kind, 0)
        by_target[action.target][action.kind] += 1
        if "frees_bytes" in action.details:
            frees["low"] += int(action.details["frees_bytes"]["low"])
            frees["high"] += int(action.details["frees_bytes"]["high"])
            workers += int(action.details.get("frees_workers", 0))
    return {"actions": len(plan.actions), "by_kind": by_kind, "by_target": by_target,
            "frees_workers": workers, "frees_bytes": frees,
            "destructive": sum(1 for a in plan.actions if a.destructive)}
