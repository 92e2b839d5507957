"""Orphan sessions of the rLLM trace store, defined once.

Pure functions: frames in, frames out, ``now`` passed in. A session is an orphan when

* **confirmed**: its id carries a tombstone (the guard saw it deleted), or it was observed deleted
  before (``deleted_ids``, e.g. from an apply journal) and came back;
* **suspected**: exactly one trace, idle longer than ``policy.orphan_idle_seconds``, and, where the
  gateway reports weight versions and the trace carries one, older than the current version by more
  than ``policy.max_weight_lag``.

A live session (a recent trace, or one at the current weight version) is never called an orphan:
a false positive leads to deleting training data.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import polars as pl

from gatewayscope.config import Policy
from gatewayscope.snapshot import TraceStoreData

ORPHANS_SCHEMA: dict[str, Any] = {
    "session_id": pl.String,
    "task": pl.String,
    "confidence": pl.String,
    "trace_count": pl.Int64,
    "last_trace_at": pl.Float64,
    "idle_seconds": pl.Float64,
    "weight_version": pl.Int64,
    "weight_lag": pl.Int64,
    "prompt_tokens": pl.Int64,
    "prompt_chars": pl.Int64,
    "reason": pl.String,
}


def task_of(session_id: pl.Expr) -> pl.Expr:
    """The task a session belongs to: its uid before the last ``:`` (rLLM uids are ``<uuid>:<rollout>``).

    >>> pl.DataFrame({"s": ["abc:0", "a:b:7", "plain"]}).select(task_of(pl.col("s")))["s"].to_list()
    ['abc', 'a:b', 'plain']
    """
    return pl.when(session_id.str.contains(":")).then(
        session_id.str.replace(r":[^:]*$", "")
    ).otherwise(session_id)


def find_orphans(
    data: TraceStoreData,
    policy: Policy,
    now: float,
    *,
    deleted_ids: Collection[str] = (),
) -> pl.DataFrame:
    """Every orphan session with its confidence, age, weight lag and prompt size (ORPHANS_SCHEMA)."""
    traces = data.candidate_traces.group_by("session_id").agg(
        pl.col("timestamp").max().alias("candidate_last_at"),
        pl.col("weight_version").max().alias("weight_version"),
        pl.col("prompt_tokens").max().alias("prompt_tokens"),
        pl.col("prompt_chars").max().alias("prompt_chars"),
    )
    confirmed_ids = pl.Series("session_id", sorted(set(data.tombstoned_ids) | set(deleted_ids)), dtype=pl.String)
    current = data.current_weight_version
    # Only a confirmed session or a one-trace one not known to be fresh can be an orphan: the rest are left out
    # before the join (a full read lists every session), by the same idle comparison as below.
    maybe = (pl.col("trace_count") == 1) & (
        pl.col("last_trace_at").is_null() | ((pl.lit(now) - pl.col("last_trace_at")) > policy.orphan_idle_seconds))
    frame = (
        data.sessions.filter(maybe | pl.col("session_id").is_in(confirmed_ids.implode()))
        .join(traces, on="session_id", how="left")
        .with_columns(
            pl.coalesce("last_trace_at", "candidate_last_at").alias("last_trace_at"),
            pl.col("session_id").is_in(confirmed_ids.implode()).alias("_confirmed"),
        )
        .with_columns(
            (pl.lit(now) - pl.col("last_trace_at")).alias("idle_seconds"),
            (pl.lit(current, dtype=pl.Int64) - pl.col("weight_version")).alias("weight_lag"),
        )
    )
    idle = pl.col("idle_seconds") > policy.orphan_idle_seconds
    # only where both the gateway's current version and the trace's are known does the lag decide
    stale = pl.col("weight_lag").is_null() | (pl.col("weight_lag") > policy.max_weight_lag)
    suspected = (pl.col("trace_count") == 1) & idle.fill_null(False) & stale
    frame = frame.filter(pl.col("_confirmed") | suspected).with_columns(
        pl.when(pl.col("_confirmed")).then(pl.lit("confirmed")).otherwise(pl.lit("suspected")).alias("confidence"),
        task_of(pl.col("session_id")).alias("task"),
    )
    deleted = pl.Series(sorted(deleted_ids), dtype=pl.String).implode()
    tombstoned = pl.Series(sorted(data.tombstoned_ids), dtype=pl.String).implode()
    reason = (
        pl.when(pl.col("session_id").is_in(tombstoned))
        .then(pl.lit("carries a tombstone: it was deleted and a late write brought it back"))
        .when(pl.col("session_id").is_in(deleted))
        .then(pl.lit("was deleted before and came back"))
        .otherwise(
            pl.format(
                "one trace, idle {}s{}",
                pl.col("idle_seconds").round(0).cast(pl.Int64),
                pl.when(pl.col("weight_lag").is_not_null())
                .then(pl.format(", {} weight versions behind", pl.col("weight_lag")))
                .otherwise(pl.lit("")),
            )
        )
    )
    return (
        frame.with_columns(reason.alias("reason"))
        .select(list(ORPHANS_SCHEMA))
        .cast(ORPHANS_SCHEMA)  # type: ignore[arg-type]
        .sort(["confidence", "last_trace_at", "session_id"], nulls_last=True)
    )


def orphans_by_task(orphans: pl.DataFrame) -> pl.DataFrame:
    """Orphans grouped by task, most first: stragglers of one hard task come together."""
    return (
        orphans.group_by("task")
        .agg(
            pl.len().alias("orphans"),
            (pl.col("confidence") == "confirmed").sum().alias("confirmed"),
            pl.col("prompt_tokens").sum().alias("prompt_tokens"),
        )
        .sort(["orphans", "task"], descending=[True, False])
    )


def trace_store_summary(data: TraceStoreData, orphans: pl.DataFrame, now: float,
                        *, by_task: pl.DataFrame | None = None) -> dict[str, Any]:
    """The figures every view shows for one trace store (JSON-able), from its orphans (:func:`find_orphans`).

    ``by_task`` is :func:`orphans_by_task` of ``orphans`` when the caller has it already.
    """
    confirmed = int((orphans["confidence"] == "confirmed").sum()) if orphans.height else 0
    last = orphans["last_trace_at"].drop_nulls()
    oldest_age = float(now - last.min()) if last.len() else None  # type: ignore[operator]
    lags = orphans["weight_lag"].drop_nulls()
    groups = orphans_by_task(orphans) if by_task is None else by_task
    summary: dict[str, Any] = {
        "sessions": data.session_count,
        "traces": data.trace_count,
        "orphans": {"confirmed": confirmed, "suspected": orphans.height - confirmed},
        "oldest_orphan_age_seconds": round(oldest_age, 3) if oldest_age is not None else None,
        "current_weight_version": data.current_weight_version,
        "max_orphan_weight_lag": int(lags.max()) if lags.len() else None,  # type: ignore[arg-type]
        "orphan_prompt_tokens": int(orphans["prompt_tokens"].sum()) if orphans.height else 0,
        "orphan_tasks": groups.height,
        "top_orphan_tasks": groups.head(5).to_dicts(),
        "access": data.access,
        "capabilities": dict(sorted(data.capabilities.items())),
        "guard": None,
    }
    if data.guard is not None:
        summary["guard"] = {
            "enabled": data.guard.enabled,
            "tombstones": data.guard.tombstones,
            "tombstone_capacity": data.guard.capacity,
            "dropped_writes": data.guard.dropped_writes,
            "evicted": data.guard.evicted,
            "triggers_intact": data.guard.triggers_intact,
            "top_droppers": data.guard.top_droppers[:5],
            "index": data.guard.index,
        }
    return summary
