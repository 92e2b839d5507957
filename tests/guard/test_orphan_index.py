"""The SQLite guard's orphan index: kept exact by its triggers, filled at install, and a scan read from it reports
exactly what the full read reports.

Every write and delete goes through rLLM's own ``SqliteTraceStore`` (the SQL the unmodified gateway runs), with its
connection opened before the guard is installed, as with a running gateway. Each equivalence check reads the same
file three times, through the index, with ``full=True`` and with the candidates read a store without the index
gets, and compares the scan report, the findings' orphans and the plan built from them.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

pytest.importorskip("rllm_model_gateway")

from gatewayscope.analysis.findings import findings
from gatewayscope.cli import main as cli_main
from gatewayscope.config import Config, Policy, Target
from gatewayscope.guard import sqlite as guard
from gatewayscope.remediate.plan import build_plan
from gatewayscope.scan import read_target, scan_report
from gatewayscope.snapshot import Snapshot, TargetSnapshot
from gatewayscope.sources.rllm_sqlite import read_trace_store_sqlite
from tests.factories import Gateway, now_data

HOUR = 3600.0
POLICY = Policy(orphan_idle_seconds=2 * HOUR)


def age(path: Path, session_id: str, seconds: float, *, weight: int | None = None) -> None:
    """Move a session's rows back in time (and give its traces a weight version), as an idle session's."""
    with sqlite3.connect(path, timeout=10) as conn:
        conn.execute("UPDATE traces SET created_at = created_at - ? WHERE trace_id IN "
                     "(SELECT trace_id FROM trace_sessions WHERE session_id = ?)", (seconds, session_id))
        conn.execute("UPDATE trace_sessions SET created_at = created_at - ? WHERE session_id = ?",
                     (seconds, session_id))
        if weight is not None:
            conn.execute("UPDATE traces SET data = json_set(data, '$.weight_version', ?, '$.timestamp', created_at) "
                         "WHERE trace_id IN (SELECT trace_id FROM trace_sessions WHERE session_id = ?)",
                         (weight, session_id))


def index_matches_store(path: Path) -> None:
    """The index holds exactly the full read's per-session figures, and the totals row sums them."""
    with sqlite3.connect(path) as conn:
        truth = conn.execute("SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at) FROM trace_sessions "
                             "GROUP BY session_id ORDER BY session_id").fetchall()
        index = conn.execute(f"SELECT * FROM {guard.INDEX_TABLE} ORDER BY session_id").fetchall()
        totals = conn.execute(f"SELECT sessions, traces FROM {guard.TOTALS_TABLE}").fetchall()
    assert index == truth
    assert totals == [(len(truth), sum(row[1] for row in truth))]


def read(path: Path, now: float, *, full: bool, deleted_ids: dict[str, float], index: bool = True) -> TargetSnapshot:
    """The scan's read (the index when it is ready), the candidates read (``index=False``: as on a store without
    the index), or every session listed (``full``)."""
    target = Target(name="store", kind="rllm", path=str(path))
    if full or not index:
        data = read_trace_store_sqlite(target, POLICY, now=now, guard_reader=guard.read_for_scan, full=full,
                                       also=list(deleted_ids))
        return TargetSnapshot(name="store", kind="rllm", address=target.address, up=True, started_at=now,
                              duration_seconds=0.0, trace_store=data)
    snap = read_target(target, POLICY, now=now, also_sessions=list(deleted_ids))  # the index when it is ready
    assert snap.up, snap.error
    snap.duration_seconds = 0.0
    return snap


