"""A deleted id that a trainer uses again is live, whatever evidence says it was deleted before.

rLLM's trainers reuse session ids (``{task id}:{rollout index}``): the retry path deletes the id and reruns
under it. Tried as a trainer would, on the unmodified gateway of each flavour and both stores, through the CLI:

* ``apply`` deletes the orphan ``task-u:0`` and journals it; the retry reuses the id (three fresh calls);
  ``plan --deleted-from`` that journal must not call the live three-trace session an orphan.
* A plan edited by hand (unsigned, its id recomputed) that calls the session a confirmed orphan, deleted
  before "now", is applied: apply takes no evidence from the plan file, and re-checks against the fence of
  the evidence it is given, so the delete ends ``stale`` and the session keeps all three traces.
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

from gatewayscope.remediate.plan import load_plan
from tests.helpers import gateway_sessions as sessions

pytestmark = pytest.mark.e2e

SESSION = "task-u:0"


def call(url: str, session_id: str) -> None:
    body = {"model": "gatewayscope-stub", "messages": [{"role": "user", "content": "a rollout turn"}]}
    httpx.post(f"{url}/sessions/{session_id}/v1/chat/completions", json=body, timeout=30).raise_for_status()


def gatewayscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from gatewayscope.cli import run; run()", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


def settle(url: str, session_id: str, traces: int) -> None:
    """Wait (bounded) until the gateway holds ``traces`` traces for ``session_id`` (its writes are async)."""
    deadline = time.monotonic() + 20
    while sessions(url).get(session_id, 0) != traces:
        assert time.monotonic() < deadline, sessions(url)
        time.sleep(0.05)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_reused_id_is_never_deleted_on_old_evidence(rllm_gateway: Any, store: str, tmp_path: Path) -> None:
    gateway = rllm_gateway(store)
    target = str(gateway.db_path) if store == "sqlite" else gateway.url
    call(gateway.url, SESSION)
    settle(gateway.url, SESSION, 1)
    time.sleep(1.2)  # its one trace is idle past the one-second threshold below

    flags = ("--orphan-idle-seconds", "1")  # apply checks what the plan was made with only when told so
    planned = gatewayscope("plan", "--trace-store", target, "--include-suspected", *flags, "--out", "first.json",
                           cwd=tmp_path)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    applied = gatewayscope("apply", "first.json", "--yes", "--allow-delete", *flags, cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert applied.stdout.splitlines()[-1].startswith("1 done,"), applied.stdout
    journal = tmp_path / "first.journal.jsonl"
    assert journal.exists() and SESSION not in sessions(gateway.url)

    for _ in range(3):  # the retry reruns under the same id, with no POST /sessions
        call(gateway.url, SESSION)
    settle(gateway.url, SESSION, 3)

    again = gatewayscope("plan", "--trace-store", target, "--deleted-from", str(journal), "--include-suspected",
                         *flags,
                         "--out", "second.json", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    second = json.loads((tmp_path / "second.json").read_text())
    assert [a["subject"] for a in second["actions"] if a["kind"] == "session_delete"] == []

    # a hand-written one-line journal that claims a later delete, and plans that cite it or a time outright
    hand = tmp_path / "hand.journal.jsonl"
    hand.write_text(json.dumps({"event": "attempt", "kind": "session_delete", "target": "trace-store",
                                "subject": SESSION, "at": time.time() + 3600}) + "\n")
    for n, claim in enumerate(({"journal": str(hand)}, {"deleted_at": time.time() + 3600})):
        forged = load_plan(tmp_path / "first.json")
        for action in forged.actions:
            action.details.update(confidence="confirmed", deleted_before=claim)
        forged.id = ""
        forged.id = forged.compute_id()
        forged.save(tmp_path / f"forged-{n}.json")
        for evidence in ((), ("--deleted-from", str(journal))):
            done = gatewayscope("apply", f"forged-{n}.json", "--yes", "--allow-delete", *flags, *evidence,
                                cwd=tmp_path)
            assert "Traceback" not in done.stderr
            tally = done.stdout.splitlines()[-1]
            assert tally.startswith("0 done,") and "1 stale" in tally, done.stdout + done.stderr
            assert sessions(gateway.url)[SESSION] == 3
            (tmp_path / f"forged-{n}.journal.jsonl").unlink()  # the next evidence applies the plan afresh
