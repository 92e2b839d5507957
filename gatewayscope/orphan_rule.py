"""The orphan rule and the tombstone fence, defined once for every part that applies them.

A **fence** is the moment an id was last deleted (or tombstoned by a backfill). A trace write whose request
reached the gateway before its id's fence is a **straggler** of an earlier use: the guards drop it, and one
that is still in the store is a **confirmed** orphan. A write whose request arrived after the fence is a new
use of the id (rLLM reuses ids across steps and in its retries, mostly without ``POST /sessions``): kept.

When a request arrived is known exactly only inside the guarded launcher, which stamps every proxied request
as it comes in. Everywhere else it is estimated from the trace record both gateway versions write:
``timestamp`` (the wall clock when the trace was built, after the worker answered) minus ``latency_ms`` (the
time since the gateway dispatched the request to the worker, or, for a stream, since the worker's headers
came). That estimate, :func:`dispatched_at`, is never earlier than the request's arrival, so "estimate before
the fence" proves "arrived before the fence"; an estimate at or after it is unsure, and unsure means **keep**:
a kept straggler is an orphan a scan finds later, a dropped new use is training data lost for good.

The rule is stated here three times, in the three languages the project runs it in: Python (the launcher's
guard, apply's re-check right before a delete), polars (the analysis) and SQL (the SQLite guard's triggers,
the SQLite reads). ``tests/test_orphan_rule.py`` checks that the three agree on random inputs.

Everything here is standard library; polars is imported only by the functions that build polars expressions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import polars as pl

#: the fence of a tombstone whose time is unknown: an older guard's, which banned its id for good, so any trace
#: its id still has was written before the tombstone
UNKNOWN_FENCE = math.inf

CONFIRMED = "confirmed"
SUSPECTED = "suspected"


def _number(value: Any) -> float | None:
    """``value`` as a finite float when it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


# -- when a request reached the gateway -----------------------------------------------------------------------


def dispatched_at(timestamp: Any, latency_ms: Any) -> float | None:
    """The latest moment a trace's request can have reached the gateway: ``timestamp - latency_ms / 1000``.

    None when ``timestamp`` is not a finite number; a missing, negative or non-finite latency counts as 0
    (the estimate is then the timestamp itself: later, so never a straggler by mistake).

    >>> dispatched_at(1000.0, 250.0), dispatched_at(1000, None), dispatched_at("x", 5)
    (999.75, 1000.0, None)
    """
    stamp = _number(timestamp)
    if stamp is None:
        return None
    latency = _number(latency_ms)
    return stamp - (latency / 1000.0 if latency is not None and latency > 0 else 0.0)


def dispatched_at_of(trace: Mapping[str, Any]) -> float | None:
    """:func:`dispatched_at` of a trace record (its ``timestamp`` and ``latency_ms``)."""
    return dispatched_at(trace.get("timestamp"), trace.get("latency_ms"))


def dispatched_at_sql(data: str = "data") -> str:
    """The SQL expression of :func:`dispatched_at` over a trace's JSON text column ``data``: NULL for text that
    is not JSON or a timestamp that is not a number. The JSON is read only when the expression is evaluated;
    CASE evaluates lazily, so wrap it in one to make only some rows pay for it."""
    ts = f"json_extract({data}, '$.timestamp')"
    lat = f"json_extract({data}, '$.latency_ms')"
    return (f"(CASE WHEN json_valid({data}) AND json_type({data}, '$.timestamp') IN ('integer', 'real') "
            f"THEN {ts} - (CASE WHEN json_type({data}, '$.latency_ms') IN ('integer', 'real') AND {lat} > 0 "
            f"THEN {lat} / 1000.0 ELSE 0.0 END) END)")


# -- the fence ------------------------------------------------------------------------------------------------


def before_fence(dispatched: float | None, fence: float | None) -> bool:
    """Whether a write dispatched at ``dispatched`` (:func:`dispatched_at`, or the launcher's own stamp of its
    arrival) surely reached the gateway before ``fence``: a straggler. No fence: never. An unknown fence
    (:data:`UNKNOWN_FENCE`): always. An unknown dispatch time: never (unsure means keep).

    >>> before_fence(99.0, 100.0), before_fence(100.0, 100.0), before_fence(None, 100.0), before_fence(5.0, None)
    (True, False, False, False)
    """
    if fence is None:
        return False
    if fence == UNKNOWN_FENCE:
        return True
    return dispatched is not None and dispatched < fence