def both_reads_agree(path: Path, *, deleted_ids: dict[str, float] | None = None) -> dict[str, Any]:
    """Scan ``path`` through the index, with the candidates read and in full; the report, orphans and plan must
    be the same. Returns the index read's report entry."""
    now = time.time()
    deleted_ids = deleted_ids or {}
    config = Config(targets=[Target(name="store", kind="rllm", path=str(path))], policy=POLICY)
    reports, plans, frames, reads = [], [], [], []
    for full, index in ((False, True), (True, True), (False, False)):
        snap = read(path, now, full=full, deleted_ids=deleted_ids, index=index)
        found = findings(Snapshot(taken_at=now, targets=[snap]), config, deleted_ids=deleted_ids)
        reports.append(scan_report(found))
        frames.append(found.orphans)
        plan = build_plan(found, include_suspected=True, created_at=now).to_dict()
        plans.append({key: value for key, value in plan.items() if key != "id"})
        reads.append(snap.trace_store)
    indexed, full_read, candidates = reads
    assert indexed is not None and full_read is not None and candidates is not None
    assert full_read.session_total is None and full_read.sessions.height == full_read.session_count
    assert candidates.session_total is not None
    for other in (1, 2):
        assert reports[0] == reports[other]
        assert frames[0].equals(frames[other])
        assert plans[0] == plans[other]
        assert reads[0].candidate_traces.sort("trace_id").equals(reads[other].candidate_traces.sort("trace_id"))
    entry: dict[str, Any] = reports[0]["targets"][0]
    entry["_index_used"] = indexed.guard is not None and indexed.guard.index == "ready"
    entry["_sessions_read"] = indexed.sessions.height
    return entry


ODD_IDS = ["quote'\"; DROP TABLE traces;--", "émoji 🧵:0", "%2F..%00", "tab\there:1", "<b>x</b>:2"]


def build(gw: Gateway, path: Path) -> None:
    """A store with suspected orphans (some within the weight lag), multi-trace and live sessions, odd ids."""
    for i in range(40):
        gw.write(f"orphan-{i}", f"task{i % 4}:{i}")
    for i in range(10):
        for turn in range(3):
            gw.write(f"multi-{i}-{turn}", f"multi:{i}")
    for i, sid in enumerate(ODD_IDS):
        gw.write(f"odd-{i}", sid)
    gw.write("live-0", "live:0")
    for i in range(40):
        age(path, f"task{i % 4}:{i}", 3 * HOUR + i * 60, weight=i % 3)
    for i in range(5):
        age(path, f"multi:{i}", 5 * HOUR)
    for sid in ODD_IDS[:3]:
        age(path, sid, 4 * HOUR)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "gateway_traces.db"


@pytest.fixture
def gw(db: Path) -> Any:
    gateway = Gateway(db)
    yield gateway
    gateway.close()


def test_a_guard_installed_on_a_store_with_orphans_reports_what_the_full_read_reports(gw: Gateway, db: Path) -> None:
    build(gw, db)
    result = guard.install(db)
    assert result.indexed_sessions == 40 + 10 + len(ODD_IDS) + 1
    index_matches_store(db)
    entry = both_reads_agree(db)
    assert entry["_index_used"]
    assert entry["orphans"]["suspected"] > 0 and entry["sessions"] == 56 and entry["traces"] == 76
    assert entry["_sessions_read"] < entry["sessions"]  # only the candidates were read
    assert entry["guard"]["index"] == "ready"


def test_deletes_stragglers_backfills_and_lifted_retries_keep_the_reads_equal(gw: Gateway, db: Path) -> None:
    build(gw, db)
    guard.install(db)
    for i in range(0, 40, 5):  # deleted orphans; their stragglers are dropped
        gw.delete(f"task{i % 4}:{i}")
        gw.write(f"late-{i}", f"task{i % 4}:{i}")
    gw.delete("multi:0")
    gw.delete(ODD_IDS[0])
    guard.add_tombstones(db, ["task1:1", "multi:1", ODD_IDS[1]])  # tombstoned while they still have rows
    index_matches_store(db)
    entry = both_reads_agree(db, deleted_ids=dict.fromkeys(("multi:2", "task2:2"), time.time()))
    assert entry["_index_used"] and entry["orphans"]["confirmed"] >= 3

    # rLLM reusing deleted uids (a retry, the next step): their new calls land after the fence, no lift needed
    for sid in ("task0:0", "multi:0"):
        gw.write(f"retry-{sid}-a", sid, now_data(f"retry-{sid}-a", sid))
        gw.write(f"retry-{sid}-b", sid, now_data(f"retry-{sid}-b", sid))
    gw.write("again-task1:1", "task1:1", now_data("again-task1:1", "task1:1"))  # no longer one trace
    index_matches_store(db)
    entry = both_reads_agree(db)
    assert entry["_index_used"]
    ids = {row["session_id"] for row in entry["orphan_sessions"]}
    assert "task0:0" not in ids and "task1:1" not in ids


