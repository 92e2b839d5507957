"""The SQLite source on files written by the gateway's own SqliteTraceStore."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gatewayscope._sqlite import locking, statements
from gatewayscope._sqlite.locking import WriterProbe, one_reader_per_file, open_descriptors
from gatewayscope._sqlite.open import open_store
from gatewayscope._sqlite.statements import StatementWatch, fetch_all, fetch_for
from gatewayscope.analysis.orphans import find_orphans
from gatewayscope.config import Policy, Target
from gatewayscope.errors import StoreError
from gatewayscope.orphan_rule import Tombstone
from gatewayscope.snapshot import GuardStats
from gatewayscope.sources import rllm_sqlite as source
from gatewayscope.sources.rllm_sqlite import iter_candidate_pages, iter_session_pages, read_trace_store_sqlite
from tests.helpers import wait_for

rllm_sqlite = pytest.importorskip("rllm_model_gateway.store.sqlite_store")

HOUR = 3600.0


def make_store(path: Path, sessions: dict[str, int], *, weight: dict[str, int] | None = None) -> None:
    """Write ``sessions`` (id -> trace count) through the gateway's own store class."""

    async def go() -> None:
        store = rllm_sqlite.SqliteTraceStore(db_path=str(path))
        for sid, count in sessions.items():
            for i in range(count):
                data = {"trace_id": f"{sid}/{i}", "session_id": sid,
                        "messages": [{"role": "user", "content": "x" * 50}],
                        "prompt_token_ids": list(range(30)), "token_counts": {"prompt": 30}, "model": "stub",
                        "timestamp": time.time()}
                if weight and sid in weight:
                    data["weight_version"] = weight[sid]
                await store.store_trace(f"{sid}/{i}", sid, data)
        await store.close()

    asyncio.run(go())


def age(path: Path, sid: str, seconds: float) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE trace_sessions SET created_at = created_at - ? WHERE session_id = ?", (seconds, sid))
        conn.execute("UPDATE traces SET created_at = created_at - ? WHERE trace_id IN "
                     "(SELECT trace_id FROM trace_sessions WHERE session_id = ?)", (seconds, sid))


def target(path: Path) -> Target:
    return Target(name="file", kind="rllm", path=str(path), timeout_seconds=0.2)


def read_only(path: Path) -> sqlite3.Connection:
    return open_store(path, readonly=True, busy_timeout=10.0)


def test_reads_sessions_and_candidates_read_only(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {"t1:0": 1, "t1:1": 1, "t2:0": 3, "t3:0": 1}, weight={"t1:0": 1, "t1:1": 5, "t3:0": 5})
    age(db, "t1:0", 3 * HOUR)
    age(db, "t1:1", 3 * HOUR)
    age(db, "t2:0", 3 * HOUR)
    before = db.read_bytes()
    policy = Policy(orphan_idle_seconds=2 * HOUR)
    listed = read_trace_store_sqlite(target(db), policy, now=time.time(), page_size=2, full=True)
    data = read_trace_store_sqlite(target(db), policy, now=time.time(), page_size=2)  # the candidates read
    assert db.read_bytes() == before, "the source must never write to the store"
    assert listed.sessions.height == 4 and int(listed.sessions["trace_count"].sum()) == 6
    assert listed.session_total is None and listed.session_count == 4 and listed.trace_count == 6
    assert data.sessions["session_id"].to_list() == ["t1:0", "t1:1"], "the candidates only"
    assert (data.session_count, data.trace_count) == (4, 6)
    assert data.sessions.equals(listed.sessions.filter(listed.sessions["session_id"].is_in(["t1:0", "t1:1"])))
    for read in (data, listed):
        assert sorted(read.candidate_traces["session_id"]) == ["t1:0", "t1:1"]
        assert read.current_weight_version == 5 and read.capabilities["weight_version"]
        assert set(read.candidate_traces["prompt_tokens"]) == {30}
        orphans = find_orphans(read, Policy(orphan_idle_seconds=2 * HOUR, max_weight_lag=2), time.time())
        # t1:1 is idle but at the current weight version: live, not an orphan
        assert orphans["session_id"].to_list() == ["t1:0"]


