"""The orphan rule's one home (gatewayscope.orphan_rule): its Python, polars and SQL forms agree on random
inputs, and the fence keeps every new use of an id and drops every straggler under random interleavings of
writes, deletes and reuses, in the in-process guard and in the SQLite guard's triggers alike."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatewayscope.orphan_rule import (
    CONFIRMED,
    IDLE_SINGLE_SQL,
    UNKNOWN_FENCE,
    before_fence,
    before_fence_expr,
    before_fence_sql,
    candidate_expr,
    confidence_expr,
    delete_fences,
    dispatched_at,
    dispatched_at_sql,
    is_candidate,
    judge,
)

times = st.one_of(st.none(), st.floats(min_value=0, max_value=2e9, allow_nan=False, allow_infinity=False))
fences = st.one_of(st.none(), st.just(UNKNOWN_FENCE), st.floats(min_value=0, max_value=2e9, allow_nan=False))


def sql_value(sql: str, *params: Any) -> Any:
    with sqlite3.connect(":memory:") as conn:
        return conn.execute(f"SELECT {sql}", params).fetchone()[0]


# -- the three forms agree ------------------------------------------------------------------------------------


@given(dispatched=times, fence=fences)
def test_before_fence_is_the_same_in_python_polars_and_sql(dispatched: float | None, fence: float | None) -> None:
    python = before_fence(dispatched, fence)
    frame = pl.DataFrame({"d": [dispatched], "f": [fence]}, schema={"d": pl.Float64, "f": pl.Float64})
    assert frame.select(before_fence_expr(pl.col("d"), pl.col("f")))[0, 0] is python
    if fence != UNKNOWN_FENCE:  # SQLite's guard has no unknown fence: its tombstones carry their time
        assert bool(sql_value(before_fence_sql("?", "?"), dispatched, fence)) is python


json_values = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**12),
                        st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=5))


@given(timestamp=json_values, latency=json_values, garbage=st.booleans())
def test_the_dispatch_estimate_is_the_same_in_python_and_sql(timestamp: Any, latency: Any, garbage: bool) -> None:
    record: dict[str, Any] = {}
    if timestamp is not None:
        record["timestamp"] = timestamp
    if latency is not None:
        record["latency_ms"] = latency
    text = "not json {" if garbage else json.dumps(record)
    python = None if garbage else dispatched_at(record.get("timestamp"), record.get("latency_ms"))
    sql = sql_value(dispatched_at_sql("?1"), text)
    if python is None:
        assert sql is None
    else:
        assert sql == pytest.approx(python, rel=1e-12, abs=1e-9)
        assert python <= float(timestamp)  # never later than the record's own time: a latency only moves it back


@given(count=st.integers(0, 4), last=times, fenced=st.booleans(),
       idle_before=st.floats(min_value=0, max_value=2e9, allow_nan=False))
def test_the_candidate_rule_is_the_same_in_python_polars_and_sql(count: int, last: float | None, fenced: bool,
                                                                 idle_before: float) -> None:
    python = is_candidate(count, last, idle_before=idle_before, fenced=fenced)
    frame = pl.DataFrame({"n": [count], "last": [last]}, schema={"n": pl.Int64, "last": pl.Float64})
    assert frame.select(candidate_expr(pl.col("n"), pl.col("last"), idle_before, pl.lit(fenced)))[0, 0] is python
    if not fenced and last is not None:  # the SQL form is the one-trace half; fenced ids are read by key
        with sqlite3.connect(":memory:") as conn:
            conn.execute("CREATE TABLE s (trace_count INTEGER, last_trace_at REAL)")
            conn.execute("INSERT INTO s VALUES (?, ?)", (count, last))
            found = conn.execute(f"SELECT COUNT(*) FROM s WHERE {IDLE_SINGLE_SQL}", (idle_before,)).fetchone()[0]
        assert bool(found) is python


sessions = st.fixed_dictionaries({
    "trace_count": st.integers(0, 3),
    "last_trace_at": st.one_of(st.none(), st.floats(0, 10_000, allow_nan=False)),
    "latest_dispatch": st.one_of(st.none(), st.floats(0, 10_000, allow_nan=False)),
    "weight_version": st.one_of(st.none(), st.integers(0, 10)),
    "tombstone_fence": st.one_of(st.none(), st.just(UNKNOWN_FENCE), st.floats(0, 10_000, allow_nan=False)),
    "reused": st.booleans(),
    "deleted_fence": st.one_of(st.none(), st.floats(0, 10_000, allow_nan=False)),
})


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(sessions, min_size=1, max_size=20), current=st.one_of(st.none(), st.integers(0, 10)),
       idle=st.floats(0, 5_000, allow_nan=False), lag=st.integers(0, 3))
def test_judge_and_its_polars_form_agree(rows: list[dict[str, Any]], current: int | None, idle: float,
                                         lag: int) -> None:
    now = 10_000.0
    python = [judge(**row, now=now, idle_seconds=idle, max_weight_lag=lag, current_weight_version=current).confidence
              for row in rows]
    frame = pl.DataFrame(rows, schema={"trace_count": pl.Int64, "last_trace_at": pl.Float64,
                                       "latest_dispatch": pl.Float64, "weight_version": pl.Int64,
                                       "tombstone_fence": pl.Float64, "reused": pl.Boolean,
                                       "deleted_fence": pl.Float64})
    polars = frame.select(confidence_expr(
        trace_count=pl.col("trace_count"), idle_seconds=pl.lit(now) - pl.col("last_trace_at"),
        latest_dispatch=pl.col("latest_dispatch"),
        weight_lag=pl.lit(current, dtype=pl.Int64) - pl.col("weight_version"),
        tombstone_fence=pl.col("tombstone_fence"), reused=pl.col("reused"), deleted_fence=pl.col("deleted_fence"),
        idle_threshold=idle, max_weight_lag=lag))[:, 0].to_list()
    assert polars == python


def test_a_live_session_reusing_a_deleted_id_is_never_confirmed() -> None:
    """The two live-session deletes of the issue, on the rule itself: evidence of an earlier delete proves nothing
    about traces dispatched after it, however many the session has; a trace before it does."""
    base = {"last_trace_at": 9_990.0, "weight_version": None, "tombstone_fence": None, "reused": False, "now": 10_000.0,
            "idle_seconds": 7200.0, "max_weight_lag": 2, "current_weight_version": None}
    assert judge(trace_count=3, latest_dispatch=9_950.0, deleted_fence=9_900.0, **base).confidence is None
    assert judge(trace_count=1, latest_dispatch=9_850.0, deleted_fence=9_900.0, **base).confidence == CONFIRMED
    assert judge(trace_count=3, latest_dispatch=None, deleted_fence=9_900.0, **base).confidence is None
    # a tombstone the guard saw written again after is no proof either; an unknown (older guard's) fence is
    stone = {**base, "deleted_fence": None}
    assert judge(trace_count=1, latest_dispatch=5.0, **{**stone, "tombstone_fence": 9.0, "reused": True}
                 ).confidence is None
    assert judge(trace_count=2, latest_dispatch=None, **{**stone, "tombstone_fence": math.inf}).confidence == CONFIRMED


def test_deleted_ids_need_their_time_and_are_per_target() -> None:
    assert delete_fences({"rl": {"a:0": 5}, "other": {"a:0": 9}}, "rl") == {"a:0": 5.0}
    assert delete_fences({"rl": {"a:0": 5}, "other": {"a:0": 9}}) == {"a:0": 9.0}
    for bad in ({"a:0"}, ["a:0"], {"a:0": "journal.jsonl"}, {"a:0": float("nan")}):
        with pytest.raises(TypeError, match="moment of its delete"):
            delete_fences(bad)  # type: ignore[arg-type]


# -- the fence under random interleavings ---------------------------------------------------------------------

#: one step of a trainer on one id: "use" (a call dispatched now), "late" (a straggler: a call dispatched at the
#: moment of an earlier step, landing now) or "delete"
#: every run starts with a trainer's step, its batch delete, a straggler, the next step's reuse and a straggler
#: landing during it (so each example exercises the fence), then goes on at random
OPENING = [("use", 0, 0), ("use", 0, 0), ("delete", 0, 0), ("late", 0, 1), ("use", 0, 0), ("late", 0, 2)]
steps = st.lists(st.tuples(st.sampled_from(["use", "use", "late", "delete"]), st.integers(0, 2),
                           st.integers(0, 30)), min_size=0, max_size=20).map(lambda ops: OPENING + ops)


def sent_at(kind: str, index: int, back: int, moments: list[float]) -> float:
    """When step ``index``'s call was dispatched: now for a use; for a straggler, just after an earlier step's
    moment (``back`` steps before the one before it), never later than now."""
    return moments[index] if kind == "use" else min(moments[index], moments[max(0, index - 1 - back)] + 0.002)


def expected_store(ops: list[tuple[str, int, int]], moments: list[float], *,
                   empty_deletes_fence: bool = True) -> dict[str, list[str]]:
    """What a correct fence keeps: a write lands unless it was dispatched before its id's latest delete.
    ``empty_deletes_fence=False``: a delete of an id with no trace in the store sets no fence (the SQLite guard's
    triggers see a delete only through the rows it removes)."""
    fence: dict[str, float] = {}
    kept: dict[str, list[str]] = {}
    for index, (kind, which, back) in enumerate(ops):
        sid = f"task-{which}:0"
        now = moments[index]
        if kind == "delete":
            if empty_deletes_fence or kept.get(sid):
                fence[sid] = now
            kept.pop(sid, None)
            continue
        latest_delete = fence.get(sid)
        if latest_delete is None or sent_at(kind, index, back, moments) >= latest_delete:  # a new use
            kept.setdefault(sid, []).append(f"t{index}")
    return kept


@settings(max_examples=150, deadline=None)
@given(ops=steps)
def test_the_in_process_guard_keeps_exactly_what_the_fence_says(ops: list[tuple[str, int, int]]) -> None:
    pytest.importorskip("rllm_model_gateway")
    from rllm_model_gateway.store.memory_store import MemoryTraceStore

    from gatewayscope.guard.memory import GuardedTraceStore, request_arrived

    clock = {"now": 1_000.0}
    moments = [1_000.0 + 10.0 * (index + 1) for index in range(len(ops))]
    guard = GuardedTraceStore(MemoryTraceStore(), clock=lambda: clock["now"])

    async def replay() -> dict[str, list[str]]:
        for index, (kind, which, back) in enumerate(ops):
            sid = f"task-{which}:0"
            clock["now"] = moments[index]
            if kind == "delete":
                await guard.delete_session(sid)
                continue
            with request_arrived(sent_at(kind, index, back, moments)):
                await guard.store_trace(f"t{index}", sid, {"trace_id": f"t{index}", "session_id": sid})
        return {sid: [t["trace_id"] for t in await guard.get_session_traces(sid)]
                for sid in {f"task-{w}:0" for _, w, _ in ops} if await guard.get_session_traces(sid)}

    assert asyncio.run(replay()) == expected_store(ops, moments)


@pytest.mark.slow  # seconds of real time: make e2e runs it
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=steps)
def test_the_sqlite_guard_keeps_exactly_what_the_fence_says(tmp_path_factory: pytest.TempPathFactory,
                                                           ops: list[tuple[str, int, int]]) -> None:
    """The same on the unmodified gateway's SqliteTraceStore with the triggers installed: the triggers read the
    dispatch time from the trace record (timestamp minus latency) and take their fence from SQLite's clock, so
    the steps here are real moments 20 ms apart (a delete's moment the one it is done at) and a straggler is
    dispatched 2 ms after the step it belongs to.
    A delete of an id that has no trace in the file removes no row, so no trigger sees it: that delete fences
    nothing (docs/guard.md says so; the in-process guard fences every delete)."""
    sqlite_store = pytest.importorskip("rllm_model_gateway.store.sqlite_store")

    from gatewayscope.guard import sqlite as sqlite_guard

    path = Path(tmp_path_factory.mktemp("fence")) / "traces.db"

    async def replay() -> tuple[dict[str, list[str]], list[float]]:
        store = sqlite_store.SqliteTraceStore(db_path=str(path))
        await store.list_sessions()  # the gateway creates its tables
        sqlite_guard.install(path)
        moments: list[float] = []
        try:
            for index, (kind, which, back) in enumerate(ops):
                await asyncio.sleep(0.02)
                moments.append(time.time())
                sid = f"task-{which}:0"
                if kind == "delete":
                    await store.delete_session(sid)
                    # the delete's moment is when it is done: its fence (SQLite's clock inside it) is no later,
                    # so a straggler "just after" this step is after the fence however slow the machine is
                    moments[-1] = time.time()
                    continue
                sent = sent_at(kind, index, back, moments)
                stamp = time.time()
                record = {"trace_id": f"t{index}", "session_id": sid, "timestamp": stamp,
                          "latency_ms": max(0.0, (stamp - sent) * 1000.0)}
                await store.store_trace(f"t{index}", sid, record)
            kept: dict[str, list[str]] = {}
            for sid in {f"task-{w}:0" for _, w, _ in ops}:
                ids = [t["trace_id"] for t in await store.get_session_traces(sid)]
                if ids:
                    kept[sid] = ids
            return kept, moments
        finally:
            await store.close()

    kept, moments = asyncio.run(replay())
    assert kept == expected_store(ops, moments, empty_deletes_fence=False)