def test_a_rewritten_trace_and_random_writes_and_deletes_keep_the_index_exact(gw: Gateway, db: Path) -> None:
    """Random traffic after the install, including the gateway's INSERT OR REPLACE of an existing trace id (its
    junction rows cascade away and come back) and traces shared by two sessions."""
    build(gw, db)
    guard.install(db, capacity=0)
    rng = random.Random(5)
    sessions = [f"r:{i}" for i in range(25)]
    for step in range(300):
        sid = rng.choice(sessions)
        roll = rng.random()
        if roll < 0.6:
            gw.write(f"t{step}", sid)
        elif roll < 0.75:
            gw.write(f"t{rng.randrange(max(step, 1))}", sid)  # an existing id rewritten, maybe another session's
        elif roll < 0.85:
            gw.delete(sid)
        else:
            guard.lift_tombstone(db, sid)
    index_matches_store(db)
    assert both_reads_agree(db)["_index_used"]


def test_writes_between_fill_pages_are_counted_once(gw: Gateway, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway writes and deletes between the fill's transactions, in ranges filled and not yet filled."""
    build(gw, db)
    monkeypatch.setattr("gatewayscope.guard.sqlite.lifecycle.INDEX_FILL_PAGE", 7)
    pages: list[tuple[int, int]] = []

    def between_pages(done: int, estimate: int) -> None:
        pages.append((done, estimate))
        n = len(pages)
        gw.write(f"fill-a-{n}", "multi:3")  # filled in the first page or not, depending on the key
        gw.write(f"fill-b-{n}", f"task{n % 4}:{n}")
        gw.write(f"fill-c-{n}", f"zz-new:{n}")  # beyond every page so far
        if n == 3:
            gw.delete("task3:7")
            gw.delete("zz-new:1")

    result = guard.install(db, progress=between_pages)
    assert len(pages) > 3 and pages[-1][0] <= pages[-1][1]
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(pages))
    assert result.indexed_sessions is not None and result.indexed_sessions > 0
    index_matches_store(db)
    assert guard.status(db).index == "ready"
    assert both_reads_agree(db)["_index_used"]


