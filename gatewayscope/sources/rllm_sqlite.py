"""Read an rLLM SQLite trace store file, strictly read-only, without holding up the gateway.

The 0.1.0 gateway runs SQLite in DELETE journal mode, where a reader's open transaction blocks
the writer's commit. So every read here is its own short statement in autocommit mode, paged by
key (``session_id``) over the gateway's own ``idx_ts_session_time`` index: the gateway's commit
waits at most for one page, never for the whole scan. A page ends after ``STATEMENT_SECONDS`` of
lock, whatever the machine or the cache: its rows come in key order and the next page starts after
the last whole session read. Candidate traces are read the same way.
Between statements the reader polls for the lock itself, every fraction of a millisecond, rather than
with SQLite's busy handler: its sleeps grow to 100 ms, and against a gateway that commits
back-to-back each of them lands in the next commit, so a reader that sleeps that way starves.
On Linux the reader also watches for a writer waiting on it (a writer in another process, such as the
gateway, holds the PENDING lock byte while it waits to commit; see :class:`WriterProbe`). A statement then
ends just before the writer's busy handler tries again, so the commit goes through at that try instead of
after a sleep with the file idle.
It works on WAL files the same way.
The file is opened with ``mode=ro``: gatewayscope never writes to the store from here.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import os
import sqlite3
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from gatewayscope.config import Policy, Target
from gatewayscope.errors import StoreError
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    SESSIONS_SCHEMA,
    GuardStats,
    TraceStoreData,
    empty_frame,
    frame_from_rows,
)

T = TypeVar("T")

#: most sessions one page may hold (a memory bound: a page usually ends sooner, on STATEMENT_SECONDS)
SESSION_PAGE = 100_000
#: tombstone ids per key range when the guard is installed
TOMBSTONE_PAGE = 4000
#: most session ids one candidate-trace read asks for (SQLite's variable limit before 3.32 is 999);
#: a read also ends after STATEMENT_SECONDS, and the next one resumes at the first unfinished session
TRACE_BATCH = 999
#: how long one read statement holds the shared lock when no waiting writer is seen (a writer the probe
#: cannot see: one in this process, or any writer off Linux). Its commit waits for the statement, plus the
#: rest of the sleep its busy handler is in: SQLite's default handler retries 1, 3, 8, 18, 33, 53, 78 ms
#: after its first try, so a 30 ms statement usually lets the commit through at its 33 ms retry. Once a
#: writer is seen waiting, the statement ends just before that writer's first retry at or after this bound
#: (at most 33 ms after its first try; so a statement may run on to about 45 ms: see fetch_for)
STATEMENT_SECONDS = 0.03
#: when SQLite's default busy handler tries again after a writer's first try (its sleeps: 1, 2, 5, 10, 15 ms)
BUSY_RETRY_SECONDS = (0.001, 0.003, 0.008, 0.018, 0.033)
#: how much sooner than a writer's retry a statement ends: that try must find the lock free
WRITER_MARGIN_SECONDS = 0.001
#: looks at the lock table slower than this, PROBE_SLOW_LOOKS in a row, turn the probe off (a network
#: filesystem asks its lock server every time; one slow look is just this process being preempted)
PROBE_SLOW_SECONDS = 0.001
PROBE_SLOW_LOOKS = 3
#: rows fetched between two looks at the clock and at the writer (a page row of a typical session costs
#: about 1 us, a candidate-trace row of a typical trace about 20 us: both chunks are a fraction of a
#: millisecond of work; a session of many traces or a long prompt makes its row dearer)
PAGE_CHUNK = 250
TRACE_CHUNK = 16
#: a statement still running this long after its planned end is interrupted (see StatementWatch)
WATCH_GRACE_SECONDS = 0.01
TOMBSTONE_TABLE = "gatewayscope_tombstones"

_REQUIRED_COLUMNS = {
    "traces": {"trace_id", "data", "created_at"},
    "trace_sessions": {"trace_id", "session_id", "created_at"},
}

_PAGE_SQL = """
    SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at)
    FROM trace_sessions
    WHERE session_id > ?
    GROUP BY session_id
    ORDER BY session_id
    LIMIT ?
