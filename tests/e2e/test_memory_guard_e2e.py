"""The guarded gateway as a real process, against the real straggler race (late writes after their deletes).

The same rollouts (30, 10 of them with a straggling call still in flight at flush + delete) leave ten
one-trace orphans behind the unmodified ``rllm-model-gateway`` and none behind
``python -m gatewayscope.guard.gateway``, whose guard counts exactly those ten dropped writes.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gatewayscope.sandbox.rollouts import RolloutRun, retry_rollout, run_rollouts
from gatewayscope.sandbox.stub_protocol import AsyncStubClient, stub_headers
from tests.helpers import gateway_sessions as sessions
from tests.helpers import guard_status, wait_for

pytestmark = pytest.mark.e2e

N_ROLLOUTS = 30
N_STRAGGLERS = 10
N_LIVE = 3
DELAY = 2.0  # seconds a straggler's late call spends at the worker
#: a guarded straggler's trace never shows up: don't let the driver wait long for it
GUARDED_SETTLE = 0.3


def metrics(url: str) -> dict[str, float]:
    """The guard's samples from ``/metrics``, parsed with prometheus_client's own parser."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    response.raise_for_status()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            assert sample.labels == {}
            values[sample.name] = sample.value
    return values


def assert_real_race(run: RolloutRun) -> set[str]:
    """The stragglers whose late call was still unanswered when their session's delete was answered.

    On an idle machine that is every straggler. On a badly overloaded one a delete can take longer than
    the late call (the driver reports it in ``race_lost_uids``); such a straggler may have landed before
    its delete, so the tests expect an orphan (unguarded) or a dropped write (guarded) only from the
    ones that raced, and exactly N when all did (the usual case). Most of them must have raced, or the
    run proves nothing.
    """
    assert run.errors == []
    assert len(run.straggler_uids) == N_STRAGGLERS
    raced = set(run.straggler_uids) - set(run.race_lost_uids)
    assert len(raced) >= N_STRAGGLERS // 2, f"the machine was too slow for the race: {run.race_lost_uids}"
    return raced


def seed_run(url: str, **kwargs: Any) -> RolloutRun:
    params: dict[str, Any] = {"n_rollouts": N_ROLLOUTS, "n_stragglers": N_STRAGGLERS, "n_live": N_LIVE,
                              "straggler_delay": DELAY}
    params.update(kwargs)
    return run_rollouts(url, **params)


def test_the_seed_race_leaves_orphans_unguarded_and_none_with_the_guard(rllm_gateway: Any,
                                                                         guarded_gateway: Any) -> None:
    # the unmodified gateway: N permanent one-trace orphans
    plain = rllm_gateway("memory")
    unguarded = seed_run(plain.url)
    raced = assert_real_race(unguarded)
    left = sessions(plain.url)
    orphans = {sid: n for sid, n in left.items() if sid in set(unguarded.deleted_uids)}
    assert raced <= set(orphans) <= set(unguarded.straggler_uids)
    assert set(orphans.values()) == {1}
    if not unguarded.race_lost_uids:
        assert len(orphans) == N_STRAGGLERS

    # the guarded launcher, same rollouts: no orphan at all, and one dropped write per raced straggler
    guarded = guarded_gateway("memory")
    run = seed_run(guarded.url, settle_timeout=GUARDED_SETTLE)
    raced = assert_real_race(run)
    assert set(run.unsettled_uids) == set(run.straggler_uids)  # no straggler's trace ever showed up
    status = wait_for("dropped writes", lambda: guard_status(guarded.url),
                      lambda s: s["dropped_writes"] >= len(raced))
    assert sessions(guarded.url) == run.live_uids  # only the live sessions, each with all its traces
    dropped = {d["session_id"]: d["dropped"] for d in status["top_droppers"]}
    assert raced <= set(dropped) <= set(run.straggler_uids)
    assert set(dropped.values()) == {1}
    n_dropped = len(dropped)
    if not run.race_lost_uids:  # the usual case: every race was real, so exactly N
        assert n_dropped == N_STRAGGLERS
    assert status == {
        "enabled": True,
        "tombstones": N_ROLLOUTS,  # every deleted uid
        "capacity": 1_000_000,
        "dropped_writes": n_dropped,
        "kept_after_fence": 0,  # no id was used again after its delete
        "evicted": 0,
        "top_droppers": status["top_droppers"],
        "index": "ready",  # the launcher over its memory store keeps the orphan index
    }
    assert metrics(guarded.url) == {
        "gatewayscope_guard_tombstones": N_ROLLOUTS,
        "gatewayscope_guard_tombstone_capacity": 1_000_000,
        "gatewayscope_guard_dropped_writes_total": n_dropped,
        "gatewayscope_guard_kept_after_fence_writes_total": 0,
        "gatewayscope_guard_tombstones_evicted_total": 0,
    }
    checked = httpx.post(f"{guarded.url}/guard/tombstones/check",
                         json={"session_ids": [*run.deleted_uids, *run.live_uids]}, timeout=10).json()
    assert checked["tombstoned"] == run.deleted_uids and checked["reused"] == []
    assert set(checked["fences"]) == set(run.deleted_uids)


