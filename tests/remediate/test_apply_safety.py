"""Apply never deletes a live session and never runs twice at once, whatever the plan file says.

* A write landing while a delete waits its turn (the rate limiter or the pacer) makes that delete
  ``stale``: the live re-check comes after the wait, right before the write (REST), or inside the write
  transaction (SQLite).
* A hand-edited plan, its id recomputed, cannot delete a live session: apply re-establishes the orphan
  rule from the live store; a plan that breaks the schema is refused with one line per problem (exit 2);
  with a plan key set, only plans signed with it are applied.
* A second apply of a plan that is being applied is refused before it writes anything.
* A dry run in which nothing could be checked exits 1.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from gatewayscope.cli import main
from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import PlanError
from gatewayscope.remediate.apply import ApplyOptions, apply_plan
from gatewayscope.remediate.journal import ApplyLockedError, Journal, apply_lock
from gatewayscope.remediate.plan import (
    PLAN_KEY_ENV,
    PLAN_KEY_FILE_ENV,
    Action,
    Plan,
    PlanFileError,
    build_plan,
    load_plan,
    session_fingerprint,
)
from gatewayscope.scan import take_snapshot
from tests.helpers import age, session_counts, write_store

URL = "http://gw.test:9090"
DAY_OLD = time.time() - 86400


class Gateway:
    """A scripted rLLM gateway: sessions -> [(trace id, time)], single deletes, the DELETE calls it got."""

    def __init__(self, sessions: dict[str, list[str]]) -> None:
        self.sessions = {sid: [(t, DAY_OLD) for t in ids] for sid, ids in sessions.items()}
        self.deleted: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = unquote(request.url.path)
        if request.method == "GET" and path.startswith("/sessions/") and path.endswith("/traces"):
            sid = path[len("/sessions/"):-len("/traces")]
            return httpx.Response(200, json=[{"trace_id": t, "session_id": sid, "timestamp": at}
                                             for t, at in self.sessions.get(sid, [])])
        if request.method == "DELETE" and path.startswith("/sessions/"):
            sid = path[len("/sessions/"):]
            self.deleted.append(sid)
            return httpx.Response(200, json={"deleted": len(self.sessions.pop(sid, []))})
        return httpx.Response(404, json={"detail": "Not Found"})


def rest_plan(sessions: dict[str, list[str]]) -> Plan:
    actions = [Action(id=f"a{i:05d}", kind="session_delete", target="gw", subject=sid,
                      before={"trace_count": len(ids)}, after={"trace_count": 0}, reason="suspected orphan",
                      fingerprint=session_fingerprint(len(ids), ids),
                      details={"trace_ids": sorted(ids), "last_trace_at": DAY_OLD, "confidence": "suspected"})
               for i, (sid, ids) in enumerate(sorted(sessions.items()), start=1)]
    plan = Plan(created_at=1.0, targets=[{"name": "gw", "kind": "rllm", "address": URL, "access": "rest",
                                          "capabilities": {}}], actions=actions, policy={})
    plan.id = plan.compute_id()
    return plan


def sqlite_plan(db: Path) -> tuple[Plan, Config]:
    config = Config(targets=[Target(name="store", kind="rllm", path=str(db))], policy=Policy())
    return build_plan(take_snapshot(config), config, include_suspected=True), config


# -- a write landing while the delete waits its turn ------------------------------------------------------

def test_rest_a_trace_landing_during_the_wait_before_a_delete_makes_it_stale(tmp_path: Path) -> None:
    """The rate limiter makes the second delete wait; a straggler's trace lands in that wait. The session
    is not the one planned any more (two traces): 'stale', no DELETE for it, both traces kept. Catches the
    re-check running before the wait (it then deleted a session that had just come alive)."""
    gateway = Gateway({"a:0": ["ta"], "b:0": ["tb"]})
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        gateway.sessions["b:0"].append(("tb-new", time.time()))  # lands during the wait

    config = Config(targets=[Target(name="gw", kind="rllm", url=URL)], policy=Policy())
    report = apply_plan(rest_plan({"a:0": ["ta"], "b:0": ["tb"]}), config,
                        options=ApplyOptions(write=True, allow_delete=True, rate=1.0, concurrency=1, sleep=sleep),
                        journal=Journal(tmp_path / "j.jsonl"), transports={"gw": httpx.MockTransport(gateway.handler)})
    assert waits, "the second delete waited for the rate limiter"
    assert {r.subject: r.outcome for r in report.results} == {"a:0": "done", "b:0": "stale"}
    assert gateway.deleted == ["a:0"]
    assert [t for t, _ in gateway.sessions["b:0"]] == ["tb", "tb-new"]


def test_sqlite_a_trace_landing_during_the_wait_before_a_delete_makes_it_stale(tmp_path: Path) -> None:
    """The same on a SQLite store written by the gateway's own store class: the session is re-read inside
    the transaction that deletes it, after every wait. Catches a re-check before the wait."""
    db = tmp_path / "traces.db"
    write_store(db, {"a:0": 1, "b:0": 1, "live:0": 2})
    age(db, ["a:0", "b:0"], 3 * 3600)
    plan, config = sqlite_plan(db)
    assert sorted(a.subject for a in plan.actions) == ["a:0", "b:0"]
    landed: list[float] = []

    def sleep(seconds: float) -> None:
        if not landed:
            landed.append(seconds)
            write_store(db, {"b:0": 1}, start=1)  # a straggler for b:0, during a wait before its delete

    report = apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True, rate=1.0, sleep=sleep),
                        journal=Journal(tmp_path / "j.jsonl"))
    assert landed
    assert {r.subject: r.outcome for r in report.results} == {"a:0": "done", "b:0": "stale"}
    assert session_counts(db) == {"b:0": 2, "live:0": 2}


# -- a hand-edited plan -------------------------------------------------------------------------------------

def test_a_hand_edited_plan_aimed_at_a_live_session_deletes_nothing(tmp_path: Path) -> None:
    """An edited plan whose id was recomputed (anyone can) passes the id check, but apply re-establishes
    the orphan rule from the live store: the live session (one fresh trace) is 'stale' and keeps its trace.
    Catches trusting the plan's fingerprint or confidence."""
    db = tmp_path / "traces.db"
    write_store(db, {"orphan:0": 1, "live:0": 1})
    age(db, ["orphan:0"], 3 * 3600)
    plan, config = sqlite_plan(db)
    (action,) = plan.actions
    action.subject = "live:0"
    action.details.update(trace_ids=None, last_trace_at=None, confidence="confirmed")
    action.fingerprint = session_fingerprint(1, None)
    action.reason = "confirmed orphan: carries a tombstone"
    plan.id = plan.compute_id()
    plan.save(tmp_path / "edited.json")
    edited = load_plan(tmp_path / "edited.json")  # the recomputed id matches: only the live re-check stops it

    report = apply_plan(edited, config, options=ApplyOptions(write=True, allow_delete=True),
                        journal=Journal(tmp_path / "j.jsonl"))
    assert [(r.subject, r.outcome) for r in report.results] == [("live:0", "stale")]
    assert "not past" in report.results[0].detail
    assert session_counts(db) == {"orphan:0": 1, "live:0": 1}


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data))


