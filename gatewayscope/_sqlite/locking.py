"""Taking a trace store's lock without costing the gateway a write.

The rLLM gateway writes a trace with one connection that may hold a read statement open when it starts its
write, and it waits for the file's lock in SQLite's default busy handler (20 s). Everything gatewayscope does
on a live store keeps these rules:

* **Poll finely, don't sleep in the busy handler.** Its sleeps grow to 100 ms, and against a gateway that
  commits back-to-back each of them lands in the next commit: a reader or writer that waits that way starves.
  :func:`retry_while_locked` tries again every fraction of a millisecond instead (a failed try holds nothing).
* **Look at the other processes' locks through SQLite's own descriptor.** ``fcntl(F_GETLK)`` says whether
  another process holds one of SQLite's lock bytes without taking any (:class:`WriterProbe`: a writer waiting
  to commit; :class:`LockTable`: any lock at all). It asks through the descriptor SQLite opened for our own
  connection, found by the file's identity (:func:`new_descriptor`): closing a descriptor of our own would drop
  every lock this process holds on the file, the connection's included. POSIX locks are per process, so our
  own locks never show; off Linux, and where the descriptor is not found, the probes see nothing and fine
  polling alone remains.
* **Reads of one file take turns in this process** (:func:`one_reader_per_file`).
* **Write exclusively, into silence, then let the gateway go next** (:class:`Writer`). In WAL mode "silence"
  is no open read transaction in another process, and none may begin until our commit is visible
  (:class:`ReadMarkSeal`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: SQLite's default busy handler sleeps (ms) in turn, then 100 ms each time (sqliteDefaultBusyCallback)
BUSY_HANDLER_SLEEPS_MS = (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100)
#: how much later than a waiting writer's retry our next transaction may start
YIELD_MARGIN_SECONDS = 0.002
#: the longest sleep between two tries for the write lock (see Writer)
WRITE_POLL_SECONDS = 0.0005
#: looks at the lock table slower than this, PROBE_SLOW_LOOKS in a row, turn a WriterProbe off (a network
#: filesystem asks its lock server every time; one slow look is just this process being preempted)
PROBE_SLOW_SECONDS = 0.001
PROBE_SLOW_LOOKS = 3


def is_busy(err: sqlite3.Error) -> bool:
    """Whether ``err`` is SQLite's "database is locked" or "busy" (someone else holds the lock)."""
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return (code & 0xFF) in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED and their extended codes
    text = str(err)
    return "locked" in text or "busy" in text


def poll_interval(waited: float) -> float:
    """Sleep between lock attempts: fine while a commit is likely to end any moment, coarser later.

    >>> poll_interval(0.01), poll_interval(0.5), poll_interval(3.0)
    (0.00025, 0.001, 0.01)
    """
    if waited < 0.05:
        return 0.00025
    return 0.001 if waited < 1.0 else 0.01


def retry_while_locked(attempt: Callable[[], T], busy_timeout: float, *, max_interval: float = 0.01) -> T:
    """``attempt()``, tried again while it fails with "database is locked" or "busy", polling finely (never
    sleeping longer than ``max_interval``) until the lock has stayed out of reach for ``busy_timeout``
    seconds; then the last such error is raised (``busy_timeout`` 0: one try). Run the connection with
    ``PRAGMA busy_timeout = 0`` so that SQLite's own growing sleeps do not come first."""
    first_try = time.monotonic()
    while True:  # bounded by busy_timeout
        try:
            return attempt()
        except sqlite3.OperationalError as err:
            waited = time.monotonic() - first_try
            if not is_busy(err) or waited >= busy_timeout:
                raise
        time.sleep(min(max_interval, poll_interval(waited)))


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


# -- the other processes' locks ----------------------------------------------------------------------------------

#: Linux's struct flock on 64-bit machines: l_type, l_whence, l_start, l_len, l_pid (and padding)
_FLOCK = "hhqqi4x"


