"""The in-process tombstone guard (gatewayscope.guard.memory) and the guarded gateway app, in process.

The inner store is the rLLM gateway's own ``MemoryTraceStore`` (and its ``SqliteTraceStore`` once), so
"resurrected" below means the straggler race of docs/concepts.md: the real store re-creating a deleted session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

pytest.importorskip("rllm_model_gateway")

from prometheus_client.parser import text_string_to_metric_families
from rllm_model_gateway.models import GatewayConfig
from rllm_model_gateway.store.memory_store import MemoryTraceStore
from rllm_model_gateway.store.sqlite_store import SqliteTraceStore

from gatewayscope.errors import ConfigError, GatewayscopeError
from gatewayscope.guard import gateway as guarded_gateway
from gatewayscope.guard.memory import GuardedTraceStore, _TopCounter
from gatewayscope.snapshot import GuardStats

T = TypeVar("T")


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run one async scenario on a fresh event loop."""

    async def main() -> T:
        return await coro_fn()

    return asyncio.run(main())


def trace(trace_id: str, session_id: str) -> dict[str, Any]:
    return {"trace_id": trace_id, "session_id": session_id, "model": "m", "messages": []}


async def write(store: Any, trace_id: str, session_id: str) -> None:
    """A write whose request reached the gateway now (its record says nothing of when it was sent)."""
    await store.store_trace(trace_id, session_id, trace(trace_id, session_id))


async def straggle(store: Any, trace_id: str, session_id: str) -> None:
    """A straggler's write: an hour-long call whose request reached the gateway an hour ago, before any delete
    these tests make; its record says so, as the gateway's own records do (timestamp minus latency)."""
    record = {**trace(trace_id, session_id), "timestamp": time.time(), "latency_ms": 3_600_000.0}
    await store.store_trace(trace_id, session_id, record)


async def session_ids(store: Any) -> set[str]:
    return {row["session_id"] for row in await store.list_sessions()}


def guarded(max_tombstones: int = 1_000_000,
            top_droppers: int = 100) -> tuple[GuardedTraceStore, MemoryTraceStore]:
    inner = MemoryTraceStore()
    return GuardedTraceStore(inner, max_tombstones=max_tombstones, top_droppers=top_droppers), inner


# ------------------------------------------------------------------------------------------------
# The seed's tests
# ------------------------------------------------------------------------------------------------


def test_straggler_after_delete_is_dropped_not_resurrected() -> None:
    guard, inner = guarded()

    async def scenario() -> None:
        await write(guard, "t1", "uid:0")
        await write(guard, "t2", "uid:0")
        assert await guard.delete_session("uid:0") == 2
        await straggle(guard, "t3", "uid:0")  # the straggler: its call returned after flush + delete

        assert await session_ids(guard) == set()
        assert await guard.get_session_traces("uid:0") == []
        assert await guard.get_trace("t3") is None
        assert "uid:0" not in inner._session_index  # the real store never saw the write

    run(scenario)
    stats = guard.stats()
    assert (stats.tombstones, stats.dropped_writes, stats.evicted) == (1, 1, 0)
    assert stats.top_droppers == [{"session_id": "uid:0", "dropped": 1}]


def test_the_block_is_permanent_across_repeated_late_writes() -> None:
    guard, _ = guarded()

    async def scenario() -> None:
        await write(guard, "t1", "uid:0")
        await guard.delete_session("uid:0")
        for i in range(25):
            await straggle(guard, f"late{i}", "uid:0")
        assert await session_ids(guard) == set()

    run(scenario)
    assert guard.is_tombstoned("uid:0")
    assert guard.stats().dropped_writes == 25
    assert guard.stats().top_droppers == [{"session_id": "uid:0", "dropped": 25}]