def test_the_guard_figures_come_from_the_guard_reader_the_caller_passes(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 1, "b:0": 2})
    asked: list[tuple[bool, float, int, bool]] = []

    def guard_reader(conn: sqlite3.Connection, tables: set[str], *, busy_timeout: float, page_size: int,
                     watch: StatementWatch) -> tuple[GuardStats | None, dict[str, Tombstone]]:
        asked.append(({"traces", "trace_sessions"} <= tables, busy_timeout, page_size, watch is not None))
        return (GuardStats(tombstones=1, capacity=10, dropped_writes=3),
                {"b:0": Tombstone(fence=time.time()), "a:0": Tombstone(fence=1.0, reused=True)})

    data = read_trace_store_sqlite(target(db), Policy(), now=time.time(), page_size=50, guard_reader=guard_reader)
    assert asked == [(True, 0.2, 50, True)]
    assert data.guard is not None and data.guard.dropped_writes == 3 and data.capabilities["guard"]
    # a tombstoned session is a candidate whatever its age and its number of traces, unless the guard saw it used
    # again after its fence (then it is one only as any session is: here a:0 is fresh)
    assert sorted(data.tombstoned_ids) == ["a:0", "b:0"] and set(data.candidate_traces["session_id"]) == {"b:0"}
    assert data.reused_ids == ["a:0"] and set(data.fences) == {"a:0", "b:0"}
    plain = read_trace_store_sqlite(target(db), Policy(), now=time.time())
    assert plain.guard is None and not plain.capabilities["guard"] and plain.tombstoned_ids == []


def test_pages_cover_every_session_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    ids = {f"s{i:03d}:0": 1 + i % 3 for i in range(57)}
    make_store(db, ids)
    conn = sqlite3.connect(db)
    seen = [row[0] for page in iter_session_pages(conn, page_size=10) for row in page]
    conn.close()
    assert seen == sorted(ids)


def test_candidate_pages_cover_every_session_once_and_pick_the_idle_one_trace_sessions(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    ids = {f"s{i:03d}:0": 1 + i % 3 for i in range(57)}
    ids.update({"": 1, "quote'\"; DROP TABLE traces;--": 1, "émoji 🧵:0": 1, "tab\there:1": 2, "[\"json\"]": 1})
    make_store(db, ids)
    idle = [sid for sid, count in ids.items() if count == 1 and not sid.startswith("s00")]
    for sid in idle:
        age(db, sid, 3 * HOUR)
    conn = read_only(db)
    for limit in (1, 7, 100_000):
        pages = list(iter_candidate_pages(conn, time.time() - 2 * HOUR, page_limit=limit))
        assert sum(count for count, _, _ in pages) == len(ids)
        assert sum(traces for _, traces, _ in pages) == sum(ids.values())
        assert [sid for _, _, found in pages for sid in found] == sorted(idle), "key order, exact ids"
        assert limit == 100_000 or len(pages) >= len(ids) // limit
    conn.close()


def test_a_candidate_page_stuck_past_its_end_is_tried_smaller_then_left_to_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "traces.db"
    ids = {f"w{i:03d}:0": 1 for i in range(40)}
    make_store(db, ids)
    conn = read_only(db)
    stalls = iter([0.06, 0.06])  # the first two sessions aggregated take 60 ms each: past the 40 ms watch
    conn.create_function("stall", 1, lambda n: (time.sleep(next(stalls, 0.0)), n)[1])
    for name in ("CANDIDATE_PAGE_SQL", "FIRST_CANDIDATE_PAGE_SQL"):
        monkeypatch.setattr(source, name, getattr(source, name).replace("COUNT(*) AS n", "stall(COUNT(*)) AS n"))
    with StatementWatch(conn) as watch:
        pages = list(iter_candidate_pages(conn, time.time(), watch=watch, page_limit=8))
        assert watch.interrupts == 2, "a page of 8, then of 2, interrupted; then a page of 1 unwatched"
    conn.close()
    assert pages[0][0] == 1 and sum(count for count, _, _ in pages) == 40
    assert [sid for _, _, found in pages for sid in found] == sorted(ids)


def test_a_page_size_below_one_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 1})
    for size in (0, -1):
        with pytest.raises(ValueError, match="page_size must be at least 1"):
            read_trace_store_sqlite(target(db), Policy(), now=time.time(), page_size=size)