def probes_supported() -> bool:
    """Whether the lock probes can look at all: Linux, with the struct flock they pack."""
    return sys.platform.startswith("linux") and struct.calcsize(_FLOCK) == 32


def _flock(lock_type: int, start: int, length: int) -> bytes:
    """A struct flock for ``fcntl`` on ``length`` bytes from ``start``."""
    return struct.pack(_FLOCK, lock_type, os.SEEK_SET, start, length, 0)


def _conflicting(answer: bytes) -> bool:
    """Whether ``F_GETLK``'s answer names a lock another process holds (an unlocked answer: none)."""
    return bool(struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK)


def _same_file(fd: int | None, identity: tuple[int, int] | None) -> bool:
    """Whether descriptor ``fd`` still refers to the file of ``identity`` (device, inode)."""
    if fd is None:
        return False
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == identity


def open_descriptors() -> dict[int, tuple[int, int]]:
    """This process's descriptors and the (device, inode) each refers to (Linux's /proc/self/fd)."""
    found: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                info = os.stat(int(name))
                found[int(name)] = (info.st_dev, info.st_ino)
    return found


def new_descriptor(path: str | Path, before: dict[int, tuple[int, int]]) -> tuple[int, tuple[int, int]] | None:
    """The descriptor of the file at ``path`` opened since ``before`` was taken (:func:`open_descriptors`), and
    the file's (device, inode); None off Linux or when there is none.

    Matched by identity, not number: a number in ``before`` may since have been closed and reused for the file.
    Take ``before`` just before opening a connection and call this after its first statement (SQLite has
    opened the file by then), so the descriptor is that connection's, never another's that may close meanwhile.
    """
    if not probes_supported():
        return None
    try:
        info = os.stat(Path(path).expanduser())
    except OSError:
        return None
    identity = (info.st_dev, info.st_ino)
    for fd, refers_to in open_descriptors().items():
        if refers_to == identity and before.get(fd) != identity:
            return fd, identity
    return None


class LockProbe:
    """Asks ``fcntl(F_GETLK)`` whether another process holds a lock that conflicts with ``lock_type`` on
    ``length`` bytes from SQLite's PENDING byte, through the descriptor ``fd`` (see the module docstring).

    Off when ``fd`` is None, and it turns itself off when the descriptor goes away: then nothing is ever held.
    """

    #: SQLite's lock bytes start at 1 GiB (sqlite3PendingByte): PENDING, RESERVED, then the 510-byte SHARED range
    PENDING_BYTE = 0x40000000

    def __init__(self, fd: int | None, identity: tuple[int, int] | None = None, *, lock_type: int,
                 length: int) -> None:
        self.fd = fd
        self.identity = identity
        self._query = _flock(lock_type, self.PENDING_BYTE, length)

    def still_valid(self) -> bool:
        """Whether the descriptor still refers to the file it was found for (it turns the probe off if not)."""
        if not _same_file(self.fd, self.identity):
            self.fd = None
        return self.fd is not None

    def held(self) -> bool:
        """Whether another process holds a conflicting lock now."""
        if self.fd is None:
            return False
        try:
            answer = fcntl.fcntl(self.fd, fcntl.F_GETLK, self._query)
        except OSError:  # the descriptor went away: stop asking
            self.fd = None
            return False
        return _conflicting(answer)


