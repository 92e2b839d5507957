"""The straggler race for real: the unmodified rLLM gateway (memory and SQLite stores) resurrects deleted sessions.

Rollouts whose late call is still in flight when they flush and delete leave exactly one trace behind
under a uid that was deleted: a permanent orphan. Everything is checked through the gateway's own API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest

from gatewayscope.sandbox.rollouts import RolloutRun, plan_rollouts, retry_rollout, run_rollouts
from gatewayscope.sandbox.stub_worker import prompt_token_ids

pytestmark = pytest.mark.e2e

STORES = ["memory", "sqlite"]
LARGE_PROMPT_TOKENS = 7_000  # a straggler's late call carries ~32,000 characters (~8,000 stub tokens)


def listed_sessions(client: httpx.Client, **params: Any) -> dict[str, dict[str, Any]]:
    return {s["session_id"]: s for s in client.get("/sessions", params=params).json()}


def assert_resurrection_outcome(gateway_url: str, run: RolloutRun, *, calls: int) -> None:
    assert run.ok, run.to_dict()
    assert all(run.in_flight_confirmed.values())  # every late call was held at the worker during the delete
    assert sorted(run.deleted_uids) == sorted(u for u in run.task_of if u not in run.live_uids)
    assert all(run.deleted_counts[u] == calls for u in run.deleted_uids)  # each delete removed its traces

    with httpx.Client(base_url=gateway_url, timeout=10) as c:
        listed = listed_sessions(c)
        assert set(listed) == set(run.straggler_uids) | set(run.live_uids)

        for uid in run.straggler_uids:
            assert listed[uid]["trace_count"] == 1
            # GET /sessions/{uid} has no fallback for a forgotten session: created_at is null there
            assert c.get(f"/sessions/{uid}").json() == {"session_id": uid, "trace_count": 1, "created_at": None,
                                                        "metadata": {}}
            [trace] = c.get(f"/sessions/{uid}/traces").json()
            assert trace["session_id"] == uid
            assert len(trace["messages"]) == 2 * calls + 2  # system, task, replies, observations, large turn
            assert trace["prompt_token_ids"] == prompt_token_ids(trace["messages"])
            assert len(trace["prompt_token_ids"]) == run.straggler_prompt_tokens[uid] > LARGE_PROMPT_TOKENS
            # The gateway forgot the session at the delete: created_at is the late trace's write time,
            # after the delete and not before the trace's own timestamp.
            assert listed[uid]["created_at"] > run.deleted_at[uid]
            assert listed[uid]["created_at"] >= trace["timestamp"]

        for uid in run.gone_uids:
            assert c.get(f"/sessions/{uid}").status_code == 404
            assert c.get(f"/sessions/{uid}/traces").json() == []

        for uid, n in run.live_uids.items():
            assert listed[uid]["trace_count"] == n
            traces = c.get(f"/sessions/{uid}/traces").json()
            assert len(traces) == n
            assert max(len(t["prompt_token_ids"]) for t in traces) < 1_000
            # A live session is remembered: created_at is its first call's arrival, before its first trace.
            assert listed[uid]["created_at"] < traces[0]["timestamp"]
            assert c.get(f"/sessions/{uid}").json()["created_at"] == listed[uid]["created_at"]


@pytest.mark.parametrize("store", STORES)
def test_stragglers_leave_exactly_their_uids_as_one_trace_orphans(rllm_gateway: Any, store: str) -> None:
    gw = rllm_gateway(store)
    run = run_rollouts(gw.url, n_rollouts=30, n_stragglers=10, straggler_delay=1.0, calls_per_rollout=3,
                       n_live=3, group_size=5, concurrency=16, seed=7)

    assert len(run.straggler_uids) == 10 and len(run.deleted_uids) == 30
    assert sorted(run.live_uids.values()) == [1, 2, 3]  # a single-trace live session is not an orphan
    assert_resurrection_outcome(gw.url, run, calls=3)

    # uids are rLLM's f"{uuid4()}:{rollout_idx}", several per task; a hard task straggles as a whole.
    for uid, task in run.task_of.items():
        head, idx = uid.rsplit(":", 1)
        assert head == task and uuid.UUID(head).version == 4 and 0 <= int(idx) < 5
    hard = {run.task_of[u] for u in run.straggler_uids}
    assert len(hard) == 2 and all(set(run.uids_by_task[t]) <= set(run.straggler_uids) for t in hard)


@pytest.mark.parametrize("store", STORES)
def test_streaming_stragglers_also_resurrect(rllm_gateway: Any, store: str) -> None:
    gw = rllm_gateway(store)
    run = run_rollouts(gw.url, n_rollouts=8, n_stragglers=4, straggler_delay=0.8, calls_per_rollout=2,
                       n_live=2, group_size=4, seed=3, straggler_stream=True, cluster_stragglers=False)
    assert_resurrection_outcome(gw.url, run, calls=2)


@pytest.mark.parametrize("store", STORES)
def test_retry_reuses_a_deleted_uid(rllm_gateway: Any, store: str) -> None:
    gw = rllm_gateway(store)
    run = run_rollouts(gw.url, n_rollouts=2, n_stragglers=1, straggler_delay=0.5, calls_per_rollout=2,
                       n_live=0, group_size=2, seed=1)
    assert run.ok
    [orphan] = run.straggler_uids
    [clean] = run.gone_uids

    # rLLM's retry: the attempt's session was deleted; the retry re-creates it and reuses the uid.
    first = retry_rollout(gw.url, clean, calls=2, explicit_create=True, metadata={"attempt": 2})
    assert (first.deleted_before, first.trace_count, first.errors) == (0, 2, [])
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        info = c.get(f"/sessions/{clean}").json()
        assert info["trace_count"] == 2 and info["metadata"] == {"attempt": 2}

    # Retrying an orphaned uid deletes the lone late trace first; a bare call re-creates it implicitly.
    second = retry_rollout(gw.url, orphan, calls=3, explicit_create=False)
    assert (second.deleted_before, second.trace_count, second.errors) == (1, 3, [])

    # A retry that completes deletes its session again, and nothing is left of it.
    third = retry_rollout(gw.url, clean, calls=1, finish=True)
    assert (third.deleted_before, third.trace_count, third.finished) == (2, 1, True)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        assert c.get(f"/sessions/{clean}").status_code == 404
        assert set(listed_sessions(c)) == {orphan}


def test_plan_is_deterministic_and_scatters_on_request() -> None:
    ids = iter(f"{i:08x}-0000-4000-8000-000000000000" for i in range(100))
    plans = plan_rollouts(n_rollouts=12, n_stragglers=5, n_live=2, group_size=4, seed=11,
                          task_id_factory=lambda: next(ids))
    ids2 = iter(f"{i:08x}-0000-4000-8000-000000000000" for i in range(100))
    again = plan_rollouts(n_rollouts=12, n_stragglers=5, n_live=2, group_size=4, seed=11,
                          task_id_factory=lambda: next(ids2))
    assert plans == again
    stragglers = [p for p in plans if p.straggler]
    assert len(stragglers) == 5 and len({p.task_id for p in stragglers}) == 2  # one whole task + 1
    assert [p.calls for p in plans if p.live] == [1, 2]
    scattered = plan_rollouts(n_rollouts=12, n_stragglers=5, group_size=4, seed=11, cluster_stragglers=False)
    assert sum(p.straggler for p in scattered) == 5
    with pytest.raises(ValueError):
        plan_rollouts(n_rollouts=3, n_stragglers=4)


def test_rollouts_command_prints_a_json_summary(rllm_gateway: Any) -> None:
    gw = rllm_gateway("memory")
    proc = subprocess.run(
        [sys.executable, "-m", "gatewayscope.sandbox.rollouts", "--gateway", gw.url, "--rollouts", "6",
         "--stragglers", "2", "--delay", "0.5", "--calls", "2", "--live", "1", "--group-size", "3"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ok"] is True and len(summary["straggler_uids"]) == 2 and len(summary["gone_uids"]) == 4
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        assert set(listed_sessions(c)) == set(summary["straggler_uids"]) | set(summary["live_uids"])
