"""Read statements on a live trace store, each holding the read lock only briefly.

The 0.1.0 gateway runs SQLite in DELETE journal mode, where a reader's open transaction blocks the writer's
commit. So a read here is a short statement in autocommit mode that stops after ``seconds`` of lock
(:func:`fetch_for`), or ends just before a writer :class:`~gatewayscope._sqlite.locking.WriterProbe` saw waiting
tries again, so that its commit goes through at that try instead of after a sleep with the file idle; the
caller resumes after the last row it read. A :class:`StatementWatch` interrupts a statement stuck past its end
on the disk. Every statement takes its lock by fine polling (:func:`~gatewayscope._sqlite.locking.retry_while_locked`).
WAL files are read the same way.
"""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

from gatewayscope._sqlite.locking import BUSY_HANDLER_SLEEPS_MS, WriterProbe, retry_while_locked

#: how long one read statement holds the shared lock when no waiting writer is seen (a writer the probe
#: cannot see: one in this process, or any writer off Linux). Its commit waits for the statement, plus the
#: rest of the sleep its busy handler is in: SQLite's default handler retries 1, 3, 8, 18, 33, 53, 78 ms
#: after its first try, so a 30 ms statement usually lets the commit through at its 33 ms retry. Once a
#: writer is seen waiting, the statement ends just before that writer's first retry at or after this bound
#: (at most 33 ms after its first try; so a statement may run on to about 45 ms: see fetch_for)
STATEMENT_SECONDS = 0.03
#: when SQLite's default busy handler tries again after a writer's first try (its first five sleeps, summed)
BUSY_RETRY_SECONDS = tuple(total / 1000 for total in itertools.accumulate(BUSY_HANDLER_SLEEPS_MS[:5]))
#: how much sooner than a writer's retry a statement ends: that try must find the lock free
WRITER_MARGIN_SECONDS = 0.001
#: rows fetched between two looks at the clock and at the writer, unless the caller says otherwise: a fraction
#: of a millisecond of work for a typical row of a session listing
DEFAULT_CHUNK = 250
#: a statement still running this long after its planned end is interrupted (see StatementWatch)
WATCH_GRACE_SECONDS = 0.01


def start(conn: sqlite3.Connection, sql: str, params: Sequence[Any],
          busy_timeout: float) -> tuple[sqlite3.Cursor, float]:
    """Start a read statement (its first step takes the lock): the cursor and when it got the lock.

    A locked file is retried with :func:`~gatewayscope._sqlite.locking.retry_while_locked`.
    """
    def attempt() -> tuple[sqlite3.Cursor, float]:
        started = time.monotonic()
        return conn.execute(sql, params), started

    return retry_while_locked(attempt, busy_timeout)


