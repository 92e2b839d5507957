"""``gatewayscope heal`` in enforce against the real rLLM gateway (both flavours) and the Bifrost emulator, while
8 writers keep using the gateway; and in dry-run, where it must send no write at all.

The confirmed orphans are made the way they appear in production: real rollouts leave one-trace orphans
behind (stragglers), a journaled cleanup (a real apply) deletes them while each of their rollouts still has a
call in flight, and those calls land afterwards and bring the sessions back: the cleanup's journal proves their
delete (heal's ``deleted_from``), and every trace they hold was dispatched before it.

Checked:

* every confirmed orphan, every oversized pool and the posture drift go to zero across passes;
* no pass writes more than its caps (actions and deletes, read from the journal and the requests sent);
* a confirmed orphan that turns live between the plan and the write (its id's next use: a new call after its
  delete) is not deleted and keeps both traces; its next passes leave it alone (a trace after the fence is a
  new use);
* every call the gateway answered 200 for the writers has its trace in the writer's session: 0 lost;
* dry-run: every request heal sent is a read, and the emulator received nothing else.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target, parse_config
from gatewayscope.heal.loop import HealLoop
from gatewayscope.heal.settings import parse_heal_settings
from gatewayscope.remediate.apply import ApplyOptions, apply_plan
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import build_plan
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small
from gatewayscope.sandbox.load import ChatLoad, running
from gatewayscope.sandbox.rollouts import DEFAULT_MODEL, land_late_calls, run_rollouts
from gatewayscope.scan import take_snapshot
from tests.helpers import gateway_sessions as sessions

pytestmark = pytest.mark.e2e

WRITERS = 8
WRITER_PAUSE = 0.05
ROLLOUTS, STRAGGLERS = 12, 7
MAX_ACTIONS_PER_PASS, MAX_DELETES_PER_PASS = 5, 3
#: a liveness bound on the passes (each fixes up to the caps), never a timing assertion
MAX_PASSES = 20
WRITES = ("PUT", "POST", "DELETE", "PATCH")
#: POSTs that only read (the guarded launcher's tombstone check, the gateway's trace query)
READ_POSTS = ("/guard/tombstones/check", "/traces/query", "/guard/orphans")


class Counting(httpx.BaseTransport):
    """Every request heal sends to one target."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.sent.append((request.method, request.url.path))
        return self.inner.handle_request(request)

    def writes(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(m, p) for m, p in self.sent if m in WRITES and not (m == "POST" and p.startswith(READ_POSTS))]


def chat(url: str, session_id: str) -> None:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "the next step uses this id again"}]}
    httpx.post(f"{url}/sessions/{quote(session_id, safe='')}/v1/chat/completions", json=body,
               timeout=30).raise_for_status()


def response_ids(url: str, session_id: str) -> set[str]:
    traces = httpx.get(f"{url}/sessions/{quote(session_id, safe='')}/traces", timeout=30).json()
    return {str((t.get("raw_response") or {}).get("id")) for t in traces}


def confirmed_orphans(url: str, journal: Path) -> list[str]:
    """Real stragglers, then a journaled cleanup that deletes their orphans while one more call each is in
    flight; those land after it. Returns the ids that came back (confirmed by ``journal``)."""
    run = run_rollouts(url, n_rollouts=ROLLOUTS, n_stragglers=STRAGGLERS, n_live=0, straggler_delay=1.0)
    assert run.ok, run.to_dict()
    orphans = sorted(run.straggler_uids)
    time.sleep(1.2)  # idle past the cleanup's threshold
    config = Config(targets=[Target(name="rl", kind="rllm", url=url)], policy=Policy(orphan_idle_seconds=1.0))

    def clean_up() -> None:
        time.sleep(1.2)  # a call to a session counts as its activity: idle past the threshold again
        plan = build_plan(take_snapshot(config), config, include_suspected=True, only=["session_delete"])
        assert sorted(a.subject for a in plan.actions) == orphans
        report = apply_plan(plan, config, options=ApplyOptions(write=True, allow_delete=True), journal=Journal(journal))
        assert report.counts["done"] == len(orphans), str(report)

    landing = land_late_calls(url, orphans, clean_up)
    assert landing.errors == [] and landing.landed == orphans
    return orphans


@pytest.fixture
def emu() -> Iterator[BifrostEmulator]:
    with BifrostEmulator() as emulator:
        seed_small(emulator)
        yield emulator


def heal_loop(url: str, emu: BifrostEmulator, state: Path, cleanup: Path, heal: dict[str, Any],
              transports: dict[str, httpx.BaseTransport], cls: type[HealLoop] = HealLoop) -> HealLoop:
    raw = {"targets": [{"name": "rl", "kind": "rllm", "url": url},
                       {"name": "bifrost", "kind": "bifrost", "url": emu.url}],
           "heal": {"state_dir": str(state), "deleted_from": [str(cleanup)], "first_pass_max_delay_seconds": 0,
                    **heal}}
    config = parse_config(raw, "heal-e2e.toml")
    loop = cls(config, parse_heal_settings(config.heal, "heal-e2e.toml"), transports=dict(transports))
    loop.prepare()
    return loop


def shrinkable(emu: BifrostEmulator) -> list[str]:
    config = parse_config({"targets": [{"name": "bifrost", "kind": "bifrost", "url": emu.url}]}, "fresh.toml")
    plan = build_plan(take_snapshot(config), config)
    return sorted(a.subject for a in plan.actions if a.kind in ("pool_shrink", "posture_fix"))