def test_a_plan_that_breaks_the_schema_is_refused_with_one_line_per_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad types in ``after`` and a missing key used to end in a ValueError/KeyError traceback. Each problem
    is now one line, exit 2, nothing sent."""
    plan = rest_plan({"a:0": ["ta"]})
    data = plan.to_dict()
    shrink = {"id": "a00002", "kind": "pool_shrink", "target": "gw", "subject": "rec", "before": {},
              "after": {"concurrency": "64", "buffer_size": True}, "reason": "r", "fingerprint": "f"}
    data["actions"].append(shrink)
    del data["actions"][0]["after"]
    path = tmp_path / "bad.json"
    _write(path, data)

    with pytest.raises(PlanFileError) as caught:
        load_plan(path)
    problems = caught.value.problems[1:]
    assert [p.strip().split(":")[0] for p in problems] == [
        "actions[0].after", "actions[1].before.concurrency", "actions[1].before.buffer_size",
        "actions[1].after.concurrency", "actions[1].after.buffer_size"]
    assert main(["apply", str(path)]) == 2
    err = capsys.readouterr().err
    assert "actions[1].after.concurrency: expected a whole number > 0, got '64'" in err
    assert "Traceback" not in err


def test_with_a_plan_key_only_plans_signed_with_it_are_applied(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plan = rest_plan({"a:0": ["ta"]})
    unsigned = plan.save(tmp_path / "unsigned.json")
    monkeypatch.setenv(PLAN_KEY_ENV, "k1-secret")
    signed = plan.save(tmp_path / "signed.json")
    assert json.loads(signed.read_text())["signature"].startswith("hmac-sha256:")
    assert load_plan(signed).id == plan.id
    with pytest.raises(PlanError, match="not signed"):
        load_plan(unsigned)
    monkeypatch.setenv(PLAN_KEY_ENV, "another-key")
    with pytest.raises(PlanError, match="does not match"):
        load_plan(signed)
    # the key from a file, as a secret mount gives it
    monkeypatch.delenv(PLAN_KEY_ENV)
    key_file = tmp_path / "plan.key"
    key_file.write_text("k1-secret\n")
    monkeypatch.setenv(PLAN_KEY_FILE_ENV, str(key_file))
    assert load_plan(signed).id == plan.id
    # a signature copied onto an edited plan does not carry over
    data = json.loads(signed.read_text())
    data["actions"][0]["subject"] = "live:0"
    edited = Plan(created_at=data["created_at"], targets=data["targets"],
                  actions=[Action.from_dict(a) for a in data["actions"]], policy=data["policy"],
                  warnings=data["warnings"], tool_version=data["tool_version"])
    data["id"] = edited.compute_id()
    _write(tmp_path / "edited.json", data)
    with pytest.raises(PlanError, match="does not match"):
        load_plan(tmp_path / "edited.json")


# -- one apply at a time --------------------------------------------------------------------------------

def test_a_second_apply_of_a_plan_being_applied_is_refused_before_it_writes(tmp_path: Path) -> None:
    gateway = Gateway({"a:0": ["ta"]})
    plan = rest_plan({"a:0": ["ta"]})
    config = Config(targets=[Target(name="gw", kind="rllm", url=URL)], policy=Policy())
    journal = Journal(tmp_path / "j.jsonl")
    # the same plan, held with another journal
    with (apply_lock(Journal(tmp_path / "other.jsonl"), plan.id),
          pytest.raises(ApplyLockedError, match=r"being applied by process \d+")):
        apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True), journal=journal,
                   transports={"gw": httpx.MockTransport(gateway.handler)})
    assert gateway.deleted == []
    assert journal.read() == []
    # released: it runs now
    report = apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True), journal=journal,
                        transports={"gw": httpx.MockTransport(gateway.handler)})
    assert report.tally()["done"] == 1


# -- a dry run that could check nothing ----------------------------------------------------------------------

def test_a_dry_run_that_could_check_nothing_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "traces.db"
    write_store(db, {"a:0": 1})
    age(db, ["a:0"], 3 * 3600)
    plan, _ = sqlite_plan(db)
    plan_path = plan.save(tmp_path / "plan.json")
    assert main(["apply", str(plan_path)]) == 0
    db.unlink()  # the store is gone: nothing can be checked
    assert main(["apply", str(plan_path)]) == 1
    assert "No action could be checked" in capsys.readouterr().out


def test_the_guard_refuses_to_install_into_a_damaged_database(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """PRAGMA quick_check fails on the file: install writes nothing and says so in one sentence (exit 1)."""
    db = tmp_path / "traces.db"
    write_store(db, {f"s:{i}": 3 for i in range(200)})
    with sqlite3.connect(db) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'idx_ts_session'").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    raw = bytearray(db.read_bytes())
    start = (root - 1) * page_size
    raw[start + 8:start + page_size] = b"\xff" * (page_size - 8)  # the index's root page, scrambled
    db.write_bytes(bytes(raw))
    before = db.read_bytes()

    assert main(["guard", "install", str(db)]) == 1
    out = capsys.readouterr()
    assert "is damaged (PRAGMA quick_check" in out.err
    assert "Traceback" not in out.err
    assert db.read_bytes() == before


@pytest.mark.e2e  # starts a process
def test_the_delete_lock_probe_sees_another_process_reading(tmp_path: Path) -> None:
    """The SQLite deleter takes its lock only when no other process holds one: its probe must see a reader in
    another process (the gateway). Catches a probe that never armed (it then polled blindly, and a gateway
    write meeting its momentary RESERVED lock was lost)."""
    import subprocess
    import sys

    from gatewayscope.remediate.sqlite_delete import SessionDeleter

    db = tmp_path / "traces.db"
    write_store(db, {"a:0": 1})
    reader = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN'); "
        "c.execute('SELECT * FROM traces').fetchall(); print('reading', flush=True); sys.stdin.readline()"),
        str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with SessionDeleter(str(db)) as deleter:
            assert deleter._locks.fd is not None
            assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
            assert deleter._locks.busy()
            assert reader.stdin is not None
            reader.stdin.write("\n")
            reader.stdin.flush()
            reader.wait(timeout=30)
            assert not deleter._locks.busy()
    finally:
        if reader.poll() is None:
            reader.kill()
        reader.wait()


@pytest.mark.e2e  # starts a process
def test_two_applies_of_one_plan_with_different_tmpdirs_and_journals_do_not_run_at_once(tmp_path: Path) -> None:
    """Two real applies: the first holds its locks while it waits for the store's write lock (held here); the
    second, with another TMPDIR and another journal, is refused: the per-plan lock is beside the plan file."""
    db = tmp_path / "traces.db"
    write_store(db, {"orphan:0": 1, "live:0": 2})
    age(db, ["orphan:0"], 3 * 3600)
    plan, _ = sqlite_plan(db)
    assert [a.subject for a in plan.actions if a.kind == "session_delete"] == ["orphan:0"]
    plan_file = plan.save(tmp_path / "plan.json")
    env = {key: value for key, value in os.environ.items() if key not in (PLAN_KEY_ENV, PLAN_KEY_FILE_ENV)}
    command = [sys.executable, "-m", "gatewayscope", "apply", str(plan_file), "--yes", "--allow-delete"]
    for name in ("tmp-a", "tmp-b"):
        (tmp_path / name).mkdir()
    blocker = sqlite3.connect(db, timeout=10, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the store's write lock: the first apply's delete waits for it
    first = subprocess.Popen([*command, "--journal", str(tmp_path / "first.jsonl")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**env, "TMPDIR": str(tmp_path / "tmp-a")})
    try:
        journal_lock = tmp_path / "first.jsonl.lock"
        deadline = time.monotonic() + 60
        while not (journal_lock.exists() and journal_lock.read_text()):  # bounded by the deadline
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first apply never took its locks"
            time.sleep(0.05)
        second = subprocess.run([*command, "--journal", str(tmp_path / "second.jsonl")], capture_output=True,
                                text=True, timeout=120, env={**env, "TMPDIR": str(tmp_path / "tmp-b")})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        out, err = first.communicate(timeout=120)
    assert second.returncode == 1, (second.stdout, second.stderr)
    assert f"is being applied by process {first.pid}" in second.stderr
    assert not (tmp_path / "second.jsonl").exists() or Journal(tmp_path / "second.jsonl").read() == []
    assert first.returncode == 0, (out, err)
    assert session_counts(db) == {"live:0": 2}
