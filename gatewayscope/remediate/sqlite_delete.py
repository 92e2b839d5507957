"""Session deletes on a live rLLM SQLite store, without costing the gateway a write.

The 0.1.0 gateway writes a trace with one connection that may hold a read statement open when it starts
its write. If another connection holds the write (RESERVED) lock at that moment, SQLite fails the
gateway's write at once with "database is locked" instead of letting it wait, and the trace is lost. So
the deletes here keep four rules:

* **Exclusive, and only into silence.** Each transaction is ``BEGIN EXCLUSIVE``, taken only when no other
  process holds any lock on the file (looked up with ``fcntl(F_GETLK)`` on SQLite's own lock bytes, where
  Linux allows; elsewhere, and on WAL files, by fine polling alone). While it runs, every gateway
  statement waits in the gateway's busy handler (20 s) instead of failing.
* **Short.** A transaction re-checks and deletes sessions until ``TRANSACTION_SECONDS`` have passed, then
  commits.
* **The gateway goes next.** After each commit the deleter sleeps past the gateway's next busy-handler
  retry (:func:`yield_seconds`), so a write that waited on us gets the lock before our next transaction.
* **Stop, don't press on.** When the lock stays out of reach for ``busy_timeout`` seconds the remaining
  deletes end ``unconfirmed`` (nothing of theirs was written).

Each session is re-read inside the transaction that deletes it, and ``decide`` says from that live state
whether the delete may go ahead: nothing can change between the check and the write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from gatewayscope.errors import StoreError

T = TypeVar("T")

#: how long one delete transaction holds the lock (it ends after the first session past this)
TRANSACTION_SECONDS = 0.005
#: sessions one transaction may take at most (they are journaled as attempts before it starts)
TRANSACTION_SESSIONS = 32
#: SQLite's default busy handler sleeps (ms) in turn, then 100 ms each time (sqliteDefaultBusyCallback)
BUSY_HANDLER_SLEEPS_MS = (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100)
#: how much later than a waiting writer's retry the next transaction may start
YIELD_MARGIN_SECONDS = 0.002
#: the longest sleep between two looks at the lock while waiting for it
POLL_SECONDS = 0.00025

_SESSION_SQL = """
    SELECT ts.trace_id, ts.created_at, json_extract(t.data, '$.weight_version')
    FROM trace_sessions AS ts LEFT JOIN traces AS t ON t.trace_id = ts.trace_id
    WHERE ts.session_id = ?
"""
_UNSHARED_SQL = """
    SELECT ts1.trace_id FROM trace_sessions ts1 WHERE ts1.session_id = ? AND NOT EXISTS (
        SELECT 1 FROM trace_sessions ts2 WHERE ts2.trace_id = ts1.trace_id AND ts2.session_id != ?)
