"""Session deletes on a live rLLM SQLite store, without costing the gateway a write.

Every delete transaction is taken by :class:`gatewayscope._sqlite.locking.Writer`: ``BEGIN EXCLUSIVE``, only
when no other process holds a lock on the file where that can be seen (in WAL mode: only while no other process
is in a read, and no read may begin until the commit), by fine polling; after each commit
the gateway's waiting writer goes first (:attr:`SessionDeleter.pause`); when the lock stays out of reach for
``busy_timeout`` seconds the remaining deletes end ``unconfirmed`` (nothing of theirs was written). On top of
that, a transaction is **short**: it re-checks and deletes sessions until ``TRANSACTION_SECONDS`` have passed,
then commits.

Each session is re-read inside the transaction that deletes it, and ``decide`` says from that live state
whether the delete may go ahead: nothing can change between the check and the write.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from gatewayscope._sqlite.locking import (
    WRITE_POLL_SECONDS,
    LockTable,
    LockTimeout,
    Writer,
    open_descriptors,
    retry_while_locked,
)
from gatewayscope._sqlite.open import connect
from gatewayscope.errors import StoreError
from gatewayscope.guard import sqlite as sqlite_guard
from gatewayscope.orphan_rule import Tombstone, dispatched_at_sql
from gatewayscope.sources._batches import batches

T = TypeVar("T")

#: how long one delete transaction holds the lock (it ends after the first session past this)
TRANSACTION_SECONDS = 0.005
#: sessions one transaction may take at most (they are journaled as attempts before it starts)
TRANSACTION_SESSIONS = 32
#: trace ids per DELETE statement (well under SQLite's variable limit)
DELETE_BATCH = 500

_SESSION_SQL = f"""
    SELECT ts.trace_id, ts.created_at, json_extract(t.data, '$.weight_version'), {dispatched_at_sql("t.data")}
    FROM trace_sessions AS ts LEFT JOIN traces AS t ON t.trace_id = ts.trace_id
    WHERE ts.session_id = ?
"""
_UNSHARED_SQL = """
    SELECT ts1.trace_id FROM trace_sessions ts1 WHERE ts1.session_id = ? AND NOT EXISTS (
        SELECT 1 FROM trace_sessions ts2 WHERE ts2.trace_id = ts1.trace_id AND ts2.session_id != ?)