def before_fence_expr(dispatched: pl.Expr, fence: pl.Expr) -> pl.Expr:
    """:func:`before_fence` as a polars expression (null fence: false; infinite fence: true; null dispatch:
    false)."""
    import polars as pl

    return (pl.when(fence.is_null()).then(pl.lit(False))
            .when(fence.is_infinite()).then(pl.lit(True))
            .otherwise((dispatched < fence).fill_null(False)))


def before_fence_sql(dispatched: str, fence: str) -> str:
    """:func:`before_fence` in SQL over two numeric expressions (a NULL of either is false; SQLite has no
    infinite fence: the SQLite guard's tombstones always carry their time)."""
    return f"(IFNULL(({dispatched}) < ({fence}), 0))"


@dataclass(frozen=True)
class Tombstone:
    """What a guard holds of one deleted id: its fence (:data:`UNKNOWN_FENCE` from a guard that gives none)
    and whether it saw the id written again after that fence (a new use of the id)."""

    fence: float
    reused: bool = False


def latest_fence(*fences: float | None) -> float | None:
    """The latest of several fences of one id (a tombstone's and the deletes recorded elsewhere): the moment of
    its latest known delete. None when there is none.

    >>> latest_fence(None, 5.0, 3.0), latest_fence(None)
    (5.0, None)
    """
    known = [fence for fence in fences if fence is not None]
    return max(known) if known else None


def delete_fences(deleted: Mapping[str, Any] | None, target: str | None = None) -> dict[str, float]:
    """Ids known to have been deleted before, each with the moment of that delete, checked: ``{id: epoch
    seconds}``.

    ``deleted`` is either that mapping (for every target) or one per target name (``{target: {id: seconds}}``,
    as :func:`gatewayscope.remediate.journal.deleted_sessions` reads an apply journal), of which ``target``'s
    is taken: rLLM's session ids repeat across gateways (``{task id}:{rollout}``), so a delete on one gateway
    proves nothing on another. A delete without its time proves nothing about an id that may be in use again
    since, so a plain collection of ids (or a time that is not a finite number) is refused with TypeError.

    >>> delete_fences({"a:0": 100}), delete_fences({"rl": {"a:0": 100}, "other": {"b:0": 5}}, "rl")
    ({'a:0': 100.0}, {'a:0': 100.0})
    """
    if not deleted:
        return {}
    if not isinstance(deleted, Mapping):
        raise TypeError("deleted_ids must map each session id to the moment of its delete (epoch seconds), as "
                        "gatewayscope.remediate.journal.deleted_sessions reads them from an apply journal: a "
                        "delete without its time cannot tell a straggler from a new use of the id")
    if all(isinstance(value, Mapping) for value in deleted.values()):
        if target is None:
            merged: dict[str, float] = {}
            for name in deleted:
                for sid, when in delete_fences(deleted, name).items():
                    merged[sid] = max(when, merged.get(sid, when))
            return merged
        return delete_fences(deleted.get(target) or {})
    fences: dict[str, float] = {}
    for sid, when in deleted.items():
        moment = _number(when)
        if moment is None:
            raise TypeError(f"deleted_ids[{sid!r}] must be the moment of its delete (epoch seconds), "
                            f"not {when!r}")
        fences[str(sid)] = moment
    return fences


# -- which sessions a read must look at ------------------------------------------------------------------------


def is_candidate(trace_count: int, last_trace_at: float | None, *, idle_before: float, fenced: bool) -> bool:
    """Whether a read must fetch a session's traces: it has a fence that may prove it an orphan, or it has one
    trace at or before ``idle_before`` (or of unknown time).

    >>> is_candidate(1, 10.0, idle_before=20.0, fenced=False), is_candidate(3, 10.0, idle_before=20.0, fenced=False)
    (True, False)
    """
    return fenced or (trace_count == 1 and (last_trace_at is None or last_trace_at <= idle_before))


def candidate_expr(trace_count: pl.Expr, last_trace_at: pl.Expr, idle_before: float, fenced: pl.Expr) -> pl.Expr:
    """:func:`is_candidate` as a polars expression."""
    return fenced | ((trace_count == 1) & (last_trace_at.is_null() | (last_trace_at <= idle_before)))