class StatementWatch:
    """Interrupts the reader's statement when it still holds the read lock past its deadline.

    The statements time themselves between chunks of rows, but one chunk can wait on the disk: when the
    store's pages are not in the OS page cache, a chunk that usually takes a fraction of a millisecond can
    take hundreds, with the gateway's commit waiting behind it. A thread of its own, armed with each
    statement's deadline, calls ``sqlite3_interrupt``: the statement stops at its next step, the rows read
    before that chunk are kept, and the next statement goes on from there (the pages the interrupted one read
    are in the page cache by then). SQLite ignores an interrupt that arrives when no statement runs, so a late
    one cannot hit the next statement.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._stopped = False
        self.interrupts = 0
        self._thread = threading.Thread(target=self._run, name="gatewayscope-sqlite-watch", daemon=True)
        self._thread.start()

    def arm(self, deadline: float | None) -> None:
        """Interrupt the running statement at ``deadline`` (``time.monotonic()``); None: not at all."""
        with self._cond:
            self._deadline = deadline
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:  # bounded: ends when close() sets _stopped
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._conn.interrupt()
                self.interrupts += 1
                self._deadline = None

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    def __enter__(self) -> StatementWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_interrupt(err: sqlite3.OperationalError) -> bool:
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    return code == 9 if code is not None else "interrupted" in str(err)  # SQLITE_INTERRUPT


def fetch_all(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = (), *,
              busy_timeout: float = 10.0, watch: StatementWatch | None = None) -> tuple[list[tuple[Any, ...]], float]:
    """Run one read statement to completion: its rows, and how long it held the read lock.

    ``fetchall()`` finishes the statement, so in autocommit mode the lock is released before this
    returns. Waits for the lock as :func:`start` does. With ``watch``, a statement still running
    ``STATEMENT_SECONDS + WATCH_GRACE_SECONDS`` after it took the lock is interrupted once (a page cache
    miss: the pages it read are cached by then) and run again unwatched to its end.
    """
    if watch is not None:
        done = fetch_watched(conn, sql, params, busy_timeout=busy_timeout, watch=watch)
        if done is not None:
            return done
    cursor, started = start(conn, sql, params, busy_timeout)
    try:
        rows = cursor.fetchall()
    finally:
        cursor.close()
    return rows, time.monotonic() - started


def fetch_watched(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = (), *, busy_timeout: float,
                  watch: StatementWatch) -> tuple[list[tuple[Any, ...]], float] | None:
    """Run one read statement to completion as :func:`fetch_all` does, but None when ``watch`` interrupted it
    ``STATEMENT_SECONDS + WATCH_GRACE_SECONDS`` after it took the lock: the caller decides what to run next.

    The watch is armed before each try for the lock, since the statement's first step runs inside it: all of an
    aggregate's work is done before its one row comes.
    """
    def attempt() -> tuple[sqlite3.Cursor, float]:
        started = time.monotonic()
        watch.arm(started + STATEMENT_SECONDS + WATCH_GRACE_SECONDS)
        try:
            return conn.execute(sql, params), started
        except BaseException:
            watch.arm(None)  # a busy file is tried again with a new deadline
            raise

    try:
        cursor, started = retry_while_locked(attempt, busy_timeout)
    except sqlite3.OperationalError as err:
        if not _is_interrupt(err):
            raise
        return None
    try:
        rows = cursor.fetchall()
    except sqlite3.OperationalError as err:
        if not _is_interrupt(err):
            raise
        return None
    finally:
        cursor.close()
        watch.arm(None)
    return rows, time.monotonic() - started


def fetch_for(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = (), *, seconds: float,
              busy_timeout: float = 10.0, probe: WriterProbe | None = None, watch: StatementWatch | None = None,
              chunk: int | None = None) -> tuple[list[tuple[Any, ...]], bool]:
    """Rows of one read statement, stopping once it has held the read lock ``seconds``; or, when ``probe``
    sees a writer waiting, just before that writer's first busy-handler retry (``BUSY_RETRY_SECONDS`` after
    its first try) at or after that bound, so the writer's commit goes through on that try. The writer's
    first try came after the last look that saw no writer, which is what the retries are counted from;
    it waits at most 33 ms, and the statement runs on to about 45 ms at most. With ``watch``, a chunk
    that is still running ``WATCH_GRACE_SECONDS`` past that end (a page cache miss) is interrupted.

    Returns the rows read and whether the statement ran to its end. Stopping early closes the
    cursor, which resets the statement and so releases the lock; the rows read so far are the
    statement's first rows, in its order. Some rows are read each time: a statement interrupted before
    its first chunk is run again a row at a time, and if that is interrupted too, unwatched.
    """
    chunk = chunk or DEFAULT_CHUNK
    if probe is not None and not probe.still_valid():
        probe = None
    watched = watch
    while True:  # bounded: at most three tries (chunk, then one row, then unwatched)
        cursor, started = start(conn, sql, params, busy_timeout)
        rows: list[tuple[Any, ...]] = []
        bound = end = started + seconds
        clear_at = started  # the last look that saw no writer waiting (we hold the lock: none waited before)
        looking = probe
        try:
            if watched is not None:  # a slow first step (run by start) still leaves the first chunk its grace
                watched.arm(max(end, time.monotonic()) + WATCH_GRACE_SECONDS)
            while True:  # bounded: each turn reads a chunk, and the statement has finitely many rows
                fetched = cursor.fetchmany(chunk)
                rows += fetched
                if len(fetched) < chunk:
                    return rows, True
                now = time.monotonic()
                if looking is not None:
                    if looking.writer_waiting():
                        retry = next((r for r in BUSY_RETRY_SECONDS if clear_at + r >= bound), BUSY_RETRY_SECONDS[-1])
                        end = clear_at + retry - WRITER_MARGIN_SECONDS
                        looking = None  # the end is fixed
                        if watched is not None:
                            watched.arm(end + WATCH_GRACE_SECONDS)
                    else:
                        clear_at = now
                if now >= end:
                    return rows, False
        except sqlite3.OperationalError as err:
            if watched is None or not _is_interrupt(err):
                raise
            if rows:
                return rows, False  # the interrupted chunk is dropped: every row kept is whole
        finally:
            cursor.close()
            if watched is not None:
                watched.arm(None)
        # interrupted before its first chunk: try one row at a time, and if even one row is that slow
        # (a huge session, a huge prompt), let the statement run unwatched rather than repeat the work
        if chunk == 1:
            watched = None
        chunk = 1