"""

#: a candidate's traces in two steps: their ids and rowids from the indexes (session order), then the rows
#: themselves in rowid order, which is the order they lie in the file: on a cold page cache that read
#: takes 3.0 s instead of 4.9 s for the benchmark's 14,840 candidates (and 0.26 s instead of 0.29 s warm)
_TRACE_IDS_SQL = """
    SELECT ts.session_id, t.trace_id, t.rowid
    FROM trace_sessions AS ts JOIN traces AS t ON t.trace_id = ts.trace_id
    WHERE ts.session_id IN ({placeholders})
    ORDER BY ts.session_id
"""
#: ``key`` is ``rowid`` (file order), or ``trace_id`` for traces whose rowid changed between the two steps
_TRACE_ROWS_SQL = """
    SELECT rowid, trace_id, created_at,
           json_extract(data, '$.weight_version'),
           json_array_length(data, '$.prompt_token_ids'),
           json_extract(data, '$.token_counts.prompt'),
           length(json_extract(data, '$.messages')),
           json_extract(data, '$.model')
    FROM traces WHERE {key} IN ({placeholders})
    ORDER BY {key}
"""


def open_read_only(path: str, *, busy_timeout: float = 10.0) -> sqlite3.Connection:
    """Open ``path`` read-only in autocommit mode, or raise StoreError with what to do."""
    file = Path(path)
    if not file.exists():
        raise StoreError(f"{path}: no such file. Give the path of the gateway's SQLite store "
                         "(rllm-model-gateway --db-path, default ~/.rllm/gateway_traces.db).")
    if file.is_dir():
        raise StoreError(f"{path} is a folder; give the gateway's SQLite file itself.")
    if not os.access(file, os.R_OK):
        raise StoreError(f"{path}: permission denied; run gatewayscope as a user that may read it.")
    uri = f"{file.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error as err:
        raise _store_error(path, err) from None
    return conn


def _store_error(path: str, err: sqlite3.Error) -> StoreError:
    text = str(err)
    if "not a database" in text or "malformed" in text:
        return StoreError(f"{path} is not a SQLite database ({text}); is this the gateway's trace store?")
    if "locked" in text or "busy" in text:
        return StoreError(f"{path} is locked by another process ({text}); it stayed locked past the busy "
                          "timeout. Try again, or raise timeout_seconds for this target.")
    if "unable to open" in text:
        return StoreError(f"{path} cannot be opened ({text}); check the path and its folder's permissions "
                          "(a WAL store needs its folder to be readable too).")
    return StoreError(f"{path}: SQLite error: {text}")


def _is_busy(err: sqlite3.OperationalError) -> bool:
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return (code & 0xFF) in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED and their extended codes
    text = str(err)
    return "locked" in text or "busy" in text


def _poll_interval(waited: float) -> float:
    """Sleep between lock attempts: fine while a commit is likely to end any moment, coarser later."""
    if waited < 0.05:
        return 0.00025
    return 0.001 if waited < 1.0 else 0.01


def retry_while_locked(attempt: Callable[[], T], busy_timeout: float, *, max_interval: float = 0.01) -> T:
    """``attempt()``, tried again while it fails with "database is locked" or "busy", polling finely
    (see the module docstring, and never sleeping longer than ``max_interval``) until the lock has stayed
    out of reach for ``busy_timeout`` seconds; then the last such error is raised. Run the connection
    with ``PRAGMA busy_timeout = 0`` so that SQLite's own growing sleeps do not come first."""
    first_try = time.monotonic()
    while True:  # bounded by busy_timeout
        try:
            return attempt()
        except sqlite3.OperationalError as err:
            waited = time.monotonic() - first_try
            if not _is_busy(err) or waited >= busy_timeout:
                raise
        time.sleep(min(max_interval, _poll_interval(waited)))


