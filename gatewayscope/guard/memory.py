"""The tombstone guard for the rLLM gateway's trace store, in process.

:class:`GuardedTraceStore` wraps ANY store that implements the gateway's ``TraceStore`` protocol
(``MemoryTraceStore``, ``SqliteTraceStore``, a custom one) and fixes the persist-after-delete race
(the straggler race, docs/concepts.md): traces persist fire-and-forget, so an LLM call still in flight
when a rollout flushes and deletes its session returns later and its ``store_trace`` re-creates the
deleted session as a permanent one-trace orphan.

A tombstone is a **fence in time** (:mod:`gatewayscope.orphan_rule`), not a ban: rLLM's trainers reuse session
ids in later steps and in their retries, mostly without ``POST /sessions``.

* ``delete_session`` sets the id's fence to now *before* it awaits the inner delete. A write admitted
  before that (awaiting the inner store) is waited for before the inner delete starts, so it cannot land
  after it; a write that is a new use of the id waits for the inner delete to end, so the delete cannot take it.
* ``store_trace`` drops and counts a write whose request reached the gateway before its id's fence (in total,
  and per session for the worst offenders, in bounded memory). When the request arrived is the stamp
  :func:`request_arrived` set for it (the launcher stamps every proxied request as it comes in), else the trace
  record's own :func:`~gatewayscope.orphan_rule.dispatched_at` (never earlier than the arrival), else now. A
  write that arrived after the fence is a new use: kept, counted, and its id marked as used again, so a scan
  does not take the session for an orphan. The fence stays: a straggler of the old use is still dropped.
* The fences are insertion-ordered and FIFO-capped (``max_tombstones``, default 1,000,000): the
  oldest is evicted first and evictions are counted; a new delete of an id moves it to the young end.
  ``max_tombstones=0`` disables the guard: every call goes straight to the inner store, exactly the legacy
  behaviour.
* :meth:`GuardedTraceStore.lift` removes a tombstone by hand (``gatewayscope guard lift``).

With ``index=True`` the guard also keeps the orphan index a scan reads instead of listing every session
(:class:`SessionIndex`): per session its trace ids and first write time, the one-trace sessions, and the
totals, updated by each write that lands and each delete. It is exact only for an inner store that starts
empty (the launcher enables it for rLLM's memory store only).

Every operation on the write path is O(1) (a dropped write costs well under a microsecond). Memory:
about 200 bytes per tombstone for an rLLM uid (the id string, its fence and its ordered-dict entry), so
roughly 200 MB when the default cap is full. The guard is meant for one asyncio event loop (the
gateway's); its bookkeeping between awaits is atomic there, it is not thread-safe.

>>> import asyncio, time
>>> class Plain:  # the smallest inner store, for the example
...     def __init__(self): self.sessions = {}
...     async def store_trace(self, trace_id, session_id, data):
...         self.sessions.setdefault(session_id, []).append(trace_id)
...     async def delete_session(self, session_id):
...         return len(self.sessions.pop(session_id, []))
>>> guard = GuardedTraceStore(Plain(), max_tombstones=10)  # type: ignore[arg-type]
>>> async def rollout():
...     sent = time.time()  # the straggler's request reaches the gateway: the call is still in flight ...
...     await guard.store_trace("t1", "uid:0", {})
...     await guard.delete_session("uid:0")
...     with request_arrived(sent):
...         await guard.store_trace("t2", "uid:0", {})  # ... and its trace lands after the delete: dropped
...     await guard.store_trace("t3", "uid:0", {})  # the next step uses the id again: kept
>>> asyncio.run(rollout())
>>> guard.stats().dropped_writes, guard.stats().kept_after_fence, guard.inner.sessions
(1, 1, {'uid:0': ['t3']})
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Protocol

from gatewayscope.guard.common import GuardStats
from gatewayscope.orphan_rule import before_fence, dispatched_at_of

#: when the request whose trace is being stored reached the gateway (epoch seconds), set per request by the
#: launcher's middleware; asyncio tasks copy it, so it follows the request into the fire-and-forget persist task
REQUEST_ARRIVAL: contextvars.ContextVar[float | None] = contextvars.ContextVar("gatewayscope_request_arrival",
                                                                               default=None)


@contextlib.contextmanager
def request_arrived(at: float) -> Iterator[None]:
    """Within this block (and the tasks it starts), a stored trace's request reached the gateway at ``at``."""
    token = REQUEST_ARRIVAL.set(at)
    try:
        yield
    finally:
        REQUEST_ARRIVAL.reset(token)

