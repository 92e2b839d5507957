"""Apply's safety on real processes: two applies of one plan, and the guarded launcher's compare-and-delete.

* Two real ``gatewayscope apply`` processes of one plan against the Bifrost emulator (a real HTTP server):
  the second is refused while the first runs, says which process holds the plan, exits 1 and sends
  nothing; every record is written once.
* The real guarded launcher in front of the stub worker: apply deletes the race's orphans through
  ``POST /guard/sessions/delete-if``; a session that gets a real chat call while its delete waits its
  turn is ``stale`` and keeps every trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target
from gatewayscope.remediate.apply import ApplyOptions, apply_plan
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import build_plan
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_realistic
from gatewayscope.scan import take_snapshot
from tests.helpers import gateway_sessions, guard_status, wait_for

pytestmark = pytest.mark.e2e


def cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", "from gatewayscope.cli import run; run()", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def test_a_second_apply_process_of_one_plan_is_refused_and_sends_nothing(tmp_path: Path) -> None:
    with BifrostEmulator() as emu:
        seed_realistic(emu)
        planner = cli("plan", "--bifrost", emu.url, "--out", "plan.json", cwd=tmp_path)
        out, err = planner.communicate(timeout=120)
        assert planner.returncode == 0, out + err
        plan = json.loads((tmp_path / "plan.json").read_text())
        shrinks = [a["subject"] for a in plan["actions"] if a["kind"] == "pool_shrink"]
        assert len(shrinks) > 100
        emu.clear_requests()
        emu.inject_slow("PUT", "provider", delay=0.05, apply_write=True, times=len(shrinks))

        first = cli("apply", "plan.json", "--yes", cwd=tmp_path)
        try:
            wait_for("the first apply's first attempt", lambda: (tmp_path / "plan.journal.jsonl").exists()
                     and '"attempt"' in (tmp_path / "plan.journal.jsonl").read_text(), bool, timeout=60)
            second = cli("apply", "plan.json", "--yes", cwd=tmp_path)
            out2, err2 = second.communicate(timeout=120)
            assert first.poll() is None, "the first apply was still running when the second ended"
            out1, err1 = first.communicate(timeout=300)
        finally:
            for proc in (first,):
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()

        assert second.returncode == 1, out2 + err2
        assert f"is being applied by process {first.pid}" in err2
        assert "nothing was sent" in err2 and "Traceback" not in err2
        assert first.returncode == 0, out1 + err1
        puts = [r.path for r in emu.requests("PUT", "/api/providers/")]
        assert len(puts) == len(shrinks) == len(set(puts))
        journal = [json.loads(line) for line in (tmp_path / "plan.journal.jsonl").read_text().splitlines()]
        assert [e["event"] for e in journal].count("apply-start") == 1


def chat(url: str, session_id: str) -> None:
    response = httpx.post(f"{url}/sessions/{session_id}/v1/chat/completions", timeout=30,
                          json={"model": "stub", "messages": [{"role": "user", "content": "still here"}]})
    response.raise_for_status()


def test_the_guarded_launcher_deletes_orphans_by_compare_and_delete_and_keeps_a_session_that_came_alive(
        guarded_gateway: Any, tmp_path: Path) -> None:
    """Four sessions of one trace each, idle past a short threshold: suspected orphans. While the deletes
    wait their turn (the rate limiter), the agent of one of them calls again: that one is 'stale' and keeps
    both traces; the others are deleted through the compare-and-delete route and carry tombstones."""
    gateway = guarded_gateway("memory")
    orphans = ["task-a:0", "task-a:1", "task-b:0"]
    revived = "task-c:0"
    for sid in [*orphans, revived]:
        chat(gateway.url, sid)
    wait_for("the traces", lambda: gateway_sessions(gateway.url), lambda s: len(s) == 4)
    time.sleep(1.2)
    config = Config(targets=[Target(name="gw", kind="rllm", url=gateway.url)],
                    policy=Policy(orphan_idle_seconds=1.0))
    plan = build_plan(take_snapshot(config), config, include_suspected=True)
    assert sorted(a.subject for a in plan.actions if a.kind == "session_delete") == sorted([*orphans, revived])
    chatted: list[float] = []

    def sleep(seconds: float) -> None:
        if not chatted:  # the first wait: every delete after it finds its session as it is then
            chatted.append(seconds)
            chat(gateway.url, revived)
            # the gateway stores a trace after it answers: wait until this write has landed
            wait_for("the revived session's second trace", lambda: gateway_sessions(gateway.url),
                     lambda s: s.get(revived) == 2)

    report = apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True, rate=2.0, concurrency=1,
                                                           sleep=sleep), journal=Journal(tmp_path / "j.jsonl"))
    outcomes = {r.subject: r.outcome for r in report.results if r.kind == "session_delete"}
    assert chatted
    assert outcomes == {**dict.fromkeys(orphans, "done"), revived: "stale"}
    assert gateway_sessions(gateway.url) == {revived: 2}
    status = guard_status(gateway.url)
    assert status["tombstones"] == len(orphans)