def _start(conn: sqlite3.Connection, sql: str, params: Sequence[Any],
           busy_timeout: float) -> tuple[sqlite3.Cursor, float]:
    """Start a read statement (its first step takes the lock): the cursor and when it got the lock.

    A locked file is retried with :func:`retry_while_locked`.
    """
    def attempt() -> tuple[sqlite3.Cursor, float]:
        started = time.monotonic()
        return conn.execute(sql, params), started

    return retry_while_locked(attempt, busy_timeout)


class StatementWatch:
    """Interrupts the reader's statement when it still holds the read lock past its deadline.

    The statements time themselves between chunks of rows, but one chunk can wait on the disk: when the
    store's pages are not in the OS page cache, a chunk that usually takes a fraction of a millisecond took
    140-520 ms in the benchmark, with the gateway's commit waiting behind it. A thread of its own, armed
    with each statement's deadline, calls ``sqlite3_interrupt``: the statement stops at its next step, the
    rows read before that chunk are kept, and the next statement goes on from there (the pages the
    interrupted one read are in the page cache by then). SQLite ignores an interrupt that arrives when no
    statement runs, so a late one cannot hit the next statement.
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
    returns. Waits for the lock as ``_start`` does. With ``watch``, a statement still running
    ``STATEMENT_SECONDS + WATCH_GRACE_SECONDS`` after it took the lock is interrupted once (a page cache
    miss: the pages it read are cached by then) and run again unwatched to its end.
    """
    for watched in (watch, None) if watch is not None else (None,):
        cursor, started = _start(conn, sql, params, busy_timeout)
        try:
            if watched is not None:
                watched.arm(max(started + STATEMENT_SECONDS, time.monotonic()) + WATCH_GRACE_SECONDS)
            rows = cursor.fetchall()
        except sqlite3.OperationalError as err:
            if watched is None or not _is_interrupt(err):
                raise
            continue
        finally:
            cursor.close()
            if watched is not None:
                watched.arm(None)
        return rows, time.monotonic() - started
    raise AssertionError("unreachable: the last try runs unwatched")


class WriterProbe:
    """Tells whether a writer in another process is waiting to commit to the store file.

    SQLite's unix locking has a writer that wants to commit take a write lock on the file's PENDING byte
    and keep it while it waits for the readers' shared locks to go; ``fcntl(F_GETLK)`` asks whether such
    a lock is held without taking any. POSIX locks are per process, so a writer in this same process is
    never seen (the statement's time bound still holds for it). The probe asks through the descriptor
    SQLite itself opened for the reader's connection: closing a descriptor of our own would drop every
    lock this process holds on the file, the connection's included. It turns itself off (and then
    :meth:`writer_waiting` is always False) off Linux, when that descriptor is not found or no longer
    refers to the file, and when looks are slow (a network filesystem asks its lock server each time).
    """

    #: SQLite's lock bytes start at 1 GiB (sqlite3PendingByte): PENDING, RESERVED, then the SHARED range
    PENDING_BYTE = 0x40000000
    #: Linux's struct flock on 64-bit machines: l_type, l_whence, l_start, l_len, l_pid (and padding)
    _FLOCK = "hhqqi4x"

    def __init__(self, fd: int | None, identity: tuple[int, int] | None = None) -> None:
        self.fd = fd
        self.identity = identity
        self._slow_looks = 0
        self._query = struct.pack(self._FLOCK, fcntl.F_RDLCK, os.SEEK_SET, self.PENDING_BYTE, 1, 0)

    @staticmethod
    def supported() -> bool:
        return sys.platform.startswith("linux") and struct.calcsize(WriterProbe._FLOCK) == 32

    @staticmethod
    def open_descriptors() -> dict[int, tuple[int, int]]:
        """This process's descriptors and the (device, inode) each refers to (Linux's /proc/self/fd)."""
        found: dict[int, tuple[int, int]] = {}
        with contextlib.suppress(OSError):
            for name in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError, ValueError):
                    info = os.stat(int(name))
                    found[int(name)] = (info.st_dev, info.st_ino)
        return found

    @classmethod
    def for_new_descriptor(cls, path: str, before: dict[int, tuple[int, int]]) -> WriterProbe:
        """A probe on the descriptor of ``path`` opened since ``before`` was taken (by the reader's connection,
        after its first statement), so never on another connection's descriptor that may close meanwhile."""
        if not cls.supported():
            return cls(None)
        try:
            info = os.stat(path)
        except OSError:
            return cls(None)
        identity = (info.st_dev, info.st_ino)
        for fd, refers_to in cls.open_descriptors().items():
            if refers_to == identity and before.get(fd) != identity:
                return cls(fd, identity)
        return cls(None)

    def still_valid(self) -> bool:
        """Whether the descriptor still refers to the store file (checked once per statement)."""
        if self.fd is None:
            return False
        try:
            info = os.fstat(self.fd)
        except OSError:
            info = None
        if info is None or (info.st_dev, info.st_ino) != self.identity:
            self.fd = None
        return self.fd is not None

    def writer_waiting(self) -> bool:
        """True while another process holds the PENDING byte: a writer waits for the readers to finish."""
        if self.fd is None:
            return False
        asked = time.monotonic()
        try:
            answer = fcntl.fcntl(self.fd, fcntl.F_GETLK, self._query)
        except OSError:  # the descriptor went away: stop asking
            self.fd = None
            return False
        self._slow_looks = self._slow_looks + 1 if time.monotonic() - asked > PROBE_SLOW_SECONDS else 0
        if self._slow_looks >= PROBE_SLOW_LOOKS:
            self.fd = None  # this answer still counts; no more looks
        return bool(struct.unpack(self._FLOCK, answer)[0] != fcntl.F_UNLCK)