class WriterProbe(LockProbe):
    """Tells whether a writer in another process is waiting to commit to the store file.

    SQLite's unix locking has a writer that wants to commit take a write lock on the file's PENDING byte and
    keep it while it waits for the readers' shared locks to go; a read lock asked for on that byte conflicts
    with nothing else. A writer in this same process is never seen (a reader's time bound still holds for it).
    The probe turns itself off (:meth:`writer_waiting` is then always False) off Linux, when the descriptor is
    not found or no longer refers to the file, and when looks are slow.
    """

    def __init__(self, fd: int | None, identity: tuple[int, int] | None = None) -> None:
        super().__init__(fd, identity, lock_type=fcntl.F_RDLCK, length=1)
        self._slow_looks = 0

    @classmethod
    def for_new_descriptor(cls, path: str | Path, before: dict[int, tuple[int, int]]) -> WriterProbe:
        """A probe on the descriptor of ``path`` opened since ``before`` (see :func:`new_descriptor`)."""
        found = new_descriptor(path, before)
        return cls(*found) if found is not None else cls(None)

    def writer_waiting(self) -> bool:
        """True while another process holds the PENDING byte: a writer waits for the readers to finish."""
        if self.fd is None:
            return False
        asked = time.monotonic()
        waiting = self.held()
        if self.fd is not None:
            self._slow_looks = self._slow_looks + 1 if time.monotonic() - asked > PROBE_SLOW_SECONDS else 0
            if self._slow_looks >= PROBE_SLOW_LOOKS:
                self.fd = None  # this answer still counts; no more looks
        return waiting


class LockTable(LockProbe):
    """Whether another process holds any SQLite lock on the file (PENDING, RESERVED or a SHARED lock).

    A write lock asked for on every lock byte conflicts with all of them. Off (:meth:`busy` always False) off
    Linux and when the descriptor is not found.
    """

    #: PENDING, RESERVED and the 510-byte SHARED range
    LOCK_BYTES = 512

    def __init__(self, fd: int | None, identity: tuple[int, int] | None = None) -> None:
        super().__init__(fd, identity, lock_type=fcntl.F_WRLCK, length=self.LOCK_BYTES)

    @classmethod
    def for_new_descriptor(cls, path: str | Path, before: dict[int, tuple[int, int]]) -> LockTable:
        """The table seen through the descriptor of ``path`` opened since ``before`` (see :func:`new_descriptor`)."""
        found = new_descriptor(path, before)
        return cls(*found) if found is not None else cls(None)

    def busy(self) -> bool:
        """True while another process holds any lock on the file."""
        return self.held()


# -- WAL: the read marks of the -shm file ----------------------------------------------------------------------------