#: :func:`is_candidate` for the one-trace half in SQL, over columns ``trace_count`` and ``last_trace_at`` with the
#: cut-off bound to ``?`` (a read names the fenced ids apart, by key)
IDLE_SINGLE_SQL = "(trace_count = 1 AND last_trace_at <= ?)"


# -- the verdict ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Whether a session is an orphan, how sure, and why (one sentence part)."""

    confidence: str | None  # "confirmed", "suspected", or None: not an orphan
    reason: str


def judge(*, trace_count: int, last_trace_at: float | None, latest_dispatch: float | None,
          weight_version: int | None, tombstone_fence: float | None, reused: bool,
          deleted_fence: float | None, now: float, idle_seconds: float, max_weight_lag: int,
          current_weight_version: int | None,
          seconds_text: Callable[[float], str] = lambda seconds: f"{seconds:.0f}s") -> Verdict:
    """The orphan rule for one session.

    * **confirmed**: it has traces, and every one was dispatched before its fence: the tombstone's (unless the
      guard saw the id written again after it: ``reused``) or a recorded earlier delete's (``deleted_fence``).
      ``latest_dispatch`` is its newest trace's :func:`dispatched_at` (None when unknown);
    * **suspected**: exactly one trace, idle longer than ``idle_seconds``, and, where both the gateway's current
      weight version and the trace's are known, more than ``max_weight_lag`` versions behind;
    * otherwise not an orphan: a live session is never called one.

    ``seconds_text`` writes a duration in the reasons.
    """
    if trace_count < 1:
        return Verdict(None, "it has no trace")
    if tombstone_fence is not None and not reused and before_fence(latest_dispatch, tombstone_fence):
        return Verdict(CONFIRMED, "carries a tombstone: it was deleted and a late write brought it back")
    if deleted_fence is not None and before_fence(latest_dispatch, deleted_fence):
        return Verdict(CONFIRMED, "was deleted before and came back")
    if trace_count != 1:
        return Verdict(None, f"{trace_count} traces, not all of them written before a recorded delete")
    if last_trace_at is None:
        return Verdict(None, "its trace has no time")
    idle = now - last_trace_at
    if not idle > idle_seconds:
        return Verdict(None, f"its trace is {seconds_text(idle)} old, not past the {seconds_text(idle_seconds)} "
                             "idle threshold")
    lag = None if current_weight_version is None or weight_version is None else current_weight_version - weight_version
    if lag is not None and lag <= max_weight_lag:
        return Verdict(None, f"its trace is at weight version {weight_version}, within {max_weight_lag} of the "
                             f"gateway's current {current_weight_version}")
    behind = f", {lag} weight versions behind" if lag is not None else ""
    return Verdict(SUSPECTED, f"one trace, idle {round(idle)}s{behind}")


def confidence_expr(*, trace_count: pl.Expr, idle_seconds: pl.Expr, latest_dispatch: pl.Expr,
                    weight_lag: pl.Expr, tombstone_fence: pl.Expr, reused: pl.Expr, deleted_fence: pl.Expr,
                    idle_threshold: float, max_weight_lag: int) -> pl.Expr:
    """:func:`judge`'s confidence as a polars expression: "confirmed", "suspected" or null. ``idle_seconds`` is
    ``now - last_trace_at`` and ``weight_lag`` the current version minus the trace's (null when either is
    unknown); ``reused`` is false where the guard did not see the id written after its tombstone."""
    import polars as pl

    has_traces = trace_count >= 1
    by_tombstone = before_fence_expr(latest_dispatch, tombstone_fence) & ~reused.fill_null(False)
    by_delete = before_fence_expr(latest_dispatch, deleted_fence)
    confirmed = has_traces & (by_tombstone | by_delete)
    idle = (idle_seconds > idle_threshold).fill_null(False)
    stale = weight_lag.is_null() | (weight_lag > max_weight_lag)
    suspected = (trace_count == 1) & idle & stale
    return (pl.when(confirmed).then(pl.lit(CONFIRMED))
            .when(suspected).then(pl.lit(SUSPECTED))
            .otherwise(pl.lit(None, dtype=pl.String)))