def test_a_sqlite_without_the_candidates_statement_lists_every_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 1, "b:0": 2})
    age(db, "a:0", 3 * HOUR)
    monkeypatch.setattr(source, "CANDIDATE_PAGE_PROBE_SQL", "SELECT json_group_array(1) FILTER (WHERE 1) ORDER")
    data = read_trace_store_sqlite(target(db), Policy(orphan_idle_seconds=HOUR), now=time.time())
    assert data.session_total is None and sorted(data.sessions["session_id"]) == ["a:0", "b:0"]
    assert find_orphans(data, Policy(orphan_idle_seconds=HOUR), time.time())["session_id"].to_list() == ["a:0"]


def test_works_on_a_wal_file(tmp_path: Path) -> None:
    db = tmp_path / "wal.db"
    make_store(db, {"a:0": 1})
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        conn.execute("INSERT INTO traces VALUES ('x', '{}', 1.0)")
        conn.execute("INSERT INTO trace_sessions VALUES ('x', 'b:0', 1.0)")
        conn.commit()
        conn.execute("INSERT INTO trace_sessions VALUES ('x', 'uncommitted:0', 1.0)")  # writer mid-transaction
        data = read_trace_store_sqlite(target(db), Policy(), now=time.time(), full=True)
        assert sorted(data.sessions["session_id"]) == ["a:0", "b:0"]
        assert read_trace_store_sqlite(target(db), Policy(), now=time.time()).session_count == 2


def test_missing_file_folder_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such file"):
        read_trace_store_sqlite(target(tmp_path / "nope.db"), Policy(), now=0)
    with pytest.raises(StoreError, match="is a folder"):
        read_trace_store_sqlite(target(tmp_path), Policy(), now=0)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a SQLite database"):
        read_trace_store_sqlite(target(junk), Policy(), now=0)