def test_a_retry_keeps_its_traces_with_or_without_a_create(guarded_gateway: Any) -> None:
    gateway = guarded_gateway("memory", via_cli=True)  # also proves the `gatewayscope gateway` command
    run = run_rollouts(gateway.url, n_rollouts=5, n_stragglers=2, n_live=0, straggler_delay=DELAY,
                       settle_timeout=GUARDED_SETTLE)
    assert run.errors == []
    raced = set(run.straggler_uids) - set(run.race_lost_uids)
    before = wait_for("dropped writes", lambda: guard_status(gateway.url)["dropped_writes"],
                      lambda n: n >= len(raced))
    recreated, bare = run.straggler_uids
    assert sessions(gateway.url) == {}

    # rLLM's retry: delete, then (with sampling params) POST /sessions with the same uid, then its calls
    retry = retry_rollout(gateway.url, recreated, calls=3, explicit_create=True)
    assert retry.errors == [] and retry.trace_count == 3
    # since #584 most retries create nothing: their bare calls came after the delete and are kept all the same
    bare_retry = retry_rollout(gateway.url, bare, calls=2, explicit_create=False)
    assert bare_retry.errors == [] and bare_retry.trace_count == 2
    assert sessions(gateway.url) == {recreated: 3, bare: 2}
    status = guard_status(gateway.url)
    assert status["dropped_writes"] == before  # nothing of the retries was dropped
    assert status["kept_after_fence"] == 5

    # the successful retry ends like any rollout: its uid's fence moves to this delete
    done = retry_rollout(gateway.url, recreated, calls=1, delete_first=False, explicit_create=False,
                         finish=True)
    assert done.finished and done.trace_count == 4
    check = httpx.post(f"{gateway.url}/guard/tombstones/check", json={"session_ids": [recreated, bare]},
                       timeout=10).json()
    assert check["tombstoned"] == [recreated, bare] and check["reused"] == [bare]
    assert sessions(gateway.url) == {bare: 2}


async def _stragglers_around_evictions(url: str, worker_url: str) -> None:
    """Two late calls in flight; delete ``old:0``, four fillers, then ``new:0`` with a cap of 5."""
    late_ids = ("old:0", "new:0")
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        worker = AsyncStubClient(client, worker_url)

        async def in_flight(sid: str) -> int:
            return (await worker.inflight(sid)).inflight

        async def late_call(sid: str) -> None:
            body = {"model": "m", "messages": [{"role": "user", "content": f"late call of {sid}"}]}
            response = await client.post(f"/sessions/{sid}/v1/chat/completions", json=body,
                                         headers=stub_headers(delay=2 * DELAY, tag=sid))
            response.raise_for_status()

        calls = [asyncio.create_task(late_call(sid)) for sid in late_ids]
        deadline = time.monotonic() + 10
        for sid in late_ids:
            while await in_flight(sid) < 1:
                assert time.monotonic() < deadline, f"the late call of {sid} never reached the worker"
                await asyncio.sleep(0.01)
        for sid in ("old:0", "filler:0", "filler:1", "filler:2", "filler:3", "new:0"):
            (await client.post("/admin/flush")).raise_for_status()
            (await client.delete(f"/sessions/{sid}")).raise_for_status()
        # the premise: both calls were still at the worker when the last delete was answered
        assert [await in_flight(sid) for sid in late_ids] == [1, 1]
        await asyncio.gather(*calls)