def test_heal_enforce_drives_orphans_pools_and_drift_to_zero_under_load(rllm_gateway: Any, emu: BifrostEmulator,
                                                                         tmp_path: Path) -> None:
    gateway = rllm_gateway("memory")
    cleanup = tmp_path / "cleanup.journal.jsonl"
    orphans = confirmed_orphans(gateway.url, cleanup)
    victim = orphans[0]  # the first delete of the first pass (plan order): it turns live before the write
    fixes = shrinkable(emu)
    assert len(fixes) > MAX_ACTIONS_PER_PASS

    class TurnsLive(HealLoop):
        """Between the plan and the write of its first pass, the victim's id is used again (its next step)."""

        turned = False

        def _enforce(self, plan: Any, *args: Any) -> None:
            if not self.turned and any(a.subject == victim for a in plan.actions):
                TurnsLive.turned = True
                chat(gateway.url, victim)
            super()._enforce(plan, *args)

    rl, bifrost = Counting(), Counting()
    loop = heal_loop(gateway.url, emu, tmp_path / "heal", cleanup, {
        "mode": "enforce",
        "actions": {"session_delete": "enforce", "pool_shrink": "enforce", "posture_fix": "enforce"},
        "limits": {"max_actions_per_pass": MAX_ACTIONS_PER_PASS, "max_deletes_per_pass": MAX_DELETES_PER_PASS}},
        {"rl": rl, "bifrost": bifrost}, cls=TurnsLive)

    reports = []
    writers = ChatLoad(url=gateway.url, prefix="live-writer-", sessions_per_writer=1, pause=WRITER_PAUSE)
    with running(writers, writers.writer_threads(WRITERS)):
        while len(reports) < MAX_PASSES:
            rl_before, bf_before = len(rl.writes()), len(bifrost.writes())
            report = loop.run_pass()
            reports.append(report)
            written = [r for r in [*report.resumed, *report.enforced] if r.outcome != "skipped"]
            deletes = [r for r in written if r.kind == "session_delete"]
            assert len(written) <= MAX_ACTIONS_PER_PASS and len(deletes) <= MAX_DELETES_PER_PASS
            # what reached the gateways: a delete (or one batch) per session at most, a PUT per record at most
            assert len(rl.writes()) - rl_before <= MAX_DELETES_PER_PASS
            assert len(bifrost.writes()) - bf_before <= MAX_ACTIONS_PER_PASS
            assert report.result == "ok", report.to_dict()
            if not report.enforced and not report.deferred:
                break
        time.sleep(0.5)  # the writers' last persists land
    assert TurnsLive.turned
    assert writers.failures == 0, writers.errors

    left = sessions(gateway.url)
    assert not (set(orphans) - {victim}) & set(left), "every confirmed orphan is deleted"
    assert left.get(victim) == 2, "the session that turned live keeps its old trace and its new one"
    outcomes = Counter((r.subject, r.outcome) for rep in reports for r in rep.enforced if r.kind == "session_delete")
    assert outcomes[(victim, "stale")] == 1 and not outcomes[(victim, "done")]
    assert all(outcomes[(sid, "done")] == 1 for sid in orphans[1:])
    for sid, ids in writers.answered.items():  # 0 answered traces lost
        assert ids <= response_ids(gateway.url, sid), sid
    assert shrinkable(emu) == []
    puts = Counter(path for method, path in bifrost.writes() if method == "PUT")
    assert len(puts) == len(fixes) and set(puts.values()) == {1}
    final = loop.run_pass()
    assert final.enforced == [] and final.deferred == [] and final.would == []
    assert not loop.snapshot_counters().breaker.open  # type: ignore[union-attr]


def test_heal_dry_run_writes_nothing(rllm_gateway: Any, emu: BifrostEmulator, tmp_path: Path) -> None:
    gateway = rllm_gateway("memory")
    cleanup = tmp_path / "cleanup.journal.jsonl"
    orphans = confirmed_orphans(gateway.url, cleanup)
    before_sessions = sessions(gateway.url)
    fixes = shrinkable(emu)
    rl, bifrost = Counting(), Counting()
    # every kind enforced in the table, suspected deletes on: the mode alone keeps it a dry run
    loop = heal_loop(gateway.url, emu, tmp_path / "heal", cleanup, {
        "actions": {"session_delete": "enforce", "pool_shrink": "enforce", "posture_fix": "enforce",
                    "record_delete": "enforce"},
        "suspected": {"delete": True, "idle_seconds": 1, "allow_below_heartbeat": True}},
        {"rl": rl, "bifrost": bifrost})
    emu.clear_requests()
    reports = [loop.run_pass() for _ in range(3)]
    assert all(r.result == "ok" and r.enforced == [] for r in reports)
    would = Counter((r.kind, r.outcome) for r in reports[-1].would)
    assert would[("session_delete", "would-write")] >= len(orphans)
    assert would[("pool_shrink", "would-write")] + would[("posture_fix", "would-write")] == len(fixes)
    assert rl.sent and bifrost.sent
    assert rl.writes() == [] and bifrost.writes() == []  # every request heal sent was a read
    assert [r for r in emu.requests() if r.method != "GET"] == []
    assert sessions(gateway.url) == before_sessions and shrinkable(emu) == fixes
    assert not [e for e in Journal(loop.settings.journal).read() if e["event"] == "attempt"]
