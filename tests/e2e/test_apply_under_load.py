"""``gatewayscope apply`` on the SQLite file of a running, loaded rLLM gateway loses none of its traces.

It runs on both gateways (``gateway_flavor``): PyPI's 0.1.0 (DELETE journal mode) and upstream main (WAL mode,
where the gateway's write from an open read fails at once if another process committed since that read began).
The store is built with the flavour's own schema and pragmas.

The REAL, unmodified ``rllm-model-gateway --store sqlite`` serves 8 writers (chat calls on their own live
sessions) and 2 readers (``GET /sessions``, ``GET /sessions/{sid}/traces``) while ``gatewayscope apply``
deletes the orphans ``gatewayscope plan --include-suspected`` planned in the same file. The 0.1.0 gateway
answers a chat call first and persists its trace afterwards, fire-and-forget, through its one SQLite
connection (20 s busy timeout); a write that fails is only logged (``Failed to persist trace ...``), the
client has its 200 already. So the rules are checked in the file itself, after the load:

* every call answered 200 has its trace in the file, under its session (by the worker's response id);
* every planned orphan is gone, and nothing else: the store's other sessions keep all their traces;
* apply exits 0 by itself, its tally line counts every planned delete done, its journal has ``apply-end``;
* the gateway never logged ``database is locked``, and every read it was asked for was answered.

The same load runs against back-to-back ``gatewayscope scan`` reads of the file (the candidates read), with the
same file checks, and every scan must report exactly the store's orphans.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.sandbox.load import missing, trace_count
from tests.e2e._load import (
    APPLY_BOUND,
    CALLS_BEFORE_APPLY,
    ORPHANS,
    STORE_SESSIONS,
    TALLY,
    cli_argv,
    cli_env,
    file_sessions,
    file_trace_ids,
    loaded_gateway,
    read_only,
    running,
    wait_for_calls,
)

pytestmark = pytest.mark.e2e

@dataclass
class ApplyRun:
    exit_code: int | None  # None: killed at APPLY_BOUND
    output: str
    seconds: float


def run_apply(plan: Path, cwd: Path) -> ApplyRun:
    """``gatewayscope apply PLAN --yes --allow-delete`` in its own process group, killed at APPLY_BOUND s."""
    log = cwd / "apply.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cli_argv("apply", plan.name, "--yes", "--allow-delete"), stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd, env=cli_env(cwd), start_new_session=True)
        try:
            deadline = started + APPLY_BOUND
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            exit_code = proc.poll()
        finally:
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    return ApplyRun(exit_code=exit_code, output=log.read_text(errors="replace"),
                    seconds=time.monotonic() - started)


def journal_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        with suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return events


# -- the test -----------------------------------------------------------------------------------------------


def test_apply_on_a_loaded_gateways_sqlite_file_loses_no_answered_trace(rllm_gateway: Any, gateway_flavor: Any,
                                                                       tmp_path: Path) -> None:
    db = tmp_path / "gateway-traces.db"
    store, gateway, load = loaded_gateway(db, rllm_gateway, gateway_flavor)
    with read_only(db) as conn:  # 0.1.0: DELETE; upstream main: WAL (the gateway set it when it opened the file)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == gateway_flavor.journal_mode

    planned = subprocess.run(cli_argv("plan", "--trace-store", str(db), "--include-suspected", "--out", "plan.json"),
                             capture_output=True, text=True, timeout=120, cwd=tmp_path, env=cli_env(tmp_path))
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    planned_ids = {a["subject"] for a in plan["actions"] if a["kind"] == "session_delete"}
    assert planned_ids == set(store.orphans), "the plan must delete exactly the store's orphans"
    assert len(plan["actions"]) == len(planned_ids)

    with running(load):
        wait_for_calls(load, CALLS_BEFORE_APPLY, "the load did not start")
        applied = run_apply(tmp_path / "plan.json", tmp_path)

    # The gateway persists after answering: read the file once its last writes have landed.
    answered, in_file = load.settled(db)
    n_answered = trace_count(answered)
    n_missing = missing(answered, in_file)
    unexpected = {sid: ids - answered.get(sid, set()) for sid, ids in in_file.items()}
    sessions_now = file_sessions(db)
    traces_now = file_trace_ids(db)
    orphans_left = sorted(sid for sid in store.orphans if sid in sessions_now)
    orphan_traces_left = sorted(tid for tid in store.orphans.values() if tid in traces_now)
    kept_changed = sorted(sid for sid, n in store.kept.items() if sessions_now.get(sid) != n)
    events = journal_events(tmp_path / "plan.journal.jsonl")
    journaled_done = sum(1 for e in events if e.get("event") == "outcome" and e.get("outcome") == "done")
    tallies = [line for line in applied.output.splitlines() if TALLY.match(line.strip())]
    gateway_log = gateway.process.output()
    locked = gateway_log.count("database is locked")
    failed_persists = gateway_log.count("Failed to persist trace")

    summary = (
        f"answered {n_answered} chat calls on {len(answered)} live sessions, {n_missing} of their traces "
        f"missing from the file; {load.reads} reads; planned {len(planned_ids)} orphan deletes, "
        f"{len(planned_ids) - len(orphans_left)} deleted ({journaled_done} journaled done); apply "
        f"{'killed after' if applied.exit_code is None else f'exited {applied.exit_code} after'} "
        f"{applied.seconds:.0f} s, tally {tallies[-1] if tallies else None!r}; gateway log: "
        f"{failed_persists} 'Failed to persist trace', {locked} 'database is locked'; "
        f"{load.failures} failed calls/reads {load.errors[:3]}; apply output tail:\n{applied.output[-1500:]}"
    )
    print(summary)

    assert load.failures == 0, summary
    assert n_missing == 0, summary
    assert not any(unexpected.values()), f"traces no call was answered for: {unexpected}\n{summary}"
    assert orphans_left == [] and orphan_traces_left == [], summary
    assert kept_changed == [], f"{len(kept_changed)} sessions that were not planned lost traces\n{summary}"
    assert applied.exit_code == 0, summary
    assert "Traceback" not in applied.output, summary
    assert tallies and tallies[-1].strip() == (
        f"{len(planned_ids)} done, 0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"), summary
    assert [e for e in events if e.get("event") == "apply-end"], f"no apply-end in the journal\n{summary}"
    assert locked == 0 and failed_persists == 0, summary
    assert gateway.process.running(), summary


#: scans run one after another while the load runs (each reads every session of the store)
SCANS_UNDER_LOAD = 4
SCAN_BOUND = 120.0


def test_scans_of_a_loaded_gateways_sqlite_file_lose_no_answered_trace_and_see_exactly_its_orphans(
        rllm_gateway: Any, gateway_flavor: Any, tmp_path: Path) -> None:
    """The scan's candidates read (each page aggregated inside SQLite, about 15 ms of lock) and its keyed reads
    of the candidates run back to back against the gateway's commits: every answered call's trace is in the
    file afterwards, the gateway logged no lock error, and every scan reported exactly the store's orphans
    (the load's sessions are fresh) and counted at least the sessions the store was built with."""
    db = tmp_path / "gateway-traces.db"
    store, gateway, load = loaded_gateway(db, rllm_gateway, gateway_flavor)
    reports: list[dict[str, Any]] = []
    with running(load):
        wait_for_calls(load, CALLS_BEFORE_APPLY, "the load did not start")
        calls_before = load.calls
        for _ in range(SCANS_UNDER_LOAD):
            scanned = subprocess.run(cli_argv("scan", "--trace-store", str(db), "--format", "json"),
                                     capture_output=True, text=True, timeout=SCAN_BOUND, cwd=tmp_path,
                                     env=cli_env(tmp_path))
            assert scanned.returncode == 0, scanned.stdout[-2000:] + scanned.stderr[-2000:]
            reports.append(json.loads(scanned.stdout)["targets"][0])
        calls_during = load.calls - calls_before
    answered, in_file = load.settled(db)
    n_answered = trace_count(answered)
    n_missing = missing(answered, in_file)
    gateway_log = gateway.process.output()
    summary = (f"answered {n_answered} chat calls ({calls_during} while {SCANS_UNDER_LOAD} scans ran), "
               f"{n_missing} of their traces missing from the file; {load.failures} failed calls/reads "
               f"{load.errors[:3]}; gateway log: {gateway_log.count('database is locked')} 'database is locked', "
               f"{gateway_log.count('Failed to persist trace')} 'Failed to persist trace'")
    print(summary)
    assert calls_during > 0, summary
    assert load.failures == 0 and n_missing == 0, summary
    assert gateway_log.count("database is locked") == 0 and gateway_log.count("Failed to persist trace") == 0, summary
    for report in reports:
        assert report["up"] and report["access"] == "sqlite", report.get("error")
        assert sorted(o["session_id"] for o in report["orphan_sessions"]) == sorted(store.orphans), summary
        assert report["sessions"] >= STORE_SESSIONS and report["traces"] >= sum(store.kept.values()) + ORPHANS
