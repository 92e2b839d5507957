"""Read every configured target into a Snapshot, and turn its findings into the scan report.

:func:`take_snapshot` is the one read behind ``gatewayscope scan``, the exporter's collectors and the
notebooks' snapshot view: targets are read concurrently, each under its own timeout, and a target
that fails becomes ``up: false`` with a sentence, never an exception that hides the others.
:func:`scan_report` is the JSON shape of the :class:`~gatewayscope.analysis.findings.Findings` of a
snapshot (``scan --format json``; the text and HTML views render the same document).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, overload

from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import GatewayscopeError
from gatewayscope.snapshot import Snapshot, TargetSnapshot

if TYPE_CHECKING:
    from gatewayscope.analysis.findings import Findings, TargetFindings
    from gatewayscope.sources.rllm_http import KnownTraces

log = logging.getLogger(__name__)

#: how many targets are read at once
MAX_PARALLEL_TARGETS = 16


def read_target(target: Target, policy: Policy, *, now: float, transport: Any = None,
                fingerprints: bool = True, known_traces: KnownTraces | None = None,
                also_sessions: Collection[str] = ()) -> TargetSnapshot:
    """Read one target; every failure is caught and described on the returned TargetSnapshot.

    ``fingerprints=False``: a Bifrost target's records are read without their plan fingerprints (a
    report or the exporter has no use for them; a plan made from such a read is refused).
    ``known_traces``: an rLLM gateway's candidate traces kept from the last read of the same target
    (see :class:`gatewayscope.sources.rllm_http.KnownTraces`). ``also_sessions``: ids the findings will be given
    as deleted before; a read from a guard's orphan index includes those of them that exist, so such a session
    is judged as by a full read.
    """
    started = time.time()
    clock = time.perf_counter()
    snap = TargetSnapshot(name=target.name, kind=target.kind, address=target.address, up=False,
                          started_at=started, duration_seconds=0.0)
    try:
        if target.kind == "rllm" and not target.is_remote:
            from gatewayscope.guard.sqlite import read_for_scan, read_index_for_scan
            from gatewayscope.sources.rllm_sqlite import read_trace_store_sqlite

            snap.trace_store = read_trace_store_sqlite(target, policy, now=now, guard_reader=read_for_scan,
                                                       index_reader=read_index_for_scan, also=also_sessions)
        elif target.kind == "rllm":
            from gatewayscope.sources.rllm_http import read_trace_store_http

            snap.trace_store = read_trace_store_http(target, policy, now=now, transport=transport,
                                                     known=known_traces, also=also_sessions)
        else:
            from gatewayscope.sources.bifrost import read_bifrost

            snap.bifrost = read_bifrost(target, policy, transport=transport, now=now, fingerprints=fingerprints)
        snap.up = True
    except GatewayscopeError as err:
        snap.error, snap.error_kind = str(err), err.kind
    except Exception as err:  # a bug or an unforeseen answer must not hide the other targets
        log.debug("reading %s failed", target.name, exc_info=True)
        snap.error = f"unexpected {type(err).__name__} while reading {target.address}: {err}"
        snap.error_kind = "internal"
    snap.duration_seconds = time.perf_counter() - clock
    return snap


def sessions_for(also_sessions: Collection[str] | Mapping[str, Any], target: str) -> list[str]:
    """The ids of ``also_sessions`` a read of ``target`` includes: all of a plain collection or ``{id: time}``
    mapping, or ``target``'s of one mapping per target name (``{target: {id: time}}``, as ``deleted_ids``).

    >>> sessions_for(["a:0"], "rl"), sessions_for({"rl": {"a:0": 1.0}, "other": {"b:0": 2.0}}, "rl")
    (['a:0'], ['a:0'])
    """
    if isinstance(also_sessions, Mapping) and also_sessions and all(
            isinstance(value, Mapping) for value in also_sessions.values()):
        return [str(sid) for sid in also_sessions.get(target) or {}]
    return [str(sid) for sid in also_sessions]


def take_snapshot(
    config: Config,
    *,
    now: float | None = None,
    transports: dict[str, Any] | None = None,
    on_target_done: Callable[[TargetSnapshot], None] | None = None,
    fingerprints: bool = True,
    also_sessions: Collection[str] | Mapping[str, Any] = (),
) -> Snapshot:
    """Read every target of ``config`` concurrently. ``transports`` maps a target name to an httpx transport.

    ``now`` (epoch seconds, default the wall clock) is the snapshot's ``taken_at``: every idle age is
    measured from it. ``on_target_done`` is called with each target's read as it completes.
    ``fingerprints=False`` is for reads that only report (see :func:`read_target`): such a snapshot
    cannot be planned from. ``also_sessions``: the ids the findings will be given as deleted before (see
    :func:`read_target`; a mapping per target name gives each target its own, see :func:`sessions_for`). A
    target that cannot be read is ``up=False`` with the sentence why:

    >>> from gatewayscope.config import Config, Policy, Target
    >>> config = Config(targets=[Target(name="gone", kind="rllm", path="/nonexistent/traces.db")], policy=Policy())
    >>> snapshot = take_snapshot(config, now=1_000_000.0)
    >>> snapshot.taken_at, snapshot.targets[0].up, snapshot.targets[0].error_kind
    (1000000.0, False, 'store')
    """
    taken_at = time.time() if now is None else now
    transports = transports or {}
    results: dict[str, TargetSnapshot] = {}

    def work(target: Target) -> TargetSnapshot:
        snap = read_target(target, config.policy, now=taken_at, transport=transports.get(target.name),
                           fingerprints=fingerprints, also_sessions=sessions_for(also_sessions, target.name))
        if on_target_done:
            on_target_done(snap)
        return snap

    workers = max(1, min(MAX_PARALLEL_TARGETS, len(config.targets)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gatewayscope-scan") as pool:
        for snap in pool.map(work, config.targets):
            results[snap.name] = snap
    snapshot = Snapshot(taken_at=taken_at, targets=[results[t.name] for t in config.targets])
    for warning in config.policy.warnings:
        for snap in snapshot.targets:
            if snap.kind == "bifrost" and warning not in snap.warnings:
                snap.warnings.append(warning)
    return snapshot


def target_report(found: TargetFindings) -> dict[str, Any]:
    """The stable JSON shape of one target in ``scan --format json`` (docs/cli.md#scan---format-json), from its
    findings."""
    entry: dict[str, Any] = {
        "name": found.name,
        "kind": found.kind,
        "address": found.address,
        "up": found.up,
        "error": found.error,
        "error_kind": found.error_kind,
        "duration_seconds": round(found.duration_seconds, 4),
        "warnings": list(found.warnings),
    }
    if found.kind == "rllm":
        entry.update({"sessions": None, "traces": None, "orphans": {"confirmed": None, "suspected": None},
                      "oldest_orphan_age_seconds": None})
        if found.orphans is not None:
            entry.update(found.summary)
            entry["orphan_sessions"] = found.orphans.to_dicts()
    elif found.records is not None:
        from gatewayscope.analysis.memory import boot_memory_sentence
        from gatewayscope.analysis.pools import bifrost_sentence

        entry.update(found.summary)
        entry["restart_sentence"] = bifrost_sentence(entry)
        entry["boot_memory_sentence"] = boot_memory_sentence(entry["boot_memory"])
    return entry


@overload
def scan_report(found: Findings) -> dict[str, Any]: ...
@overload
def scan_report(found: Snapshot, config: Config, *,
                deleted_ids: Mapping[str, Any] | None = None) -> dict[str, Any]: ...


def scan_report(found: Findings | Snapshot, config: Config | None = None, *,
                deleted_ids: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole scan as one JSON-able document: the shape of ``gatewayscope scan --format json``.

    Give the :class:`~gatewayscope.analysis.findings.Findings` of a snapshot; a Snapshot with its config (and
    ``deleted_ids``) is analysed first.
    """
    from gatewayscope import __version__
    from gatewayscope.analysis.findings import findings

    if isinstance(found, Snapshot):
        if config is None:
            raise TypeError("scan_report(snapshot, config): a snapshot is analysed under a config's policy")
        found = findings(found, config, deleted_ids=deleted_ids)
    return {
        "gatewayscope_version": __version__,
        "taken_at": found.taken_at,
        "policy": found.policy.to_dict(),
        "targets": [target_report(t) for t in found.targets],
    }