def test_unrelated_sessions_are_unaffected() -> None:
    guard, _ = guarded()

    async def scenario() -> None:
        await write(guard, "a1", "task:0")
        await write(guard, "b1", "task:1")
        await guard.delete_session("task:0")
        await straggle(guard, "a2", "task:0")  # dropped
        await write(guard, "b2", "task:1")  # kept
        await write(guard, "c1", "task:2")  # a new session: kept
        assert await session_ids(guard) == {"task:1", "task:2"}
        assert [t["trace_id"] for t in await guard.get_session_traces("task:1")] == ["b1", "b2"]
        assert [t["trace_id"] for t in await guard.get_session_traces("task:2")] == ["c1"]

    run(scenario)
    assert guard.stats().dropped_writes == 1
    assert guard.tombstoned_among(["task:0", "task:1", "task:2"]) == ["task:0"]


def test_fifo_cap_evicts_the_oldest_first_and_counts() -> None:
    guard, _ = guarded(max_tombstones=3)

    async def scenario() -> None:
        for i in range(5):
            await write(guard, f"t{i}", f"s{i}")
            await guard.delete_session(f"s{i}")
        assert guard.tombstoned_among([f"s{i}" for i in range(5)]) == ["s2", "s3", "s4"]
        # an evicted id is unprotected again (the documented cost of the cap); a kept one is not
        await straggle(guard, "late0", "s0")
        await straggle(guard, "late4", "s4")
        assert await session_ids(guard) == {"s0"}

    run(scenario)
    stats = guard.stats()
    assert (stats.tombstones, stats.capacity, stats.evicted, stats.dropped_writes) == (3, 3, 2, 1)


def test_deleting_again_makes_a_tombstone_young_again() -> None:
    guard, _ = guarded(max_tombstones=2)

    async def scenario() -> None:
        await guard.delete_session("a")
        await guard.delete_session("b")
        await guard.delete_session("a")  # a is now the youngest
        await guard.delete_session("c")  # evicts b, not a

    run(scenario)
    assert guard.tombstoned_among(["a", "b", "c"]) == ["a", "c"]
    assert guard.stats().evicted == 1


def test_cap_zero_restores_the_legacy_behaviour() -> None:
    guard, _ = guarded(max_tombstones=0)

    async def scenario() -> None:
        await write(guard, "t1", "uid:0")
        await guard.delete_session("uid:0")
        await write(guard, "t2", "uid:0")  # the straggler resurrects the session, as in 0.1.0
        rows = await guard.list_sessions()
        assert [(r["session_id"], r["trace_count"]) for r in rows] == [("uid:0", 1)]

    run(scenario)
    assert not guard.enabled
    assert not guard.is_tombstoned("uid:0")
    assert guard.add_tombstones(["x"]) == (0, 0)
    assert guard.stats() == GuardStats(tombstones=0, capacity=0, dropped_writes=0, evicted=0, enabled=False,
                                       index="absent", kept_after_fence=0)


def test_per_session_drop_counts_keep_the_worst_offenders_in_bounded_memory() -> None:
    guard, _ = guarded(top_droppers=3)

    async def scenario() -> None:
        for sid in ["heavy", "medium"] + [f"once{i}" for i in range(50)]:
            await guard.delete_session(sid)
        for i in range(10):
            await straggle(guard, f"h{i}", "heavy")
        for i in range(4):
            await straggle(guard, f"m{i}", "medium")
        for i in range(50):  # fifty one-off stragglers churn through the table
            await straggle(guard, f"o{i}", f"once{i}")

    run(scenario)
    stats = guard.stats()
    assert stats.dropped_writes == 64  # the total stays exact
    assert len(guard._droppers) == 3  # the per-session table stays bounded
    assert stats.top_droppers == [
        {"session_id": "heavy", "dropped": 10},
        {"session_id": "medium", "dropped": 4},
        {"session_id": "once49", "dropped": 1},
    ]


def test_top_counter_is_exact_while_tracked_and_bounded() -> None:
    counter = _TopCounter(2)
    for key in ["a", "a", "b", "c", "c", "c", "d", "a"]:
        counter.add(key)
    # "c" evicts "b" (the lowest count, 1); "d" evicts "a" (2, below "c"'s 3); "a" comes back from 1
    # and evicts "d" (1)
    assert counter.top() == [("c", 3), ("a", 1)]
    assert len(counter) == 2
    disabled = _TopCounter(0)
    disabled.add("x")
    assert disabled.top() == []


