"""The SQLite tombstone guard (gatewayscope.guard.sqlite), on real files written by the gateway's own store.

Every trace write and session delete below goes through rLLM's ``SqliteTraceStore`` (the exact SQL the
unmodified ``rllm-model-gateway --store sqlite`` runs), driven on an asyncio loop, with its persistent
connection opened BEFORE the guard is installed, as with a running gateway. "Resurrected" means what seed
000 describes: the real store re-creating a deleted session from a straggling write.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("rllm_model_gateway")

from gatewayscope.cli import main as cli_main
from gatewayscope.errors import ConfigError, GatewayscopeError, StoreError, UnreachableError
from gatewayscope.guard import backfill as guard_backfill
from gatewayscope.guard import sqlite as guard
from gatewayscope.guard.sqlite import lifecycle
from gatewayscope.snapshot import GuardStats
from tests.factories import Gateway, late_data, now_data, trace_data


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "gateway_traces.db"


@pytest.fixture
def gw(db: Path) -> Iterator[Gateway]:
    gateway = Gateway(db)
    yield gateway
    gateway.close()


def raw(path: Path) -> sqlite3.Connection:
    """A plain connection like the gateway's (foreign keys on), autocommit."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def all_trace_ids(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT trace_id FROM traces")}


def tombstones(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute(f"SELECT session_id, dropped_writes FROM {guard.TOMBSTONES_TABLE}"))


def fk_violations(path: Path) -> list[Any]:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA foreign_key_check").fetchall()


def gateway_state(path: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """The gateway's schema and rows, byte for byte comparable."""
    with sqlite3.connect(path) as conn:
        schema = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                              "WHERE name NOT LIKE 'gatewayscope_%' ORDER BY type, name").fetchall()
        traces = conn.execute("SELECT trace_id, data, created_at FROM traces ORDER BY trace_id").fetchall()
        links = conn.execute("SELECT trace_id, session_id, created_at FROM trace_sessions "
                             "ORDER BY trace_id, session_id").fetchall()
    return schema, traces, links


def seed_sessions(gw: Gateway) -> None:
    gw.write("a1", "A")
    gw.write("a2", "A")
    gw.write("b1", "B")
    gw.write("c1", "C")


# ------------------------------------------------------------------------------------------------
# the triggers
# ------------------------------------------------------------------------------------------------


def test_unguarded_store_resurrects_a_deleted_session(gw: Gateway) -> None:
    """The baseline the guard exists for (the straggler race), on the same store."""
    seed_sessions(gw)
    assert gw.delete("A") == 2
    gw.write("a3", "A")  # the straggler
    assert gw.sessions()["A"] == 1


