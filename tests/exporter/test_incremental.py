"""The exporter's incremental reads of a SQLite trace store: equal to a full read after appends, and a full read
whenever it cannot be sure (a deleted session, a deleted top row whose rowid comes back, VACUUM, a replaced file,
the interval, the guard).

The files carry the gateway's own schema and journal mode (its ``SqliteTraceStore`` creates them, run by the
flavour's interpreter); rows are written with the gateway's own statements (``store_trace``,
``delete_session``), with chosen times so a session can be idle without an UPDATE.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gatewayscope.analysis.findings import target_findings
from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import StoreError
from gatewayscope.exporter import collectors, settings
from gatewayscope.exporter.server import Exporter
from gatewayscope.exporter.settings import ExporterSettings
from gatewayscope.guard import sqlite as guard_sqlite
from gatewayscope.scan import read_target
from gatewayscope.snapshot import TargetSnapshot, TraceStoreData
from gatewayscope.sources import rllm_sqlite_incremental as incremental
from gatewayscope.sources.rllm_sqlite import read_trace_store_sqlite
from gatewayscope.sources.rllm_sqlite_incremental import IncrementalStore
from tests.e2e._store import _gateway_schema

pytest.importorskip("rllm_model_gateway.store.sqlite_store")

NOW = time.time()
DAY = 86400.0
POLICY = Policy()


# -- the gateway's own writes ---------------------------------------------------------------------------------

def store_trace(conn: sqlite3.Connection, trace_id: str, sid: str, created: float, *, weight: int | None = None,
                tokens: int = 20) -> None:
    """The gateway's ``store_trace``, its two statements and one commit, at time ``created``."""
    data: dict[str, Any] = {"trace_id": trace_id, "session_id": sid, "messages": [{"role": "user", "content": "x"}],
                            "prompt_token_ids": list(range(tokens)), "model": "stub", "timestamp": created}
    if weight is not None:
        data["weight_version"] = weight
    conn.execute("INSERT OR REPLACE INTO traces (trace_id, data, created_at) VALUES "
                 "(?, ?, COALESCE((SELECT created_at FROM traces WHERE trace_id = ?), ?))",
                 (trace_id, json.dumps(data), trace_id, created))
    conn.execute("INSERT OR IGNORE INTO trace_sessions (trace_id, session_id, created_at) VALUES "
                 "(?, ?, COALESCE((SELECT created_at FROM traces WHERE trace_id = ?), ?))",
                 (trace_id, sid, trace_id, created))
    conn.commit()


def delete_session(conn: sqlite3.Connection, sid: str) -> None:
    """The gateway's ``delete_session``: its junction rows, then its unshared traces."""
    unique = [row[0] for row in conn.execute(
        "SELECT ts1.trace_id FROM trace_sessions ts1 WHERE ts1.session_id = ? AND NOT EXISTS "
        "(SELECT 1 FROM trace_sessions ts2 WHERE ts2.trace_id = ts1.trace_id AND ts2.session_id != ?)",
        (sid, sid))]
    conn.execute("DELETE FROM trace_sessions WHERE session_id = ?", (sid,))
    conn.executemany("DELETE FROM traces WHERE trace_id = ?", [(t,) for t in unique])
    conn.commit()


def writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=10)
    conn.execute("PRAGMA foreign_keys = ON")  # as the gateway's connection
    return conn


def new_store(path: Path, python: str, sessions: dict[str, int], *, idle: frozenset[str] = frozenset()) -> None:
    """A store with the flavour's schema holding ``sessions`` (id -> traces); ``idle`` ones are two days old."""
    _gateway_schema(path, python)
    with writer(path) as conn:
        for sid, count in sessions.items():
            for i in range(count):
                store_trace(conn, f"{sid}/{i}", sid, NOW - (2 * DAY if sid in idle else 60) + i)
    conn.close()


@pytest.fixture
def store(tmp_path: Path, gateway_flavor: Any) -> Path:
    path = tmp_path / "traces.db"
    new_store(path, gateway_flavor.python, {"kept-a": 3, "kept-b": 2, "orphan-1": 1, "orphan-2": 1, "live": 1},
              idle=frozenset({"orphan-1", "orphan-2"}))
    return path


def target(path: Path) -> Target:
    return Target(name="file", kind="rllm", path=str(path), timeout_seconds=5)


def full(path: Path) -> TraceStoreData:
    return read_trace_store_sqlite(target(path), POLICY, now=NOW, full=True)