def test_the_fifo_cap_evicts_the_oldest_tombstone_first(guarded_gateway: Any, stub_worker: str) -> None:
    gateway = guarded_gateway("memory", max_tombstones=5)
    asyncio.run(_stragglers_around_evictions(gateway.url, stub_worker))

    # old:0's tombstone was evicted: its straggler re-creates it (the documented cost of a cap);
    # new:0's tombstone is still there: its straggler is dropped
    left = wait_for("the evicted id's late trace", lambda: sessions(gateway.url), lambda s: "old:0" in s)
    status = wait_for("the dropped write", lambda: guard_status(gateway.url),
                      lambda s: s["dropped_writes"] == 1)
    assert left == {"old:0": 1}
    assert (status["tombstones"], status["capacity"], status["evicted"]) == (5, 5, 1)
    assert status["top_droppers"] == [{"session_id": "new:0", "dropped": 1}]
    check = httpx.post(f"{gateway.url}/guard/tombstones/check",
                       json={"session_ids": ["old:0", "filler:0", "filler:3", "new:0"]}, timeout=10).json()
    assert check["tombstoned"] == ["filler:0", "filler:3", "new:0"]
    values = metrics(gateway.url)
    assert values == {
        "gatewayscope_guard_tombstones": 5,
        "gatewayscope_guard_tombstone_capacity": 5,
        "gatewayscope_guard_dropped_writes_total": 1,
        "gatewayscope_guard_kept_after_fence_writes_total": 0,
        "gatewayscope_guard_tombstones_evicted_total": 1,
    }


def test_max_tombstones_zero_restores_the_old_behaviour(guarded_gateway: Any) -> None:
    gateway = guarded_gateway("memory", max_tombstones=0)
    run = seed_run(gateway.url)
    raced = assert_real_race(run)
    left = sessions(gateway.url)
    orphans = {sid: n for sid, n in left.items() if sid in set(run.deleted_uids)}
    assert raced <= set(orphans) <= set(run.straggler_uids)  # as with the unmodified gateway
    assert set(orphans.values()) == {1}
    if not run.race_lost_uids:
        assert len(orphans) == N_STRAGGLERS
    assert guard_status(gateway.url) == {"enabled": False, "tombstones": 0, "capacity": 0,
                                         "dropped_writes": 0, "kept_after_fence": 0, "evicted": 0,
                                         "top_droppers": [], "index": "absent"}
    assert metrics(gateway.url)["gatewayscope_guard_tombstone_capacity"] == 0
    refused = httpx.post(f"{gateway.url}/guard/tombstones", json={"session_ids": ["x"]}, timeout=10)
    assert refused.status_code == 409


def test_the_in_process_guard_also_protects_the_sqlite_store(guarded_gateway: Any) -> None:
    gateway = guarded_gateway("sqlite")
    run = run_rollouts(gateway.url, n_rollouts=10, n_stragglers=3, n_live=1, straggler_delay=DELAY,
                       settle_timeout=GUARDED_SETTLE)
    assert run.errors == []
    raced = set(run.straggler_uids) - set(run.race_lost_uids)
    status = wait_for("dropped writes", lambda: guard_status(gateway.url),
                      lambda st: st["dropped_writes"] >= len(raced))
    dropped = {d["session_id"]: d["dropped"] for d in status["top_droppers"]}
    assert raced <= set(dropped) <= set(run.straggler_uids)
    assert sessions(gateway.url) == run.live_uids
    # the file itself holds no row of any deleted session
    assert gateway.db_path is not None
    with sqlite3.connect(f"file:{gateway.db_path}?mode=ro", uri=True) as conn:
        stored = {row[0] for row in conn.execute("SELECT DISTINCT session_id FROM trace_sessions")}
    assert stored == set(run.live_uids)