#: SQLite's WAL-index (``-shm``) lock bytes (wal.c): WAL_WRITE_LOCK 120, WAL_CKPT_LOCK 121, WAL_RECOVER_LOCK 122,
#: WAL_READ_LOCK(n) = 123 + n for the five read marks; every connection holds the DMS byte 128 shared while open
WAL_READ_LOCK_FIRST = 123
WAL_READ_LOCKS = 5
WAL_DMS_LOCK = 128
class ReadMarkSeal:
    """Holds every read mark of a WAL store's ``-shm`` file, so that no other process is in a read transaction
    and none can begin one.

    A WAL reader holds a shared lock on one read-mark byte for as long as its read transaction lasts, and takes
    it when the transaction begins. :meth:`seal` asks ``fcntl(F_SETLK)`` for a write lock on all five at once:
    the kernel grants it only when no other process holds any of them (it never waits), and while it is held
    another process's reader cannot begin (SQLite retries it with short sleeps, up to about 10 s). Our own
    connection's shared lock on its mark is merged into ours (POSIX locks are per process).

    SQLite itself drops and retakes this process's read-mark locks in one case: a commit whose read stands on
    read mark 0 (the WAL was fully checkpointed when the read began) restarts the WAL first, and that opens the
    seal before the commit is visible. :meth:`keep_off_mark_zero` prevents it: an open-file-description lock on
    mark 0 conflicts with this process's own POSIX locks too, so a read that begins under it takes another mark.

    The locks are taken through SQLite's own descriptor of the ``-shm`` file, found by its identity and never
    closed (closing any descriptor of it would drop every lock this process holds on it). Off Linux, and when
    the descriptor is not found, :attr:`fd` is None and nothing is sealed.
    """

    def __init__(self, fd: int | None, identity: tuple[int, int] | None = None) -> None:
        self.fd = fd
        self.identity = identity

    @classmethod
    def for_store(cls, path: str | Path) -> ReadMarkSeal:
        """The seal through this process's descriptor of ``path``'s ``-shm`` file (SQLite opens one per process
        and keeps it while any connection to the file is open: call this while one is)."""
        if not probes_supported() or not hasattr(fcntl, "F_OFD_SETLK"):
            return cls(None)
        try:
            # beside the file itself, as SQLite opens it (connect() resolves links)
            info = os.stat(f"{Path(path).expanduser().resolve()}-shm")
        except OSError:
            return cls(None)
        identity = (info.st_dev, info.st_ino)
        for fd, refers_to in open_descriptors().items():
            if refers_to == identity:
                return cls(fd, identity)
        return cls(None)

    def _still_valid(self) -> bool:
        if not _same_file(self.fd, self.identity):
            self.fd = None
        return self.fd is not None

    def _lock(self, command: int, lock_type: int, start: int, length: int) -> bytes:
        assert self.fd is not None
        return fcntl.fcntl(self.fd, command, _flock(lock_type, start, length))

    def seal(self) -> bool:
        """Take the write lock on every read mark if no other process holds one; False (nothing taken) if one
        does. A descriptor that went away turns the seal off (:attr:`fd` None) and also answers False."""
        if not self._still_valid():
            return False
        try:
            self._lock(fcntl.F_SETLK, fcntl.F_WRLCK, WAL_READ_LOCK_FIRST, WAL_READ_LOCKS)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                self.fd = None
            return False
        return True

    def release(self) -> None:
        """Drop this process's locks on the read marks (call once our connection's transaction has ended)."""
        if self._still_valid():
            with contextlib.suppress(OSError):
                self._lock(fcntl.F_SETLK, fcntl.F_UNLCK, WAL_READ_LOCK_FIRST, WAL_READ_LOCKS)

    def others_connected(self) -> bool:
        """Whether another process has the store open (it holds the DMS byte shared)."""
        if not self._still_valid():
            return False
        try:
            answer = self._lock(fcntl.F_GETLK, fcntl.F_WRLCK, WAL_DMS_LOCK, 1)
        except OSError:
            return False
        return _conflicting(answer)

    def keep_off_mark_zero(self) -> bool:
        """Take an open-file-description write lock on read mark 0, so that a read our connection begins now
        stands on another mark; False (nothing taken) while any process, this one included, holds mark 0."""
        if not self._still_valid():
            return False
        try:
            self._lock(fcntl.F_OFD_SETLK, fcntl.F_WRLCK, WAL_READ_LOCK_FIRST, 1)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                self.fd = None
            return False
        return True

    def allow_mark_zero(self) -> None:
        """Drop the lock :meth:`keep_off_mark_zero` took (this process's POSIX locks are not touched)."""
        if self._still_valid():
            with contextlib.suppress(OSError):
                self._lock(fcntl.F_OFD_SETLK, fcntl.F_UNLCK, WAL_READ_LOCK_FIRST, 1)


# -- reads of one file take turns ----------------------------------------------------------------------------------

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
    lock = file_lock(path)
    if lock is None:
        yield
        return
    with lock:
        yield


def file_lock(path: str | Path) -> threading.Lock | None:
    """The lock reads (and WAL writes) of the file at ``path`` take turns on in this process; None when the
    path cannot be stat'ed."""
    try:
        info = os.stat(Path(path).expanduser())
    except OSError:
        return None
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault((info.st_dev, info.st_ino), threading.Lock())


# -- the one way to write ---------------------------------------------------------------------------------------------


class LockTimeout(sqlite3.OperationalError):
    """The write lock stayed out of reach for the whole busy timeout; nothing was written."""


class Transaction:
    """An open write transaction; ``rollback_only()`` ends it without writing anything."""

    def __init__(self) -> None:
        self.rollback = False

    def rollback_only(self) -> None:
        self.rollback = True