def test_lift_reopens_an_id_and_only_a_tombstoned_one() -> None:
    guard, _ = guarded()

    async def scenario() -> None:
        await write(guard, "t1", "uid:0")
        await guard.delete_session("uid:0")
        assert guard.lift("uid:0") is True
        assert guard.lift("uid:0") is False
        assert guard.lift("never-deleted") is False
        await write(guard, "retry1", "uid:0")  # the retry's traces are kept
        await write(guard, "retry2", "uid:0")
        assert [t["trace_id"] for t in await guard.get_session_traces("uid:0")] == ["retry1", "retry2"]

    run(scenario)
    stats = guard.stats()
    assert (stats.tombstones, stats.dropped_writes, stats.evicted) == (0, 0, 0)


def test_add_tombstones_backfills_idempotently_and_deletes_nothing() -> None:
    guard, _ = guarded(max_tombstones=4)

    async def scenario() -> None:
        await write(guard, "orphan", "old:3")  # an orphan left by an unguarded gateway
        assert guard.add_tombstones(["old:3", "old:4", "old:3"]) == (2, 1)
        assert guard.add_tombstones(["old:3", "old:4"]) == (0, 2)
        # backfill records, it never deletes: the orphan is still there until someone deletes it
        assert await session_ids(guard) == {"old:3"}
        await straggle(guard, "late", "old:4")
        assert await session_ids(guard) == {"old:3"}
        # the cap applies to backfill too: the oldest (old:3) is evicted
        assert guard.add_tombstones(["n1", "n2", "n3"]) == (3, 0)

    run(scenario)
    assert guard.tombstoned_among(["old:3", "old:4", "n1", "n2", "n3", "n1"]) == ["old:4", "n1", "n2", "n3"]
    stats = guard.stats()
    assert (stats.tombstones, stats.evicted, stats.dropped_writes) == (4, 1, 1)


def test_tombstoned_among_keeps_the_given_order_without_duplicates() -> None:
    guard, _ = guarded()
    guard.add_tombstones(["b", "a"])
    assert guard.tombstoned_among(["z", "a", "b", "a", "y", "b"]) == ["a", "b"]
    assert guard.tombstoned_among([]) == []


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_tombstones"):
        GuardedTraceStore(MemoryTraceStore(), max_tombstones=-1)
    with pytest.raises(ValueError, match="top_droppers"):
        GuardedTraceStore(MemoryTraceStore(), top_droppers=-5)


# ------------------------------------------------------------------------------------------------
# asyncio interleavings: an inner store that awaits inside delete_session / store_trace
# ------------------------------------------------------------------------------------------------