"""


@dataclass(frozen=True)
class SessionState:
    """A session as the live store holds it: its trace ids, newest trace time, newest weight version, when its
    newest trace was dispatched, and its tombstone."""

    trace_ids: tuple[str, ...]
    last_trace_at: float | None
    weight_version: int | None
    #: True/False where the store has the tombstone guard, None where it has none
    tombstoned: bool | None
    #: the latest :func:`~gatewayscope.orphan_rule.dispatched_at` of its traces (None when one is unknown)
    latest_dispatch: float | None = None
    #: its tombstone's fence (``orphan_rule.UNKNOWN_FENCE`` where the guard gives no time), None without one
    fence: float | None = None
    #: whether the guard saw the id written again after that fence (a new use)
    reused: bool = False


@dataclass
class Decision(Generic[T]):
    """What became of one item: ``deleted`` traces when it was deleted, else the ``verdict`` that kept it."""

    item: T
    state: SessionState
    verdict: object = None
    deleted: int | None = None


class SessionDeleter:
    """Deletes sessions of one SQLite store under the rules of this module; use as a context manager."""

    def __init__(self, path: str, *, busy_timeout: float = 10.0, readonly: bool = False) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self._conn: sqlite3.Connection | None = None
        self._writer: Writer | None = None
        self._has_tombstones = False

    @property
    def pause(self) -> float:
        """How long to stay off the lock after the last transaction (see :meth:`Writer.transaction`)."""
        return self._writer.pause if self._writer is not None else 0.0

    @property
    def _locks(self) -> LockTable:
        """What the writer sees of the other processes' locks on the file."""
        return self._writer.locks if self._writer is not None else LockTable(None)

    @property
    def lock_waits(self) -> int:
        """How many times a transaction waited for the gateway's locks to clear."""
        return self._writer.lock_waits if self._writer is not None else 0

    @property
    def longest_lock_wait(self) -> float:
        """The longest such wait, in seconds."""
        return self._writer.longest_lock_wait if self._writer is not None else 0.0

    def __enter__(self) -> SessionDeleter:
        file = Path(self.path)
        if not file.is_file():
            raise StoreError(f"{self.path}: no such file; give the gateway's SQLite trace store.")
        before = open_descriptors()
        try:
            conn = connect(file, readonly=self.readonly, busy_timeout=0)
            try:
                conn.execute("PRAGMA foreign_keys = ON")
                writer = Writer.for_connection(conn, file, before, busy_timeout=self.busy_timeout)
                self._has_tombstones = self._retry(lambda: sqlite_guard.has_tombstone_table(conn))
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: cannot open it for deleting ({err}).") from None
        self._conn, self._writer = conn, writer
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _retry(self, attempt: Callable[[], T]) -> T:
        """``attempt()``, polling for the lock as the writer does (the connection has no busy handler)."""
        return retry_while_locked(attempt, self.busy_timeout, max_interval=WRITE_POLL_SECONDS)

    def read_state(self, session_id: str) -> SessionState:
        """The session's live state (call inside a transaction, or alone for a dry run)."""
        assert self._conn is not None
        conn = self._conn
        rows = self._retry(lambda: conn.execute(_SESSION_SQL, (session_id,)).fetchall())
        tombstone: Tombstone | None = None
        if self._has_tombstones:
            tombstone = self._retry(lambda: sqlite_guard.tombstone_of(conn, session_id))
        times = [float(r[1]) for r in rows if isinstance(r[1], (int, float))]
        versions = [int(r[2]) for r in rows if isinstance(r[2], int) and not isinstance(r[2], bool)]
        dispatched = [float(r[3]) for r in rows if isinstance(r[3], (int, float))]
        return SessionState(trace_ids=tuple(sorted(str(r[0]) for r in rows)),
                            last_trace_at=max(times) if times else None,
                            weight_version=max(versions) if versions else None,
                            tombstoned=None if not self._has_tombstones else tombstone is not None,
                            latest_dispatch=max(dispatched) if dispatched and len(dispatched) == len(rows) else None,
                            fence=tombstone.fence if tombstone is not None else None,
                            reused=tombstone.reused if tombstone is not None else False)

    def _delete(self, session_id: str) -> int:
        """The gateway's own delete: the session's junction rows, then its traces no other session shares."""
        assert self._conn is not None
        unique = [row[0] for row in self._conn.execute(_UNSHARED_SQL, (session_id, session_id))]
        self._conn.execute("DELETE FROM trace_sessions WHERE session_id = ?", (session_id,))
        for chunk in batches(unique, DELETE_BATCH):
            self._conn.execute(f"DELETE FROM traces WHERE trace_id IN ({','.join('?' * len(chunk))})", chunk)
        return len(unique)

    def transaction(self, items: Sequence[T], session_id: Callable[[T], str],
                    decide: Callable[[T, SessionState], object]) -> list[Decision[T]]:
        """One short exclusive transaction over the first of ``items``: each is re-read, ``decide`` returns
        None to delete it (or a verdict that keeps it), until ``TRANSACTION_SECONDS`` have passed. Returns
        the items it settled (at least one), in order; the caller passes the rest to the next call and then
        waits :attr:`pause` before it.

        Raises TimeoutError when the lock stayed out of reach for ``busy_timeout`` seconds (nothing was
        written), StoreError when SQLite fails (the transaction is rolled back: nothing was written).
        """
        assert self._conn is not None and self._writer is not None and items and not self.readonly
        settled: list[Decision[T]] = []
        try:
            with self._writer.transaction():
                held_from = time.monotonic()
                for item in items:
                    if settled and time.monotonic() - held_from >= TRANSACTION_SECONDS:
                        break
                    sid = session_id(item)
                    state = self.read_state(sid)
                    verdict = decide(item, state)
                    decision = Decision(item, state, verdict)
                    if verdict is None:
                        decision.deleted = self._delete(sid)
                    settled.append(decision)
        except LockTimeout:
            raise TimeoutError from None
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: the delete transaction failed and was rolled back, nothing "
                             f"was deleted in it ({err}).") from None
        return settled
