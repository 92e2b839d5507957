"""Plan and apply against the real rLLM gateway, with real one-trace orphans left by real stragglers.

* The guarded launcher (``python -m gatewayscope.guard.gateway``, memory store) drops a straggler's write
  while the deleted id holds a tombstone; its FIFO cap is the documented way one still gets through. The
  test evicts the rollouts' tombstones (deleting more ids than the cap while the stragglers' late calls
  are still at the worker), so the stragglers resurrect their sessions; then plan and apply tombstone
  them first and delete them, and a later straggler for a deleted id is dropped again.
* The unmodified gateway on SQLite (no guard): the plan says how to install one, and the deletes go
  straight to the file while the gateway runs.
* The CLI once, end to end: ``plan``, ``show``, a dry ``apply``, ``apply --yes --allow-delete``, and again.

Orphans are confirmed the way ``gatewayscope plan --deleted-from`` confirms them (ids known deleted that
came back), or, for the CLI, found by their idle time after their rows are aged in the file: a live
session with one fresh trace must never be called an orphan, and none is deleted here.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import GatewayscopeError
from gatewayscope.remediate.apply import ApplyOptions, apply_plan
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import build_plan
from gatewayscope.sandbox.rollouts import land_late_calls, run_rollouts
from gatewayscope.sandbox.stub_protocol import StubClient
from gatewayscope.scan import take_snapshot
from tests.helpers import age, guard_status, wait_for
from tests.helpers import gateway_sessions as sessions

pytestmark = pytest.mark.e2e

TAIL = "0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"


def late_call(url: str, session_id: str) -> None:
    """A call for ``session_id`` that reaches the gateway now."""
    body = {"model": "gatewayscope-stub", "messages": [{"role": "user", "content": "a late tool result"}]}
    httpx.post(f"{url}/sessions/{session_id}/v1/chat/completions", json=body, timeout=30).raise_for_status()


def journal_order_ok(path: Path) -> None:
    """The backfill's outcome is journaled before the first session delete is attempted."""
    events = [(e["event"], e.get("kind")) for e in Journal(path).read()]
    backfill_done = events.index(("outcome", "tombstone_backfill"))
    first_delete = events.index(("attempt", "session_delete"))
    assert backfill_done < first_delete, events


# -- (a) the guarded launcher, memory store ------------------------------------------------------------------

CAP = 10
N_ROLLOUTS, N_STRAGGLERS, N_LIVE = 8, 4, 3
LATE = 3.0  # seconds a straggler's late call spends at the worker


def test_guarded_gateway_orphans_are_tombstoned_before_they_are_deleted(guarded_gateway: Any, stub_worker: str,
                                                                         tmp_path: Path) -> None:
    gateway = guarded_gateway("memory", max_tombstones=CAP)
    url = gateway.url

    # real stragglers, whose tombstones the cap evicts while their late calls are still at the worker
    with ThreadPoolExecutor(max_workers=1) as pool:
        rollouts = pool.submit(run_rollouts, url, n_rollouts=N_ROLLOUTS, n_stragglers=N_STRAGGLERS, n_live=N_LIVE,
                               straggler_delay=LATE)
        wait_for("every rollout deleted", lambda: guard_status(url),
                 lambda s: s["tombstones"] + s["evicted"] >= N_ROLLOUTS)
        for i in range(CAP):
            httpx.delete(f"{url}/sessions/filler:{i}", timeout=10).raise_for_status()
        with httpx.Client(timeout=10) as worker:
            in_flight = StubClient(worker, stub_worker).inflight().inflight
        assert in_flight == N_STRAGGLERS, "the late calls must still be in flight after the evictions"
        run = rollouts.result(timeout=60)
    assert run.ok, run.to_dict()
    status = guard_status(url)
    assert (status["dropped_writes"], status["evicted"]) == (0, N_ROLLOUTS)
    before = sessions(url)
    assert {s: n for s, n in before.items() if s in set(run.deleted_uids)} == dict.fromkeys(run.straggler_uids, 1)
    assert {s: before[s] for s in run.live_uids} == run.live_uids

    # plan: the orphans are confirmed by the rollouts' own deletes; the guard is seen, so tombstones come first
    config = Config(targets=[Target(name="guarded", kind="rllm", url=url)], policy=Policy())
    # the launcher's orphan index holds only idle candidates: the deleted ids are named to the read
    snapshot = take_snapshot(config, also_sessions=run.deletes)
    store = snapshot.targets[0].trace_store
    assert store is not None and store.guard is not None, "the scan must see the launcher's guard"
    assert store.session_total is not None, "the scan must read the launcher's orphan index"
    with pytest.raises(GatewayscopeError, match="also_sessions"):  # never fewer orphans without a word
        build_plan(take_snapshot(config), config, deleted_ids=run.deletes)
    plan = build_plan(snapshot, config, deleted_ids=run.deletes)
    assert [a.kind for a in plan.actions] == ["tombstone_backfill"] + ["session_delete"] * N_STRAGGLERS
    assert plan.actions[0].after == {"session_ids": sorted(run.straggler_uids)}
    assert sorted(a.subject for a in plan.actions[1:]) == sorted(run.straggler_uids)
    assert not any("no tombstone guard" in w for w in plan.warnings)

    journal = tmp_path / "journal.jsonl"
    report = apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True), journal=Journal(journal))

    assert report.tally_line() == f"{N_STRAGGLERS + 1} done, {TAIL}"
    journal_order_ok(journal)
    after = sessions(url)
    assert not set(after) & set(run.straggler_uids)
    assert after == {s: before[s] for s in run.live_uids}  # live sessions untouched, trace for trace
    checked = httpx.post(f"{url}/guard/tombstones/check",
                         json={"session_ids": [*run.straggler_uids, *run.live_uids]}, timeout=10).json()
    assert sorted(checked["tombstoned"]) == sorted(run.straggler_uids)
    assert guard_status(url)["tombstones"] == CAP

    # single use: a second apply does nothing
    again = apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True), journal=Journal(journal))
    assert again.already_applied and again.results == []
    assert sessions(url) == after

    # a straggler in flight when its id is deleted again is dropped, not resurrected; a call that comes after the
    # delete is the id's next use, and kept
    victim, reused = run.straggler_uids[0], run.straggler_uids[1]
    late = land_late_calls(url, [victim], lambda: httpx.delete(f"{url}/sessions/{victim}", timeout=10),
                           settle_timeout=2.0)
    assert late.errors == [] and late.landed == []
    status = wait_for("the dropped late write", lambda: guard_status(url), lambda s: s["dropped_writes"] == 1)
    assert status["top_droppers"] == [{"session_id": victim, "dropped": 1}]
    late_call(url, reused)
    wait_for("the reused id's trace", lambda: sessions(url), lambda left: left.get(reused) == 1)
    assert victim not in sessions(url) and guard_status(url)["kept_after_fence"] == 1


