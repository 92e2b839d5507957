"""`gatewayscope scan` against the real rLLM gateway: the straggler race reproduced for real, reported exactly.

Each test runs real rollouts through the unmodified gateway (memory store over REST, SQLite store from its
file); stragglers whose late call returns after flush + delete leave one-trace orphans, and the scan must
report exactly those, as suspected, and never a live or multi-trace session.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.cli import main
from gatewayscope.sandbox.rollouts import run_rollouts

pytestmark = pytest.mark.e2e

IDLE = 1.0  # seconds: the rollouts' orphans are fresh


def scan_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["scan", "--format", "json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out)


def orphan_ids(entry: dict[str, Any], confidence: str | None = None) -> set[str]:
    return {o["session_id"] for o in entry["orphan_sessions"] if confidence in (None, o["confidence"])}


def touch_live(url: str, run: Any) -> str:
    """Keep the live sessions live: one more call each right before the scan (as a running rollout would),
    and start one more live session whose single trace is brand new. Returns that session's id."""
    from urllib.parse import quote

    import httpx

    fresh = "fresh-live-task:0"
    wanted = {**{uid: n + 1 for uid, n in run.live_uids.items()}, fresh: 1}
    with httpx.Client(base_url=url, timeout=30) as client:
        for uid in wanted:
            response = client.post(f"/sessions/{quote(uid, safe='')}/v1/chat/completions",
                                   json={"model": "stub", "messages": [{"role": "user", "content": "still here"}]})
            response.raise_for_status()
        # the gateway persists traces after answering (fire-and-forget): wait until they are stored
        deadline = time.monotonic() + 20
        for uid, count in wanted.items():
            while len(client.get(f"/sessions/{quote(uid, safe='')}/traces").json()) < count:
                assert time.monotonic() < deadline, f"the trace of {uid} was not stored in 20 s"
                time.sleep(0.02)
    return fresh


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_scan_reports_exactly_the_stragglers(store: str, rllm_gateway: Any,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    gateway = rllm_gateway(store)
    # live sessions with one trace (the first) and with several; multi-trace rollouts are deleted
    run = run_rollouts(gateway.url, n_rollouts=30, n_stragglers=10, n_live=3, live_calls=[1, 2, 4],
                       straggler_delay=1.5)
    assert not run.errors
    expected = set(run.straggler_uids) - set(run.race_lost_uids)
    assert len(expected) >= 5, "too few stragglers raced their delete to test anything"
    time.sleep(IDLE + 0.2)
    fresh = touch_live(gateway.url, run)
    address = gateway.url if store == "memory" else str(gateway.db_path)
    code, report = scan_json(capsys, "--trace-store", address, "--orphan-idle-seconds", str(IDLE))
    assert code == 0
    (entry,) = report["targets"]
    assert entry["up"] and entry["error"] is None
    assert entry["access"] == ("rest" if store == "memory" else "sqlite")
    assert orphan_ids(entry) == expected
    assert orphan_ids(entry, "suspected") == expected
    assert entry["orphans"] == {"confirmed": 0, "suspected": len(expected)}
    # live sessions (one with a single trace of its own) are never called orphans
    assert not orphan_ids(entry) & {*run.live_uids, fresh}
    assert entry["sessions"] == len(expected) + len(run.live_uids) + 1
    assert entry["traces"] == len(expected) + sum(n + 1 for n in run.live_uids.values()) + 1
    assert entry["oldest_orphan_age_seconds"] >= IDLE
    # the stragglers' prompts are the large ones, grouped by task
    assert all(o["prompt_tokens"] and o["prompt_tokens"] > 1000 for o in entry["orphan_sessions"])
    tasks = {run.task_of[uid] for uid in expected}
    assert {g["task"] for g in entry["top_orphan_tasks"]} <= tasks
    assert entry["orphan_tasks"] == len(tasks)


def test_text_view_and_snapshot_round_trip(rllm_gateway: Any, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    gateway = rllm_gateway("memory")
    run = run_rollouts(gateway.url, n_rollouts=6, n_stragglers=3, n_live=0, straggler_delay=1.5)
    expected = set(run.straggler_uids) - set(run.race_lost_uids)
    time.sleep(IDLE + 0.2)
    saved = tmp_path / "snap"
    assert main(["scan", "--trace-store", gateway.url, "--orphan-idle-seconds", str(IDLE),
                 "--save-snapshot", str(saved)]) == 0
    text = capsys.readouterr().out
    assert f"0 confirmed, {len(expected)} suspected" in text
    gateway.stop()  # the offline analysis needs no gateway
    code, report = scan_json(capsys, "--load-snapshot", str(saved), "--orphan-idle-seconds", str(IDLE))
    assert code == 0
    assert orphan_ids(report["targets"][0]) == expected


def test_guarded_sqlite_store_marks_tombstoned_orphans_confirmed(rllm_gateway: Any,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from gatewayscope.guard import sqlite as sqlite_guard

    gateway = rllm_gateway("sqlite")
    run = run_rollouts(gateway.url, n_rollouts=10, n_stragglers=4, n_live=1, live_calls=[2], straggler_delay=1.5)
    orphans = set(run.straggler_uids) - set(run.race_lost_uids)
    sqlite_guard.install(gateway.db_path)
    # backfill the existing orphans: the guard now knows they were deleted
    new, _ = sqlite_guard.add_tombstones(gateway.db_path, sorted(orphans))
    assert new == len(orphans)
    # a fresh round under the guard: its stragglers are dropped and counted, not resurrected
    second = run_rollouts(gateway.url, n_rollouts=6, n_stragglers=3, n_live=0, straggler_delay=1.5)
    raced = set(second.straggler_uids) - set(second.race_lost_uids)
    code, report = scan_json(capsys, "--trace-store", str(gateway.db_path), "--orphan-idle-seconds", "3600")
    assert code == 0
    (entry,) = report["targets"]
    # confirmed by their tombstones although far younger than the idle threshold
    assert orphan_ids(entry, "confirmed") == orphans
    assert not orphan_ids(entry) & raced
    guard = entry["guard"]
    assert guard["triggers_intact"] is True
    assert guard["tombstone_capacity"] == sqlite_guard.DEFAULT_CAPACITY
    assert guard["dropped_writes"] == len(raced)
    assert guard["tombstones"] >= len(orphans) + len(second.deleted_uids)


def test_down_garbage_and_bad_files_give_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import http.server
    import threading

    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>definitely not the gateway</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    from gatewayscope.sandbox.processes import free_port

    not_db = tmp_path / "notes.db"
    not_db.write_text("hello")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    try:
        code, report = scan_json(
            capsys, "--timeout", "2",
            "--trace-store", f"http://127.0.0.1:{free_port()}",
            "--trace-store", f"http://127.0.0.1:{server.server_address[1]}",
            "--trace-store", str(not_db), "--trace-store", str(other), "--trace-store", str(tmp_path / "missing.db"),
        )
    finally:
        server.shutdown()
    assert code == 1
    by_kind = [(t["up"], t["error_kind"]) for t in report["targets"]]
    assert by_kind == [(False, "unreachable"), (False, "bad_response"), (False, "store"), (False, "store"),
                       (False, "store")]
    errors = [t["error"] for t in report["targets"]]
    assert "Cannot reach the rLLM gateway" in errors[0]
    assert "not JSON" in errors[1]
    assert "not a SQLite database" in errors[2]
    assert "not an rLLM trace store" in errors[3]
    assert "no such file" in errors[4]
    # the text view says the same, one target after another, and no traceback anywhere
    assert main(["scan", "--trace-store", str(tmp_path / "missing.db")]) == 1
    captured = capsys.readouterr()
    assert "DOWN" in captured.out and "no such file" in captured.out
    assert "Traceback" not in captured.out + captured.err
