"""What a plan says about its session deletes: how apply paces them and, for a 0.1.0 memory store, how long
they take (a range: each delete scans the whole store, at a cost per session and trace that depends on the
machine)."""

from __future__ import annotations

import re

from gatewayscope.config import Config, Policy, Target
from gatewayscope.remediate.plan import DELETE_DUTY, MEMORY_DELETE_SECONDS_PER_ITEM, build_plan
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    SESSIONS_SCHEMA,
    Snapshot,
    TargetSnapshot,
    TraceStoreData,
    frame_from_rows,
)

NOW = 1_800_000_000.0


def plan_warning(sessions: int, orphans: int, *, access: str = "rest", batch: bool = False) -> str:
    rows = [(f"live-{i}:0", 3, NOW - 100.0, None) for i in range(sessions - orphans)]
    rows += [(f"orphan-{i}:0", 1, NOW - 90_000.0, None) for i in range(orphans)]
    traces = [(f"orphan-{i}:0", f"t{i}", NOW - 90_000.0, None, 10, 40, "m", NOW - 90_001.0) for i in range(orphans)]
    data = TraceStoreData(sessions=frame_from_rows(rows, SESSIONS_SCHEMA),
                          candidate_traces=frame_from_rows(traces, CANDIDATE_TRACES_SCHEMA),
                          capabilities={"batch_delete": batch}, access=access)
    address = "http://127.0.0.1:9090" if access == "rest" else "/srv/traces.db"
    snap = TargetSnapshot(name="rl", kind="rllm", address=address, up=True, started_at=NOW,
                          duration_seconds=1.0, trace_store=data)
    target = Target(name="rl", kind="rllm", url=address) if access == "rest" else Target(
        name="rl", kind="rllm", path=address)
    plan = build_plan(Snapshot(taken_at=NOW, targets=[snap]), Config(targets=[target], policy=Policy()),
                      include_suspected=True, created_at=NOW)
    assert sum(a.kind == "session_delete" for a in plan.actions) == orphans
    return next(w for w in plan.warnings if "session(s)" in w and "deletes" in w)


def test_a_big_memory_store_gets_the_pace_and_a_time_range() -> None:
    warning = plan_warning(50_000, 10_000)
    assert "deletes 10000 session(s) through the gateway's own delete, one at a time" in warning
    assert f"at most {DELETE_DUTY:.0%} of the gateway's time" in warning
    match = re.search(r"about (\d+)m (\d+)s to (\d+)m (\d+)s at this store's size", warning)
    assert match, warning
    low = int(match[1]) * 60 + int(match[2])
    high = int(match[3]) * 60 + int(match[4])
    # 10,000 deletes, each scanning what is left of 50,000 sessions + 130,000 traces (170,000 on average)
    scanned = 10_000 * (180_000 - 20_000 / 2)
    assert low == round(scanned * MEMORY_DELETE_SECONDS_PER_ITEM[0] / DELETE_DUTY)
    assert high == round(scanned * MEMORY_DELETE_SECONDS_PER_ITEM[1] / DELETE_DUTY)
    assert "apply --rate sets a fixed pace instead" in warning


def test_a_small_store_takes_under_a_second() -> None:
    assert "under a second" in plan_warning(200, 20)


def test_batch_and_sqlite_say_how_without_a_memory_estimate() -> None:
    batch = plan_warning(1_000, 100, batch=True)
    assert "one batch at a time" in batch and "scans every session" not in batch
    sqlite = plan_warning(1_000, 100, access="sqlite")
    assert "SQLite file, in short exclusive transactions" in sqlite and "scans every session" not in sqlite
    # 100 deletes at 1-8 ms each: apply's own cost on that file, lock waits included
    assert "about a second or less" in sqlite
    assert "about 2s (idle store) to 16s (busy gateway)" in plan_warning(3_000, 2_000, access="sqlite")