_FILE_LOCKS_GUARD = threading.Lock()
_FILE_LOCKS: dict[tuple[int, int], threading.Lock] = {}


@contextlib.contextmanager
def one_reader_per_file(path: str) -> Iterator[None]:
    """Hold off other reads of the same file in this process until this one ends.

    Two connections of one process share its lock on the file: SQLite gives the second one a shared lock
    from its own records, without asking the kernel, even while another process's writer holds PENDING.
    Two interleaved readers could then keep a writer out indefinitely (two targets naming one file, read in
    parallel), so reads of one file take turns. A path that cannot be stat'ed is not held (opening it
    fails with its own message).
    """
    try:
        info = os.stat(path)
    except OSError:
        yield
        return
    with _FILE_LOCKS_GUARD:
        lock = _FILE_LOCKS.setdefault((info.st_dev, info.st_ino), threading.Lock())
    with lock:
        yield


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
    chunk = chunk or PAGE_CHUNK
    if probe is not None and not probe.still_valid():
        probe = None
    watched = watch
    while True:  # bounded: at most three tries (chunk, then one row, then unwatched)
        cursor, started = _start(conn, sql, params, busy_timeout)
        rows: list[tuple[Any, ...]] = []
        bound = end = started + seconds
        clear_at = started  # the last look that saw no writer waiting (we hold the lock: none waited before)
        looking = probe
        try:
            if watched is not None:  # a slow first step (run by _start) still leaves the first chunk its grace
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


def check_trace_store(conn: sqlite3.Connection, path: str, *, busy_timeout: float = 10.0) -> set[str]:
    """Raise StoreError unless the file holds the gateway's tables; return all table names."""
    try:
        names, _ = fetch_all(conn, "SELECT name FROM sqlite_master WHERE type = 'table'",
                             busy_timeout=busy_timeout)
        tables = {row[0] for row in names}
        for table, columns in _REQUIRED_COLUMNS.items():
            if table not in tables:
                raise StoreError(
                    f"{path} is not an rLLM trace store: it has no {table!r} table "
                    f"(tables: {', '.join(sorted(tables)) or 'none'})."
                )
            info, _ = fetch_all(conn, f"PRAGMA table_info({table})", busy_timeout=busy_timeout)
            present = {row[1] for row in info}
            missing = columns - present
            if missing:
                raise StoreError(f"{path} is not an rLLM trace store: table {table!r} lacks "
                                 f"{', '.join(sorted(missing))}.")
    except sqlite3.Error as err:
        raise _store_error(path, err) from None
    return tables