def assert_same(got: TraceStoreData, want: TraceStoreData) -> None:
    """The figures a scan draws from a read: every session's count and times, and the candidates' traces."""
    assert got.sessions.equals(want.sessions), (got.sessions, want.sessions)
    order = ["session_id", "trace_id"]
    assert got.candidate_traces.sort(order).equals(want.candidate_traces.sort(order))
    assert got.current_weight_version == want.current_weight_version
    assert (got.tombstoned_ids, got.guard) == (want.tombstoned_ids, want.guard)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def read(inc: IncrementalStore, path: Path) -> TraceStoreData:
    data = inc.read(target(path), POLICY, now=NOW)
    assert data is not None, "an unguarded store is read here"
    return data


# -- incremental reads equal full reads -----------------------------------------------------------------------

@pytest.mark.e2e  # starts a process
def test_appends_are_merged_into_the_last_reads_figures(store: Path) -> None:
    inc = IncrementalStore()
    assert_same(read(inc, store), full(store))
    assert inc.last == ("full", "first")
    with writer(store) as conn:
        store_trace(conn, "kept-a/9", "kept-a", NOW - 5)           # an existing session grows
        store_trace(conn, "orphan-1/1", "orphan-1", NOW - 4)       # a candidate gets a second trace: no orphan
        store_trace(conn, "new-1/0", "new-1", NOW - 3)             # a new session
        store_trace(conn, "stale/0", "stale", NOW - 3 * DAY)       # a new, already idle one-trace session
        store_trace(conn, "old-time/0", "kept-b", NOW - 9 * DAY)   # an earlier first trace time
    conn.close()
    got = read(inc, store)
    assert inc.last == ("incremental", None)
    want = full(store)
    assert_same(got, want)
    figures = {row[0]: row[1] for row in got.sessions.rows()}
    assert (figures["kept-a"], figures["orphan-1"], figures["new-1"], figures["kept-b"]) == (4, 2, 1, 3)
    assert set(got.candidate_traces["session_id"]) == {"orphan-2", "stale"}
    # nothing new: incremental again, the same figures
    assert_same(read(inc, store), want)
    assert inc.last == ("incremental", None)
    assert inc.counts() == {"modes": {"incremental": 2, "full": 1, "guarded": 0},
                            "reasons": {"first": 1, "interval": 0, "file": 0, "schema": 0, "rows": 0}}


@pytest.mark.e2e  # starts a process
def test_a_candidate_trace_rewritten_is_read_again(store: Path) -> None:
    inc = IncrementalStore()
    read(inc, store)
    with writer(store) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")  # no cascade: only the traces row changes (a new rowid)
        store_trace(conn, "orphan-2/0", "orphan-2", NOW, weight=7, tokens=99)
    conn.close()
    got = read(inc, store)
    assert inc.last == ("incremental", None)
    assert_same(got, full(store))
    row = got.candidate_traces.filter(pl.col("session_id") == "orphan-2").row(0, named=True)
    assert (row["weight_version"], row["prompt_tokens"]) == (7, 99)


# -- every case it cannot be sure of is a full read, and right ------------------------------------------------

def _delete_a_session(path: Path, python: str) -> None:
    with writer(path) as conn:
        delete_session(conn, "kept-b")
        store_trace(conn, "new/0", "new", NOW)  # a new row makes the count of all rows look the same
    conn.close()


def _delete_the_top_row_and_insert_again(path: Path, python: str) -> None:
    with writer(path) as conn:
        top = conn.execute("SELECT rowid, session_id FROM trace_sessions ORDER BY rowid DESC LIMIT 1").fetchone()
        delete_session(conn, top[1])
        store_trace(conn, "usurper/0", "usurper", NOW - 3 * DAY)  # takes the deleted row's rowid
        assert conn.execute("SELECT MAX(rowid) FROM trace_sessions").fetchone()[0] == top[0]
    conn.close()


def _vacuum(path: Path, python: str) -> None:
    with writer(path) as conn:
        delete_session(conn, "kept-a")
        conn.execute("VACUUM")  # renumbers the rowids after the deleted ones
    conn.close()


def _replace_the_file(path: Path, python: str) -> None:
    other = path.with_name("other.db")
    sessions = {"kept-a": 3, "kept-b": 2, "orphan-1": 1, "orphan-2": 1, "live": 1, "x": 1}
    new_store(other, python, sessions, idle=frozenset({"x"}))
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(other, path)


