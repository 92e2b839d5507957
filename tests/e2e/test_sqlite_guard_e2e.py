"""The SQLite tombstone guard with the REAL, unmodified ``rllm-model-gateway --store sqlite`` process.

On both gateways (``gateway_flavor``): PyPI's 0.1.0 keeps its file in DELETE journal mode, upstream main in
WAL mode, with the triggers working the same in both.

The guard is installed into the gateway's database file while the gateway runs (its persistent connection
already open); nothing of the gateway is changed. Stragglers come from gatewayscope's rollout driver: each
straggler's late call is held in flight at the stub worker while the rollout flushes and deletes its
session, and its trace is persisted after the delete (the straggler race).
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
from gatewayscope.sandbox.rollouts import DEFAULT_MODEL, RolloutRun, land_late_calls, retry_rollout, run_rollouts
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

ROLLOUTS: dict[str, Any] = {"n_rollouts": 30, "n_stragglers": 10, "straggler_delay": 2.0,
                            "calls_per_rollout": 3, "n_live": 3, "group_size": 5, "concurrency": 16, "seed": 7}

#: a load writer's pause between two calls (the gateway persists each trace after it answers)
WRITER_PAUSE = 0.01


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
    wait_for("the barrier trace", lambda: listed(url).get(sid) == 1, bool, timeout=30.0)
    with httpx.Client(base_url=url, timeout=30) as client:
        client.delete(f"/sessions/{quote(sid, safe='')}").raise_for_status()


def test_the_straggler_race_leaves_no_orphan_with_the_guard_installed(rllm_gateway: Any, gateway_flavor: Any) -> None:
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
    assert str(status.journal_mode).lower() == gateway_flavor.journal_mode  # the triggers work in WAL mode too

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


#: install (twice) / uninstall cycles under load; every cycle commits three guard transactions into the file
GUARD_CYCLES = 12
#: answered calls, and churn deletes, after each install and each uninstall
CALLS_PER_PHASE, CHURN_PER_PHASE = 30, 2


def test_install_and_uninstall_under_load_lose_no_trace_of_a_live_session(rllm_gateway: Any,
                                                                        gateway_flavor: Any) -> None:
    """Writers, a churn of short sessions deleted as soon as their trace shows, and readers of the gateway's
    REST API (on the gateway's one SQLite connection, as a trainer and a dashboard read it), all along while
    the guard is installed (twice), kept, and uninstalled in the running gateway's file, GUARD_CYCLES times."""
    gw = rllm_gateway("sqlite")
    db = gw.db_path
    assert db is not None
    with read_only(db) as conn:  # 0.1.0 keeps its file in DELETE mode; upstream main switches it to WAL
        assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == gateway_flavor.journal_mode
    run_id = uuid.uuid4().hex[:8]
    answered: dict[str, set[str]] = {}  # live session -> markers of the calls the gateway answered
    lock = threading.Lock()
    stop = threading.Event()
    phase = ["before"]  # before, then installed-N / uninstalled-N
    calls_in: dict[str, int] = {}
    churned: dict[str, list[str]] = {}  # phase -> sessions created and deleted within it
    reads = [0]
    errors: list[str] = []

    def writer(worker: int) -> None:
        sessions = [f"live-{run_id}-{worker}-{k}" for k in range(3)]
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            n = 0
            while not stop.is_set():
                sid = sessions[n % len(sessions)]
                marker = f"{sid}#{n}"
                current = phase[0]
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
                    calls_in[current] = calls_in.get(current, 0) + 1
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
                current = phase[0]
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
                if phase[0] == current:
                    with lock:
                        churned.setdefault(current, []).append(sid)
                n += 1

    def reader() -> None:
        """A trainer's and a dashboard's reads through the gateway (its one store connection)."""
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            while not stop.is_set():
                with lock:
                    live = sorted(answered)
                try:
                    client.get("/sessions", params={"limit": 100}).raise_for_status()
                    if live:
                        client.get(f"/sessions/{live[reads[0] % len(live)]}/traces").raise_for_status()
                except httpx.HTTPError as err:
                    errors.append(f"reader: {err}")
                    return
                reads[0] += 1
                stop.wait(0.02)

    def loaded(name: str) -> bool:
        with lock:
            return ((calls_in.get(name, 0) >= CALLS_PER_PHASE and len(churned.get(name, [])) >= CHURN_PER_PHASE)
                    or bool(errors))

    def summary() -> str:
        log = gw.process.output()
        return (f"journal mode {gateway_flavor.journal_mode}; gateway log: {log.count('Failed to persist')} "
                f"'Failed to persist', {log.count('database is locked')} 'database is locked'; "
                f"calls per phase {calls_in}; errors {errors[:3]}")

    installs: list[Any] = []
    uninstalls: list[Any] = []
    statuses: list[Any] = []
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=churn), threading.Thread(target=reader), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    try:
        wait_for("load before install", lambda: calls_in.get("before", 0) >= CALLS_PER_PHASE or bool(errors), bool,
                 timeout=30.0)
        for cycle in range(GUARD_CYCLES):
            if errors:
                break
            installs.append((guard.install(db), guard.install(db)))  # the second: idempotent, also under load
            phase[0] = f"installed-{cycle}"
            wait_for(f"load after install {cycle}", lambda cycle=cycle: loaded(f"installed-{cycle}"), bool,
                     timeout=30.0)
            with lock:
                deleted_under_guard = list(churned.get(f"installed-{cycle}", []))
            with read_only(db) as conn:  # sessions deleted under the guard carry tombstones
                tombstoned = guard.tombstoned_among(conn, deleted_under_guard)
            statuses.append((guard.status(db), tombstoned == deleted_under_guard))
            uninstalls.append(guard.uninstall(db))
            phase[0] = f"uninstalled-{cycle}"
            wait_for(f"load after uninstall {cycle}", lambda cycle=cycle: loaded(f"uninstalled-{cycle}"), bool,
                     timeout=30.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a load thread did not stop"
    assert errors == [], summary()
    assert len(installs) == len(uninstalls) == GUARD_CYCLES
    assert all(first.created and not again.changed for first, again in installs)
    assert all(st.installed and st.triggers_intact and st.dropped_writes == 0 and ok for st, ok in statuses)
    assert all(result.removed for result in uninstalls)
    assert reads[0] >= 10

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
    try:
        wait_for("every answered call's trace in the file", lambda: markers_in_db() == answered, bool, timeout=30.0)
    except AssertionError:
        found = markers_in_db()
        lost = sum(len(m - found.get(sid, set())) for sid, m in answered.items())
        raise AssertionError(f"{lost} of {sum(map(len, answered.values()))} answered calls have no trace in "
                             f"the file; {summary()}") from None
    assert not guard.status(db).installed  # the last uninstall took everything of the guard out of the file
    assert not any(sid.startswith("churn-") for sid in db_sessions(db))  # every churn delete went through
    assert "Failed to persist" not in gw.process.output(), summary()
    assert "database is locked" not in gw.process.output(), summary()


def settled(probe: Callable[[], int], *, quiet: float = 1.0, timeout: float = 20.0) -> int:
    """``probe()`` once it has not changed for ``quiet`` seconds (at most ``timeout`` seconds of polling)."""
    deadline = time.monotonic() + timeout
    value, since = probe(), time.monotonic()
    while time.monotonic() < deadline:  # bounded by the deadline
        time.sleep(0.1)
        latest = probe()
        if latest != value:
            value, since = latest, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return value


def test_a_retry_reusing_a_deleted_uid_keeps_its_traces(rllm_gateway: Any,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The SQLite guard never sees rLLM's POST /sessions, and needs not: a retry's calls reach the gateway after
    the delete, so the triggers keep them and count them as kept after a fence; ``guard status`` shows both."""
    gw = rllm_gateway("sqlite")
    db = gw.db_path
    assert db is not None
    assert cli_main(["guard", "install", db]) == 0
    run = run_rollouts(gw.url, n_rollouts=2, n_stragglers=0, calls_per_rollout=2, n_live=0, group_size=2, seed=1)
    assert run.ok and len(run.deleted_uids) == 2
    uid = run.deleted_uids[0]
    before = settled(lambda: guard.status(db).dropped_writes)

    retry = retry_rollout(gw.url, uid, calls=2, explicit_create=False)  # delete, then the rerun's two calls
    assert retry.errors == [] and retry.calls == 2
    wait_for("the retry's two traces", lambda: listed(gw.url).get(uid) == 2, bool, timeout=30.0)
    status = guard.status(db)
    assert status.dropped_writes == before and status.kept_after_fence == 2
    capsys.readouterr()
    assert cli_main(["guard", "status", db]) == 0
    out = capsys.readouterr().out
    assert "kept after a fence  2 " in out


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_backfilled_ids_drop_their_stragglers_and_keep_their_next_use(store: str, rllm_gateway: Any,
                                                                       guarded_gateway: Any,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``gatewayscope guard backfill`` of ids deleted before the guard existed: the guarded launcher's memory
    store (by URL) and an unmodified gateway's SQLite file with the triggers (by path), on both gateways. The
    backfill fences them now: calls already in flight then (stragglers) are dropped, later calls are kept."""
    if store == "memory":
        gw = guarded_gateway("memory")
        target = gw.url

        def dropped() -> int:
            return int(httpx.get(f"{gw.url}/guard/status", timeout=10).json()["dropped_writes"])
    else:
        gw = rllm_gateway("sqlite")
        assert gw.db_path is not None
        target = gw.db_path
        assert cli_main(["guard", "install", target]) == 0

        def dropped() -> int:
            return guard.status(target).dropped_writes
    deleted_before = ["old-task:0", "old-task:1"]
    capsys.readouterr()

    def backfill_twice() -> None:
        assert cli_main(["guard", "backfill", target, *deleted_before]) == 0
        assert cli_main(["guard", "backfill", target, *deleted_before]) == 0  # idempotent: nothing new

    late = land_late_calls(gw.url, deleted_before, backfill_twice, settle_timeout=3.0)
    assert late.errors == [] and late.landed == []  # every straggler's trace was dropped
    out = capsys.readouterr().out
    assert "2 new tombstones, 0 already tombstoned" in out and "0 new tombstones, 2 already tombstoned" in out
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        assert _chat(client, "live-task:0", "a live call")
        assert _chat(client, "old-task:1", "the id's next use")
    wait_for("the live traces and the drops", lambda: listed(gw.url).get("live-task:0") == 1
             and listed(gw.url).get("old-task:1") == 1 and dropped() >= 2, bool, timeout=30.0)
    assert listed(gw.url) == {"live-task:0": 1, "old-task:1": 1}
    assert dropped() == 2
