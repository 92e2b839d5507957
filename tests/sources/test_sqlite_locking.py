"""The one write path on a live trace store (gatewayscope._sqlite.locking.Writer), on plain SQLite files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gatewayscope._sqlite.locking import LockTimeout, Writer, open_descriptors
from gatewayscope._sqlite.open import connect


def make_file(path: Path, *, wal: bool = False) -> None:
    with sqlite3.connect(path) as conn:
        if wal:
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x INTEGER)")
    conn.close()


def rows(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        found = [row[0] for row in conn.execute("SELECT x FROM t ORDER BY x")]
    conn.close()
    return found


def writer_on(path: Path, *, busy_timeout: float = 5.0) -> tuple[sqlite3.Connection, Writer]:
    before = open_descriptors()
    conn = connect(path, readonly=False, busy_timeout=busy_timeout)
    return conn, Writer.for_connection(conn, path, before, busy_timeout=busy_timeout)


def test_a_transaction_commits_and_rolls_back_as_asked(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    make_file(db)
    conn, writer = writer_on(db)
    try:
        with writer.transaction():
            conn.execute("INSERT INTO t VALUES (1)")
        with writer.transaction() as txn:
            conn.execute("INSERT INTO t VALUES (2)")
            txn.rollback_only()
        with pytest.raises(RuntimeError), writer.transaction():
            conn.execute("INSERT INTO t VALUES (3)")
            raise RuntimeError("boom")
        assert not conn.in_transaction
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000, "the connection's own handler is back"
        assert 0.002 < writer.pause <= 0.102, "past the gateway's next busy-handler retry, at most its longest sleep"
    finally:
        conn.close()
    assert rows(db) == [1]


def test_a_lock_that_stays_out_of_reach_ends_in_lock_timeout_and_nothing_is_written(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    make_file(db)
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    conn, writer = writer_on(db, busy_timeout=0.2)
    try:
        started = time.monotonic()
        with pytest.raises(LockTimeout, match="database is locked"), writer.transaction():
            conn.execute("INSERT INTO t VALUES (1)")
        assert 0.2 <= time.monotonic() - started < 5
        # released while the writer waits: it goes through
        timer = threading.Timer(0.2, lambda: holder.execute("ROLLBACK"))
        timer.start()
        writer.busy_timeout = 30
        with writer.transaction():
            conn.execute("INSERT INTO t VALUES (2)")
        timer.join()
        assert writer.lock_waits == 1 and writer.longest_lock_wait >= 0.1
    finally:
        conn.close()
        holder.close()
    assert rows(db) == [2]


def test_in_wal_mode_the_writer_polls_without_a_lock_table(tmp_path: Path) -> None:
    db = tmp_path / "wal.db"
    make_file(db, wal=True)
    conn, writer = writer_on(db)
    try:
        assert writer.wal and writer.locks.fd is None
        with writer.transaction():
            conn.execute("INSERT INTO t VALUES (7)")
    finally:
        conn.close()
    assert rows(db) == [7]


@pytest.mark.e2e  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the lock table reads Linux's struct flock")
def test_the_writer_begins_only_once_no_other_process_holds_a_lock(tmp_path: Path) -> None:
    """A reader in another process (the gateway mid-read) holds a shared lock: the writer does not even try
    until it is gone, so it never holds RESERVED while the gateway's write could meet it."""
    db = tmp_path / "a.db"
    make_file(db)
    reader = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN'); "
        "c.execute('SELECT * FROM t').fetchall(); print('reading', flush=True); time.sleep(0.5)"),
        str(db)], stdout=subprocess.PIPE, text=True)
    conn, writer = writer_on(db)
    try:
        assert writer.locks.fd is not None
        assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
        reading_since = time.monotonic()
        assert writer.locks.busy()
        with writer.transaction():
            assert time.monotonic() - reading_since > 0.3, "the transaction began while the reader held its lock"
            conn.execute("INSERT INTO t VALUES (1)")
        assert writer.lock_waits == 1
    finally:
        conn.close()
        if reader.poll() is None:
            reader.kill()
        reader.wait()
    assert rows(db) == [1]


# -- WAL mode: the read marks are sealed --------------------------------------------------------------------------