@pytest.mark.parametrize(("change", "reason"), [
    (_delete_a_session, "rows"),
    (_delete_the_top_row_and_insert_again, "rows"),
    (_vacuum, "schema"),
    (_replace_the_file, "file"),
])
@pytest.mark.e2e  # starts a process
def test_a_change_it_cannot_follow_is_read_in_full(store: Path, gateway_flavor: Any, change: Any,
                                                   reason: str) -> None:
    inc = IncrementalStore()
    read(inc, store)
    change(store, gateway_flavor.python)
    got = read(inc, store)
    assert inc.last == ("full", reason)
    assert_same(got, full(store))
    # and the read after builds on that one
    with writer(store) as conn:
        store_trace(conn, "after/0", "after", NOW)
    conn.close()
    assert_same(read(inc, store), full(store))
    assert inc.last == ("incremental", None)


@pytest.mark.e2e  # starts a process
def test_rows_rewritten_in_the_rowids_of_deleted_ones_are_read_in_full(tmp_path: Path, gateway_flavor: Any) -> None:
    """Once the top rows are deleted, later writes take their rowids: a session deleted, a trace re-stored
    twice and a new session can leave the same count up to the watermark and the very same row at it, with
    other rows below. The digest of the rows' times sees it; the read is full and right."""
    path = tmp_path / "traces.db"
    _gateway_schema(path, gateway_flavor.python)
    conn = writer(path)
    try:
        store_trace(conn, "a", "A", NOW - 200)
        store_trace(conn, "p", "P", NOW - 190)  # rowid 2
        store_trace(conn, "y0", "Q", NOW - 180)  # rowid 3
        store_trace(conn, "t", "B", NOW - 170)  # rowid 4: the watermark
        delete_session(conn, "P")  # a gap at rowid 2 before the first read
        inc = IncrementalStore()
        assert_same(read(inc, path), full(path))
        delete_session(conn, "Q")  # rowid 3 goes
        store_trace(conn, "t", "B", NOW - 170)  # re-stored: its junction row comes back at rowid 2
        store_trace(conn, "y1", "R", NOW - 100)  # rowid 3
        store_trace(conn, "t", "B", NOW - 170)  # again: back at rowid 4, the same row as at the first read
        rows = conn.execute("SELECT rowid, trace_id, session_id FROM trace_sessions ORDER BY rowid").fetchall()
    finally:
        conn.close()
    assert rows == [(1, "a", "A"), (3, "y1", "R"), (4, "t", "B")]
    data = read(inc, path)
    assert inc.last == ("full", "rows")
    assert sorted(data.sessions["session_id"].to_list()) == ["A", "B", "R"]
    assert_same(data, full(path))


@pytest.mark.e2e  # starts a process
def test_the_interval_bounds_the_time_between_full_reads(store: Path) -> None:
    clock = Clock()
    inc = IncrementalStore(full_read_interval_seconds=600, clock=clock)
    read(inc, store)
    clock.now += 599
    read(inc, store)
    assert inc.last == ("incremental", None)
    clock.now += 1
    assert_same(read(inc, store), full(store))
    assert inc.last == ("full", "interval")
    inc.full_read_interval_seconds = 0  # 0: every read is full
    read(inc, store)
    assert inc.last == ("full", "interval")


@pytest.mark.e2e  # starts a process
def test_a_store_with_the_guard_is_left_to_the_scans_read(store: Path) -> None:
    inc = IncrementalStore()
    read(inc, store)
    guard_sqlite.install(store)
    assert inc.read(target(store), POLICY, now=NOW) is None  # the caller reads it as the scan does
    assert inc.last == ("guarded", None) and inc.state is None
    guard_sqlite.uninstall(store)
    assert_same(read(inc, store), full(store))
    assert inc.last == ("full", "first")  # the guarded read left no state to build on


def test_a_failed_read_leaves_no_state(tmp_path: Path) -> None:
    inc = IncrementalStore()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(Exception, match="not a SQLite database"):
        read(inc, garbage)
    assert inc.state is None


# -- the exporter ---------------------------------------------------------------------------------------------