class SlowDeleteStore(MemoryTraceStore):
    """Like SqliteTraceStore: the delete removes the rows, then yields to the loop (its commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.delete_entered = asyncio.Event()
        self.release_delete = asyncio.Event()

    async def delete_session(self, session_id: str) -> int:
        deleted = await super().delete_session(session_id)
        self.delete_entered.set()
        await self.release_delete.wait()
        return deleted


class SlowWriteStore(MemoryTraceStore):
    """A write that yields to the loop before it lands (an aiosqlite commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.write_entered = asyncio.Event()
        self.release_write = asyncio.Event()

    async def store_trace(self, trace_id: str, session_id: str, data: dict[str, Any]) -> None:
        self.write_entered.set()
        await self.release_write.wait()
        await super().store_trace(trace_id, session_id, data)


async def _straggler_during_inner_delete(max_tombstones: int) -> set[str]:
    inner = SlowDeleteStore()
    guard = GuardedTraceStore(inner, max_tombstones=max_tombstones)
    await write(guard, "t1", "uid:0")
    delete = asyncio.create_task(guard.delete_session("uid:0"))
    await inner.delete_entered.wait()  # the inner delete is running and awaiting
    await straggle(guard, "t2", "uid:0")  # the straggler's trace lands right now
    inner.release_delete.set()
    await delete
    return await session_ids(inner)


def test_a_straggler_arriving_during_an_awaited_inner_delete_is_dropped() -> None:
    assert run(lambda: _straggler_during_inner_delete(1_000)) == set()


def test_the_same_interleaving_resurrects_without_the_guard() -> None:
    # proves the scenario above really races: the unguarded store keeps the straggler
    assert run(lambda: _straggler_during_inner_delete(0)) == {"uid:0"}


async def _write_in_flight_when_delete_arrives(max_tombstones: int) -> tuple[set[str], int]:
    inner = SlowWriteStore()
    guard = GuardedTraceStore(inner, max_tombstones=max_tombstones)
    pending = asyncio.create_task(write(guard, "t1", "uid:0"))  # admitted: no tombstone yet
    await inner.write_entered.wait()
    delete = asyncio.create_task(guard.delete_session("uid:0"))
    await asyncio.sleep(0)  # let the delete run up to its first await
    inner.release_write.set()
    await pending
    deleted = await delete
    return await session_ids(inner), deleted


def test_a_write_admitted_before_the_delete_lands_before_it() -> None:
    remaining, deleted = run(lambda: _write_in_flight_when_delete_arrives(1_000))
    assert remaining == set()
    assert deleted == 1  # the delete waited for the write and removed its trace


def test_a_write_in_flight_lands_after_the_delete_without_the_guard() -> None:
    remaining, deleted = run(lambda: _write_in_flight_when_delete_arrives(0))
    assert (remaining, deleted) == ({"uid:0"}, 0)


# ------------------------------------------------------------------------------------------------
# Delegation, and another inner store
# ------------------------------------------------------------------------------------------------


def test_every_protocol_method_is_delegated() -> None:
    calls: list[tuple[Any, ...]] = []

    class Recorder:
        async def store_trace(self, trace_id: str, session_id: str, data: dict[str, Any]) -> None:
            calls.append(("store_trace", trace_id, session_id, data))

        async def get_trace(self, trace_id: str) -> dict[str, Any] | None:
            calls.append(("get_trace", trace_id))
            return {"trace_id": trace_id}

        async def get_session_traces(self, session_id: str, since: float | None = None,
                                     limit: int | None = None) -> list[dict[str, Any]]:
            calls.append(("get_session_traces", session_id, since, limit))
            return [{"x": 1}]

        async def delete_session(self, session_id: str) -> int:
            calls.append(("delete_session", session_id))
            return 7

        async def list_sessions(self, since: float | None = None,
                                limit: int | None = None) -> list[dict[str, Any]]:
            calls.append(("list_sessions", since, limit))
            return [{"session_id": "s"}]

        async def flush(self) -> None:
            calls.append(("flush",))

        async def close(self) -> None:
            calls.append(("close",))

    guard = GuardedTraceStore(Recorder())

    async def scenario() -> list[Any]:
        await guard.store_trace("t", "s", {"d": 1})
        results: list[Any] = [
            await guard.get_trace("t"),
            await guard.get_session_traces("s", since=1.5, limit=3),
            await guard.delete_session("s"),
            await guard.list_sessions(since=2.5, limit=4),
        ]
        await guard.flush()
        await guard.close()
        return results

    assert run(scenario) == [{"trace_id": "t"}, [{"x": 1}], 7, [{"session_id": "s"}]]
    assert calls == [
        ("store_trace", "t", "s", {"d": 1}), ("get_trace", "t"), ("get_session_traces", "s", 1.5, 3),
        ("delete_session", "s"), ("list_sessions", 2.5, 4), ("flush",), ("close",),
    ]


def test_the_guard_works_around_the_real_sqlite_store(tmp_path: Path) -> None:
    inner = SqliteTraceStore(db_path=str(tmp_path / "traces.db"))
    guard = GuardedTraceStore(inner)

    async def scenario() -> list[str]:
        try:
            await write(guard, "t1", "uid:0")
            await write(guard, "k1", "keep:0")
            await guard.delete_session("uid:0")
            await straggle(guard, "t2", "uid:0")
            return sorted(await session_ids(guard))
        finally:
            await guard.close()

    assert run(scenario) == ["keep:0"]
    assert guard.stats().dropped_writes == 1


# ------------------------------------------------------------------------------------------------
# The guarded gateway app, in process (httpx's ASGI transport; no worker needed for these routes)
# ------------------------------------------------------------------------------------------------


def app_client(max_tombstones: int = 1_000_000) -> tuple[Any, httpx.AsyncClient]:
    app = guarded_gateway.build_app(GatewayConfig(store_worker="memory"), max_tombstones=max_tombstones)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test")
    return app, client


def test_after_a_delete_the_next_use_of_the_id_is_kept_with_or_without_a_create() -> None:
    app, client = app_client()
    guard: GuardedTraceStore = app.state.guard

    async def scenario() -> None:
        async with client:
            await write(guard, "t1", "uid:0")
            assert (await client.delete("/sessions/uid:0")).json() == {"deleted": 1}
            await straggle(guard, "late", "uid:0")  # the old use's straggler: dropped
            await write(guard, "step2a", "uid:0")  # the next step's bare use: kept, no create needed
            # an explicit create changes nothing: the fence stays and the old use's stragglers are still dropped
            created = await client.post("/sessions", json={"session_id": "uid:0", "metadata": {"retry": 1}})
            assert created.json() == {"session_id": "uid:0", "url": "/sessions/uid:0/v1"}
            assert guard.is_tombstoned("uid:0") and guard.is_reused("uid:0")
            await straggle(guard, "late2", "uid:0")
            await write(guard, "step2b", "uid:0")
            info = (await client.get("/sessions/uid:0")).json()
            assert info["trace_count"] == 2
            assert [t["trace_id"] for t in (await client.get("/sessions/uid:0/traces")).json()] == [
                "step2a", "step2b"]

    run(scenario)
    stats = guard.stats()
    assert (stats.dropped_writes, stats.kept_after_fence) == (2, 2)


def test_a_new_delete_moves_the_fence_and_forgets_the_use_before_it() -> None:
    guard, _ = guarded()

    async def scenario() -> None:
        await guard.delete_session("uid:0")
        first = guard.fence_of("uid:0")
        await write(guard, "step2", "uid:0")
        assert guard.is_reused("uid:0")
        await guard.delete_session("uid:0")  # the end of step 2
        assert guard.fence_of("uid:0") >= first and not guard.is_reused("uid:0")
        await straggle(guard, "late", "uid:0")
        assert await session_ids(guard) == set()

    run(scenario)


async def _new_use_during_an_awaited_inner_delete() -> list[str]:
    inner = SlowDeleteStore()
    guard = GuardedTraceStore(inner)
    await write(guard, "t1", "uid:0")
    delete = asyncio.create_task(guard.delete_session("uid:0"))
    await inner.delete_entered.wait()  # the inner delete is running and awaiting
    retry = asyncio.create_task(write(guard, "retry1", "uid:0"))  # the retry's first call lands right now
    await asyncio.sleep(0)
    inner.release_delete.set()
    await delete
    await retry
    return [t["trace_id"] for t in await inner.get_session_traces("uid:0")]


def test_a_new_use_arriving_during_an_awaited_inner_delete_waits_for_it_and_is_kept() -> None:
    assert run(_new_use_during_an_awaited_inner_delete) == ["retry1"]


def test_guard_routes_follow_the_contract() -> None:
    app, client = app_client(max_tombstones=3)
    guard: GuardedTraceStore = app.state.guard

    async def scenario() -> None:
        async with client:
            await client.delete("/sessions/a:0")
            await straggle(guard, "late", "a:0")
            await straggle(guard, "late2", "a:0")
            status = (await client.get("/guard/status")).json()
            assert status == {"enabled": True, "tombstones": 1, "capacity": 3, "dropped_writes": 2,
                              "kept_after_fence": 0, "evicted": 0,
                              "top_droppers": [{"session_id": "a:0", "dropped": 2}], "index": "ready"}

            added = await client.post("/guard/tombstones", json={"session_ids": ["a:0", "task/x:1", "b:0"]})
            assert added.json() == {"added": 2, "already": 1, "tombstones": 3}
            await write(guard, "again", "b:0")  # b:0 used again after its (backfilled) fence
            added = await client.post("/guard/tombstones", json={"session_ids": ["c:0"]})
            assert added.json() == {"added": 1, "already": 0, "tombstones": 3}  # a:0 evicted

            checked = (await client.post("/guard/tombstones/check",
                                         json={"session_ids": ["a:0", "b:0", "nope", "task/x:1"]})).json()
            assert checked["tombstoned"] == ["b:0", "task/x:1"] and checked["reused"] == ["b:0"]
            assert set(checked["fences"]) == {"b:0", "task/x:1"}
            assert all(abs(fence - time.time()) < 60 for fence in checked["fences"].values())

            assert (await client.delete("/guard/tombstones/task/x:1")).json() == {"lifted": True}
            assert (await client.delete("/guard/tombstones/task/x:1")).json() == {"lifted": False}
            status = (await client.get("/guard/status")).json()
            assert (status["tombstones"], status["evicted"], status["kept_after_fence"]) == (2, 1, 1)

    run(scenario)


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "must be JSON"),
    (b"", "JSON object"),
    (b'["a"]', "JSON object"),
    (b'{"ids": ["a"]}', "JSON object"),
    (b'{"session_ids": "a"}', "must be a list"),
    (b'{"session_ids": ["a", 3]}', "session_ids[1] must be a non-empty string"),
    (b'{"session_ids": [""]}', "session_ids[0] must be a non-empty string"),
])
def test_guard_routes_refuse_a_wrong_body_with_400(body: bytes, message: str) -> None:
    app, client = app_client()

    async def scenario() -> None:
        async with client:
            for path in ("/guard/tombstones", "/guard/tombstones/check"):
                response = await client.post(path, content=body, headers={"content-type": "application/json"})
                assert response.status_code == 400
                assert message in response.json()["error"]

    run(scenario)
    assert app.state.guard.stats().tombstones == 0


