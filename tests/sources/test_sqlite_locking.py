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