@pytest.mark.e2e  # starts a process
def test_the_exporter_reads_incrementally_and_counts_its_reads(store: Path) -> None:
    config = Config(targets=[target(store)], policy=POLICY)
    exporter = Exporter(config, ExporterSettings(min_interval_seconds=0))
    from prometheus_client.exposition import generate_latest

    first = generate_latest(exporter.metrics_registry(10)).decode()
    with writer(store) as conn:
        store_trace(conn, "stale/0", "stale", NOW - 3 * DAY)
    conn.close()
    text = generate_latest(exporter.metrics_registry(10)).decode()
    assert 'gatewayscope_trace_store_sessions{target="file"} 5.0' in first
    assert 'gatewayscope_trace_store_sessions{target="file"} 6.0' in text
    assert 'gatewayscope_trace_store_orphan_sessions{confidence="suspected",target="file"} 3.0' in text
    assert 'gatewayscope_exporter_store_reads_total{mode="incremental",target="file"} 1.0' in text
    assert 'gatewayscope_exporter_store_reads_total{mode="full",target="file"} 1.0' in text
    assert 'gatewayscope_exporter_store_full_reads_total{reason="first",target="file"} 1.0' in text


@pytest.mark.e2e  # starts a process
def test_the_exporter_reads_a_guarded_store_as_the_scan_does(store: Path) -> None:
    guard_sqlite.install(store)
    config = Config(targets=[target(store)], policy=POLICY)
    exporter = Exporter(config, ExporterSettings(min_interval_seconds=0))
    result = exporter.cache.fetch(config.targets, 30)[0]
    assert result.snapshot.up and result.snapshot.trace_store is not None
    assert result.snapshot.trace_store.guard is not None  # the guard's figures: the scan's read
    assert exporter.cache.counters()["file"]["store_reads"]["modes"] == {"incremental": 0, "full": 0, "guarded": 1}


def test_the_exporters_vocabularies_and_default_are_the_sources() -> None:
    assert collectors.STORE_READ_MODES == incremental.MODES
    assert collectors.FULL_READ_REASONS == incremental.FULL_REASONS
    assert settings.DEFAULT_FULL_READ_INTERVAL_SECONDS == incremental.DEFAULT_FULL_READ_INTERVAL_SECONDS


# -- rows no gateway writes: the scan and the exporter read them the same way (issue 23) ----------------------

def foreign_row(path: Path, sid: Any, created: Any) -> None:
    """A junction row (and its trace) another program wrote: a session id or a time of a type the gateway never
    writes (the columns' REAL and TEXT affinities keep a TEXT time TEXT and a BLOB id a BLOB)."""
    with writer(path) as conn:
        conn.execute("INSERT INTO traces (trace_id, data, created_at) VALUES ('foreign/0', '{}', ?)", (created,))
        conn.execute("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES ('foreign/0', ?, ?)",
                     (sid, created))
    conn.close()


def scan_read(path: Path) -> TargetSnapshot:
    return read_target(target(path), POLICY, now=NOW)


@pytest.mark.e2e  # starts a process
def test_a_text_time_is_read_alike_by_the_scan_and_the_exporter(store: Path) -> None:
    foreign_row(store, "text-time", "yesterday")
    want = full(store)
    assert ("text-time", 1, None, None) in want.sessions.rows()  # an unknown time, and so no candidate
    assert_same(read(IncrementalStore(), store), want)
    scanned = scan_read(store)
    assert scanned.up, scanned.error
    exported = Exporter(Config(targets=[target(store)], policy=POLICY),
                        ExporterSettings(min_interval_seconds=0)).cache.fetch([target(store)], 30)[0].snapshot
    assert exported.up, exported.error
    orphans = [sorted(target_findings(snap, POLICY, now=NOW).orphans["session_id"].to_list())  # type: ignore[index]
               for snap in (scanned, exported)]
    assert orphans[0] == orphans[1] == ["orphan-1", "orphan-2"]


@pytest.mark.e2e  # starts a process
def test_a_text_time_in_the_rows_added_since_is_read_as_a_full_read_reads_it(store: Path) -> None:
    inc = IncrementalStore()
    read(inc, store)
    foreign_row(store, "text-time", "yesterday")
    assert_same(read(inc, store), full(store))


@pytest.mark.e2e  # starts a process
def test_a_blob_session_id_is_the_same_sentence_from_the_scan_and_the_exporter(store: Path) -> None:
    foreign_row(store, b"\x00\xff", NOW - 2 * DAY)
    scanned = scan_read(store)
    exported = Exporter(Config(targets=[target(store)], policy=POLICY),
                        ExporterSettings(min_interval_seconds=0)).cache.fetch([target(store)], 30)[0].snapshot
    with pytest.raises(StoreError) as listed:
        full(store)
    assert not scanned.up and not exported.up
    assert scanned.error == exported.error == str(listed.value)
    assert scanned.error_kind == exported.error_kind == "store"
    assert "session id that is not text (a BLOB)" in str(listed.value)