def test_delete_records_a_tombstone(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    guard.install(db)
    assert gw.delete("A") == 2
    assert tombstones(db) == {"A": 0}
    assert guard.status(db).tombstones == 1
    assert gw.sessions() == {"B": 1, "C": 1}
    with sqlite3.connect(db) as conn:
        (source,) = conn.execute(f"SELECT source FROM {guard.TOMBSTONES_TABLE}").fetchone()
    assert source == "delete"


def test_straggler_after_delete_is_dropped_and_counted_once(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    guard.install(db)
    gw.delete("A")
    gw.write("a3", "A")  # store_trace: a trace row, then a junction row; one dropped write
    assert "A" not in gw.sessions()
    assert gw.trace_ids("A") == []
    assert "a3" not in all_trace_ids(db)  # no orphan trace row
    assert fk_violations(db) == []
    status = guard.status(db)
    assert status.dropped_writes == 1
    assert [(d.session_id, d.dropped) for d in status.top_droppers] == [("A", 1)]
    gw.write("a4", "A")
    gw.write("a5", "A")
    assert guard.status(db).dropped_writes == 3
    assert tombstones(db) == {"A": 3}
    assert "A" not in gw.sessions()


def test_the_junction_row_decides_whatever_session_the_trace_data_names(gw: Gateway, db: Path) -> None:
    """The junction row says which session a write is for: a straggler is refused there, and its unshared trace
    row removed, even when its JSON names another session; a write whose dispatch time cannot be read is kept
    (unsure means keep: a kept straggler is an orphan a scan finds, a dropped new use is lost)."""
    seed_sessions(gw)
    guard.install(db)
    gw.delete("A")
    gw.write("x2", "A", trace_data("x2", "some-other-id"))  # data names a live id, the link is for A
    assert "A" not in gw.sessions() and "x2" not in all_trace_ids(db)
    gw.write("x1", "A", {"no": "timestamp here"})
    assert gw.sessions()["A"] == 1 and "x1" in all_trace_ids(db)
    status = guard.status(db)
    assert (status.dropped_writes, status.kept_after_fence) == (1, 1)
    assert tombstones(db)["A"] == 1
    assert fk_violations(db) == []


def test_two_interleaved_writes_of_one_tombstoned_session_count_once_each(gw: Gateway, db: Path) -> None:
    """The gateway's two statements of one write (the trace row, then its junction row) can interleave with
    another write's of the same session: each dropped write still counts once (it counted twice when the
    triggers remembered one pending trace per session), and no bookkeeping row stays behind."""
    seed_sessions(gw)
    guard.install(db)
    gw.delete("A")
    conn = raw(db)
    try:
        for trace_id in ("p1", "p2"):  # both trace rows first ...
            conn.execute("INSERT OR REPLACE INTO traces (trace_id, data, created_at) VALUES (?, ?, ?)",
                         (trace_id, json.dumps(trace_data(trace_id, "A")), time.time()))
        for trace_id in ("p1", "p2"):  # ... then both junction rows
            conn.execute("INSERT OR IGNORE INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)",
                         (trace_id, "A", time.time()))
    finally:
        conn.close()
    assert "A" not in gw.sessions()
    assert guard.status(db).dropped_writes == 2
    assert tombstones(db)["A"] == 2
    assert {"p1", "p2"}.isdisjoint(all_trace_ids(db))


def test_refused_trace_row_does_not_violate_the_foreign_key(gw: Gateway, db: Path) -> None:
    """RAISE(IGNORE) in a BEFORE trigger skips the junction row before SQLite checks its foreign key.

    Replays the gateway's two statements on a connection with foreign_keys ON: the trace row lands, the
    INSERT OR IGNORE of its junction row is refused and takes the unshared trace row with it, and nothing
    raises. Without the guard a junction row whose parent does not exist fails with a foreign-key error.
    """
    seed_sessions(gw)
    guard.install(db)
    gw.delete("A")
    conn = raw(db)
    conn.execute("BEGIN")
    conn.execute("INSERT OR REPLACE INTO traces (trace_id, data, created_at) VALUES (?, ?, ?)",
                 ("late", json.dumps(trace_data("late", "A")), 1.0))
    conn.execute("INSERT OR IGNORE INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)",
                 ("late", "A", 1.0))
    assert conn.execute("SELECT COUNT(*) FROM traces WHERE trace_id = 'late'").fetchone() == (0,)
    conn.execute("COMMIT")
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        conn.execute("INSERT OR IGNORE INTO trace_sessions (trace_id, session_id, created_at) "
                     "VALUES ('no-such-trace', 'B', 1.0)")
    conn.close()
    assert fk_violations(db) == []
    assert guard.status(db).dropped_writes == 1


def test_malformed_trace_data_is_not_an_error(gw: Gateway, db: Path) -> None:
    """The trace trigger reads JSON only when it is valid: a non-JSON row still inserts."""
    guard.install(db)
    conn = raw(db)
    conn.execute("INSERT INTO traces (trace_id, data, created_at) VALUES ('odd', 'not json {', 1.0)")
    conn.execute("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES ('odd', 'O', 1.0)")
    conn.close()
    assert gw.sessions() == {"O": 1}


def test_rewriting_a_trace_of_a_live_one_trace_session_does_not_tombstone_it(gw: Gateway, db: Path) -> None:
    """INSERT OR REPLACE of an existing trace id cascades (foreign key) to its junction rows; the trigger
    must tell that cascade (trace row already gone) from the gateway's delete (trace row still there)."""
    gw.write("b1", "B")
    guard.install(db)
    gw.write("b1", "B")  # same trace id again: REPLACE deletes the row, the cascade deletes (b1, B)
    assert gw.sessions() == {"B": 1}
    assert tombstones(db) == {}
    gw.write("b2", "B")
    assert gw.sessions() == {"B": 2}


def test_shared_traces(gw: Gateway, db: Path) -> None:
    """A trace linked to two sessions: deleting one keeps the trace for the other; a straggler that
    re-sends the shared trace id for the deleted session changes nothing of the live one."""
    gw.write("t1", "A")
    gw.write("a2", "A")
    gw.write("b1", "B")
    conn = raw(db)
    conn.execute("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES ('t1', 'B', 2.0)")
    guard.install(db)
    before = conn.execute("SELECT data FROM traces WHERE trace_id = 't1'").fetchone()
    assert gw.delete("A") == 1  # a2 only: t1 is shared with B
    assert tombstones(db) == {"A": 0}
    assert sorted(gw.trace_ids("B")) == ["b1", "t1"]
    gw.write("t1", "A", trace_data("t1", "A", model="late"))  # unguarded, the REPLACE would unlink B's t1
    assert sorted(gw.trace_ids("B")) == ["b1", "t1"]
    assert conn.execute("SELECT data FROM traces WHERE trace_id = 't1'").fetchone() == before
    assert "A" not in gw.sessions()
    assert guard.status(db).dropped_writes == 1
    assert gw.delete("B") == 2
    assert all_trace_ids(db) == set()
    assert tombstones(db) == {"A": 1, "B": 0}
    conn.close()
    assert fk_violations(db) == []


def test_unrelated_sessions_are_unaffected(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    guard.install(db)
    gw.delete("A")
    gw.write("b2", "B")
    gw.write("c2", "C")
    gw.write("d1", "D")
    assert gw.sessions() == {"B": 2, "C": 2, "D": 1}
    assert guard.status(db).dropped_writes == 0
    assert set(tombstones(db)) == {"A"}


def test_partial_unlink_is_not_a_session_delete(gw: Gateway, db: Path) -> None:
    """Only the delete of a session's LAST junction row records a tombstone."""
    seed_sessions(gw)
    guard.install(db)
    conn = raw(db)
    conn.execute("DELETE FROM trace_sessions WHERE trace_id = 'a1' AND session_id = 'A'")
    conn.close()
    assert tombstones(db) == {}
    gw.write("a3", "A")
    assert gw.sessions()["A"] == 2


# ------------------------------------------------------------------------------------------------
# capacity (FIFO)
# ------------------------------------------------------------------------------------------------


def deleted_under_capacity(gw: Gateway, db: Path, sessions: int, capacity: int) -> guard.GuardStatus:
    """Sessions ``s0``... (one trace each) written, the guard installed with ``capacity``, then every session
    deleted, oldest first; the guard's status."""
    for i in range(sessions):
        gw.write(f"t{i}", f"s{i}")
    guard.install(db, capacity=capacity)
    for i in range(sessions):
        gw.delete(f"s{i}")
    return guard.status(db)


def test_fifo_capacity_evicts_the_oldest_first_and_counts(gw: Gateway, db: Path) -> None:
    status = deleted_under_capacity(gw, db, 5, capacity=3)
    assert set(tombstones(db)) == {"s2", "s3", "s4"}
    assert (status.tombstones, status.capacity, status.evicted) == (3, 3, 2)
    gw.write("late0", "s0")  # the evicted tombstone no longer protects s0: the cap is a backstop
    gw.write("late4", "s4")
    assert gw.sessions() == {"s0": 1}
    new, already = guard.add_tombstones(db, ["x", "y"])
    assert (new, already) == (2, 0)
    assert set(tombstones(db)) == {"s4", "x", "y"}
    assert guard.status(db).evicted == 4


def test_capacity_zero_is_unlimited(gw: Gateway, db: Path) -> None:
    status = deleted_under_capacity(gw, db, 6, capacity=0)
    assert (status.tombstones, status.capacity, status.evicted) == (6, 0, 0)


def test_lowering_the_capacity_evicts_now(gw: Gateway, db: Path) -> None:
    guard.install(db, capacity=10)
    guard.add_tombstones(db, [f"s{i}" for i in range(6)])
    result = guard.install(db, capacity=4)
    assert result.changed and result.previous_capacity == 10 and result.evicted == 2
    assert "evicted the 2 oldest" in result.message
    assert set(tombstones(db)) == {"s2", "s3", "s4", "s5"}
    status = guard.status(db)
    assert (status.tombstones, status.evicted) == (4, 2)
    guard.add_tombstones(db, ["s6"])  # the triggers keep the count exact from there on
    assert set(tombstones(db)) == {"s3", "s4", "s5", "s6"}
    assert (guard.status(db).tombstones, guard.status(db).evicted) == (4, 3)
    again = guard.install(db)  # no capacity given: keep 4
    assert not again.changed and again.capacity == 4
    assert guard.status(db).capacity == 4


def test_negative_capacity_is_a_config_error(db: Path, gw: Gateway) -> None:
    with pytest.raises(ConfigError, match="whole number"):
        guard.install(db, capacity=-1)


# ------------------------------------------------------------------------------------------------
# install / uninstall
# ------------------------------------------------------------------------------------------------


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_install_is_idempotent(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    first = guard.install(db)
    assert first.changed and first.created and first.capacity == guard.DEFAULT_CAPACITY
    digest = file_digest(db)
    second = guard.install(db)
    assert not second.changed
    assert "already installed" in second.message and "nothing changed" in second.message
    assert file_digest(db) == digest  # not one byte written
    status = guard.status(db)
    assert status.installed and status.triggers_intact and status.schema_version == guard.SCHEMA_VERSION


def test_uninstall_restores_the_gateway_schema_and_rows_exactly(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    before = gateway_state(db)
    guard.install(db)
    guard.add_tombstones(db, ["gone-1", "gone-2"])
    result = guard.uninstall(db)
    assert set(result.removed) == set(guard.GUARD_OBJECTS)
    assert result.tombstones == 2
    assert gateway_state(db) == before
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'gatewayscope%'").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert not guard.uninstall(db).removed  # twice: nothing to do, says so
    gw.delete("A")
    gw.write("a9", "A")  # unguarded again
    assert gw.sessions()["A"] == 1


def test_install_refuses_what_is_not_a_trace_store(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(StoreError, match="no such file"):
        guard.install(missing)
    assert not missing.exists()  # never created
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    with pytest.raises(StoreError, match=r"is not an rLLM trace store: it has no 'traces' table \(tables: notes\)"):
        guard.install(other)
    with sqlite3.connect(other) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]  # untouched
    text = tmp_path / "notes.txt"
    text.write_text("hello, I am not a database\n" * 100)
    with pytest.raises(StoreError, match="is not a SQLite database"):
        guard.install(text)
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(StoreError, match="first request"):
        guard.install(empty)
    with pytest.raises(StoreError, match="folder"):
        guard.install(tmp_path)
    half = tmp_path / "half.db"
    with sqlite3.connect(half) as conn:
        conn.execute("CREATE TABLE traces (trace_id TEXT PRIMARY KEY, data TEXT, created_at REAL)")
        conn.execute("CREATE TABLE trace_sessions (trace_id TEXT, created_at REAL)")
    with pytest.raises(StoreError, match="lacks the column"):
        guard.install(half)
    with pytest.raises(StoreError, match="no such file"):
        guard.status(missing)


def test_install_waits_for_the_write_lock_and_says_when_it_stays_locked(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    holder = raw(db)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError, match="stayed locked"):
        guard.install(db, busy_timeout=0.2)
    holder.execute("ROLLBACK")
    # released while install waits: install goes through
    holder.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.3, lambda: holder.execute("ROLLBACK"))
    timer.start()
    try:
        result = guard.install(db, busy_timeout=30)
    finally:
        timer.join()
        holder.close()
    assert result.created
    assert guard.status(db).triggers_intact


def test_a_store_locked_by_another_process_is_busy_not_damaged(gw: Gateway, db: Path) -> None:
    """An exclusive lock another connection holds: the integrity check says busy and how to go on, never
    "damaged" with advice to restore a backup."""
    seed_sessions(gw)
    holder = raw(db)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError) as caught:
            guard.check_integrity(db, busy_timeout=0.2)
        with pytest.raises(StoreError, match="stayed locked") as installing:
            guard.install(db, busy_timeout=0.2)
        assert "damaged" not in str(installing.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "busy, not damaged" in str(caught.value) and "damaged (" not in str(caught.value)
    assert "backup" not in str(caught.value)


def test_a_reinstall_that_changes_nothing_checks_nothing(gw: Gateway, db: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seed_sessions(gw)
    first = guard.install(db)
    assert first.changed and first.checked == "full"

    def no_check(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an install that writes nothing ran the integrity check")

    monkeypatch.setattr("gatewayscope.guard.sqlite.lifecycle.check_integrity", no_check)
    again = guard.install(db)
    assert not again.changed and "nothing changed" in again.message


def test_a_delete_journal_store_too_large_to_check_in_time_gets_its_schema_checked(gw: Gateway, db: Path) -> None:
    """The whole-file check of a rollback-journal store stops at the hold bound (every gateway commit waits for
    it); the schema and the guard's tables are then checked, each in a read of its own, and the install says
    so. A WAL store is checked whole on a snapshot whatever the bound; --full-check checks whole."""
    with sqlite3.connect(db) as conn:  # bulk: enough pages that the whole check outlasts a tiny bound
        conn.execute("INSERT INTO traces (trace_id, data, created_at) WITH RECURSIVE n(i) AS "
                     "(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
                     "SELECT printf('bulk-%06d', i), json_object('session_id', 'bulk:' || i, 'pad', "
                     "hex(randomblob(200))), i FROM n")
    assert guard.check_integrity(db, hold_seconds=1e-6).scope == "schema"
    assert guard.check_integrity(db, hold_seconds=1e-6, full=True).scope == "full"
    result = guard.install(db)
    assert result.checked == "full"  # 5 s is plenty for this file
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
    assert guard.check_integrity(db, hold_seconds=1e-6).scope == "full"


def test_the_hold_bound_stops_the_check_s_walk_of_the_b_trees(tmp_path: Path) -> None:
    """The whole-file check's walk of the b-trees is one VM step (no progress handler runs inside it before
    SQLite 3.43): on a large rollback-journal store it alone would hold every gateway commit for minutes.
    A file that is all b-tree and no index loop: the bounded check still stops at the bound."""
    path = tmp_path / "blobs.db"
    with sqlite3.connect(path) as conn:  # about 60 MB of overflow pages, no index, no NOT NULL column
        conn.execute("CREATE TABLE blobs (b BLOB)")
        conn.execute("INSERT INTO blobs WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                     "WHERE i < 1500) SELECT randomblob(40000) FROM n")
    whole = min(guard.check_integrity(path, full=True).seconds for _ in range(2))  # the second one warm
    assert guard.check_integrity(path, hold_seconds=whole / 5).scope == "schema"


def test_the_schema_check_waits_for_a_lock_taken_right_after_the_whole_check_gave_way(
        gw: Gateway, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The moment the whole-file check gives way is when the gateway's held-up commits take the lock: every
    read of the schema-scope check waits for it (up to busy_timeout) instead of calling the store busy at once."""
    seed_sessions(gw)
    holder = raw(db)
    real_check = lifecycle._quick_check
    timers: list[threading.Timer] = []

    def whole_check_gives_way(conn: sqlite3.Connection, *, table: str | None = None) -> list[str]:
        if table is not None:
            return real_check(conn, table=table)
        conn.execute("ROLLBACK")  # the check's read ends, and a gateway commit takes the lock for 0.3 s
        holder.execute("BEGIN EXCLUSIVE")
        timers.append(threading.Timer(0.3, lambda: holder.execute("ROLLBACK")))
        timers[-1].start()
        conn.execute("BEGIN")
        raise sqlite3.OperationalError("interrupted")

    monkeypatch.setattr(lifecycle, "_quick_check", whole_check_gives_way)
    try:
        assert guard.check_integrity(db, busy_timeout=10).scope == "schema"
    finally:
        for timer in timers:
            timer.join()
        holder.close()


def test_a_damaged_store_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    writer = Gateway(path)
    writer.write("a1", "A")
    writer.close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO traces (trace_id, data, created_at) WITH RECURSIVE n(i) AS "
                     "(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000) "
                     "SELECT printf('t-%06d', i), hex(randomblob(300)), i FROM n")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    with open(path, "r+b") as handle:  # scribble over an interior page of the traces table
        handle.seek(page_size * (pages // 2) + 16)
        handle.write(b"\xff" * 64)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="is damaged"):
        guard.install(path)
    assert path.read_bytes() == before


def test_install_under_concurrent_writes_loses_nothing(gw: Gateway, db: Path) -> None:
    """A second gateway-store connection writes live sessions in a thread while install runs."""
    seed_sessions(gw)
    stop = threading.Event()
    written: list[str] = []
    errors: list[BaseException] = []

    def writer() -> None:
        other = Gateway(db)
        try:
            i = 0
            while not stop.is_set() or i < 50:
                other.write(f"live-{i}", f"live-{i % 7}")
                written.append(f"live-{i}")
                i += 1
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)
        finally:
            other.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(written) < 20:
            threading.Event().wait(0.01)
        result = guard.install(db)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert result.created
    assert set(written) <= all_trace_ids(db)
    assert guard.status(db).dropped_writes == 0 and tombstones(db) == {}


def test_triggers_intact_detection_and_repair(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    guard.install(db)
    conn = raw(db)
    conn.execute("DROP TRIGGER gatewayscope_count_reuse")
    status = guard.status(db)
    assert status.installed and not status.triggers_intact
    assert status.missing == ["gatewayscope_count_reuse"]
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as ro:
        stats = guard.read_guard(ro)
    assert stats is not None and stats.triggers_intact is False and stats.enabled is False
    # an altered trigger (same name, other SQL) is caught too
    conn.execute("DROP TRIGGER gatewayscope_tombstone_on_delete")
    conn.execute("CREATE TRIGGER gatewayscope_tombstone_on_delete AFTER DELETE ON trace_sessions "
                 "BEGIN SELECT 1; END")
    conn.close()
    status = guard.status(db)
    assert status.altered == ["gatewayscope_tombstone_on_delete"]
    repaired = guard.install(db)
    assert repaired.changed and not repaired.created
    assert repaired.repaired == ["gatewayscope_count_reuse", "gatewayscope_tombstone_on_delete"]
    assert guard.status(db).triggers_intact
    gw.delete("A")
    gw.write("a3", "A")
    assert "A" not in gw.sessions()


def test_reinstall_keeps_tombstones_and_counters(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    guard.install(db)
    gw.delete("A")
    gw.write("a3", "A")
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER gatewayscope_drop_session_link")
    guard.install(db)
    status = guard.status(db)
    assert (status.tombstones, status.dropped_writes) == (1, 1)


def test_a_newer_schema_is_refused(gw: Gateway, db: Path) -> None:
    guard.install(db)
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE {guard.META_TABLE} SET value = 99 WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="newer"):
        guard.install(db)


# ------------------------------------------------------------------------------------------------
# lift, backfill, reading
# ------------------------------------------------------------------------------------------------




def test_retry_reusing_a_deleted_uid_is_kept_and_the_old_attempt_straggler_still_dropped(gw: Gateway,
                                                                                         db: Path) -> None:
    """rLLM's retry deletes the session and reuses its uid without POST /sessions (the SQLite store never sees
    one): its calls came after the delete, so they are kept; a straggler of the failed attempt is not."""
    uid = "task-7:0"
    gw.write("r1", uid, now_data("r1", uid))
    guard.install(db)
    gw.delete(uid)  # the failed attempt's cleanup
    gw.write("retry-1", uid, now_data("retry-1", uid))  # the retry's first call: kept
    gw.write("late", uid, late_data("late", uid))  # the failed attempt's call, still in flight: dropped
    gw.write("retry-2", uid, now_data("retry-2", uid))
    assert gw.trace_ids(uid) == ["retry-1", "retry-2"]
    status = guard.status(db)
    assert [(d.session_id, d.dropped) for d in status.top_droppers] == [(uid, 1)]
    assert (status.dropped_writes, status.kept_after_fence) == (1, 2)
    with sqlite3.connect(db) as conn:
        assert conn.execute(f"SELECT kept_writes FROM {guard.REUSES_TABLE} WHERE session_id = ?",
                            (uid,)).fetchone() == (2,)
    assert guard.lift_tombstone(db, uid) is True and guard.lift_tombstone(db, uid) is False
    after = guard.status(db)
    assert after.tombstones == 0 and after.dropped_writes == 1  # the total is history, kept
    with sqlite3.connect(db) as conn:
        assert conn.execute(f"SELECT COUNT(*) FROM {guard.REUSES_TABLE}").fetchone() == (0,)


def test_each_step_reuses_the_ids_the_last_one_deleted(gw: Gateway, db: Path) -> None:
    """rLLM's trainers name a rollout ``{task id}:{rollout}`` and sample a task again in later steps: every step
    writes to the ids the step before deleted. Each step keeps its own traces; a straggler of an earlier step
    that lands during the next one is dropped, and the next delete moves the fence on."""
    guard.install(db)
    ids = [f"task-{t}:{r}" for t in range(2) for r in range(2)]
    for step in range(3):
        for sid in ids:
            for call in range(3):
                gw.write(f"s{step}-{sid}-{call}", sid, now_data(f"s{step}-{sid}-{call}", sid))
        if step:  # a straggler of the step before lands while the id is in use again
            gw.write(f"late-{step}", ids[0], late_data(f"late-{step}", ids[0]))
        assert gw.sessions() == dict.fromkeys(ids, 3)
        assert gw.trace_ids(ids[0]) == [f"s{step}-{ids[0]}-{call}" for call in range(3)]
        with sqlite3.connect(db) as conn:
            fences = dict(conn.execute(f"SELECT session_id, deleted_at FROM {guard.TOMBSTONES_TABLE}"))
        for sid in ids:
            gw.delete(sid)
        with sqlite3.connect(db) as conn:
            moved = dict(conn.execute(f"SELECT session_id, deleted_at FROM {guard.TOMBSTONES_TABLE}"))
            assert conn.execute(f"SELECT COUNT(*) FROM {guard.REUSES_TABLE}").fetchone() == (0,)
        assert all(moved[sid] >= fences.get(sid, 0.0) for sid in ids)
    status = guard.status(db)
    assert (status.tombstones, status.dropped_writes, status.kept_after_fence) == (4, 2, 2 * 4 * 3)


def test_add_tombstones_is_idempotent_and_deletes_nothing(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    guard.install(db)
    before = gateway_state(db)
    assert guard.add_tombstones(db, ["x", "y", "x", ""]) == (2, 0)
    assert guard.add_tombstones(db, ["y", "z", "B"]) == (2, 1)
    assert gateway_state(db) == before  # backfill deleted nothing, even for B which still has rows
    gw.write("b2", "B")  # tombstone first, then delete: a straggler in between is dropped
    with sqlite3.connect(db) as conn:
        sources = dict(conn.execute(f"SELECT session_id, source FROM {guard.TOMBSTONES_TABLE}"))
    assert sources["B"] == "backfill"
    gw.delete("B")
    assert "B" not in gw.sessions()
    assert tombstones(db) == {"x": 0, "y": 0, "z": 0, "B": 1}
    with sqlite3.connect(db) as conn:  # the delete is B's latest: it moves the fence, and says so
        sources = dict(conn.execute(f"SELECT session_id, source FROM {guard.TOMBSTONES_TABLE}"))
    assert sources["B"] == "delete"


def test_add_tombstones_needs_the_guard(gw: Gateway, db: Path) -> None:
    with pytest.raises(StoreError, match="guard install"):
        guard.add_tombstones(db, ["x"])
    with pytest.raises(StoreError, match="guard install"):
        guard.lift_tombstone(db, "x")


def test_add_tombstones_in_several_transactions(gw: Gateway, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gatewayscope.guard.sqlite.state.WRITE_BATCH", 7)
    guard.install(db)
    ids = [f"s{i}" for i in range(30)]
    assert guard.add_tombstones(db, ids[:10]) == (10, 0)
    assert guard.add_tombstones(db, ids) == (20, 10)
    assert guard.status(db).tombstones == 30


def test_the_scan_reads_the_guard_figures_and_the_tombstoned_sessions_that_still_have_rows(
        gw: Gateway, db: Path) -> None:
    from gatewayscope._sqlite.open import open_store
    from gatewayscope._sqlite.statements import StatementWatch

    seed_sessions(gw)
    conn = open_store(db, readonly=True, busy_timeout=5.0)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    with StatementWatch(conn) as watch:
        assert guard.read_for_scan(conn, tables, busy_timeout=5.0, page_size=2, watch=watch) == (None, {})
    conn.close()
    guard.install(db)
    # tombstones for B and C (still in the store: a delete that has not run yet) and for sessions long gone
    guard.add_tombstones(db, ["B", "C", "gone-1", "gone-2", "gone-3"])
    conn = open_store(db, readonly=True, busy_timeout=5.0)
    conn.execute("PRAGMA busy_timeout = 0")
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    try:
        with StatementWatch(conn) as watch:
            stats, tombstoned = guard.read_for_scan(conn, tables, busy_timeout=5.0, page_size=2, watch=watch)
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0, "the source's statements poll: handler off"
    finally:
        conn.close()
    assert stats is not None and stats.tombstones == 5 and stats.triggers_intact
    assert sorted(tombstoned) == ["B", "C"], "paged two ids at a time, every page read"
    assert all(not stone.reused and abs(stone.fence - time.time()) < 60 for stone in tombstoned.values())


def test_read_guard_and_tombstoned_among_on_a_read_only_connection(gw: Gateway, db: Path) -> None:
    seed_sessions(gw)
    ro_uri = f"{db.resolve().as_uri()}?mode=ro"
    with sqlite3.connect(ro_uri, uri=True) as ro:
        assert guard.read_guard(ro) is None
        assert guard.tombstoned_among(ro, ["A"]) == []
    guard.install(db, capacity=5_000)
    gw.delete("A")
    gw.write("a3", "A")
    gw.write("a4", "A")
    guard.add_tombstones(db, [f"old-{i}" for i in range(1_200)])
    ro = sqlite3.connect(ro_uri, uri=True)
    try:
        stats = guard.read_guard(ro)
        asked = ["B", "old-1199", "A", "nope", "old-3", "A"] + [f"other-{i}" for i in range(1_000)]
        found = guard.tombstoned_among(ro, asked)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro.execute(f"DELETE FROM {guard.TOMBSTONES_TABLE}")
    finally:
        ro.close()
    assert stats == GuardStats(tombstones=1_201, capacity=5_000, dropped_writes=2, evicted=0, enabled=True,
                               triggers_intact=True, top_droppers=[{"session_id": "A", "dropped": 2}],
                               index="ready")
    assert found == ["old-1199", "A", "old-3"]


def test_wal_journal_mode(db: Path) -> None:
    gateway = Gateway(db, wal=True)
    try:
        seed_sessions(gateway)
        result = guard.install(db)
        assert result.created
        gateway.delete("A")
        gateway.write("a3", "A")
        ro = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            stats = guard.read_guard(ro)
            assert guard.tombstoned_among(ro, ["A", "B"]) == ["A"]
        finally:
            ro.close()
        assert stats is not None and stats.dropped_writes == 1 and stats.tombstones == 1
        status = guard.status(db)
        assert status.journal_mode == "wal" and status.triggers_intact
        assert guard.add_tombstones(db, ["w1"]) == (1, 0)
        assert guard.lift_tombstone(db, "A")
        gateway.write("a4", "A")
        assert gateway.sessions() == {"A": 1, "B": 1, "C": 1}
        assert not guard.install(db).changed
        guard.uninstall(db)
    finally:
        gateway.close()


# ------------------------------------------------------------------------------------------------
# backfill and lift through a target (SQLite path or guarded gateway URL)
# ------------------------------------------------------------------------------------------------


def test_read_ids_file(tmp_path: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text("# orphans from scan\n  a:0  \n\nb:1\n   # indented comment\nc/d:2\n")
    assert guard_backfill.read_ids_file(ids) == ["a:0", "b:1", "c/d:2"]
    with pytest.raises(GatewayscopeError, match="no such ids file"):
        guard_backfill.read_ids_file(tmp_path / "nope.txt")
    with pytest.raises(GatewayscopeError, match="folder"):
        guard_backfill.read_ids_file(tmp_path)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(GatewayscopeError, match="not UTF-8"):
        guard_backfill.read_ids_file(binary)


def test_backfill_a_sqlite_target(gw: Gateway, db: Path) -> None:
    guard.install(db)
    result = guard_backfill.backfill_tombstones(str(db), [" a ", "b", "a", ""])
    assert (result.new, result.already, result.total) == (2, 0, 2)
    result = guard_backfill.backfill_tombstones(str(db), ["b", "c"])
    assert (result.new, result.already, result.total) == (1, 1, 3)
    assert guard_backfill.lift(str(db), "a") is True
    assert guard_backfill.lift(str(db), "a") is False


class FakeGuardedGateway:
    """The guarded gateway's /guard routes (route contract of ``gatewayscope gateway``), over httpx's seam."""

    def __init__(self, *, guarded: bool = True) -> None:
        self.guarded = guarded
        self.tombstones: dict[str, None] = {}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.raw_path.decode()
        if not self.guarded:
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.method == "GET" and path == "/guard/status":
            return httpx.Response(200, json={"enabled": True, "tombstones": len(self.tombstones),
                                             "capacity": 1_000_000, "dropped_writes": 0, "evicted": 0,
                                             "top_droppers": []})
        if request.method == "POST" and path == "/guard/tombstones":
            ids = json.loads(request.content)["session_ids"]
            added = [sid for sid in dict.fromkeys(ids) if sid not in self.tombstones]
            self.tombstones.update(dict.fromkeys(added))
            return httpx.Response(200, json={"added": len(added), "already": len(ids) - len(added),
                                             "tombstones": len(self.tombstones)})
        if request.method == "DELETE" and path.startswith("/guard/tombstones/"):
            from urllib.parse import unquote

            sid = unquote(path.removeprefix("/guard/tombstones/"))
            lifted = sid in self.tombstones
            self.tombstones.pop(sid, None)
            return httpx.Response(200, json={"lifted": lifted})
        return httpx.Response(404, json={"error": "no route"})


def test_backfill_a_guarded_gateway_in_batches() -> None:
    fake = FakeGuardedGateway()
    client = httpx.Client(transport=httpx.MockTransport(fake))
    ids = [f"{i:05d}:0" for i in range(12_000)]
    result = guard_backfill.backfill_tombstones("http://gw.test:9090/", ids, client=client)
    assert (result.new, result.already, result.total) == (12_000, 0, 12_000)
    posts = [r for r in fake.requests if r.method == "POST"]
    assert [len(json.loads(r.content)["session_ids"]) for r in posts] == [5_000, 5_000, 2_000]
    again = guard_backfill.backfill_tombstones("http://gw.test:9090", [*ids[:10], "new:0"], client=client)
    assert (again.new, again.already, again.total) == (1, 10, 12_001)
    assert guard_backfill.lift("http://gw.test:9090", "a/b:0", client=client) is False
    fake.tombstones["a/b:0"] = None
    assert guard_backfill.lift("http://gw.test:9090", "a/b:0", client=client) is True
    assert fake.requests[-1].url.raw_path == b"/guard/tombstones/a%2Fb%3A0"


def test_backfill_an_unguarded_gateway_says_what_to_run() -> None:
    client = httpx.Client(transport=httpx.MockTransport(FakeGuardedGateway(guarded=False)))
    with pytest.raises(GatewayscopeError, match="gatewayscope gateway.*instead of 'rllm-model-gateway'"):
        guard_backfill.backfill_tombstones("http://gw.test", ["a"], client=client)
    with pytest.raises(GatewayscopeError, match="unguarded"):
        guard_backfill.lift("http://gw.test", "a", client=client)


def test_backfill_an_unreachable_gateway() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(refuse))
    with pytest.raises(UnreachableError, match="Cannot reach http://gw.test"):
        guard_backfill.backfill_tombstones("http://gw.test", ["a"], client=client)


# ------------------------------------------------------------------------------------------------
# the CLI
# ------------------------------------------------------------------------------------------------


def test_cli_install_status_backfill_lift_uninstall(gw: Gateway, db: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    seed_sessions(gw)
    path = str(db)
    assert cli_main(["guard", "status", path]) == 1
    assert "not installed" in capsys.readouterr().out
    assert cli_main(["guard", "install", path, "--capacity", "1000"]) == 0
    assert "Installed the tombstone guard" in capsys.readouterr().out
    assert cli_main(["guard", "install", path]) == 0
    assert "nothing changed" in capsys.readouterr().out
    gw.delete("A")
    gw.write("a3", "A")
    ids = tmp_path / "ids.txt"
    ids.write_text("# to delete\nold-1\nold-2\n\nA\n")
    assert cli_main(["guard", "backfill", path, "--ids-file", str(ids)]) == 0
    assert "2 new tombstones, 1 already tombstoned; 3 tombstones in total" in capsys.readouterr().out
    assert cli_main(["guard", "backfill", path, "old-3"]) == 0
    assert "1 new" in capsys.readouterr().out
    assert cli_main(["guard", "status", path]) == 0
    out = capsys.readouterr().out
    assert "triggers intact" in out and "4 / 1,000" in out and "dropped writes  1" in out
    assert "A" in out and f"gatewayscope guard lift {path} SESSION_ID" in out
    assert cli_main(["guard", "status", path, "--format", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["tombstones"] == 4 and body["top_droppers"][0]["session_id"] == "A"
    assert cli_main(["guard", "lift", path, "A"]) == 0
    assert "Lifted the tombstone of A" in capsys.readouterr().out
    assert cli_main(["guard", "lift", path, "A"]) == 0
    assert "has no tombstone" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER gatewayscope_drop_session_link")
    assert cli_main(["guard", "status", path]) == 1
    out = capsys.readouterr().out
    assert "NOT intact" in out and "gatewayscope_drop_session_link" in out
    assert f"Repair with: gatewayscope guard install {path}" in out
    assert cli_main(["guard", "uninstall", path]) == 0
    assert "Removed the tombstone guard" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["guard", "install", str(tmp_path / "none.db")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    assert cli_main(["guard", "backfill", str(tmp_path / "none.db"), "--ids-file", str(tmp_path / "x")]) == 1
    assert "no such ids file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["guard", "install", "x.db", "--capacity", "-5"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["guard", "backfill", "x.db"])
    assert exit_info.value.code == 2
    assert cli_main(["guard"]) == 2


def test_cli_every_guard_action_is_documented() -> None:
    import argparse

    from gatewayscope.cli import build_parser

    parser = build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    guard_parser = top.choices["guard"]
    assert guard_parser.description
    sub = next(a for a in guard_parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"install", "status", "uninstall", "lift", "backfill", "run"}
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, action_parser in sub.choices.items():
        assert helps.get(name), f"guard {name} has no one-line help"
        assert action_parser.description, f"guard {name} has no description"
        for arg in action_parser._actions:
            assert arg.help, f"guard {name} {arg.dest} has no help"


def test_a_schema_3_guard_upgrades_in_place_keeping_its_tombstones_as_fences(gw: Gateway, db: Path) -> None:
    """A store an older gatewayscope guarded (schema 3: every write to a tombstoned id dropped, the pending-drop
    table and the drop trigger) upgrades with ``install``: its tombstones become fences at their delete times (a
    hand-edited one without a time is fenced at the upgrade), its counters stay, the legacy objects go, and from
    then on a straggler is dropped while a new use of the id is kept."""
    gw.write("t-live", "live:0")
    gw.write("t-old", "gone:0")
    gw.delete("gone:0")
    fence = time.time() - 60
    fixture = (Path(__file__).parent / "fixtures" / "guard_schema3.sql").read_text(encoding="utf-8")
    with sqlite3.connect(db) as conn:
        conn.executescript(fixture)
        conn.execute("INSERT INTO gatewayscope_tombstones (session_id, deleted_at, dropped_writes, seq) "
                     "VALUES ('gone:0', ?, 2, 1), ('hand:0', 'yesterday', 0, 2)", (fence,))
        conn.execute("INSERT INTO gatewayscope_pending_drops (session_id, trace_id) VALUES ('gone:0', 't-x')")
        conn.execute("UPDATE gatewayscope_guard SET value = 2 WHERE key = 'dropped_writes_total'")
    assert guard.status(db).schema_version == 3
    before_upgrade = time.time()
    result = guard.install(db)
    assert result.changed
    state = guard.status(db)
    assert (state.schema_version, state.triggers_intact, state.tombstones) == (4, True, 2), state
    assert state.dropped_writes == 2 and not state.missing and not state.altered
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name IN ('gatewayscope_drop_trace', "
                            "'gatewayscope_pending_drops')").fetchall() == []
        gone = guard.tombstone_of(conn, "gone:0")
        hand = guard.tombstone_of(conn, "hand:0")
    assert gone is not None and gone.fence == pytest.approx(fence) and not gone.reused
    assert hand is not None and before_upgrade <= hand.fence <= time.time()
    # a straggler dispatched before the delete is dropped; a use that began after it is kept, with no create
    gw.write("t-straggler", "gone:0", trace_data("t-straggler", "gone:0", timestamp=fence - 5, latency_ms=900))
    gw.write("t-new", "gone:0", trace_data("t-new", "gone:0", timestamp=time.time(), latency_ms=5))
    assert gw.trace_ids("gone:0") == ["t-new"]
    after = guard.status(db)
    assert (after.dropped_writes, after.kept_after_fence) == (3, 1)
    with sqlite3.connect(db) as conn:
        reused = guard.tombstone_of(conn, "gone:0")
    assert reused is not None and reused.reused
    # a second install changes nothing and keeps the fences
    assert not guard.install(db).changed
