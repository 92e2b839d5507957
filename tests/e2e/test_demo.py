"""``gatewayscope demo`` as a user runs it: a real process that starts the whole sandbox (stub worker, two real
rLLM gateways, two guarded stores, the Bifrost emulator, the exporter), prints where everything is and the plan
it would apply, and stops everything it started: right away with ``--once``, on Ctrl-C (SIGINT) or SIGTERM
otherwise.

"Everything stopped" is checked from the outside: every port the demo printed refuses connections afterwards,
and no process whose command line names the demo's work folder (the SQLite gateway, the exporter) is left.
Each test runs once per rLLM gateway (``gateway_flavor``): the demo starts the flavour's gateways
(``$GATEWAYSCOPE_GATEWAY_PYTHON``), itself running in the test environment.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.remediate.plan import load_plan
from gatewayscope.sandbox.processes import GATEWAY_PYTHON_ENV

pytestmark = pytest.mark.e2e

DEMO = [sys.executable, "-c", "from gatewayscope.cli import run; run()", "demo", "--rollouts", "6",
        "--stragglers", "2"]
PARTS = {"stub worker", "rllm-memory", "rllm-sqlite", "rllm-memory-guarded", "rllm-sqlite-guarded", "bifrost emulator",
         "exporter"}
URL = re.compile(r"^\s+([\w -]+):\s+(http://127\.0\.0\.1:\d+)\s*$", re.MULTILINE)
RLLM_TARGETS = ("rllm-memory", "rllm-sqlite", "rllm-memory-guarded", "rllm-sqlite-guarded")


def demo_env(flavor: Any) -> dict[str, str]:
    """Our environment, with the demo's rLLM gateways run by the flavour's Python (the demo itself runs in ours)."""
    return {**os.environ, GATEWAY_PYTHON_ENV: flavor.python}


def journal_mode(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def endpoints(stdout: str) -> dict[str, str]:
    """The parts the demo printed under 'Sandbox (loopback):', by name."""
    return dict(URL.findall(stdout))


def port_open(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def processes_naming(text: str) -> list[str]:
    """Command lines of running processes that contain ``text`` (this test's own process excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(cmdline)
    return found


def assert_all_stopped(parts: dict[str, str], workdir: Path) -> None:
    assert set(parts) == PARTS, parts
    still = {name: url for name, url in parts.items() if port_open(url)}
    assert still == {}, f"still listening after the demo stopped: {still}"
    assert processes_naming(str(workdir)) == []


def test_demo_once_prints_everything_and_stops_cleanly(gateway_flavor: Any, tmp_path: Path) -> None:
    workdir = tmp_path / "sandbox"
    done = subprocess.run([*DEMO, "--once", "--workdir", str(workdir)], capture_output=True, text=True, timeout=240,
                          env=demo_env(gateway_flavor))
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    parts = endpoints(out)
    assert_all_stopped(parts, workdir)
    # the flavour's gateway wrote the SQLite store: 0.1.0 keeps it in DELETE mode, upstream main in WAL
    assert journal_mode(workdir / "gateway_traces.db") == gateway_flavor.journal_mode

    # what it found: suspected orphans behind the unguarded gateways; on the store guarded late the orphans a
    # journaled cleanup deleted before its guard and late calls brought back (confirmed by that journal);
    # none behind the guarded gateway; the guards' figures (6 deletes and 2 dropped late writes behind each)
    assert out.count("Orphan sessions: 0 confirmed, 2 suspected") == 2
    assert "Orphan sessions: 2 confirmed, 0 suspected" in out
    assert out.count("Guard: 6 tombstones of 1,000,000, 2 dropped writes (stragglers).") == 2
    assert "The guards dropped the late writes of 4 more (rllm-memory-guarded: 2, rllm-sqlite-guarded: 2)." in out
    journal = workdir / "cleanup-before-guard.journal.jsonl"
    assert f"--deleted-from {journal}" in out
    assert f"Prometheus metrics: {parts['exporter']}/metrics" in out
    # the plan it would apply (written, never applied): tombstones first on the guarded store, then deletes
    plan = load_plan(workdir / "plan.json")
    assert f"Plan {plan.id}" in out
    assert {a.kind for a in plan.actions} == {"tombstone_backfill", "session_delete", "posture_fix", "pool_shrink",
                                              "record_delete"}
    backfills = [a for a in plan.actions if a.kind == "tombstone_backfill"]
    deletes = [a for a in plan.actions if a.kind == "session_delete"]
    assert [a.target for a in backfills] == ["rllm-sqlite-guarded"]  # its confirmed orphans carry no tombstone
    assert sorted(backfills[0].after["session_ids"]) == sorted(
        a.subject for a in deletes if a.target == "rllm-sqlite-guarded")
    assert all(a.details["deleted_before"] for a in deletes if a.target == "rllm-sqlite-guarded")
    assert {a.target: a.details["confidence"] for a in deletes} == {
        "rllm-memory": "suspected", "rllm-sqlite": "suspected", "rllm-sqlite-guarded": "confirmed"}
    assert len(deletes) == 6
    assert "written, NOT applied" in out
    assert {p.name for p in workdir.glob("*.journal*")} <= {journal.name, f"{journal.name}.lock"}  # its cleanup's
    assert re.search(r"jupyter lab (--allow-root )?\S*notebooks", out)
    assert f"GATEWAYSCOPE_CONFIG={workdir / 'gatewayscope.toml'}" in out
    assert "stopped everything it started" in done.stderr


@contextlib.contextmanager
def running_demo(workdir: Path, log: Path, flavor: Any) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Start the demo without --once; collect its stdout lines in a thread; kill its group if a test fails."""
    with open(log, "w") as errors:
        proc = subprocess.Popen([*DEMO, "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=errors,
                                text=True, start_new_session=True, env=demo_env(flavor))
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        try:
            yield proc, lines
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            reader.join(timeout=10)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_everything_the_running_demo_started(gateway_flavor: Any, tmp_path: Path,
                                                           signum: int) -> None:
    workdir = tmp_path / "sandbox"
    log = tmp_path / "demo.stderr"
    with running_demo(workdir, log, gateway_flavor) as (proc, lines):
        deadline = time.monotonic() + 240
        while not any("keeps running" in line for line in lines):
            assert proc.poll() is None, f"the demo exited early:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"the demo did not come up:\n{log.read_text()[-4000:]}"
            time.sleep(0.1)
        parts = endpoints("".join(lines))
        assert all(port_open(url) for url in parts.values()), parts
        # the demo's gateways are the flavour's: only upstream main has /admin/weight_version
        for name in RLLM_TARGETS:
            answer = httpx.get(f"{parts[name]}/admin/weight_version", timeout=30)
            assert answer.status_code == (200 if gateway_flavor.weight_version else 404), (name, answer.text)

        # the exporter it started serves the sandbox's targets
        exporter = parts["exporter"]
        deadline = time.monotonic() + 60
        while True:
            metrics = httpx.get(f"{exporter}/metrics", timeout=30).text
            up = dict(re.findall(r'^gatewayscope_up\{kind="\w+",target="([\w-]+)"\} (\S+)$', metrics, re.MULTILINE))
            if up == dict.fromkeys((*RLLM_TARGETS, "bifrost"), "1.0") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert up == dict.fromkeys((*RLLM_TARGETS, "bifrost"), "1.0"), metrics[:2000]

        # `gatewayscope plan` on the sandbox with the cleanup's journal: the orphans of the store guarded late,
        # confirmed by it, their tombstones first; the suspected ones elsewhere are left out (warned)
        config = workdir / "gatewayscope.toml"
        journal = workdir / "cleanup-before-guard.journal.jsonl"
        planned = subprocess.run([sys.executable, "-c", "from gatewayscope.cli import run; run()", "plan",
                                  "--config", str(config), "--deleted-from", str(journal),
                                  "--out", str(tmp_path / "plan.json")],
                                 capture_output=True, text=True, timeout=120)
        assert planned.returncode == 0, planned.stderr[-4000:]
        plan = load_plan(tmp_path / "plan.json")
        rllm = [(a.kind, a.target) for a in plan.actions if a.target.startswith("rllm")]
        assert rllm == [("tombstone_backfill", "rllm-sqlite-guarded")] + [("session_delete", "rllm-sqlite-guarded")] * 2
        assert "rllm-memory: 2 suspected orphan session(s) left out" in planned.stdout

        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 0, log.read_text()[-4000:]
    assert_all_stopped(parts, workdir)
    assert "stopped everything it started" in log.read_text()