# -- (b) the unmodified gateway on SQLite, no guard ---------------------------------------------------------------

def test_unguarded_sqlite_store_orphans_are_deleted_in_the_file(rllm_gateway: Any, tmp_path: Path) -> None:
    gateway = rllm_gateway("sqlite")
    run = run_rollouts(gateway.url, n_rollouts=8, n_stragglers=3, n_live=3, straggler_delay=1.0)
    assert run.ok, run.to_dict()
    before = sessions(gateway.url)
    assert {s: n for s, n in before.items() if s in set(run.deleted_uids)} == dict.fromkeys(run.straggler_uids, 1)

    db = str(gateway.db_path)
    config = Config(targets=[Target(name="store", kind="rllm", path=db)], policy=Policy())
    with pytest.raises(GatewayscopeError, match="also_sessions"):  # the candidates read holds only candidates
        build_plan(take_snapshot(config), config, deleted_ids=run.deletes)
    plan = build_plan(take_snapshot(config, also_sessions=run.deletes), config, deleted_ids=run.deletes)
    assert sorted((a.kind, a.subject) for a in plan.actions) == [("session_delete", u) for u in
                                                                 sorted(run.straggler_uids)]
    assert any(w.endswith(f"to stop that: gatewayscope guard install {db}.") for w in plan.warnings)

    report = apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True),
                        journal=Journal(tmp_path / "journal.jsonl"), deleted_ids=run.deletes)

    assert report.tally_line() == f"3 done, {TAIL}"
    after = sessions(gateway.url)  # read through the gateway that kept running
    assert after == {s: before[s] for s in run.live_uids} == run.live_uids
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        left = {row[0] for row in conn.execute("SELECT DISTINCT session_id FROM trace_sessions")}
        orphan_traces = conn.execute(
            "SELECT COUNT(*) FROM traces WHERE trace_id NOT IN (SELECT trace_id FROM trace_sessions)").fetchone()[0]
    assert left == set(run.live_uids)
    assert orphan_traces == 0


# -- (c) the CLI, end to end ----------------------------------------------------------------------------------------

def gatewayscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from gatewayscope.cli import run; run()", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def test_the_cli_plans_shows_dry_runs_applies_and_refuses_to_apply_twice(rllm_gateway: Any, tmp_path: Path) -> None:
    gateway = rllm_gateway("sqlite")
    run = run_rollouts(gateway.url, n_rollouts=6, n_stragglers=2, n_live=2, straggler_delay=1.0)
    assert run.ok, run.to_dict()
    assert sorted(run.live_uids.values()) == [1, 2]  # one live session has a single, fresh trace
    db = str(gateway.db_path)
    age(db, run.straggler_uids, 3 * 3600)  # the orphans have been idle three hours; the live ones have not
    installed = gatewayscope("guard", "install", db, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    before = sessions(gateway.url)

    planned = gatewayscope("plan", "--trace-store", db, "--include-suspected", "--out", "plan.json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "Plan written to plan.json" in planned.stdout
    # suspected orphans get no tombstone ahead of their delete (they may be live); each delete records its own
    assert "2 actions: 2 session_delete" in planned.stdout

    shown = gatewayscope("show", "plan.json", "--format", "md", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("\n# Plan `") or shown.stdout.startswith("# Plan `")
    assert "| session_delete | 2 |" in shown.stdout
    for uid in run.straggler_uids:
        assert f"`{uid}`" in shown.stdout
    for uid in run.live_uids:
        assert uid not in shown.stdout

    dry = gatewayscope("apply", "plan.json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "Dry run, nothing was sent: 2 would-write." in dry.stdout
    assert sessions(gateway.url) == before
    assert not (tmp_path / "plan.journal.jsonl").exists()

    applied = gatewayscope("apply", "plan.json", "--yes", "--allow-delete", cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert applied.stdout.splitlines()[-1] == f"2 done, {TAIL}"
    assert sessions(gateway.url) == {uid: before[uid] for uid in run.live_uids}
    with sqlite3.connect(db) as conn:  # the guard's trigger tombstoned each deleted session
        assert sorted(r[0] for r in conn.execute("SELECT session_id FROM gatewayscope_tombstones")) == sorted(
            run.straggler_uids)

    again = gatewayscope("apply", "plan.json", "--yes", "--allow-delete", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "was already applied" in again.stdout and "nothing to do" in again.stdout
    assert sessions(gateway.url) == {uid: before[uid] for uid in run.live_uids}
