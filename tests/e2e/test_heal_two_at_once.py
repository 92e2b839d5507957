"""Two heals at once.

* On one journal: the second ``gatewayscope heal`` process refuses to start, names the first (its pid), and
  sends nothing; once the first is stopped, the journal is free again.
* On two journals against the same guarded gateway (the launcher's compare-and-delete): both plan the same
  orphans and run their passes at the same moment, and each session is deleted exactly once; the other heal's
  delete of it ends ``stale`` or ``already-done``, and the live sessions keep every trace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import parse_config
from gatewayscope.heal.loop import HealLoop
from gatewayscope.heal.settings import parse_heal_settings
from gatewayscope.remediate.journal import Journal
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small
from tests.helpers import gateway_sessions, run_at_once, wait_for

pytestmark = pytest.mark.e2e


def chat(url: str, session_id: str) -> None:
    httpx.post(f"{url}/sessions/{session_id}/v1/chat/completions", timeout=30,
               json={"model": "stub", "messages": [{"role": "user", "content": "hello"}]}).raise_for_status()


def test_a_second_heal_process_on_one_journal_refuses_and_names_the_first(tmp_path: Path) -> None:
    with BifrostEmulator() as emu:
        seed_small(emu)
        config = tmp_path / "g.toml"
        config.write_text(f'[[targets]]\nname = "bifrost"\nkind = "bifrost"\nurl = "{emu.url}"\n'
                          f'[heal]\nstate_dir = "{tmp_path / "state"}"\ninterval_seconds = 3600\n'
                          "first_pass_max_delay_seconds = 0\n")
        argv = [sys.executable, "-c", "from gatewayscope.cli import run; run()", "heal", "--config", str(config)]
        first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        try:
            journal = Journal(tmp_path / "state" / "heal.journal.jsonl")
            wait_for("the first heal's pass", lambda: [e["event"] for e in journal.read()],
                     lambda events: "heal-pass-end" in events, timeout=60)
            emu.clear_requests()
            second = subprocess.run([*argv, "--once"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
            assert second.returncode == 1
            assert f"Another heal holds the journal {journal.path}: process {first.pid} on host " in second.stderr
            assert "did not start (nothing was read or written)" in second.stderr
            assert emu.requests() == []  # the second one read nothing either
        finally:
            first.send_signal(signal.SIGTERM)
            _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
        assert "heal pass ok" in err and "gatewayscope heal stopped." in err
        again = subprocess.run([*argv, "--once"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert again.returncode == 0, again.stderr


ORPHANS = [f"task-{c}:{i}" for c in "abc" for i in range(3)]


def test_two_heals_on_two_journals_delete_each_session_once(guarded_gateway: Any, tmp_path: Path) -> None:
    gateway = guarded_gateway("memory")
    for sid in ORPHANS:
        chat(gateway.url, sid)
    wait_for("the traces", lambda: gateway_sessions(gateway.url), lambda s: len(s) == len(ORPHANS))
    time.sleep(1.2)  # idle past the short threshold: suspected orphans
    live = "live:0"
    chat(gateway.url, live)
    loops = []
    for i in range(2):
        raw = {"targets": [{"name": "gw", "kind": "rllm", "url": gateway.url}],
               "heal": {"mode": "enforce", "state_dir": str(tmp_path / f"heal-{i}"), "first_pass_max_delay_seconds": 0,
                        "actions": {"session_delete": "enforce"}, "limits": {"concurrency": 4},
                        "suspected": {"delete": True, "idle_seconds": 1, "allow_below_heartbeat": True}}}
        config = parse_config(raw, f"heal-{i}.toml")
        loop = HealLoop(config, parse_heal_settings(config.heal, f"heal-{i}.toml"))
        loop.prepare()
        loops.append(loop)
    reports: list[Any] = run_at_once([loop.run_pass for loop in loops])
    assert all(r is not None and r.result == "ok" for r in reports)
    done = Counter(r.subject for rep in reports for r in rep.enforced if r.kind == "session_delete"
                   and r.outcome == "done")
    assert done == dict.fromkeys(ORPHANS, 1), done  # each session deleted by exactly one of them
    others = Counter(r.outcome for rep in reports for r in rep.enforced
                     if r.kind == "session_delete" and r.outcome != "done")
    assert set(others) <= {"stale", "already-done"}
    assert gateway_sessions(gateway.url) == {live: 1}
    checked = httpx.post(f"{gateway.url}/guard/tombstones/check", json={"session_ids": ORPHANS}, timeout=10).json()
    assert sorted(checked["tombstoned"]) == sorted(ORPHANS)
    assert os.path.exists(loops[0].settings.journal) and os.path.exists(loops[1].settings.journal)


def test_a_heal_killed_mid_write_resumes_without_writing_a_record_twice(tmp_path: Path) -> None:
    """``kill -9`` of a ``gatewayscope heal`` process while a pool write it sent is still unanswered (the write
    has landed); a restarted heal resumes the pass from the journal: that record reads back as already done and
    no record is ever written twice."""
    from gatewayscope.sandbox.bifrost_emulator import ANY

    with BifrostEmulator() as emu:
        seed_small(emu)
        emu.inject_slow("PUT", ANY, delay=30.0, apply_write=True, times=None)  # each write lands, its answer waits
        state = tmp_path / "state"
        config = tmp_path / "g.toml"
        config.write_text(f'[[targets]]\nname = "bifrost"\nkind = "bifrost"\nurl = "{emu.url}"\n'
                          f'[heal]\nmode = "enforce"\nstate_dir = "{state}"\nfirst_pass_max_delay_seconds = 0\n'
                          '[heal.actions]\npool_shrink = "enforce"\n[heal.limits]\nconcurrency = 1\n')
        argv = [sys.executable, "-c", "from gatewayscope.cli import run; run()", "heal", "--config", str(config)]
        first = subprocess.Popen([*argv, "--once"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        try:
            wait_for("the first write to land", lambda: len(emu.requests("PUT")), lambda n: n >= 1, timeout=60)
        finally:
            first.kill()  # SIGKILL: no handler runs, no outcome is journaled
            first.wait(timeout=30)
        events = Journal(state / "heal.journal.jsonl").read()
        assert [e["event"] for e in events].count("attempt") == 1 and not [e for e in events if e["event"] == "outcome"]
        emu.state.faults.clear()
        again = subprocess.run([*argv, "--once", "--format", "json"], capture_output=True, text=True, timeout=120,
                               cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        puts = Counter(r.path for r in emu.requests("PUT"))
        assert puts and set(puts.values()) == {1}, puts  # the landed write was read back, never sent again
        import json

        report = json.loads(again.stdout)
        killed = [r for r in report["resumed"] if r["outcome"] == "already-done"]
        assert len(killed) == 1 and all(r["outcome"] in ("done", "already-done") for r in report["resumed"])