def test_an_interrupted_fill_leaves_the_full_read_until_install_completes_it(
        gw: Gateway, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build(gw, db)
    monkeypatch.setattr("gatewayscope.guard.sqlite.lifecycle.INDEX_FILL_PAGE", 10)

    def interrupt(done: int, estimate: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        guard.install(db, progress=interrupt)
    status = guard.status(db)
    assert status.index == "building" and status.triggers_intact
    gw.write("meanwhile", "task1:1")
    entry = both_reads_agree(db)
    assert not entry["_index_used"] and entry["guard"]["index"] == "building"

    result = guard.install(db)
    assert result.changed and result.indexed_sessions == 56
    assert "orphan index" in result.message
    index_matches_store(db)
    assert both_reads_agree(db)["_index_used"]
    assert not guard.install(db).changed  # complete and intact: nothing to do


def schema_1(path: Path) -> None:
    """What an older gatewayscope installed: the tombstone guard without the orphan index."""
    with sqlite3.connect(path) as conn:
        for name in ("gatewayscope_index_on_insert", "gatewayscope_index_on_delete", "gatewayscope_index_on_update"):
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute("DROP INDEX gatewayscope_sessions_single")
        conn.execute(f"DROP TABLE {guard.INDEX_TABLE}")
        conn.execute(f"DROP TABLE {guard.TOTALS_TABLE}")
        conn.execute(f"DELETE FROM {guard.META_TABLE} WHERE key = 'index_ready'")
        conn.execute(f"UPDATE {guard.META_TABLE} SET value = 1 WHERE key = 'schema_version'")


def test_a_guard_from_an_older_gatewayscope_is_scanned_in_full_and_upgraded_by_install(
        gw: Gateway, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(gw, db)
    guard.install(db)
    guard.add_tombstones(db, ["task2:6"])
    schema_1(db)
    status = guard.status(db)
    assert status.triggers_intact and status.index == "absent" and status.schema_version == 1
    entry = both_reads_agree(db)
    assert not entry["_index_used"]
    assert entry["guard"]["index"] == "absent" and entry["guard"]["enabled"]
    assert cli_main(["guard", "status", str(db)]) == 0
    assert "orphan index    absent (a guard installed by an older gatewayscope)" in capsys.readouterr().out

    assert cli_main(["guard", "install", str(db)]) == 0  # not a terminal: no progress bar, one sentence
    out, err = capsys.readouterr()
    assert "Built its orphan index of 56 sessions" in out and err == ""
    schema_1(db)
    result = guard.install(db)
    assert result.changed and not result.created and result.indexed_sessions == 56
    assert "gatewayscope_sessions" in result.repaired
    assert guard.status(db).schema_version == guard.SCHEMA_VERSION
    assert guard.tombstone_count(db) == 1  # the tombstones were kept
    index_matches_store(db)
    assert both_reads_agree(db)["_index_used"]


def test_a_damaged_index_is_not_read_and_install_rebuilds_it(gw: Gateway, db: Path) -> None:
    build(gw, db)
    guard.install(db)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER gatewayscope_index_on_delete")
    gw.delete("task0:4")  # not seen by the index: it must not be read now
    status = guard.status(db)
    assert status.index == "damaged" and status.triggers_intact  # the tombstone guard itself is whole
    entry = both_reads_agree(db)
    assert not entry["_index_used"] and entry["guard"]["index"] == "damaged"
    assert guard.install(db).indexed_sessions == 55
    index_matches_store(db)


def test_uninstall_drops_the_index_and_the_scan_reads_in_full(gw: Gateway, db: Path) -> None:
    build(gw, db)
    guard.install(db)
    removed = guard.uninstall(db).removed
    assert set(guard.INDEX_OBJECTS) <= set(removed)
    with sqlite3.connect(db) as conn:
        left = conn.execute("SELECT name FROM sqlite_master WHERE name LIKE 'gatewayscope%'").fetchall()
    assert left == []
    entry = both_reads_agree(db)
    assert not entry["_index_used"] and entry["guard"] is None


def test_trace_writes_fire_one_upsert_each(gw: Gateway, db: Path) -> None:
    """The index costs a trace write one totals update and one upsert by primary key: no statement of its triggers
    scans a table (the gateway's delete reads a session's first and last time by its own index)."""
    build(gw, db)
    guard.install(db)
    with sqlite3.connect(db) as conn:
        sqls = [row[0] for row in conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'gatewayscope_index_%'")]
        for sql in sqls:
            body = sql.split("BEGIN", 1)[1].rsplit("END", 1)[0]
            for statement in filter(str.strip, body.split(";")):
                text = statement.replace("NEW.", "?1_").replace("OLD.", "?2_")
                text = text.replace("?1_session_id", "'s'").replace("?2_session_id", "'s'")
                text = text.replace("?1_created_at", "1.0").replace("?2_created_at", "1.0")
                plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {text}"))
                assert "SCAN" not in plan.replace("SCAN CONSTANT ROW", ""), (statement, plan)


def test_index_and_candidates_reads_survive_a_snapshot_round_trip_and_a_full_listings_manifest_is_unchanged(
        gw: Gateway, db: Path, tmp_path: Path) -> None:
    build(gw, db)
    now = time.time()
    config = Config(targets=[Target(name="store", kind="rllm", path=str(db))], policy=POLICY)
    listed = Snapshot(taken_at=now, targets=[read(db, now, full=True, deleted_ids={})])
    listed.save(tmp_path / "listed")
    assert "session_total" not in (tmp_path / "listed" / "manifest.json").read_text()  # as before the index
    plain = Snapshot(taken_at=now, targets=[read(db, now, full=False, deleted_ids={})])  # the candidates read
    loaded_plain = Snapshot.load(plain.save(tmp_path / "plain"))
    plain_data = loaded_plain.targets[0].trace_store
    assert plain_data is not None and (plain_data.session_total, plain_data.trace_total) == (56, 76)
    assert scan_report(findings(loaded_plain, config)) == scan_report(findings(listed, config))

    guard.install(db)
    snapshot = Snapshot(taken_at=now, targets=[read(db, now, full=False, deleted_ids={})])
    loaded = Snapshot.load(snapshot.save(tmp_path / "indexed"))
    data = loaded.targets[0].trace_store
    assert data is not None and (data.session_total, data.trace_total) == (56, 76)
    assert scan_report(findings(loaded, config)) == scan_report(findings(snapshot, config))


def test_the_notebook_scan_reads_the_sessions_it_was_told_were_deleted_from_an_indexed_store(
        gw: Gateway, db: Path) -> None:
    """A session an earlier apply deleted that came back with several traces is no index candidate: the
    notebook's scan names it to the read, as ``plan --deleted-from`` does, so it is still confirmed."""
    from gatewayscope.notebook.controllers import ScanController

    build(gw, db)
    guard.install(db)
    confirmed = ScanController(trace_stores=[str(db)], orphan_idle_seconds=HOUR, deleted_ids={"multi:2": time.time()})
    confirmed.scan()
    assert confirmed.snapshot is not None and confirmed.snapshot.targets[0].trace_store is not None
    assert confirmed.snapshot.targets[0].trace_store.session_total is not None  # the index was read
    orphans = confirmed.orphans_frame()
    assert orphans.filter(pl.col("session_id") == "multi:2")["confidence"].to_list() == ["confirmed"]


def test_an_empty_session_id_is_a_session_to_every_read(gw: Gateway, db: Path) -> None:
    """The full read, the candidates read, the exporter's incremental read and the index fill page by key from the
    smallest one:
    a session whose id is the empty string is read by each (it sorts before every other id)."""
    from gatewayscope.sources.rllm_sqlite_incremental import IncrementalStore

    gw.write("empty-0", "")
    gw.write("other-0", "a:0")
    gw.write("other-1", "a:0")
    age(db, "", 3 * HOUR)
    target = Target(name="store", kind="rllm", path=str(db))
    now = time.time()
    full = read_trace_store_sqlite(target, POLICY, now=now, full=True)
    assert sorted(full.sessions["session_id"].to_list()) == ["", "a:0"]
    candidates = read_trace_store_sqlite(target, POLICY, now=now)
    assert candidates.sessions["session_id"].to_list() == [""] and candidates.session_count == 2
    incremental = IncrementalStore().read(target, POLICY, now=now)
    assert incremental is not None
    assert sorted(incremental.sessions["session_id"].to_list()) == ["", "a:0"]
    guard.install(db)
    index_matches_store(db)
    entry = both_reads_agree(db)
    assert entry["_index_used"] and entry["sessions"] == 2
    assert [row["session_id"] for row in entry["orphan_sessions"]] == [""]


def test_findings_refuse_deleted_ids_an_index_read_was_not_asked_for(gw: Gateway, db: Path, tmp_path: Path) -> None:
    """An index read holds the candidates and the ids it was asked for: given other deleted ids, the findings
    say how to read them instead of confirming fewer orphans; the ids asked for survive a snapshot's round trip."""
    from gatewayscope.errors import GatewayscopeError

    build(gw, db)
    guard.install(db)
    config = Config(targets=[Target(name="store", kind="rllm", path=str(db))], policy=POLICY)
    now = time.time()
    blind = Snapshot(taken_at=now, targets=[read(db, now, full=False, deleted_ids={})])
    with pytest.raises(GatewayscopeError, match=r"also_sessions"):
        findings(blind, config, deleted_ids={"multi:2": now})
    asked = Snapshot(taken_at=now, targets=[read(db, now, full=False, deleted_ids={"multi:2": now})])
    loaded = Snapshot.load(asked.save(tmp_path / "snap"))
    for snapshot in (asked, loaded):
        found = findings(snapshot, config, deleted_ids={"multi:2": now})
        assert found.orphans.filter(pl.col("session_id") == "multi:2")["confidence"].to_list() == ["confirmed"]
    assert findings(blind, config).counts["orphans"] > 0  # without deleted ids nothing is missing


def test_the_index_stays_exact_through_a_replaced_row(gw: Gateway, db: Path) -> None:
    """No gateway writes it, but the index must not be wrong where a writer does: ``INSERT OR REPLACE`` into
    ``trace_sessions`` deletes the old row without firing a delete trigger (``recursive_triggers`` is off), and
    the index still equals the full read's figures."""
    build(gw, db)
    guard.install(db)
    with sqlite3.connect(db) as conn:
        sid, trace_id = conn.execute("SELECT session_id, trace_id FROM trace_sessions WHERE session_id LIKE "
                                     "'task%' LIMIT 1").fetchone()
        conn.execute("INSERT OR REPLACE INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)",
                     (trace_id, sid, time.time()))
        index_matches_store(db)
        # the same junction row moved to another session: the old session loses it, the new one gains it
        conn.execute("INSERT OR REPLACE INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)",
                     (trace_id, "moved:0", time.time()))
    index_matches_store(db)
    both_reads_agree(db)


def without_not_null(source: Path, target: Path) -> None:
    """A copy of the gateway's store whose tables allow a NULL ``created_at`` (as a hand-made or older writer's
    schema may): the gateway's own CREATE statements without their NOT NULL, and every row."""
    with sqlite3.connect(source) as old, sqlite3.connect(target) as new:
        for (sql,) in old.execute("SELECT sql FROM sqlite_master WHERE type IN ('table', 'index') AND sql IS NOT "
                                  "NULL AND name NOT LIKE 'sqlite_%' ORDER BY type DESC"):
            new.execute(sql.replace("NOT NULL", ""))
        for table in ("traces", "trace_sessions"):
            rows = old.execute(f"SELECT * FROM {table}").fetchall()
            marks = ", ".join("?" * len(rows[0]))
            new.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


def test_the_index_stays_exact_through_rows_without_a_time(gw: Gateway, db: Path, tmp_path: Path) -> None:
    """A row whose ``created_at`` is NULL: a scalar MIN/MAX with a NULL is NULL, the aggregate is not. The index
    keeps the full read's first and last times, for a session with other rows and for one with only that row,
    and after that row is deleted again."""
    build(gw, db)
    store = tmp_path / "nullable.db"
    without_not_null(db, store)
    guard.install(store)
    with sqlite3.connect(store) as conn:
        conn.execute("INSERT INTO traces (trace_id, data, created_at) VALUES ('null-time', '{}', NULL)")
        conn.execute("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES ('null-time', ?, NULL)",
                     ("multi:3",))
        conn.execute("INSERT INTO traces (trace_id, data, created_at) VALUES ('null-only', '{}', NULL)")
        conn.execute("INSERT INTO trace_sessions (trace_id, session_id, created_at) "
                     "VALUES ('null-only', 'null-only:0', NULL)")
    index_matches_store(store)
    with sqlite3.connect(store) as conn:
        conn.execute("DELETE FROM trace_sessions WHERE trace_id = 'null-time'")
    index_matches_store(store)