def iter_session_pages(conn: sqlite3.Connection, page_size: int = SESSION_PAGE, *,
                       page_seconds: float | None = STATEMENT_SECONDS, busy_timeout: float = 10.0,
                       probe: WriterProbe | None = None,
                       watch: StatementWatch | None = None) -> Iterator[list[tuple[Any, ...]]]:
    """Pages of (session_id, trace_count, first_trace_at, last_trace_at), each read in its own statement.

    A page holds at most ``page_size`` sessions, and ends once its statement has held the read lock
    ``page_seconds`` (None: no time bound), or when a writer ``probe`` saw waiting is due to try again
    (see :func:`fetch_for`). Either way every row is a whole session (the GROUP BY walks the index in
    key order and emits a session once its last row is counted), so the next page starts after the
    last session read.
    """
    last = ""
    while True:
        if page_seconds is None:
            rows, _ = fetch_all(conn, _PAGE_SQL, (last, page_size), busy_timeout=busy_timeout, watch=watch)
            ended = len(rows) < page_size
        else:
            rows, ended = fetch_for(conn, _PAGE_SQL, (last, page_size), seconds=page_seconds,
                                    busy_timeout=busy_timeout, probe=probe, watch=watch)
            ended = ended and len(rows) < page_size
        if not rows:
            return
        yield rows
        if ended:
            return
        last = rows[-1][0]


def _tombstoned_sessions(conn: sqlite3.Connection, page_size: int = TOMBSTONE_PAGE, *,
                         busy_timeout: float = 10.0, watch: StatementWatch | None = None) -> list[str]:
    """Ids that carry a tombstone and still have rows in the store, read a key range at a time."""
    found: list[str] = []
    last = ""
    while True:
        page, _ = fetch_all(
            conn, f"SELECT session_id FROM {TOMBSTONE_TABLE} WHERE session_id > ? ORDER BY session_id LIMIT ?",
            (last, page_size), busy_timeout=busy_timeout, watch=watch,
        )
        if not page:
            return found
        upper = page[-1][0]
        present, _ = fetch_all(
            conn, f"SELECT session_id FROM {TOMBSTONE_TABLE} AS tb WHERE session_id > ? AND session_id <= ? "
            "AND EXISTS (SELECT 1 FROM trace_sessions AS ts WHERE ts.session_id = tb.session_id)",
            (last, upper), busy_timeout=busy_timeout, watch=watch,
        )
        found.extend(row[0] for row in present)
        if len(page) < page_size:
            return found
        last = upper


def read_guard_stats(conn: sqlite3.Connection, tables: set[str]) -> GuardStats | None:
    """The SQLite guard's figures when it is installed in this file."""
    if TOMBSTONE_TABLE not in tables:
        return None
    from gatewayscope.guard import sqlite as sqlite_guard

    return sqlite_guard.read_guard(conn)


def current_weight_version(conn: sqlite3.Connection, *, busy_timeout: float = 10.0,
                           watch: StatementWatch | None = None) -> int | None:
    """The newest weight version the store's recent traces carry (upstream gateways record one)."""
    rows, _ = fetch_all(
        conn,
        "SELECT MAX(json_extract(data, '$.weight_version')) FROM "
        "(SELECT data FROM traces ORDER BY created_at DESC LIMIT 200)",
        busy_timeout=busy_timeout, watch=watch,
    )
    value = rows[0][0] if rows else None
    return int(value) if isinstance(value, (int, float)) else None