#: a process that holds a WAL read open, then writes from it when told (the upstream gateway's one connection
#: with a read statement open when a persist comes): "wrote", or "lost <error>" when SQLite refused the write
_READ_THEN_WRITE = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=20)\n"
    "c.execute('BEGIN'); c.execute('SELECT count(*) FROM t').fetchall()\n"
    "print('reading', flush=True); sys.stdin.readline()\n"
    "try:\n"
    "    c.execute('INSERT INTO t VALUES (100)'); c.execute('COMMIT'); print('wrote', flush=True)\n"
    "except sqlite3.OperationalError as err:\n"
    "    print('lost', err, flush=True)\n"
)
#: a process that begins a read when started, then writes from it: the count it read, then "wrote" or "lost"
_BEGIN_READ_THEN_WRITE = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=20)\n"
    "print('starting', flush=True)\n"
    "c.execute('BEGIN'); print(c.execute('SELECT count(*) FROM t').fetchone()[0], flush=True)\n"
    "try:\n"
    "    c.execute('INSERT INTO t VALUES (100)'); c.execute('COMMIT'); print('wrote', flush=True)\n"
    "except sqlite3.OperationalError as err:\n"
    "    print('lost', err, flush=True)\n"
)


def _python(script: str, db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _stop(proc: subprocess.Popen[str]) -> str:
    """The rest of the process's output once it ended (killed if it did not within 30 s)."""
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


@pytest.mark.e2e  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the seal packs Linux's struct flock")
@pytest.mark.parametrize("named", ["by-its-path", "through-a-symlink"])
def test_in_wal_mode_the_writer_waits_for_another_process_read_so_its_write_from_that_read_goes_through(
        tmp_path: Path, named: str) -> None:
    """Another process's read is open: committing now would fail its next write from that read at once
    (SQLITE_BUSY_SNAPSHOT). The writer waits until the read has ended; the other process's write goes through.
    A store named through a symlink is sealed too (SQLite's -shm lies beside the file the link points to)."""
    (tmp_path / "real").mkdir()
    db = tmp_path / "real" / "wal.db"
    make_file(db, wal=True)
    name = db
    if named == "through-a-symlink":
        name = tmp_path / "link.db"
        name.symlink_to(db)
    other = _python(_READ_THEN_WRITE, db)
    conn, writer = writer_on(name, busy_timeout=30)
    done = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with writer.transaction():
                conn.execute("INSERT INTO t VALUES (1)")
        except BaseException as err:
            failures.append(err)
        done.set()

    thread = threading.Thread(target=write)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "reading"
        thread.start()
        assert not done.wait(0.3), "the writer committed while another process's read was open"
        assert other.stdin is not None
        other.stdin.write("go\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "wrote"
        assert done.wait(30) and failures == []
        assert writer.lock_waits == 1
    finally:
        thread.join(timeout=30)
        out = _stop(other)
        conn.close()
    assert out == "" and rows(db) == [1, 100]


@pytest.mark.e2e  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the seal packs Linux's struct flock")
def test_in_wal_mode_no_read_of_another_process_begins_during_the_transaction(tmp_path: Path) -> None:
    """A read another process begins while the transaction is open waits for its commit and sees it, so a
    write from that read goes through (without the seal it reads the old state and its write fails at once)."""
    db = tmp_path / "wal.db"
    make_file(db, wal=True)
    conn, writer = writer_on(db)
    other: subprocess.Popen[str] | None = None
    try:
        with writer.transaction():
            conn.execute("INSERT INTO t VALUES (1)")
            other = _python(_BEGIN_READ_THEN_WRITE, db)
            assert other.stdout is not None and other.stdout.readline().strip() == "starting"
            time.sleep(0.3)  # the other process tries to begin its read meanwhile
        assert other.stdout.readline().strip() == "1", "the other process's read began before our commit"
        assert other.stdout.readline().strip() == "wrote"
    finally:
        out = _stop(other) if other is not None else ""
        conn.close()
    assert out == "" and rows(db) == [1, 100]


@pytest.mark.e2e  # starts a process
def test_the_seal_is_refused_while_another_process_reads(tmp_path: Path) -> None:
    """seal and keep_off_mark_zero are granted only while no other process is in a read (on a fully checkpointed
    WAL its read stands on mark 0); others_connected sees another process's connection."""
    from gatewayscope._sqlite.locking import ReadMarkSeal

    db = tmp_path / "wal.db"
    make_file(db, wal=True)
    conn = connect(db, readonly=False, busy_timeout=5)
    conn.execute("SELECT count(*) FROM t").fetchall()
    seal = ReadMarkSeal.for_store(db)
    other = _python(_READ_THEN_WRITE, db)
    try:
        if not sys.platform.startswith("linux"):
            assert seal.fd is None and not seal.seal()
            return
        assert seal.fd is not None
        assert other.stdout is not None and other.stdout.readline().strip() == "reading"
        assert seal.others_connected()
        assert not seal.seal(), "sealed while another process's read was open"
        assert not seal.keep_off_mark_zero(), "the other process reads on mark 0 (the WAL is checkpointed)"
        assert other.stdin is not None
        other.stdin.write("go\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "wrote"
        assert _stop(other) == ""
        assert not seal.others_connected()
        assert seal.seal()
        assert not seal.keep_off_mark_zero(), "an open-file-description lock conflicts with our own POSIX lock"
        seal.release()
        assert seal.keep_off_mark_zero()
        seal.allow_mark_zero()
    finally:
        _stop(other)
        conn.close()


def test_in_wal_mode_a_read_of_this_process_holds_the_writer_off(tmp_path: Path) -> None:
    """This process's read of the same file would lose its read mark to our seal: the writer waits for it,
    and ends in LockTimeout (nothing written) when it lasts the whole busy timeout."""
    from gatewayscope._sqlite.locking import one_reader_per_file

    db = tmp_path / "wal.db"
    make_file(db, wal=True)
    conn, writer = writer_on(db, busy_timeout=0.2)
    try:
        with one_reader_per_file(str(db)), pytest.raises(LockTimeout), writer.transaction():
            conn.execute("INSERT INTO t VALUES (1)")
        with writer.transaction():
            conn.execute("INSERT INTO t VALUES (2)")
    finally:
        conn.close()
    assert rows(db) == [2]


#: a process that, until its stdin closes (at most 100,000 rounds), reads and then writes from that read, as
#: the upstream gateway's one connection does; prints how many writes it made and how many SQLite refused
#: (two of them would refuse each other's: one gateway runs at a time)
_READERS_WRITING = (
    "import sqlite3, sys, threading\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=20)\n"
    "stop = threading.Event()\n"
    "threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()\n"
    "print('running', flush=True)\n"
    "wrote = lost = 0\n"
    "for n in range(100_000):\n"
    "    if stop.is_set():\n"
    "        break\n"
    "    c.execute('BEGIN'); c.execute('SELECT count(*) FROM t').fetchall()\n"
    "    try:\n"
    "        c.execute('INSERT INTO t VALUES (-1)'); c.execute('COMMIT'); wrote += 1\n"
    "    except sqlite3.OperationalError:\n"
    "        c.execute('ROLLBACK'); lost += 1\n"
    "print(wrote, lost, flush=True)\n"
)


@pytest.mark.e2e  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the seal packs Linux's struct flock")
def test_in_wal_mode_many_transactions_cost_a_busy_reading_writer_nothing(tmp_path: Path) -> None:
    """A process reads and writes from its reads back to back (and another only reads) while the writer commits
    200 transactions: none of its writes is refused (without the seal most of them are)."""
    db = tmp_path / "wal.db"
    make_file(db, wal=True)
    others = [_python(_READERS_WRITING, db), _python(_READERS_WRITING.replace("INSERT INTO t VALUES (-1)", "SELECT 1"),
                                                     db)]
    conn, writer = writer_on(db, busy_timeout=30)
    try:
        for other in others:
            assert other.stdout is not None and other.stdout.readline().strip() == "running"
        for n in range(200):
            with writer.transaction():
                conn.execute("INSERT INTO t VALUES (?)", (n,))
    finally:
        conn.close()
        outputs = []
        for other in others:
            outputs.append(_stop(other).split())  # its stdin closes: it stops and prints its counts
    assert all(len(out) == 2 for out in outputs), outputs
    wrote, lost = (int(count) for count in outputs[0])
    assert wrote > 0 and lost == 0, f"{lost} of {wrote + lost} writes from a read refused"
    assert [x for x in rows(db) if x >= 0] == list(range(200))
