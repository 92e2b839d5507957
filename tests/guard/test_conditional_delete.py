"""The guarded launcher's compare-and-delete: nothing lands between the check and the delete.

``GuardedTraceStore.delete_session_if`` holds new writes for the session at a gate, lets writes already
admitted land, reads the session and deletes it only when its traces and tombstone state are the ones
given. The inner store here yields to the event loop on every read (as a store doing I/O does), so a
write can arrive in the middle of the check.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gatewayscope.guard.memory import GuardedTraceStore, request_arrived


class YieldingStore:
    """A minimal TraceStore whose reads and deletes await (other tasks run meanwhile)."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[str]] = {}

    async def store_trace(self, trace_id: str, session_id: str, data: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        self.sessions.setdefault(session_id, []).append(trace_id)

    async def get_session_traces(self, session_id: str, since: float | None = None,
                                 limit: int | None = None) -> list[dict[str, Any]]:
        ids = list(self.sessions.get(session_id, []))
        await asyncio.sleep(0.01)
        return [{"trace_id": t, "session_id": session_id} for t in ids]

    async def delete_session(self, session_id: str) -> int:
        await asyncio.sleep(0)
        return len(self.sessions.pop(session_id, []))


def test_a_write_arriving_during_the_check_waits_and_then_lands_as_a_new_use() -> None:
    async def scenario() -> tuple[Any, dict[str, list[str]], int]:
        inner = YieldingStore()
        guard = GuardedTraceStore(inner)
        await guard.store_trace("t1", "s:0", {})
        delete = asyncio.create_task(guard.delete_session_if("s:0", ["t1"], False))
        await asyncio.sleep(0.001)  # the check is reading now
        with request_arrived(time.time()):  # the request reaches the gateway now, after the check began
            await guard.store_trace("t2", "s:0", {})  # waits at the gate, then lands after the delete
        return await delete, inner.sessions, guard.stats().dropped_writes

    (deleted, live, tombstoned), sessions, dropped = asyncio.run(scenario())
    assert (deleted, live, tombstoned) == (1, ["t1"], False)
    assert sessions == {"s:0": ["t2"]}  # the orphan is gone; the write the check never saw is kept
    assert dropped == 0


def test_a_straggler_from_before_the_check_is_dropped_after_the_delete() -> None:
    async def scenario() -> tuple[dict[str, list[str]], int]:
        inner = YieldingStore()
        guard = GuardedTraceStore(inner)
        await guard.store_trace("t1", "s:0", {})
        sent = time.time()  # its request reached the gateway before the check
        delete = asyncio.create_task(guard.delete_session_if("s:0", ["t1"], False))
        await asyncio.sleep(0.001)
        with request_arrived(sent):
            await guard.store_trace("late", "s:0", {})
        await delete
        return inner.sessions, guard.stats().dropped_writes

    assert asyncio.run(scenario()) == ({}, 1)


def test_a_session_that_does_not_match_is_kept_and_its_waiting_write_lands() -> None:
    async def scenario() -> tuple[Any, dict[str, list[str]], bool]:
        inner = YieldingStore()
        guard = GuardedTraceStore(inner)
        await guard.store_trace("t1", "s:0", {})
        await guard.store_trace("t2", "s:0", {})
        delete = asyncio.create_task(guard.delete_session_if("s:0", ["t1"], False))
        await asyncio.sleep(0.001)
        await guard.store_trace("t3", "s:0", {})
        return await delete, inner.sessions, guard.is_tombstoned("s:0")

    (deleted, live, _), sessions, tombstoned = asyncio.run(scenario())
    assert deleted is None and live == ["t1", "t2"]
    assert sessions == {"s:0": ["t1", "t2", "t3"]}
    assert not tombstoned


@pytest.mark.parametrize("expected_tombstone", [True, False])
def test_a_tombstone_lifted_or_added_since_the_read_is_a_mismatch(expected_tombstone: bool) -> None:
    async def scenario() -> Any:
        guard = GuardedTraceStore(YieldingStore())
        await guard.store_trace("t1", "s:0", {})
        if not expected_tombstone:
            guard.add_tombstones(["s:0"])
        return await guard.delete_session_if("s:0", ["t1"], expected_tombstone)

    deleted, _, _ = asyncio.run(scenario())
    assert deleted is None
