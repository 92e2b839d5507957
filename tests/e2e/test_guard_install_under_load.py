"""``gatewayscope guard install`` on the SQLite file of a running, loaded rLLM gateway: it finishes, and the
gateway loses none of the traces of the calls it answered.

The REAL, unmodified ``rllm-model-gateway --store sqlite`` serves 8 writers (chat calls on their own live
sessions) and 2 readers while ``gatewayscope guard install`` runs on its file: the integrity check, the triggers
and the orphan index's fill, each in short transactions the gateway's writes go between. The store is built
with the flavour's own schema and pragmas, at a size CI holds (the 10M-session figure is the
``guard-install-under-load`` bench row). Checked in the file itself after the load, as the apply's load test
does (the 0.1.0 gateway answers first and persists afterwards; a failed write is only logged):

* install exits 0 by itself and says it installed the guard, and ``guard status`` finds it installed, its
  triggers intact and its orphan index ready;
* every call answered 200 has its trace in the file, under its session, and the load saw no failed call or read;
* the gateway never logged ``database is locked`` or ``Failed to persist trace``;
* the calls answered after install went through the guard's triggers: the orphan index counts their sessions
  with all of their traces.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.sandbox.load import missing, trace_count
from tests.e2e._load import (
    CALLS_BEFORE_APPLY,
    WRITERS,
    cli_argv,
    cli_env,
    loaded_gateway,
    read_only,
    running,
    wait_for_calls,
)

pytestmark = pytest.mark.e2e

#: sessions in the store when the gateway starts, and how many of them are day-old one-trace orphans
STORE_SESSIONS = 50_000
ORPHANS = 5_000
#: liveness bound of the install (seconds), never a timing assertion: it only ends an install that hangs
INSTALL_BOUND = 300.0
#: answered calls after install returned before the load stops: writes that meet the installed triggers
CALLS_AFTER_INSTALL = 100


def index_counts(path: Path, prefix: str) -> dict[str, int]:
    """The orphan index's trace count of each of the load's sessions."""
    conn = read_only(path)
    try:
        rows = conn.execute("SELECT session_id, trace_count FROM gatewayscope_sessions "
                            "WHERE substr(session_id, 1, ?) = ?", (len(prefix), prefix)).fetchall()
    finally:
        conn.close()
    return {str(sid): int(count) for sid, count in rows}


def test_guard_install_on_a_loaded_gateways_file_finishes_and_loses_no_answered_trace(
        rllm_gateway: Any, gateway_flavor: Any, tmp_path: Path) -> None:
    db = tmp_path / "gateway-traces.db"
    _, gateway, load = loaded_gateway(db, rllm_gateway, gateway_flavor, sessions=STORE_SESSIONS, orphans=ORPHANS)
    with running(load):
        wait_for_calls(load, CALLS_BEFORE_APPLY, "the load did not start")
        calls_before = load.calls
        started = time.monotonic()
        installed = subprocess.run(cli_argv("guard", "install", str(db), "--busy-timeout", "30"),
                                   capture_output=True, text=True, timeout=INSTALL_BOUND, cwd=tmp_path,
                                   env=cli_env(tmp_path))
        install_seconds = time.monotonic() - started
        calls_during = load.calls - calls_before
        wait_for_calls(load, load.calls + CALLS_AFTER_INSTALL, "the load stalled after install")
    answered, in_file = load.settled(db)
    n_answered = trace_count(answered)
    n_missing = missing(answered, in_file)
    status = subprocess.run(cli_argv("guard", "status", str(db), "--format", "json"), capture_output=True,
                            text=True, timeout=120, cwd=tmp_path, env=cli_env(tmp_path))
    gateway_log = gateway.process.output()
    locked = gateway_log.count("database is locked")
    failed_persists = gateway_log.count("Failed to persist trace")
    summary = (f"install exited {installed.returncode} after {install_seconds:.1f} s on {STORE_SESSIONS:,} sessions "
               f"with {WRITERS} writers ({calls_during} calls answered meanwhile): {installed.stdout.strip()!r} "
               f"{installed.stderr[-1500:]!r}; answered {n_answered} calls on {len(answered)} live sessions, "
               f"{n_missing} of their traces missing from the file; {load.reads} reads; {load.failures} failed "
               f"calls/reads {load.errors[:3]}; gateway log: {failed_persists} 'Failed to persist trace', "
               f"{locked} 'database is locked'")
    print(summary)

    assert installed.returncode == 0, summary
    assert "Traceback" not in installed.stderr and "could not finish" not in installed.stdout + installed.stderr
    assert status.returncode == 0, status.stdout + status.stderr
    guard = json.loads(status.stdout)
    assert guard["installed"] and guard["triggers_intact"] and guard["index"] == "ready", guard
    assert calls_during > 0, summary  # the gateway wrote while install ran
    assert load.failures == 0, summary
    assert n_missing == 0, summary
    assert locked == 0 and failed_persists == 0, summary
    assert gateway.process.running(), summary
    indexed = index_counts(db, load.prefix)
    assert {sid: len(ids) for sid, ids in in_file.items()} == indexed, "the orphan index must count every trace"
