"""The orphan rules, on hand-made frames."""

from __future__ import annotations

import polars as pl

from gatewayscope.analysis.orphans import find_orphans, orphans_by_task, trace_store_summary
from gatewayscope.config import Policy
from gatewayscope.snapshot import CANDIDATE_TRACES_SCHEMA, SESSIONS_SCHEMA, TraceStoreData, frame_from_rows

NOW = 1_000_000.0
HOUR = 3600.0


def data(sessions: list[tuple], traces: list[tuple], *, current: int | None = None,
         tombstoned: list[str] | None = None) -> TraceStoreData:
    return TraceStoreData(
        sessions=frame_from_rows(sessions, SESSIONS_SCHEMA),
        candidate_traces=frame_from_rows(traces, CANDIDATE_TRACES_SCHEMA),
        tombstoned_ids=tombstoned or [],
        current_weight_version=current,
    )


def trace(sid: str, ts: float, weight: int | None = None, tokens: int = 100) -> tuple:
    return (sid, f"t-{sid}", ts, weight, tokens, tokens * 4, "m", ts - 1.0)


def test_one_trace_idle_sessions_are_suspected_and_live_ones_never() -> None:
    d = data(
        sessions=[
            ("taskA:0", 1, NOW - 3 * HOUR, None),  # idle 3 h, one trace: suspected
            ("taskA:1", 1, NOW - 3 * HOUR, None),  # same task
            ("taskB:0", 1, NOW - 60, None),  # recent: live
            ("taskC:0", 5, NOW - 5 * HOUR, None),  # several traces: not the signature
            ("taskD:0", 1, NOW - 5 * HOUR, None),  # created long ago but its trace is recent: live
        ],
        traces=[trace("taskA:0", NOW - 3 * HOUR), trace("taskA:1", NOW - 2.5 * HOUR, tokens=900),
                trace("taskD:0", NOW - 120)],
    )
    orphans = find_orphans(d, Policy(orphan_idle_seconds=2 * HOUR), NOW)
    assert orphans["session_id"].to_list() == ["taskA:0", "taskA:1"]
    assert set(orphans["confidence"]) == {"suspected"}
    assert orphans["task"].to_list() == ["taskA", "taskA"]
    assert orphans["idle_seconds"].to_list() == [3 * HOUR, 2.5 * HOUR]
    summary = trace_store_summary(d, orphans, NOW)
    assert summary["sessions"] == 5 and summary["traces"] == 9
    assert summary["orphans"] == {"confirmed": 0, "suspected": 2}
    assert summary["oldest_orphan_age_seconds"] == 3 * HOUR
    assert summary["orphan_prompt_tokens"] == 1000
    assert orphans_by_task(orphans).row(0) == ("taskA", 2, 0, 1000)


def test_weight_lag_decides_where_known() -> None:
    sessions = [(f"s{i}", 1, NOW - 4 * HOUR, None) for i in range(4)]
    traces = [trace("s0", NOW - 4 * HOUR, weight=10), trace("s1", NOW - 4 * HOUR, weight=7),
              trace("s2", NOW - 4 * HOUR, weight=None), trace("s3", NOW - 4 * HOUR, weight=8)]
    orphans = find_orphans(data(sessions, traces, current=10), Policy(orphan_idle_seconds=HOUR, max_weight_lag=2),
                           NOW)
    # s0 is at the current version (live), s3 is exactly at the allowed lag; s2 carries no version
    assert sorted(orphans["session_id"].to_list()) == ["s1", "s2"]
    lags = dict(zip(orphans["session_id"], orphans["weight_lag"], strict=True))
    assert lags == {"s1": 3, "s2": None}
    # without a current version the lag cannot be judged: idle alone decides
    assert find_orphans(data(sessions, traces), Policy(orphan_idle_seconds=HOUR), NOW).height == 4


def test_tombstone_or_known_delete_confirms_whatever_the_age() -> None:
    d = data(
        sessions=[("x:0", 1, NOW - 10, None), ("y:0", 2, NOW - 10, None), ("z:0", 1, NOW - 3 * HOUR, None)],
        traces=[trace("x:0", NOW - 10), trace("z:0", NOW - 3 * HOUR), trace("y:0", NOW - 12), trace("y:0", NOW - 11)],
        tombstoned=["x:0", "not-listed"],
    )
    orphans = find_orphans(d, Policy(orphan_idle_seconds=2 * HOUR), NOW, deleted_ids={"y:0": NOW - 5})
    by_id = {r["session_id"]: r for r in orphans.to_dicts()}
    assert by_id["x:0"]["confidence"] == "confirmed" and "tombstone" in by_id["x:0"]["reason"]
    assert by_id["y:0"]["confidence"] == "confirmed" and "deleted before" in by_id["y:0"]["reason"]
    assert by_id["z:0"]["confidence"] == "suspected"
    assert set(by_id) == {"x:0", "y:0", "z:0"}


def test_sqlite_last_trace_at_is_used_without_candidate_rows() -> None:
    d = data(sessions=[("a:0", 1, NOW - 9 * HOUR, NOW - 9 * HOUR)], traces=[])
    orphans = find_orphans(d, Policy(), NOW)
    assert orphans.height == 1 and orphans["prompt_tokens"].to_list() == [None]


def test_empty_store() -> None:
    d = data([], [])
    orphans = find_orphans(d, Policy(), NOW)
    assert orphans.height == 0
    summary = trace_store_summary(d, orphans, NOW)
    assert summary["orphans"] == {"confirmed": 0, "suspected": 0}
    assert summary["oldest_orphan_age_seconds"] is None and summary["traces"] == 0
    assert isinstance(orphans.schema["weight_lag"], pl.Int64)
