"""Read every configured target into a Snapshot, and reduce it to the scan report.

This is the one core function behind ``gatewayscope scan``, the exporter's collectors and the
notebooks' snapshot view: targets are read concurrently, each under its own timeout, and a target
that fails becomes ``up: false`` with a sentence, never an exception that hides the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gatewayscope.config import DEFAULT_MEMORY_LIMIT_BYTES, Config, Policy, Target
from gatewayscope.errors import GatewayscopeError
from gatewayscope.snapshot import Snapshot, TargetSnapshot

if TYPE_CHECKING:
    from gatewayscope.sources.rllm_http import KnownTraces

log = logging.getLogger(__name__)

#: how many targets are read at once
MAX_PARALLEL_TARGETS = 16


def read_target(target: Target, policy: Policy, *, now: float, transport: Any = None,
                fingerprints: bool = True, known_traces: KnownTraces | None = None) -> TargetSnapshot:
    """Read one target; every failure is caught and described on the returned TargetSnapshot.

    ``fingerprints=False``: a Bifrost target's records are read without their plan fingerprints (a
    report or the exporter has no use for them; a plan made from such a read is refused).
    ``known_traces``: an rLLM gateway's candidate traces kept from the last read of the same target
    (see :class:`gatewayscope.sources.rllm_http.KnownTraces`).
    """
    started = time.time()
    clock = time.perf_counter()
    snap = TargetSnapshot(name=target.name, kind=target.kind, address=target.address, up=False,
                          started_at=started, duration_seconds=0.0)
    try:
        if target.kind == "rllm" and target.path:
            from gatewayscope.sources.rllm_sqlite import read_trace_store_sqlite

            snap.trace_store = read_trace_store_sqlite(target, policy, now=now)
        elif target.kind == "rllm":
            from gatewayscope.sources.rllm_http import read_trace_store_http

            snap.trace_store = read_trace_store_http(target, policy, now=now, transport=transport,
                                                     known=known_traces)
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


def take_snapshot(
    config: Config,
    *,
    now: float | None = None,
    transports: dict[str, Any] | None = None,
    on_target_done: Callable[[TargetSnapshot], None] | None = None,
    fingerprints: bool = True,
) -> Snapshot:
    """Read every target of ``config`` concurrently. ``transports`` maps a target name to an httpx transport.

    ``fingerprints=False`` is for reads that only report (see :func:`read_target`): such a snapshot
    cannot be planned from.
    """
    taken_at = time.time() if now is None else now
    transports = transports or {}
    results: dict[str, TargetSnapshot] = {}

    def work(target: Target) -> TargetSnapshot:
        snap = read_target(target, config.policy, now=taken_at, transport=transports.get(target.name),
                           fingerprints=fingerprints)
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


def summarize_target(snap: TargetSnapshot, config: Config, now: float,
                     *, deleted_ids: Collection[str] = ()) -> dict[str, Any]:
    """The stable JSON shape of one target in ``scan --format json`` (documented in README)."""
    entry: dict[str, Any] = {
        "name": snap.name,
        "kind": snap.kind,
        "address": snap.address,
        "up": snap.up,
        "error": snap.error,
        "error_kind": snap.error_kind,
        "duration_seconds": round(snap.duration_seconds, 4),
        "warnings": list(snap.warnings),
    }
    if snap.kind == "rllm":
        entry.update({"sessions": None, "traces": None, "orphans": {"confirmed": None, "suspected": None},
                      "oldest_orphan_age_seconds": None})
        if snap.trace_store is not None:
            from gatewayscope.analysis.orphans import find_orphans, trace_store_summary

            orphans = find_orphans(snap.trace_store, config.policy, now, deleted_ids=deleted_ids)
            entry.update(trace_store_summary(snap.trace_store, orphans, now))
            entry["orphan_sessions"] = orphans.to_dicts()
    elif snap.bifrost is not None:
        from gatewayscope.analysis.pools import bifrost_sentence, bifrost_summary

        target = _find_target(config, snap.name)
        limit = target.memory_limit_bytes if target else DEFAULT_MEMORY_LIMIT_BYTES
        entry.update(bifrost_summary(snap.bifrost, config.policy, limit))
        entry["restart_sentence"] = bifrost_sentence(entry)
    return entry


def _find_target(config: Config, name: str) -> Target | None:
    return next((t for t in config.targets if t.name == name), None)


def scan_report(snapshot: Snapshot, config: Config, *, deleted_ids: Collection[str] = ()) -> dict[str, Any]:
    """The whole scan as one JSON-able document."""
    from gatewayscope import __version__

    return {
        "gatewayscope_version": __version__,
        "taken_at": snapshot.taken_at,
        "policy": {
            "orphan_idle_seconds": config.policy.orphan_idle_seconds,
            "max_weight_lag": config.policy.max_weight_lag,
            "standard_pool": config.policy.standard_pool,
            "custom_pool": config.policy.custom_pool,
            "queue_per_worker": config.policy.queue_per_worker,
        },
        "targets": [summarize_target(s, config, snapshot.taken_at, deleted_ids=deleted_ids)
                    for s in snapshot.targets],
    }