def test_not_a_trace_store(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(StoreError, match="not an rLLM trace store: it has no 'traces' table"):
        read_trace_store_sqlite(target(other), Policy(), now=0)


def test_locked_file_gives_a_clear_message(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    make_store(db, {"a:0": 1})
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match="locked by another process"):
            read_trace_store_sqlite(target(db), Policy(), now=0)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_time_cut_pages_cover_every_session_whole(tmp_path: Path) -> None:
    """A page cut by time (here: after every chunk) still yields whole sessions, each exactly once."""
    db = tmp_path / "traces.db"
    ids = {f"s{i:04d}:0": 1 + i % 4 for i in range(300)}
    make_store(db, ids)
    conn = sqlite3.connect(db)
    expected = conn.execute("SELECT session_id, COUNT(*) FROM trace_sessions GROUP BY session_id "
                            "ORDER BY session_id").fetchall()
    rows = [row for page in iter_session_pages(conn, page_size=10_000, page_seconds=0.0) for row in page]
    conn.close()
    assert [(r[0], r[1]) for r in rows] == expected


def test_time_cut_candidate_reads_match_one_full_read(tmp_path: Path) -> None:
    """Candidate traces read in time-cut batches equal one unbounded read (no trace lost or doubled)."""
    from gatewayscope.sources import rllm_sqlite

    db = tmp_path / "traces.db"
    make_store(db, {f"c{i:03d}:0": 1 + i % 3 for i in range(120)})
    conn = sqlite3.connect(db)
    wanted = sorted(f"c{i:03d}:0" for i in range(0, 120, 2))
    def read(seconds: float) -> list[tuple]:
        pages = rllm_sqlite.iter_candidate_traces(conn, wanted, seconds=seconds, busy_timeout=5.0)
        return sorted(row for page in pages for row in page)

    cut, whole = read(0.0), read(60.0)
    conn.close()
    assert cut == whole
    assert {row[0] for row in whole} == set(wanted)
    assert len(whole) == sum(1 + i % 3 for i in range(0, 120, 2))


#: a writer in its own process, as the gateway is: one commit that has to wait for our read
_WRITER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=30.0, isolation_level=None)
conn.execute("BEGIN")
conn.execute("INSERT INTO traces (trace_id, data, created_at) VALUES ('late', '{}', 0)")
print("inserted", flush=True)
conn.execute("COMMIT")
print("committed", flush=True)
"""


@pytest.mark.e2e  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer probe reads Linux's struct flock")
def test_probe_sees_a_writer_in_another_process_wait_for_our_read(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {f"p{i:03d}:0": 2 for i in range(200)})
    other = read_only(db)  # another connection's descriptor must not be picked
    other.execute("SELECT 1 FROM traces LIMIT 1").fetchall()
    before = open_descriptors()
    conn = read_only(db)
    cursor = conn.execute("SELECT session_id FROM trace_sessions")
    cursor.fetchone()  # the statement is open: it holds the shared lock
    probe = WriterProbe.for_new_descriptor(str(db), before)
    assert probe.fd is not None and probe.fd not in before, "the probe must use this connection's descriptor"
    other.close()
    assert probe.still_valid()
    assert not probe.writer_waiting()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "inserted"
        wait_for("the writer waiting on the PENDING byte", probe.writer_waiting, bool, timeout=10.0, interval=0.01)
        assert writer.poll() is None, "the writer cannot commit while our statement is open"
        cursor.close()  # ends the statement: the writer's next try commits
        assert writer.stdout.readline().strip() == "committed"
        assert writer.wait(timeout=30) == 0
        assert not probe.writer_waiting()
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        conn.close()


class _ScriptedProbe(WriterProbe):
    """A probe that answers from a list: no descriptor, no timing."""

    def __init__(self, answers: list[bool]) -> None:
        super().__init__(None)
        self.answers = answers
        self.asked = 0

    def still_valid(self) -> bool:
        return True

    def writer_waiting(self) -> bool:
        self.asked += 1
        return self.answers.pop(0) if self.answers else False


class _Clock:
    """``time`` for the statements and the probe: every ``monotonic()`` call is ``step`` (one millisecond) later."""

    def __init__(self, step: float = 0.001) -> None:
        self.now = 1000.0
        self.step = step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(
    ("writer_seen_at_look", "rows_read"),
    [
        # bound 30.5 ms, margin 0.5 ms, and look k happens k ms into the statement (no edge falls on a look)
        (None, 31),  # no writer: the statement ends at its bound
        (6, 38),  # first tried after look 5: retries at 6, 8, 13, 23, 38 ms; 38 is the first past the bound
        (25, 32),  # first tried after 24 ms: retries at 25, 27, 32 ms; it ends at 31.5 ms
        (28, 35),  # first tried after 27 ms: its 3 ms retry (30 ms) comes before the bound, its 8 ms one after
    ],
)
def test_a_statement_ends_just_before_the_waiting_writers_first_retry_past_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer_seen_at_look: int | None, rows_read: int) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {f"w{i:03d}:0": 1 for i in range(100)})
    conn = sqlite3.connect(db)
    monkeypatch.setattr(statements, "time", _Clock())
    monkeypatch.setattr(statements, "WRITER_MARGIN_SECONDS", 0.0005)
    # one row per chunk and one clock tick per look
    answers = [] if writer_seen_at_look is None else [False] * (writer_seen_at_look - 1) + [True]
    rows, ended = fetch_for(conn, "SELECT session_id FROM trace_sessions ORDER BY session_id", seconds=0.0305,
                            probe=_ScriptedProbe(answers), chunk=1)
    conn.close()
    assert not ended
    assert len(rows) == rows_read


def test_a_quiet_file_runs_the_statement_to_its_end(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {f"w{i:03d}:0": 1 for i in range(100)})
    conn = sqlite3.connect(db)
    quiet = _ScriptedProbe([])
    rows, ended = fetch_for(conn, "SELECT session_id FROM trace_sessions", seconds=3600.0, probe=quiet, chunk=10)
    conn.close()
    assert ended and len(rows) == 100 and quiet.asked == 10  # looked after every full chunk


def test_pages_ended_for_a_writer_still_cover_every_session_whole(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {f"s{i:04d}:0": 1 + i % 4 for i in range(300)})
    monkeypatch.setattr(statements, "BUSY_RETRY_SECONDS", (0.0,))  # a seen writer's retry is due at once
    monkeypatch.setattr(statements, "DEFAULT_CHUNK", 7)
    conn = sqlite3.connect(db)
    expected = conn.execute("SELECT session_id, COUNT(*) FROM trace_sessions GROUP BY session_id "
                            "ORDER BY session_id").fetchall()
    always = _ScriptedProbe([True] * 10_000)
    pages = list(iter_session_pages(conn, page_size=10_000, page_seconds=3600.0, probe=always))
    conn.close()
    assert len(pages) > 10, "every page ended early"
    assert [(r[0], r[1]) for page in pages for r in page] == expected


def test_a_probe_whose_descriptor_now_names_another_file_stops(tmp_path: Path) -> None:
    store, elsewhere = tmp_path / "a.db", tmp_path / "b.db"
    store.write_bytes(b"")
    elsewhere.write_bytes(b"")
    info = store.stat()
    fd = os.open(elsewhere, os.O_RDONLY)
    try:
        probe = WriterProbe(fd, (info.st_dev, info.st_ino))
        assert not probe.still_valid() and probe.fd is None
        assert not probe.writer_waiting()
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer probe reads Linux's struct flock")
def test_slow_looks_in_a_row_turn_the_probe_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 1})
    before = open_descriptors()
    conn = read_only(db)
    conn.execute("SELECT 1 FROM traces").fetchall()
    probe = WriterProbe.for_new_descriptor(str(db), before)
    assert probe.fd is not None
    monkeypatch.setattr(locking, "time", _Clock(step=0.005))  # every look seems to take 5 ms (a lock server)
    for _ in range(locking.PROBE_SLOW_LOOKS - 1):
        assert not probe.writer_waiting()
    assert probe.fd is not None, "a slow look or two is just preemption"
    assert not probe.writer_waiting()
    assert probe.fd is None, "slow looks in a row turn the probe off"
    conn.close()


def test_reads_of_one_file_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two connections of one process would share the lock and keep a writer out: one read at a time."""
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 1})
    entered = threading.Event()
    real = source._read_trace_store_sqlite

    def spy(*args: object, **kwargs: object) -> object:
        entered.set()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(source, "_read_trace_store_sqlite", spy)
    results: list[object] = []
    reader = threading.Thread(target=lambda: results.append(read_trace_store_sqlite(target(db), Policy(), now=0)))
    with one_reader_per_file(str(db)):
        reader.start()
        assert not entered.wait(0.3), "a second read of the same file must wait for the first"
    reader.join(timeout=30)
    assert entered.is_set() and len(results) == 1


