"""The SQLite tombstone guard with the REAL, unmodified ``rllm-model-gateway --store sqlite`` process.

The guard is installed into the gateway's database file while the gateway runs (its persistent connection
already open); nothing of the gateway is changed. Stragglers come from gatewayscope's rollout driver: each
straggler's late call is held in flight at the stub worker while the rollout flushes and deletes its
session, and its trace is persisted after the delete (the straggler race, docs/concepts.md).
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gatewayscope.cli import main as cli_main
from gatewayscope.guard import sqlite as guard
from gatewayscope.sandbox.rollouts import DEFAULT_MODEL, RolloutRun, retry_rollout, run_rollouts

pytestmark = pytest.mark.e2e

ROLLOUTS: dict[str, Any] = {"n_rollouts": 30, "n_stragglers": 10, "straggler_delay": 2.0,
                            "calls_per_rollout": 3, "n_live": 3, "group_size": 5, "concurrency": 16, "seed": 7}

#: a load writer's pause between two calls (the gateway persists each trace after it answers)
WRITER_PAUSE = 0.01


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``predicate`` (a liveness bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def listed(url: str) -> dict[str, int]:
    with httpx.Client(base_url=url, timeout=10) as c:
        return {s["session_id"]: s["trace_count"] for s in c.get("/sessions").json()}


def read_only(path: str) -> sqlite3.Connection:
    return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=20)


def db_sessions(path: str) -> dict[str, int]:
    """Sessions and their trace counts, straight from the file."""
    with read_only(path) as conn:
        return dict(conn.execute("SELECT session_id, COUNT(*) FROM trace_sessions GROUP BY session_id"))


def trace_rows_naming(path: str, session_ids: set[str]) -> list[str]:
    """Trace rows whose JSON names one of ``session_ids`` (orphan trace rows included, linked or not)."""
    with read_only(path) as conn:
        rows = conn.execute("SELECT json_extract(data, '$.session_id') FROM traces").fetchall()
    return [sid for (sid,) in rows if sid in session_ids]


def barrier(url: str) -> None:
    """One more call, answered after every earlier call, and wait for its trace: the gateway has handled the
    fire-and-forget writes of the calls answered before it (one store connection, writes in order)."""
    sid = f"barrier-{uuid.uuid4()}"
    with httpx.Client(base_url=url, timeout=30) as client:
        assert _chat(client, sid, "barrier")
    wait_until(lambda: listed(url).get(sid) == 1, "the barrier trace")
    with httpx.Client(base_url=url, timeout=30) as client:
        client.delete(f"/sessions/{quote(sid, safe='')}").raise_for_status()


def test_straggler_race_leaves_no_orphan_with_the_guard_installed(rllm_gateway: Any) -> None:
    # Without the guard: every straggler whose late call raced its delete is left as a one-trace orphan.
    bare = rllm_gateway("sqlite")
    unguarded = run_rollouts(bare.url, **ROLLOUTS)
    assert unguarded.errors == [], unguarded.to_dict()
    # a lost race leaves no late trace to settle: the delete removed it with the session
    assert set(unguarded.unsettled_uids) <= set(unguarded.race_lost_uids), unguarded.to_dict()
    raced = set(unguarded.straggler_uids) - set(unguarded.race_lost_uids)
    # A late call answered before its delete returned (a loaded machine) may or may not have raced.
    assert len(raced) >= ROLLOUTS["n_stragglers"] // 2, unguarded.to_dict()
    orphans = {sid: n for sid, n in listed(bare.url).items() if sid in unguarded.deleted_uids}
    assert raced <= set(orphans) <= set(unguarded.straggler_uids) and set(orphans.values()) == {1}
    n_orphans = len(orphans)

    # The same rollouts with the guard installed into the running gateway's file.
    gw = rllm_gateway("sqlite")
    assert gw.db_path is not None
    result = guard.install(gw.db_path)
    assert result.created
    run: RolloutRun = run_rollouts(gw.url, **ROLLOUTS, settle_timeout=1.0)
    assert run.errors == [], run.to_dict()
    assert len(run.deleted_uids) == ROLLOUTS["n_rollouts"]
    raced_here = set(run.straggler_uids) - set(run.race_lost_uids)
    assert len(raced_here) >= ROLLOUTS["n_stragglers"] // 2, run.to_dict()
    # The driver waited for each raced straggler's late trace to show up; with the guard none does.
    assert raced_here <= set(run.unsettled_uids) <= set(run.straggler_uids)

    # Every late call was answered before run_rollouts returned; the barrier covers their writes.
    barrier(gw.url)
    status = guard.status(gw.db_path, top=50)
    droppers = {d.session_id: d.dropped for d in status.top_droppers}
    assert raced_here <= set(droppers) <= set(run.straggler_uids)
    assert set(droppers.values()) == {1}  # each straggler's write (trace row + junction row) counted once
    assert status.dropped_writes == len(droppers)
    if not unguarded.race_lost_uids and not run.race_lost_uids:  # the usual case: every race was won
        assert status.dropped_writes == n_orphans == ROLLOUTS["n_stragglers"]
    assert status.tombstones == ROLLOUTS["n_rollouts"] + 1 and status.triggers_intact  # + the barrier

    # No orphan: the gateway lists only the live sessions, with all their traces.
    assert listed(gw.url) == run.live_uids
    assert db_sessions(gw.db_path) == run.live_uids
    assert trace_rows_naming(gw.db_path, set(run.deleted_uids)) == []  # not even an unlinked trace row
    with read_only(gw.db_path) as conn:
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        for uid in run.deleted_uids:
            assert c.get(f"/sessions/{quote(uid, safe='')}").status_code == 404
    assert "Failed to persist" not in gw.process.output()


def _chat(client: httpx.Client, sid: str, marker: str) -> bool:
    """One call through the gateway; True when the gateway answered it."""
    body = {"model": DEFAULT_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": marker}]}
    resp = client.post(f"/sessions/{quote(sid, safe='')}/v1/chat/completions", json=body)
    return resp.status_code == 200


def test_install_under_load_loses_no_trace_of_a_live_session(rllm_gateway: Any) -> None:
    gw = rllm_gateway("sqlite")
    db = gw.db_path
    assert db is not None
    run_id = uuid.uuid4().hex[:8]
    answered: dict[str, set[str]] = {}  # live session -> markers of the calls the gateway answered
    churn_after_install: list[str] = []  # sessions deleted after install had returned
    lock = threading.Lock()
    stop = threading.Event()
    installed = threading.Event()
    calls_after_install = [0]
    errors: list[str] = []

    def writer(worker: int) -> None:
        sessions = [f"live-{run_id}-{worker}-{k}" for k in range(3)]
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            n = 0
            while not stop.is_set():
                sid = sessions[n % len(sessions)]
                marker = f"{sid}#{n}"
                after = installed.is_set()
                try:
                    ok = _chat(client, sid, marker)
                except httpx.HTTPError as err:
                    errors.append(f"{sid}: {err}")
                    return
                if not ok:
                    errors.append(f"{sid}: call {n} not answered")
                    return
                with lock:
                    answered.setdefault(sid, set()).add(marker)
                    if after:
                        calls_after_install[0] += 1
                n += 1
                # paced, as agents are: unpaced, four writers queue persist tasks faster than the 0.1.0
                # store commits them, and a churn session's trace waits seconds behind thousands of them
                stop.wait(WRITER_PAUSE)

    def churn() -> None:
        """Short sessions deleted (after their trace is visible) all along: tombstones during install."""
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            n = 0
            while not stop.is_set():
                sid = f"churn-{run_id}-{n}"
                after = installed.is_set()
                try:
                    if not _chat(client, sid, f"{sid}#0"):
                        errors.append(f"{sid}: not answered")
                        return
                    deadline = time.monotonic() + 20
                    while client.get(f"/sessions/{sid}").status_code != 200:
                        if time.monotonic() > deadline:
                            errors.append(f"{sid}: trace never persisted")
                            return
                        time.sleep(0.01)
                    client.delete(f"/sessions/{sid}").raise_for_status()
                except httpx.HTTPError as err:
                    errors.append(f"{sid}: {err}")
                    return
                if after:
                    churn_after_install.append(sid)
                n += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads.append(threading.Thread(target=churn))
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: sum(len(m) for m in answered.values()) >= 40 or bool(errors), "load before install")
        first = guard.install(db)
        again = guard.install(db)  # idempotent, also under load
        installed.set()
        wait_until(lambda: (calls_after_install[0] >= 60 and len(churn_after_install) >= 3) or bool(errors),
                   "load after install")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert errors == []
    assert first.created and not again.changed

    def markers_in_db() -> dict[str, set[str]]:
        with read_only(db) as conn:
            rows = conn.execute(
                "SELECT ts.session_id, json_extract(t.data, '$.messages[0].content') "
                "FROM trace_sessions AS ts JOIN traces AS t ON t.trace_id = ts.trace_id "
                "WHERE ts.session_id LIKE 'live-%'").fetchall()
        found: dict[str, set[str]] = {}
        for sid, marker in rows:
            found.setdefault(sid, set()).add(marker)
        return found

    # The gateway persists fire-and-forget after it answers: wait for the last writes, then compare exactly.
    wait_until(lambda: markers_in_db() == answered, "every answered call's trace in the file")
    assert sum(len(m) for m in answered.values()) >= 100
    status = guard.status(db)
    assert status.triggers_intact and status.dropped_writes == 0
    with read_only(db) as conn:
        assert guard.tombstoned_among(conn, churn_after_install) == churn_after_install
        assert guard.tombstoned_among(conn, sorted(answered)) == []
    assert not any(sid.startswith("churn-") for sid in db_sessions(db))
    assert "Failed to persist" not in gw.process.output()
    assert "database is locked" not in gw.process.output()


def test_retry_reusing_a_deleted_uid_is_dropped_until_lifted(rllm_gateway: Any,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The SQLite guard never sees rLLM's POST /sessions: a retry's writes are dropped, visible in status,
    and ``guard lift`` lets them land."""
    gw = rllm_gateway("sqlite")
    db = gw.db_path
    assert db is not None
    assert cli_main(["guard", "install", db]) == 0
    run = run_rollouts(gw.url, n_rollouts=2, n_stragglers=0, calls_per_rollout=2, n_live=0, group_size=2, seed=1)
    assert run.ok and len(run.deleted_uids) == 2
    uid = run.deleted_uids[0]

    retry = retry_rollout(gw.url, uid, calls=2, explicit_create=True)
    assert retry.errors == [] and retry.calls == 2
    wait_until(lambda: guard.status(db).dropped_writes >= 2, "the retry's dropped writes")
    capsys.readouterr()
    assert cli_main(["guard", "status", db]) == 0
    out = capsys.readouterr().out
    assert uid in out and "guard lift" in out
    assert [(d.session_id, d.dropped) for d in guard.status(db).top_droppers] == [(uid, 2)]
    assert uid not in listed(gw.url)

    assert cli_main(["guard", "lift", db, uid]) == 0
    assert "Lifted" in capsys.readouterr().out
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        assert _chat(client, uid, "after the lift")
    wait_until(lambda: listed(gw.url).get(uid) == 1, "the lifted session's trace")
    assert guard.status(db).dropped_writes == 2