def test_backfill_on_a_disabled_guard_is_refused_with_409() -> None:
    _, client = app_client(max_tombstones=0)

    async def scenario() -> None:
        async with client:
            response = await client.post("/guard/tombstones", json={"session_ids": ["a"]})
            assert response.status_code == 409
            assert "disabled" in response.json()["error"]
            assert (await client.post("/guard/tombstones/check", json={"session_ids": ["a"]})).json() == {
                "tombstoned": [], "fences": {}, "reused": []}
            status = (await client.get("/guard/status")).json()
            assert (status["enabled"], status["capacity"], status["tombstones"]) == (False, 0, 0)

    run(scenario)


def metric_values(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no HELP"
        for sample in family.samples:
            assert sample.labels == {}, "no label (and so no session id) on the guard's metrics"
            values[sample.name] = sample.value
    return values


def test_metrics_expose_the_guard_figures_without_labels() -> None:
    app, client = app_client(max_tombstones=2)
    guard: GuardedTraceStore = app.state.guard

    async def scenario() -> tuple[str, str]:
        async with client:
            for sid in ("a", "b", "c"):
                await client.delete(f"/sessions/{sid}")
            for _ in range(3):
                await straggle(guard, "late", "c")
            await write(guard, "next", "c")
            plain = await client.get("/metrics")
            assert plain.headers["content-type"].startswith("text/plain")
            open_metrics = await client.get("/metrics", headers={"accept": "application/openmetrics-text"})
            assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
            return plain.text, open_metrics.text

    plain, open_metrics = run(scenario)
    assert metric_values(plain) == {
        "gatewayscope_guard_tombstones": 2.0,
        "gatewayscope_guard_tombstone_capacity": 2.0,
        "gatewayscope_guard_dropped_writes_total": 3.0,
        "gatewayscope_guard_kept_after_fence_writes_total": 1.0,
        "gatewayscope_guard_tombstones_evicted_total": 1.0,
    }
    assert "# TYPE gatewayscope_guard_dropped_writes_total counter" in plain
    assert "# TYPE gatewayscope_guard_tombstones gauge" in plain
    assert open_metrics.rstrip().endswith("# EOF")


def test_each_scrape_builds_fresh_families() -> None:
    guard = GuardedTraceStore(MemoryTraceStore(), max_tombstones=5)
    collector = guarded_gateway.GuardCollector(guard)
    first = {m.name: m.samples[0].value for m in collector.collect()}
    guard.add_tombstones(["x", "y"])
    second = {m.name: m.samples[0].value for m in collector.collect()}
    assert first["gatewayscope_guard_tombstones"] == 0
    assert second["gatewayscope_guard_tombstones"] == 2


# ------------------------------------------------------------------------------------------------
# The launcher: a drop-in for rllm-model-gateway's flags, env vars and YAML
# ------------------------------------------------------------------------------------------------


def _rllm_help() -> str:
    from rllm_model_gateway import server

    out = io.StringIO()
    argv = sys.argv
    sys.argv = ["rllm-model-gateway", "--help"]
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            server.main()
    finally:
        sys.argv = argv
    return out.getvalue()


def test_the_launcher_accepts_every_rllm_flag_with_the_same_defaults() -> None:
    import re

    rllm_flags = set(re.findall(r"(--[a-z][a-z-]*)", _rllm_help())) - {"--help"}
    assert rllm_flags == {"--host", "--port", "--config", "--worker", "--db-path", "--store", "--log-level"}
    parser = guarded_gateway.build_parser()
    ours = {opt for action in parser._actions for opt in action.option_strings}
    assert rllm_flags <= ours and "--max-tombstones" in ours

    args = parser.parse_args([])
    rllm_dests = ("host", "port", "config", "worker", "db_path", "store", "log_level")
    # like rLLM's: all unset, so its env vars, YAML and GatewayConfig defaults apply
    assert {k: getattr(args, k) for k in rllm_dests} == dict.fromkeys(rllm_dests)
    assert args.max_tombstones == 1_000_000
    args = parser.parse_args(["--worker", "http://w1/v1", "--worker", "http://w2", "--max-tombstones", "0"])
    assert (args.worker, args.max_tombstones) == (["http://w1/v1", "http://w2"], 0)
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        parser.parse_args(["--max-tombstones", "-1"])


def test_config_comes_from_rllm_own_loader_env_and_yaml(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm_model_gateway.server import _load_config

    config_file = tmp_path / "gateway.yaml"
    config_file.write_text("port: 9191\nstore_worker: memory\nhealth_check_interval: 3.5\n")
    monkeypatch.setenv("RLLM_GATEWAY_HOST", "127.0.0.2")
    args = guarded_gateway.build_parser().parse_args(
        ["--config", str(config_file), "--worker", "http://127.0.0.1:1/v1", "--max-tombstones", "7"])
    ours = guarded_gateway.load_config(args)
    assert ours == _load_config(argparse.Namespace(config=str(config_file), worker=["http://127.0.0.1:1/v1"]))
    assert (ours.host, ours.port, ours.store_worker, ours.health_check_interval) == (
        "127.0.0.2", 9191, "memory", 3.5)

    missing = guarded_gateway.build_parser().parse_args(["--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(ConfigError, match="Cannot read the gateway config file"):
        guarded_gateway.load_config(missing)
    monkeypatch.setenv("RLLM_GATEWAY_PORT", "not-a-port")
    with pytest.raises(ConfigError, match="not valid"):
        guarded_gateway.load_config(guarded_gateway.build_parser().parse_args([]))


def test_a_missing_gateway_is_one_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rllm_model_gateway.server", None)  # makes the import fail
    with pytest.raises(GatewayscopeError, match=r"pip install 'gatewayscope\[gateway\]'"):
        guarded_gateway.require_gateway()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert guarded_gateway.main(["--store", "memory"]) == 1
    assert "pip install 'gatewayscope[gateway]'" in err.getvalue()


def test_the_cli_subcommand_registers_the_same_flags() -> None:
    from gatewayscope.cli import gateway as cli_gateway

    parser = argparse.ArgumentParser(prog="gatewayscope")
    cli_gateway.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gateway", "--port", "9999", "--store", "memory", "--max-tombstones", "5"])
    assert (args.command, args.port, args.store, args.max_tombstones) == ("gateway", 9999, "memory", 5)
    assert args.func is cli_gateway.run


def test_a_store_without_the_0_1_0_protocol_is_refused() -> None:
    class NewerStore:
        async def store_trace(self, trace: Any, extras: Any = None) -> None: ...

    with pytest.raises(GatewayscopeError, match=r"0\.1\.0"):
        guarded_gateway.build_app(GatewayConfig(store_worker="memory"), store=NewerStore())