def _stalling_connection(db: Path, after_rows: int) -> sqlite3.Connection:
    """A connection whose ``stall(n)`` sleeps 50 ms once ``n`` passes ``after_rows`` (a page cache miss)."""
    conn = read_only(db)
    conn.create_function("stall", 1, lambda n: (time.sleep(0.05) if n > after_rows else None, n)[1])
    return conn


def test_a_chunk_stuck_past_its_end_is_interrupted_and_the_rows_before_it_are_kept(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {f"w{i:03d}:0": 1 for i in range(60)})
    # the cursor steps one row ahead of what it returns: rows past 12 stall, so the third chunk (rows 11-15)
    # stalls inside its fetch, far past the 20 ms end, where no look at the clock can end it
    conn = _stalling_connection(db, after_rows=12)
    sql = "SELECT session_id, stall(ROW_NUMBER() OVER (ORDER BY session_id)) FROM trace_sessions ORDER BY session_id"
    with StatementWatch(conn) as watch:
        rows, ended = fetch_for(conn, sql, seconds=0.02, watch=watch, chunk=5)
        assert watch.interrupts == 1
        assert not ended and [row[1] for row in rows] == list(range(1, 11)), "whole chunks only, in order"
        # the interrupt is spent: the next statement runs
        assert fetch_all(conn, "SELECT COUNT(*) FROM trace_sessions", watch=watch)[0] == [(60,)]
    conn.close()