"""
TOMBSTONE_TABLE = "gatewayscope_tombstones"


def yield_seconds(held: float) -> float:
    """How long to stay off the lock after holding it ``held`` seconds, so a writer that started waiting
    for it meanwhile (and so has waited at most ``held``) makes its next busy-handler try first.

    >>> round(yield_seconds(0.005), 3), round(yield_seconds(0.04), 3), round(yield_seconds(5.0), 3)
    (0.007, 0.022, 0.102)
    """
    waited_ms = 0.0
    for sleep_ms in BUSY_HANDLER_SLEEPS_MS:
        if waited_ms + sleep_ms > held * 1000:
            return sleep_ms / 1000 + YIELD_MARGIN_SECONDS
        waited_ms += sleep_ms
    return BUSY_HANDLER_SLEEPS_MS[-1] / 1000 + YIELD_MARGIN_SECONDS


@dataclass(frozen=True)
class SessionState:
    """A session as the live store holds it: its trace ids, newest trace time, newest weight version."""

    trace_ids: tuple[str, ...]
    last_trace_at: float | None
    weight_version: int | None
    #: True/False where the store has the tombstone guard, None where it has none
    tombstoned: bool | None


@dataclass
class Decision(Generic[T]):
    """What became of one item: ``deleted`` traces when it was deleted, else the ``verdict`` that kept it."""

    item: T
    state: SessionState
    verdict: object = None
    deleted: int | None = None


class LockTable:
    """Whether another process holds any SQLite lock on the file (PENDING, RESERVED or a SHARED lock).

    Asks ``fcntl(F_GETLK)`` through the descriptor SQLite opened for our own connection (closing one of
    our own would drop this process's locks on the file). POSIX locks are per process, so our own locks
    never show. Off Linux, or when the descriptor is not found, :meth:`busy` is always False and the
    deleter relies on fine polling alone.
    """

    PENDING_BYTE = 0x40000000
    #: PENDING, RESERVED and the 510-byte SHARED range
    LOCK_BYTES = 512
    _FLOCK = "hhqqi4x"

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self._query = struct.pack(self._FLOCK, fcntl.F_WRLCK, os.SEEK_SET, self.PENDING_BYTE, self.LOCK_BYTES, 0)

    @classmethod
    def for_connection(cls, path: str, before: dict[int, tuple[int, int]]) -> LockTable:
        """The table seen through the descriptor of ``path`` opened since ``before`` was taken (by identity:
        a descriptor number in ``before`` may since have been closed and reused for the file)."""
        if not sys.platform.startswith("linux") or struct.calcsize(cls._FLOCK) != 32:
            return cls(None)
        try:
            info = os.stat(path)
        except OSError:
            return cls(None)
        identity = (info.st_dev, info.st_ino)
        for fd, refers_to in _descriptors().items():
            if refers_to == identity and before.get(fd) != identity:
                return cls(fd)
        return cls(None)

    def busy(self) -> bool:
        if self.fd is None:
            return False
        try:
            answer = fcntl.fcntl(self.fd, fcntl.F_GETLK, self._query)
        except OSError:
            self.fd = None
            return False
        return bool(struct.unpack(self._FLOCK, answer)[0] != fcntl.F_UNLCK)


def _descriptors() -> dict[int, tuple[int, int]]:
    """This process's descriptors and the (device, inode) each refers to."""
    found: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                info = os.stat(int(name))
                found[int(name)] = (info.st_dev, info.st_ino)
    return found


def _is_busy(err: sqlite3.OperationalError) -> bool:
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (5, 6)
    return "locked" in str(err) or "busy" in str(err)


class SessionDeleter:
    """Deletes sessions of one SQLite store under the rules of this module; use as a context manager."""

    def __init__(self, path: str, *, busy_timeout: float = 10.0, readonly: bool = False) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        #: how long to stay off the lock after the last transaction (see :func:`yield_seconds`)
        self.pause = 0.0
        self._conn: sqlite3.Connection | None = None
        self._locks = LockTable(None)
        self._wal = False
        self._has_tombstones = False
        #: how many times a transaction waited for the gateway's locks to clear, and the longest wait
        self.lock_waits = 0
        self.longest_lock_wait = 0.0

    def __enter__(self) -> SessionDeleter:
        file = Path(self.path)
        if not file.is_file():
            raise StoreError(f"{self.path}: no such file; give the gateway's SQLite trace store.")
        before = _descriptors()
        try:
            mode = "ro" if self.readonly else "rw"
            conn = sqlite3.connect(f"{file.resolve().as_uri()}?mode={mode}", uri=True, isolation_level=None,
                                   timeout=0, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA foreign_keys = ON")
            self._wal = str(self._retry(lambda: conn.execute("PRAGMA journal_mode").fetchone()[0])).lower() == "wal"
            self._has_tombstones = self._retry(lambda: conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TOMBSTONE_TABLE,)).fetchone()
            ) is not None
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: cannot open it for deleting ({err}).") from None
        self._conn = conn
        # in WAL mode every connection holds a shared lock on the file for as long as it is open
        self._locks = LockTable(None) if self._wal else LockTable.for_connection(str(file.resolve()), before)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _retry(self, attempt: Callable[[], T]) -> T:
        started = time.monotonic()
        while True:  # bounded by busy_timeout
            try:
                return attempt()
            except sqlite3.OperationalError as err:
                if not _is_busy(err) or time.monotonic() - started >= self.busy_timeout:
                    raise
            time.sleep(POLL_SECONDS)

    def _begin(self) -> None:
        """``BEGIN EXCLUSIVE``, tried only while no other process holds a lock on the file."""
        assert self._conn is not None
        started = time.monotonic()
        waited = False
        while True:  # bounded by busy_timeout
            if not self._locks.busy():
                try:
                    self._conn.execute("BEGIN EXCLUSIVE")
                    break
                except sqlite3.OperationalError as err:
                    if not _is_busy(err):
                        raise
            waited = True
            if time.monotonic() - started >= self.busy_timeout:
                raise TimeoutError
            time.sleep(POLL_SECONDS)
        if waited:
            self.lock_waits += 1
            self.longest_lock_wait = max(self.longest_lock_wait, time.monotonic() - started)

    def read_state(self, session_id: str) -> SessionState:
        """The session's live state (call inside a transaction, or alone for a dry run)."""
        assert self._conn is not None
        conn = self._conn
        rows = self._retry(lambda: conn.execute(_SESSION_SQL, (session_id,)).fetchall())
        tombstoned: bool | None = None
        if self._has_tombstones:
            tombstoned = self._retry(lambda: conn.execute(
                f"SELECT 1 FROM {TOMBSTONE_TABLE} WHERE session_id = ?", (session_id,)).fetchone()) is not None
        times = [float(r[1]) for r in rows if isinstance(r[1], (int, float))]
        versions = [int(r[2]) for r in rows if isinstance(r[2], int) and not isinstance(r[2], bool)]
        return SessionState(trace_ids=tuple(sorted(str(r[0]) for r in rows)),
                            last_trace_at=max(times) if times else None,
                            weight_version=max(versions) if versions else None, tombstoned=tombstoned)

    def _delete(self, session_id: str) -> int:
        """The gateway's own delete: the session's junction rows, then its traces no other session shares."""
        assert self._conn is not None
        unique = [row[0] for row in self._conn.execute(_UNSHARED_SQL, (session_id, session_id))]
        self._conn.execute("DELETE FROM trace_sessions WHERE session_id = ?", (session_id,))
        for start in range(0, len(unique), 500):
            chunk = unique[start:start + 500]
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
        assert self._conn is not None and items and not self.readonly
        self._begin()
        held_from = time.monotonic()
        settled: list[Decision[T]] = []
        try:
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
            self._conn.execute("COMMIT")
        except BaseException as err:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):
                raise StoreError(f"{self.path}: the delete transaction failed and was rolled back, nothing "
                                 f"was deleted in it ({err}).") from None
            raise
        finally:
            self.pause = yield_seconds(time.monotonic() - held_from)
        return settled
