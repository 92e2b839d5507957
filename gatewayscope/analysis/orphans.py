"""Orphan sessions of the rLLM trace store.

Pure functions: frames in, frames out, ``now`` passed in. The rule itself, and the tombstone fence it rests
on, lives in :mod:`gatewayscope.orphan_rule` (shared with the guards, the sources and apply); this applies it
to a whole store at once. A session is an orphan when

* **confirmed**: every trace it still has was dispatched before its fence: its tombstone's (the guard saw it
  deleted, and did not see it written again after), or a recorded earlier delete's (``deleted_ids``, e.g. from
  an apply journal, each with the moment of that delete);
* **suspected**: exactly one trace, idle longer than ``policy.orphan_idle_seconds``, and, where the
  gateway reports weight versions and the trace carries one, older than the current version by more
  than ``policy.max_weight_lag``.

A live session (a recent trace, or one at the current weight version, or one used again after its delete)
is never called an orphan: a false positive leads to deleting training data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from gatewayscope.config import Policy
from gatewayscope.orphan_rule import UNKNOWN_FENCE, before_fence_expr, confidence_expr
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


def _fence_frame(data: TraceStoreData, deleted_ids: Mapping[str, float]) -> pl.DataFrame:
    """Per fenced session: its tombstone's fence (infinite when the guard gave none), whether the guard saw it
    written after that fence, and the latest recorded earlier delete."""
    ids = sorted(set(data.tombstoned_ids) | set(deleted_ids))
    tombstoned = set(data.tombstoned_ids)
    reused = set(data.reused_ids)
    return pl.DataFrame({
        "session_id": ids,
        "_tombstone_fence": [data.fences.get(sid, UNKNOWN_FENCE) if sid in tombstoned else None for sid in ids],
        "_reused": [sid in reused for sid in ids],
        "_deleted_fence": [deleted_ids.get(sid) for sid in ids],
    }, schema={"session_id": pl.String, "_tombstone_fence": pl.Float64, "_reused": pl.Boolean,
               "_deleted_fence": pl.Float64})


def find_orphans(
    data: TraceStoreData,
    policy: Policy,
    now: float,
    *,
    deleted_ids: Mapping[str, float] | None = None,
) -> pl.DataFrame:
    """Every orphan session with its confidence, age, weight lag and prompt size (ORPHANS_SCHEMA).

    ``deleted_ids`` maps session ids known to have been deleted before to the moment of that delete: only the
    traces dispatched before it make such a session a confirmed orphan (the id may be in use again since)."""
    deleted = dict(deleted_ids or {})
    traces = data.candidate_traces.group_by("session_id").agg(
        pl.col("timestamp").max().alias("candidate_last_at"),
        pl.col("weight_version").max().alias("weight_version"),
        pl.col("prompt_tokens").max().alias("prompt_tokens"),
        pl.col("prompt_chars").max().alias("prompt_chars"),
        # every trace's dispatch time must be known for "all of them before the fence"
        pl.when(pl.col("dispatched_at").null_count() == 0).then(pl.col("dispatched_at").max())
        .alias("_latest_dispatch"),
        pl.len().alias("_traces_read"),
    )
    fences = _fence_frame(data, deleted)
    current = data.current_weight_version
    # Only a fenced session or a one-trace one not known to be fresh can be an orphan: the rest are left out
    # before the join (a full read lists every session), by the same idle comparison as below.
    maybe = (pl.col("trace_count") == 1) & (
        pl.col("last_trace_at").is_null() | ((pl.lit(now) - pl.col("last_trace_at")) > policy.orphan_idle_seconds))
    frame = (
        data.sessions.filter(maybe | pl.col("session_id").is_in(fences["session_id"].implode()))
        .join(traces, on="session_id", how="left")
        .join(fences, on="session_id", how="left")
        .with_columns(
            pl.coalesce("last_trace_at", "candidate_last_at").alias("last_trace_at"),
            # a session read with fewer traces than it has (it grew during the read) has an unknown latest dispatch
            pl.when(pl.col("_traces_read") >= pl.col("trace_count")).then(pl.col("_latest_dispatch"))
            .alias("_latest_dispatch"),
        )
        .with_columns(
            (pl.lit(now) - pl.col("last_trace_at")).alias("idle_seconds"),
            (pl.lit(current, dtype=pl.Int64) - pl.col("weight_version")).alias("weight_lag"),
        )
        .with_columns(confidence_expr(
            trace_count=pl.col("trace_count"), idle_seconds=pl.col("idle_seconds"),
            latest_dispatch=pl.col("_latest_dispatch"), weight_lag=pl.col("weight_lag"),
            tombstone_fence=pl.col("_tombstone_fence"), reused=pl.col("_reused"),
            deleted_fence=pl.col("_deleted_fence"), idle_threshold=policy.orphan_idle_seconds,
            max_weight_lag=policy.max_weight_lag).alias("confidence"))
        .filter(pl.col("confidence").is_not_null())
        .with_columns(task_of(pl.col("session_id")).alias("task"))
    )
    tombstone_confirmed = (before_fence_expr(pl.col("_latest_dispatch"), pl.col("_tombstone_fence"))
                           & ~pl.col("_reused").fill_null(False))
    reason = (
        pl.when((pl.col("confidence") == "confirmed") & tombstone_confirmed)
        .then(pl.lit("carries a tombstone: it was deleted and a late write brought it back"))
        .when(pl.col("confidence") == "confirmed")
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
            "kept_after_fence": data.guard.kept_after_fence,
            "evicted": data.guard.evicted,
            "triggers_intact": data.guard.triggers_intact,
            "top_droppers": data.guard.top_droppers[:5],
            "index": data.guard.index,
        }
    return summary