class Writer:
    """Write transactions on one connection to a live trace store, each taken so that it costs the gateway
    no write.

    * **Exclusive, not immediate.** The 0.1.0 gateway runs its persists and its reads concurrently on one
      connection, so it may hold a read statement open when it starts a write. If another connection then holds
      the write (RESERVED) lock, SQLite fails the gateway's write at once with "database is locked" instead of
      letting it wait (waiting could deadlock), and that trace is lost. An exclusive transaction only starts
      when no statement of the gateway is open, and while it runs every gateway statement waits in the
      gateway's busy handler instead.
    * **Only into silence.** ``BEGIN EXCLUSIVE`` is tried only while :class:`LockTable` sees no lock of another
      process on the file (where it can see: on Linux). Each try is immediate and they come every quarter to
      half millisecond (:func:`retry_while_locked`).
    * **In WAL mode, silence is sealed.** The upstream gateway's write from an open read fails at once when
      another connection holds the WAL write lock, or committed since that read began (SQLITE_BUSY_SNAPSHOT).
      So a WAL transaction opens a read, then takes :class:`ReadMarkSeal` (granted only while no other process
      is in a read transaction, and keeping any from beginning), and only then upgrades its read to the write
      lock (``BEGIN IMMEDIATE`` while the read is open); the seal is dropped once the transaction has ended.
      Every read the gateway begins meanwhile waits and then sees our commit; every write waits for it. Our
      read is kept off read mark 0 (:meth:`ReadMarkSeal.keep_off_mark_zero`), and our connection never
      checkpoints (the gateway does, and the last connection to close): either would make SQLite drop the
      seal's locks before our commit is visible. Reads of the same file by this process wait too
      (:func:`file_lock`): their read marks are this process's, and the seal would take them over.
    * **The gateway goes next.** After each transaction :attr:`pause` is how long to stay off the lock
      (:func:`yield_seconds`): the caller sleeps it before its next transaction, so a write that waited on us
      gets the lock first.
    * **Stop, don't press on.** When the lock stays out of reach for ``busy_timeout`` seconds,
      :class:`LockTimeout` (a "database is locked" error) is raised and nothing is written.
    """

    def __init__(self, conn: sqlite3.Connection, *, busy_timeout: float, locks: LockTable | None = None,
                 wal: bool = False, path: str | Path | None = None) -> None:
        self.conn = conn
        self.busy_timeout = busy_timeout
        self.locks = locks if locks is not None else LockTable(None)
        self.wal = wal
        self.path = path
        #: the WAL read marks, found once our connection has the ``-shm`` file open (None: not looked yet)
        self.seal: ReadMarkSeal | None = None
        #: how long to stay off the lock after the last transaction
        self.pause = 0.0
        #: how many times a transaction waited for the other processes' locks to clear, and the longest wait
        self.lock_waits = 0
        self.longest_lock_wait = 0.0

    @classmethod
    def for_connection(cls, conn: sqlite3.Connection, path: str | Path, before: dict[int, tuple[int, int]], *,
                       busy_timeout: float) -> Writer:
        """A writer on ``conn``, a connection to ``path`` opened after ``before`` was taken
        (:func:`open_descriptors`). Reads the journal mode, by fine polling: in WAL mode no lock table is used,
        the read marks are sealed instead, and the connection does not checkpoint."""
        def journal_mode() -> str:
            return str(conn.execute("PRAGMA journal_mode").fetchone()[0])

        wal = _without_busy_handler(conn, lambda: retry_while_locked(journal_mode, busy_timeout)).lower() == "wal"
        if wal:
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        locks = LockTable(None) if wal else LockTable.for_new_descriptor(path, before)
        return cls(conn, busy_timeout=busy_timeout, locks=locks, wal=wal, path=path)

    def _begin(self) -> None:
        """``BEGIN EXCLUSIVE``, tried only while no other process holds a lock on the file."""
        def attempt() -> None:
            if self.locks.busy():
                raise LockTimeout("database is locked")
            self.conn.execute("BEGIN EXCLUSIVE")

        self._polled(attempt)

    def _begin_sealed(self) -> ReadMarkSeal | None:
        """In WAL mode: a read (kept off read mark 0), the seal, then the write lock (see the class docstring);
        returns the seal held (None where there is none to take: then this is polling alone)."""
        held: list[ReadMarkSeal] = []
        if self.seal is None and self.path is not None:
            retry_while_locked(lambda: self.conn.execute("SELECT count(*) FROM sqlite_master").fetchall(),
                               self.busy_timeout)  # SQLite opens the -shm file for a first read
            self.seal = ReadMarkSeal.for_store(self.path)
        seal = self.seal if self.seal is not None and self.seal.fd is not None else None

        def attempt() -> None:
            off_zero = sealed = False
            reading: sqlite3.Cursor | None = None
            try:
                if seal is not None:
                    off_zero = seal.keep_off_mark_zero()
                    if not off_zero:
                        raise LockTimeout("database is locked")
                reading = self.conn.execute("SELECT count(*) FROM sqlite_master")  # our read stays open
                if seal is not None:
                    seal.allow_mark_zero()
                    off_zero = False
                    sealed = seal.seal()
                    if not sealed:
                        raise LockTimeout("database is locked")
                self.conn.execute("BEGIN IMMEDIATE")  # upgrades the open read: fails if anyone committed since
            except BaseException:
                if reading is not None:
                    reading.close()  # our read ends before the seal is dropped
                if seal is not None and off_zero:
                    seal.allow_mark_zero()
                if seal is not None and sealed:
                    seal.release()
                raise
            assert reading is not None
            reading.close()
            if seal is not None:
                held.append(seal)

        self._polled(attempt)
        return held[0] if held else None

    def _polled(self, attempt: Callable[[], None]) -> None:
        """``attempt()`` by fine polling without the busy handler; counts the waits; LockTimeout at the end."""
        tries = 0

        def counted() -> None:
            nonlocal tries
            tries += 1
            attempt()

        started = time.monotonic()
        try:
            _without_busy_handler(self.conn, lambda: retry_while_locked(counted, self.busy_timeout,
                                                                        max_interval=WRITE_POLL_SECONDS))
        except sqlite3.OperationalError as err:
            if is_busy(err):
                raise LockTimeout(str(err)) from None
            raise
        if tries > 1:
            self.lock_waits += 1
            self.longest_lock_wait = max(self.longest_lock_wait, time.monotonic() - started)

    @contextlib.contextmanager
    def _this_process_quiet(self) -> Iterator[None]:
        """In WAL mode, the turn of this process's reads of the file (see the class docstring)."""
        lock = file_lock(self.path) if self.wal and self.path is not None else None
        if lock is None:
            yield
            return
        if not lock.acquire(timeout=max(self.busy_timeout, 0.001)):
            raise LockTimeout("database is locked (by a read of this process)")
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """``BEGIN EXCLUSIVE`` (``BEGIN IMMEDIATE`` under the seal in WAL mode) ... ``COMMIT`` (or ``ROLLBACK``
        after ``rollback_only()`` or an error), taken by the rules above; sets :attr:`pause` when it ends."""
        with self._this_process_quiet():
            sealed: ReadMarkSeal | None = None
            if self.wal:
                sealed = self._begin_sealed()
            else:
                self._begin()
            held_from = time.monotonic()
            txn = Transaction()
            try:
                yield txn
                self.conn.execute("ROLLBACK" if txn.rollback else "COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise
            finally:
                if sealed is not None:
                    sealed.release()
                self.pause = yield_seconds(time.monotonic() - held_from)


def _without_busy_handler(conn: sqlite3.Connection, run: Callable[[], T]) -> T:
    """``run()`` with the connection's busy handler off (fine polling decides the waits), then set back."""
    (busy_ms,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        return run()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