def test_a_statement_interrupted_before_its_first_rows_is_tried_a_row_at_a_time_then_left_to_finish(
        tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {f"w{i:03d}:0": 1 for i in range(3)})
    conn = _stalling_connection(db, after_rows=0)  # every row takes 50 ms: even one row overruns a 0 s bound
    sql = "SELECT session_id, stall(ROW_NUMBER() OVER (ORDER BY session_id)) FROM trace_sessions ORDER BY session_id"
    with StatementWatch(conn) as watch:
        rows, ended = fetch_for(conn, sql, seconds=0.0, watch=watch, chunk=100)
        assert watch.interrupts == 2, "the whole chunk, then a single row, then no more"
        assert not ended and [row[0] for row in rows] == ["w000:0"], "the unwatched try reads a row: progress"
    conn.close()


def test_fetch_all_interrupted_once_runs_again_unwatched(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {f"w{i:03d}:0": 1 for i in range(3)})
    conn = _stalling_connection(db, after_rows=1)  # the first row comes with the statement's start
    with StatementWatch(conn) as watch:
        rows, _ = fetch_all(conn, "SELECT stall(rowid) FROM trace_sessions ORDER BY rowid", watch=watch)
        assert rows == [(1,), (2,), (3,)] and watch.interrupts == 1
    conn.close()


def test_an_interrupt_with_no_statement_running_does_not_hit_the_next_one(tmp_path: Path) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 2})
    conn = read_only(db)
    with StatementWatch(conn) as watch:
        watch.arm(time.monotonic())
        wait_for("the watch to fire", lambda: watch.interrupts, lambda n: n == 1, timeout=10.0, interval=0.01)
        assert fetch_all(conn, "SELECT COUNT(*) FROM traces")[0] == [(2,)]
    conn.close()


def test_a_trace_whose_rowid_was_reused_between_the_two_steps_is_not_taken_for_the_candidates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 1, "b:0": 1})
    with sqlite3.connect(db) as setup:
        newest = setup.execute("SELECT trace_id, rowid FROM traces ORDER BY rowid DESC LIMIT 1").fetchone()
    setup.close()
    real = source.fetch_for
    mutated: list[bool] = []

    def between_the_steps(conn: sqlite3.Connection, sql: str, params: object = (), **kwargs: object) -> object:
        if "WHERE rowid IN" in sql and not mutated:  # the gateway deletes a session and writes another
            with sqlite3.connect(db) as writer:
                writer.execute("DELETE FROM trace_sessions WHERE trace_id = ?", (newest[0],))
                writer.execute("DELETE FROM traces WHERE trace_id = ?", (newest[0],))
                writer.execute("INSERT INTO traces (trace_id, data, created_at) VALUES ('other', '{}', 0)")
                reused = writer.execute("SELECT rowid FROM traces WHERE trace_id = 'other'").fetchone()[0]
            writer.close()
            assert reused == newest[1], "SQLite hands out the deleted top rowid again"
            mutated.append(True)
        return real(conn, sql, params, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(source, "fetch_for", between_the_steps)
    conn = read_only(db)
    rows = [row for page in source.iter_candidate_traces(conn, ["a:0", "b:0"], seconds=60.0, busy_timeout=5.0)
            for row in page]
    conn.close()
    assert mutated
    assert [row[1] for row in rows] == [tid for tid in ("a:0/0", "b:0/0") if tid != newest[0]]


def test_a_trace_renumbered_between_the_two_steps_is_found_by_its_id(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A VACUUM renumbers the rowids of a table with a text key: the traces are still there, and still read."""
    db = tmp_path / "traces.db"
    make_store(db, {"a:0": 1, "b:0": 1, "c:0": 2})
    real = source.fetch_for
    moved: list[bool] = []

    def between_the_steps(conn: sqlite3.Connection, sql: str, params: object = (), **kwargs: object) -> object:
        if "WHERE rowid IN" in sql and not moved:
            with sqlite3.connect(db) as writer:  # shift every rowid, as a renumbering would
                writer.execute("UPDATE traces SET rowid = rowid + 1000")
            writer.close()
            moved.append(True)
        return real(conn, sql, params, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(source, "fetch_for", between_the_steps)
    conn = read_only(db)
    rows = sorted(row[:2] for page in source.iter_candidate_traces(conn, ["a:0", "b:0", "c:0"], seconds=60.0,
                                                                    busy_timeout=5.0) for row in page)
    conn.close()
    assert moved
    assert rows == [("a:0", "a:0/0"), ("b:0", "b:0/0"), ("c:0", "c:0/0"), ("c:0", "c:0/1")]