#: the default cap on tombstones, as in the seed's fix (about 200 MB when full)
DEFAULT_MAX_TOMBSTONES = 1_000_000
#: how many of the worst-dropping sessions the guard keeps a count for
DEFAULT_TOP_DROPPERS = 100


class TraceStore(Protocol):
    """The rLLM gateway's ``TraceStore`` protocol as released on PyPI (0.1.0,
    ``rllm_model_gateway.store.base``), restated here so this module imports without the gateway."""

    async def store_trace(self, trace_id: str, session_id: str, data: dict[str, Any]) -> None: ...

    async def get_trace(self, trace_id: str) -> dict[str, Any] | None: ...

    async def get_session_traces(
        self, session_id: str, since: float | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]: ...

    async def delete_session(self, session_id: str) -> int: ...

    async def list_sessions(
        self, since: float | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class _TopCounter:
    """Exact per-key counts for at most ``capacity`` keys, O(1) per increment.

    Keys are grouped in buckets by count (a stream-summary layout). When a new key arrives at a full
    table, the oldest key with the lowest count is evicted, so keys that dropped many writes stay and
    one-off keys churn among themselves. A key's count is exact while it is tracked; an evicted key
    that comes back starts again from 1.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._count: dict[str, int] = {}
        self._buckets: dict[int, OrderedDict[str, None]] = {}
        self._min = 0

    def __len__(self) -> int:
        return len(self._count)

    def add(self, key: str) -> None:
        if self.capacity <= 0:
            return
        old = self._count.get(key)
        if old is None:
            if len(self._count) >= self.capacity:
                self._evict_one()
            self._count[key] = 1
            self._buckets.setdefault(1, OrderedDict())[key] = None
            self._min = 1
            return
        bucket = self._buckets[old]
        del bucket[key]
        if not bucket:
            del self._buckets[old]
            if self._min == old:
                self._min = old + 1
        self._count[key] = old + 1
        self._buckets.setdefault(old + 1, OrderedDict())[key] = None

    def _evict_one(self) -> None:
        bucket = self._buckets[self._min]
        key, _ = bucket.popitem(last=False)
        del self._count[key]
        if not bucket:
            del self._buckets[self._min]
            # the next add() inserts a count-1 key and resets ``_min``; nothing reads it before then

    def top(self, n: int | None = None) -> list[tuple[str, int]]:
        """The tracked keys, highest count first (ties: the key that reached its count first)."""
        ordered = [(key, count) for count in sorted(self._buckets, reverse=True)
                   for key in self._buckets[count]]
        return ordered if n is None else ordered[:n]


class SessionIndex:
    """What a scan needs of every session, kept from the writes that land and the deletes (the orphan index).

    Per session: its trace ids in write order (a trace id written again for the same session counts once, as
    rLLM's memory store counts it) and the wall-clock time of its first write; the sessions with exactly one
    trace, in the order they got it; and the totals. A write is one dict lookup and one list append (plus a
    membership test over that session's trace ids), a delete one pop.
    """

    def __init__(self) -> None:
        #: session id -> [its trace ids, the time of its first write]
        self.sessions: dict[str, tuple[list[str], float]] = {}
        #: the sessions with exactly one trace
        self.singles: dict[str, None] = {}
        #: the trace counts summed
        self.traces = 0

    def add(self, session_id: str, trace_id: str, at: float) -> None:
        """A trace of ``session_id`` landed (written at or after ``at``)."""
        entry = self.sessions.get(session_id)
        if entry is None:
            self.sessions[session_id] = ([trace_id], at)
            self.singles[session_id] = None
            self.traces += 1
            return
        ids = entry[0]
        if trace_id in ids:
            return
        ids.append(trace_id)
        self.traces += 1
        if len(ids) == 2:
            self.singles.pop(session_id, None)

    def remove(self, session_id: str) -> None:
        """``session_id`` was deleted with all its traces."""
        entry = self.sessions.pop(session_id, None)
        if entry is not None:
            self.traces -= len(entry[0])
            self.singles.pop(session_id, None)

    def trace_count(self, session_id: str) -> int:
        entry = self.sessions.get(session_id)
        return 0 if entry is None else len(entry[0])

    def first_at(self, session_id: str) -> float | None:
        entry = self.sessions.get(session_id)
        return None if entry is None else entry[1]

    def created_at(self, session_id: str, created: Mapping[str, float], stamps: Mapping[str, float]) -> float | None:
        """The session's creation time as the gateway's listing gives it: rLLM's session manager's record of the
        id (``created``), else its first trace's time in the inner store (``stamps``: trace id -> time), else
        the index's own time of its first write (at or before the store's)."""
        when = created.get(session_id)
        if when is not None:
            return when
        entry = self.sessions.get(session_id)
        if entry is None:
            return None
        times = [stamps[t] for t in entry[0] if t in stamps]
        return min(times) if times else entry[1]

    def candidates(self, *, idle_before: float | None, tombstones: Collection[str], also: Iterable[str] = (),
                   created: Mapping[str, float] | None = None,
                   stamps: Mapping[str, float] | None = None) -> list[tuple[str, int, float | None]]:
        """(session_id, trace_count, created_at) of the sessions a scan reads traces of, sorted by id: the
        one-trace sessions created at or before ``idle_before`` (all of them when None), the sessions among
        ``tombstones``, and those of ``also`` (see :meth:`created_at` for ``created`` and ``stamps``).

        Costs the one-trace sessions plus the smaller of the tombstones and the sessions, in memory; no await,
        so it is one consistent moment of the index.
        """
        sessions = self.sessions
        created = created if created is not None else {}
        stamps = stamps if stamps is not None else {}
        rows: dict[str, float | None] = {}
        for sid in self.singles:
            when = self.created_at(sid, created, stamps)
            if idle_before is None or when is None or when <= idle_before:
                rows[sid] = when
        if len(tombstones) < len(sessions):
            more = [sid for sid in tombstones if sid in sessions]
        else:
            more = [sid for sid in sessions if sid in tombstones]
        more.extend(sid for sid in also if sid in sessions)
        for sid in more:
            if sid not in rows:
                rows[sid] = self.created_at(sid, created, stamps)
        return [(sid, len(sessions[sid][0]), rows[sid]) for sid in sorted(rows)]


class _Confirmable(Collection[str]):
    """The tombstoned ids not used again since their fence: those a fence may prove orphans (a live view)."""

    def __init__(self, tombstones: Mapping[str, float], reused: Mapping[str, None]) -> None:
        self._tombstones, self._reused = tombstones, reused

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._tombstones and session_id not in self._reused

    def __len__(self) -> int:
        return len(self._tombstones) - len(self._reused)  # every reused id carries a tombstone

    def __iter__(self) -> Iterator[str]:
        reused = self._reused
        return (sid for sid in self._tombstones if sid not in reused)


class GuardedTraceStore:
    """A ``TraceStore`` that refuses to resurrect deleted sessions and keeps every new use of a deleted id.

    Only the protocol's methods are delegated; anything else the inner store offers is reached through
    :attr:`inner`, so no method can write around the guard by accident.

    Args:
        inner: the store to wrap; every protocol method is delegated to it.
        max_tombstones: the FIFO cap on remembered deletions; ``0`` disables the guard entirely.
        top_droppers: how many sessions keep an exact dropped-write count (the worst offenders).
        index: keep the orphan index (:attr:`index`); only for an inner store that starts empty, and only while
            the guard is enabled.
        clock: the wall clock fences are read from (the one request arrivals are stamped with).
    """

    def __init__(
        self,
        inner: TraceStore,
        *,
        max_tombstones: int = DEFAULT_MAX_TOMBSTONES,
        top_droppers: int = DEFAULT_TOP_DROPPERS,
        index: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(max_tombstones, bool) or not isinstance(max_tombstones, int) or max_tombstones < 0:
            raise ValueError(f"max_tombstones must be a whole number >= 0 (0 disables the guard), "
                             f"not {max_tombstones!r}")
        if isinstance(top_droppers, bool) or not isinstance(top_droppers, int) or top_droppers < 0:
            raise ValueError(f"top_droppers must be a whole number >= 0, not {top_droppers!r}")
        self.inner = inner
        self.max_tombstones = max_tombstones
        self.top_droppers = top_droppers
        self._clock = clock
        #: session id -> its fence: the moment of its latest delete (or backfill), oldest first
        self._tombstones: OrderedDict[str, float] = OrderedDict()
        #: the tombstoned ids written again after their fence (a new use); a new delete takes an id off
        self._reused: dict[str, None] = {}
        self._dropped = 0
        self._kept_after_fence = 0
        self._evicted = 0
        self._droppers = _TopCounter(top_droppers)
        # writes admitted (not stragglers when they arrived) and still awaiting the inner store
        self._inflight: dict[str, int] = {}
        # deletes waiting for those writes to land before they delete
        self._drained: dict[str, asyncio.Event] = {}
        # sessions whose inner delete is running: a new use of the id waits for it to end
        self._deleting: dict[str, asyncio.Event] = {}
        # sessions under a compare-and-delete: their writes wait until it has decided
        self._gates: dict[str, asyncio.Event] = {}
        #: the orphan index, or None when not kept
        self.index: SessionIndex | None = SessionIndex() if index and max_tombstones > 0 else None

    # -- the guard's own API ----------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """False when ``max_tombstones`` is 0: the wrapper is then a plain pass-through."""
        return self.max_tombstones > 0

    def is_tombstoned(self, session_id: str) -> bool:
        """Whether ``session_id`` carries a tombstone (its stragglers are dropped)."""
        return session_id in self._tombstones

    def fence_of(self, session_id: str) -> float | None:
        """The moment of ``session_id``'s latest delete (its fence), or None when it carries no tombstone."""
        return self._tombstones.get(session_id)

    def is_reused(self, session_id: str) -> bool:
        """Whether ``session_id`` was written again after its fence (a new use of a deleted id)."""
        return session_id in self._reused

    @property
    def tombstones(self) -> Collection[str]:
        """The tombstoned ids (a live view: read it without awaiting in between)."""
        return self._tombstones.keys()

    @property
    def confirmable(self) -> Collection[str]:
        """The tombstoned ids not written again since their fence (a live view): those a fence may prove orphans."""
        return _Confirmable(self._tombstones, self._reused)

    def tombstoned_among(self, session_ids: Iterable[str]) -> list[str]:
        """The ids of ``session_ids`` that carry a tombstone, in the given order, without duplicates."""
        tombstones = self._tombstones
        return [sid for sid in dict.fromkeys(session_ids) if sid in tombstones]

    def lift(self, session_id: str) -> bool:
        """Remove ``session_id``'s tombstone (by hand: a new use needs none lifted). True if it had one."""
        self._reused.pop(session_id, None)
        try:
            del self._tombstones[session_id]
        except KeyError:
            return False
        return True

    def add_tombstones(self, session_ids: Iterable[str]) -> tuple[int, int]:
        """Record tombstones for ids known to be deleted, deleting nothing (backfill): each new one is fenced now.

        Idempotent: an id that already has a tombstone keeps it, its fence and its place. Returns
        ``(new, already)``. The FIFO cap applies, so adding more than the capacity evicts the oldest
        (and counts the evictions). On a disabled guard nothing is recorded and ``(0, 0)`` is returned.
        """
        if not self.enabled:
            return 0, 0
        new = already = 0
        now = self._clock()
        for sid in session_ids:
            if sid in self._tombstones:
                already += 1
            else:
                self._record(sid, now)
                new += 1
        return new, already

    def stats(self) -> GuardStats:
        """The guard's figures right now (``capacity`` is 0 and ``enabled`` False when disabled)."""
        return GuardStats(
            tombstones=len(self._tombstones),
            capacity=self.max_tombstones,
            dropped_writes=self._dropped,
            evicted=self._evicted,
            kept_after_fence=self._kept_after_fence,
            enabled=self.enabled,
            top_droppers=[{"session_id": sid, "dropped": n}
                          for sid, n in self._droppers.top(self.top_droppers)],
            index="ready" if self.index is not None else "absent",
        )

    def _record(self, session_id: str, fence: float, *, move: bool = False) -> None:
        """Set ``session_id``'s fence (``move``: also to the young end, forgetting its use since the old fence)."""
        tombstones = self._tombstones
        if session_id in tombstones:
            if move:
                tombstones[session_id] = fence
                tombstones.move_to_end(session_id)
                self._reused.pop(session_id, None)
            return
        tombstones[session_id] = fence
        if len(tombstones) > self.max_tombstones:
            evicted, _ = tombstones.popitem(last=False)
            self._reused.pop(evicted, None)
            self._evicted += 1

    def _arrival(self, data: Any) -> float:
        """When the request of a trace being stored reached the gateway: its stamp, else the latest moment its
        record allows (:func:`~gatewayscope.orphan_rule.dispatched_at`), else now; never earlier than it was."""
        stamp = REQUEST_ARRIVAL.get()
        if stamp is not None:
            return stamp
        dispatched = dispatched_at_of(data) if isinstance(data, Mapping) else None
        return dispatched if dispatched is not None else self._clock()

    # -- the TraceStore protocol ------------------------------------------------------------------

    async def store_trace(self, trace_id: str, session_id: str, data: dict[str, Any]) -> None:
        """Store a trace, unless its request reached the gateway before its session's latest delete: then drop
        it and count it."""
        if self._gates:
            gate = self._gates.get(session_id)
            while gate is not None:  # bounded: a compare-and-delete holds its gate for one read and one delete
                await gate.wait()
                gate = self._gates.get(session_id)
        if not self.enabled:
            await self.inner.store_trace(trace_id, session_id, data)
            return
        fence = self._tombstones.get(session_id)
        if fence is not None:
            if before_fence(self._arrival(data), fence):
                self._dropped += 1
                self._droppers.add(session_id)
                return
            deleting = self._deleting.get(session_id)
            while deleting is not None:  # bounded: the delete that set the fence ends; then this new use lands
                await deleting.wait()
                deleting = self._deleting.get(session_id)
            if session_id in self._tombstones:  # still fenced after the wait (a lift or an eviction may end it)
                self._kept_after_fence += 1
                self._reused[session_id] = None
        inflight = self._inflight
        inflight[session_id] = inflight.get(session_id, 0) + 1
        try:
            index = self.index
            if index is None:
                await self.inner.store_trace(trace_id, session_id, data)
            else:
                at = self._clock()  # at or before the inner store's own time for the write
                await self.inner.store_trace(trace_id, session_id, data)
                index.add(session_id, trace_id, at)
        finally:
            left = inflight[session_id] - 1
            if left:
                inflight[session_id] = left
            else:
                del inflight[session_id]
                waiter = self._drained.pop(session_id, None)
                if waiter is not None:
                    waiter.set()

    async def delete_session(self, session_id: str) -> int:
        """Fence the session now, let writes already admitted for it land, then delete it.

        The fence is set before the first await, so any straggler arriving from now on (including during an
        inner delete that awaits I/O) is dropped, and a new use of the id waits until the inner delete is over.
        Deleting an id that already has a tombstone moves its fence to now and it to the young end of the FIFO.
        """
        if not self.enabled:
            return await self.inner.delete_session(session_id)
        return await self._delete(session_id, self._clock())

    async def _delete(self, session_id: str, fence: float) -> int:
        """Fence ``session_id`` at ``fence`` (no later than now), then delete it as :meth:`delete_session` does."""
        self._record(session_id, fence, move=True)
        done = asyncio.Event()
        previous = self._deleting.get(session_id)
        self._deleting[session_id] = done
        try:
            if previous is not None:
                await previous.wait()  # bounded: each delete of an id ends; they run one at a time
            if session_id in self._inflight:
                waiter = self._drained.get(session_id)
                if waiter is None:
                    waiter = self._drained[session_id] = asyncio.Event()
                await waiter.wait()
            deleted = await self.inner.delete_session(session_id)
            if self.index is not None:
                self.index.remove(session_id)
            return deleted
        finally:
            if self._deleting.get(session_id) is done:
                del self._deleting[session_id]
            done.set()

    async def delete_session_if(self, session_id: str, trace_ids: Iterable[str],
                                tombstoned: bool) -> tuple[int | None, list[str], bool]:
        """Delete ``session_id`` only while its traces are exactly ``trace_ids`` and its tombstone state is
        ``tombstoned``: nothing can land between the check and the delete.

        New writes for the session wait at a gate, writes already admitted are let land first, then the
        session is read and, when it matches, deleted, fenced at the moment the check began: a write whose
        request arrived later is a new use and lands after the delete (the check did not see it). Returns
        ``(deleted, live_trace_ids, live_tombstoned)``; ``deleted`` is None when it did not match and
        nothing was deleted (the waiting writes then go on as if nothing happened).
        """
        if not self.enabled:
            raise RuntimeError("the guard is disabled (--max-tombstones 0)")
        while session_id in self._gates:  # bounded: each gate is held for one read and one delete
            await self._gates[session_id].wait()
        gate = self._gates[session_id] = asyncio.Event()
        # the fence is the moment the check begins: a write whose request arrives after it was not seen by the
        # check, so it is a new use of the id (kept, after the delete); one from before it was in the check's read
        checked_at = self._clock()
        try:
            if session_id in self._inflight:
                waiter = self._drained.get(session_id)
                if waiter is None:
                    waiter = self._drained[session_id] = asyncio.Event()
                await waiter.wait()
            traces = await self.inner.get_session_traces(session_id)
            live = sorted(str(t.get("trace_id")) for t in traces if isinstance(t, dict))
            live_tombstoned = session_id in self._tombstones
            if live != sorted(trace_ids) or live_tombstoned != tombstoned or not live:
                return None, live, live_tombstoned
            # no await between the check above and the fence _delete sets first
            return await self._delete(session_id, checked_at), live, live_tombstoned
        finally:
            del self._gates[session_id]
            gate.set()

    async def get_trace(self, trace_id: str) -> dict[str, Any] | None:
        """Delegated to the inner store."""
        return await self.inner.get_trace(trace_id)

    async def get_session_traces(
        self, session_id: str, since: float | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Delegated to the inner store."""
        return await self.inner.get_session_traces(session_id, since=since, limit=limit)

    async def list_sessions(
        self, since: float | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Delegated to the inner store."""
        return await self.inner.list_sessions(since=since, limit=limit)

    async def flush(self) -> None:
        """Delegated to the inner store."""
        await self.inner.flush()

    async def close(self) -> None:
        """Delegated to the inner store."""
        await self.inner.close()