def _iter_by_session(conn: sqlite3.Connection, sql: str, session_ids: list[str], *, seconds: float,
                     busy_timeout: float, probe: WriterProbe | None,
                     watch: StatementWatch | None) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``sql`` (first column: the session id, rows ordered by it) for ``session_ids``, in
    statements of at most ``seconds`` of lock each (see :func:`fetch_for`).

    When a statement stops early every session before the last one read is whole; the next statement
    starts again at that last session.
    """
    todo = sorted(set(session_ids))  # Python's str order is SQLite's BINARY order (UTF-8 bytes)
    start = 0
    while start < len(todo):  # bounded: every turn moves ``start`` forward
        batch = todo[start:start + TRACE_BATCH]
        rows, ended = fetch_for(conn, sql.format(placeholders=",".join("?" * len(batch))), batch, seconds=seconds,
                                busy_timeout=busy_timeout, probe=probe, watch=watch, chunk=TRACE_CHUNK)
        if ended:
            yield rows
            start += len(batch)
            continue
        last = rows[-1][0]
        whole = [row for row in rows if row[0] != last]
        if whole:
            yield whole
            start = bisect.bisect_left(todo, last, start)
        else:  # one session's rows filled the whole statement: read that session alone, to its end
            rows, _ = fetch_all(conn, sql.format(placeholders="?"), [last], busy_timeout=busy_timeout)
            yield rows
            start = bisect.bisect_right(todo, last, start)


def _iter_candidate_traces(conn: sqlite3.Connection, session_ids: list[str], *, seconds: float,
                           busy_timeout: float, probe: WriterProbe | None = None,
                           watch: StatementWatch | None = None) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of (session_id, trace_id, created_at, weight_version, prompt ids, prompt tokens, prompt chars,
    model) for every trace of ``session_ids``, in statements of at most ``seconds`` of lock each.

    First the traces' ids and rowids (``_TRACE_IDS_SQL``, by session), then their rows (``_TRACE_ROWS_SQL``)
    in rowid order; a statement that stops early is resumed after the last rowid it read. A trace whose
    rowid now holds another trace id (deleted and its rowid reused, or renumbered by a VACUUM, between the
    two steps) is looked up again by its id: found, it counts; gone, it is left out, as any trace deleted
    meanwhile is.
    """
    links: dict[int, list[tuple[str, str]]] = {}  # rowid -> [(session_id, trace_id)]: a trace may be shared
    for rows in _iter_by_session(conn, _TRACE_IDS_SQL, session_ids, seconds=seconds, busy_timeout=busy_timeout,
                                 probe=probe, watch=watch):
        for sid, trace_id, rowid in rows:
            links.setdefault(rowid, []).append((sid, trace_id))
    found: set[str] = set()
    for rows in _iter_trace_rows(conn, "rowid", sorted(links), seconds=seconds, busy_timeout=busy_timeout,
                                 probe=probe, watch=watch):
        matched = [(sid, trace_id, *values) for rowid, trace_id, *values in rows
                   for sid, expected in links[rowid] if trace_id == expected]
        found.update(row[1] for row in matched)
        yield matched
    # a trace not found under its rowid was deleted, or moved (VACUUM renumbers rowids): look it up by id
    by_id: dict[str, list[str]] = {}
    for pairs in links.values():
        for sid, trace_id in pairs:
            if trace_id not in found:
                by_id.setdefault(trace_id, []).append(sid)
    for rows in _iter_trace_rows(conn, "trace_id", sorted(by_id), seconds=seconds, busy_timeout=busy_timeout,
                                 probe=probe, watch=watch):
        yield [(sid, trace_id, *values) for _, trace_id, *values in rows for sid in by_id[trace_id]]


def _iter_trace_rows(conn: sqlite3.Connection, key: str, keys: list[Any], *, seconds: float, busy_timeout: float,
                     probe: WriterProbe | None, watch: StatementWatch | None) -> Iterator[list[tuple[Any, ...]]]:
    """``_TRACE_ROWS_SQL`` rows for the sorted ``keys`` of column ``key`` (``rowid`` or ``trace_id``), in
    statements of at most ``seconds`` of lock each; one that stops early is resumed after the last key read."""
    column = 0 if key == "rowid" else 1
    start = 0
    while start < len(keys):  # bounded: every turn moves ``start`` forward (a stopped statement read rows)
        batch = keys[start:start + TRACE_BATCH]
        sql = _TRACE_ROWS_SQL.format(key=key, placeholders=",".join("?" * len(batch)))
        rows, ended = fetch_for(conn, sql, batch, seconds=seconds, busy_timeout=busy_timeout, probe=probe,
                                watch=watch, chunk=TRACE_CHUNK)
        yield rows
        start = start + len(batch) if ended else bisect.bisect_right(keys, rows[-1][column], start)


def _sessions_frame(rows: list[tuple[Any, ...]]) -> pl.DataFrame:
    """One page as a SESSIONS_SCHEMA frame, built column by column (twice as fast as by rows)."""
    return pl.DataFrame([pl.Series(name, [row[i] for row in rows], dtype=dtype)
                         for i, (name, dtype) in enumerate(SESSIONS_SCHEMA.items())])


def read_trace_store_sqlite(target: Target, policy: Policy, *, now: float,
                            page_size: int = SESSION_PAGE) -> TraceStoreData:
    """Read the sessions and candidate traces of the SQLite store at ``target.path``.

    ``page_size`` caps the sessions of one page; a page also ends after ``STATEMENT_SECONDS`` of lock,
    and so do candidate-trace reads. ``target.timeout_seconds`` is how long one statement may wait for
    the lock before the read fails with StoreError.
    """
    assert target.path, "a SQLite trace-store target needs a path"
    with one_reader_per_file(target.path):
        return _read_trace_store_sqlite(target.path, target.timeout_seconds, policy, now=now, page_size=page_size)


def _read_trace_store_sqlite(path: str, wait: float, policy: Policy, *, now: float, page_size: int) -> TraceStoreData:
    descriptors = WriterProbe.open_descriptors() if WriterProbe.supported() else {}
    conn = open_read_only(path, busy_timeout=wait)
    watch: StatementWatch | None = None
    try:
        # our own statements poll for the lock (_start); the guard's reads keep SQLite's busy handler
        conn.execute("PRAGMA busy_timeout = 0")
        tables = check_trace_store(conn, path, busy_timeout=wait)
        probe = WriterProbe.for_new_descriptor(path, descriptors)  # SQLite opened the file by now
        watch = StatementWatch(conn)
        try:
            pages: list[pl.DataFrame] = []
            for rows in iter_session_pages(conn, page_size, busy_timeout=wait, probe=probe, watch=watch):
                # built between statements: the gateway commits meanwhile
                pages.append(_sessions_frame(rows))
            sessions = pl.concat(pages, rechunk=True) if pages else empty_frame(SESSIONS_SCHEMA)
            del pages
            conn.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
            guard = read_guard_stats(conn, tables)
            conn.execute("PRAGMA busy_timeout = 0")
            tombstoned = (_tombstoned_sessions(conn, min(page_size, TOMBSTONE_PAGE), busy_timeout=wait, watch=watch)
                          if guard and guard.tombstones else [])
            weight = current_weight_version(conn, busy_timeout=wait, watch=watch)

            idle_before = now - policy.orphan_idle_seconds
            candidates = sessions.filter(
                (pl.col("trace_count") == 1) & (pl.col("last_trace_at") <= idle_before)
            )["session_id"].to_list()
            if tombstoned:
                seen = set(candidates)
                candidates.extend(sid for sid in tombstoned if sid not in seen)
            trace_rows: list[tuple[Any, ...]] = []
            for rows in _iter_candidate_traces(conn, candidates, seconds=STATEMENT_SECONDS, busy_timeout=wait,
                                               probe=probe, watch=watch):
                for (sid, trace_id, created, weight_v, n_ids, n_prompt, chars, model) in rows:
                    prompt_tokens = n_ids if n_ids else n_prompt
                    trace_rows.append((
                        sid, trace_id, created,
                        int(weight_v) if isinstance(weight_v, (int, float)) else None,
                        int(prompt_tokens) if isinstance(prompt_tokens, (int, float)) else None,
                        chars, model if isinstance(model, str) else None,
                    ))
        except sqlite3.Error as err:
            raise _store_error(path, err) from None
    finally:
        if watch is not None:
            watch.close()
        conn.close()
    return TraceStoreData(
        sessions=sessions,
        candidate_traces=frame_from_rows(trace_rows, CANDIDATE_TRACES_SCHEMA),
        tombstoned_ids=tombstoned,
        current_weight_version=weight,
        guard=guard,
        capabilities={"weight_version": weight is not None, "batch_delete": False, "guard": guard is not None},
        access="sqlite",
    )
