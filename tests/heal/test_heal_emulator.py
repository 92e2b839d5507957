"""Heal passes against the Bifrost emulator (a real HTTP server): dry-run sends no write, enforce drives the
oversized pools and the posture drift to zero across capped passes, and every safeguard holds: the kill switch
stops writes within one action, injected 5xx and timeouts trip the breaker, a restart resumes without writing
again, one heal per journal, two heals on two journals leave the records as one would, and a restart is resumed.

Every request heal sends goes through a counting transport, and the emulator logs every request it receives.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Config, parse_config
from gatewayscope.heal.loop import HealLoop
from gatewayscope.heal.safeguards import HealLockedError
from gatewayscope.heal.settings import parse_heal_settings
from gatewayscope.heal.status import heal_status
from gatewayscope.remediate.journal import Journal
from gatewayscope.sandbox.bifrost_emulator import ANY, BifrostEmulator, seed_small
from tests.helpers import run_at_once

WRITES = ("PUT", "POST", "DELETE", "PATCH")


class Counting(httpx.BaseTransport):
    """Every request heal sends, in order; ``after`` is called with each answered request."""

    def __init__(self, after: Callable[[httpx.Request], None] | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[tuple[str, str]] = []
        self.after = after
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.sent.append((request.method, request.url.path))
        response = self.inner.handle_request(request)
        if self.after is not None:
            self.after(request)
        return response

    def writes(self) -> list[tuple[str, str]]:
        with self.lock:
            return [entry for entry in self.sent if entry[0] in WRITES]


@pytest.fixture
def emu() -> Iterator[BifrostEmulator]:
    with BifrostEmulator() as emulator:
        seed_small(emulator)
        yield emulator


def setup(emu: BifrostEmulator, state: Path, heal: dict[str, Any], *, transport: httpx.BaseTransport | None = None,
          name: str = "bifrost") -> tuple[HealLoop, Config]:
    raw = {"targets": [{"name": name, "kind": "bifrost", "url": emu.url}],
           "heal": {"state_dir": str(state), "first_pass_max_delay_seconds": 0, **heal}}
    config = parse_config(raw, "test.toml")
    settings = parse_heal_settings(config.heal, "test.toml")
    loop = HealLoop(config, settings, transports={name: transport} if transport else None, sleep=lambda _s: None)
    loop.prepare()
    return loop, config


ENFORCE = {"mode": "enforce", "actions": {"pool_shrink": "enforce", "posture_fix": "enforce"}}


def over_pool(emu: BifrostEmulator) -> list[str]:
    """The records a fresh plan would still resize (over their kind's pool, and resizable)."""
    from gatewayscope.remediate.plan import build_plan
    from gatewayscope.scan import take_snapshot

    config = parse_config({"targets": [{"name": "bifrost", "kind": "bifrost", "url": emu.url}]}, "fresh.toml")
    plan = build_plan(take_snapshot(config), config)
    return sorted(a.subject for a in plan.actions if a.kind == "pool_shrink")


def workers(emu: BifrostEmulator, names: list[str]) -> dict[str, int]:
    """The workers the emulator parks for each record now (its own accounting)."""
    return {name: emu.parked_workers(name) for name in names}


def drifted(emu: BifrostEmulator) -> bool:
    config = httpx.get(f"{emu.url}/api/config", timeout=10).json()["client_config"]
    return bool(config.get("drop_excess_requests"))


def test_dry_run_sends_no_write_ever(emu: BifrostEmulator, tmp_path: Path) -> None:
    counting = Counting()
    loop, _ = setup(emu, tmp_path, {"actions": {"pool_shrink": "enforce", "posture_fix": "enforce"}},
                    transport=counting)  # enforce per kind, but the mode is dry-run
    before = over_pool(emu)
    emu.clear_requests()
    reports = [loop.run_pass() for _ in range(3)]
    assert all(r.result == "ok" and r.enforced == [] for r in reports)
    would = [(r.kind, r.outcome) for r in reports[-1].would]
    assert would.count(("pool_shrink", "would-write")) == len(before) > 0
    assert ("posture_fix", "would-write") in would
    assert counting.sent and counting.writes() == []  # every request heal sent was a read
    assert [r for r in emu.requests() if r.method != "GET"] == []  # and the gateway received no other
    assert over_pool(emu) == before and drifted(emu)
    events = Journal(loop.settings.journal).read()
    assert not [e for e in events if e["event"] == "attempt"]
    assert sum(1 for e in events if e["event"] == "heal-would") == 3 * len(reports[-1].would)
    counters = loop.snapshot_counters()
    assert counters.would[("bifrost", "pool_shrink")] == len(before) and counters.actions == {}


def test_enforce_drives_pools_and_drift_to_zero_within_the_caps(emu: BifrostEmulator, tmp_path: Path) -> None:
    counting = Counting()
    cap = 3
    loop, _ = setup(emu, tmp_path, {**ENFORCE, "limits": {"max_actions_per_pass": cap, "concurrency": 2}},
                    transport=counting)
    start = over_pool(emu)
    assert len(start) > cap and drifted(emu)
    writes_per_pass = []
    for _ in range(len(start) + 2):  # bounded: each pass fixes up to `cap` subjects
        sent = len(counting.writes())
        report = loop.run_pass()
        writes_per_pass.append(len(counting.writes()) - sent)
        assert report.result == "ok" and len(report.enforced) <= cap
        if not report.enforced and not report.deferred:
            break
    assert max(writes_per_pass) <= cap  # never more writes in a pass than its cap
    assert over_pool(emu) == [] and not drifted(emu)
    assert all(n <= 512 for n in workers(emu, start).values())
    puts = Counter(path for method, path in counting.writes() if method == "PUT")
    assert all(n == 1 for n in puts.values()), puts  # each record (and the config) written once
    assert len(puts) == len(start) + 1
    assert heal_status(loop.settings)["outcomes_last_24h"]["pool_shrink"]["done"] == len(start)


def test_the_kill_switch_stops_writes_within_one_action(emu: BifrostEmulator, tmp_path: Path) -> None:
    holder: dict[str, HealLoop] = {}

    def pause_after_first_put(request: httpx.Request) -> None:
        if request.method == "PUT" and not holder.get("flipped"):
            holder["loop"].settings.pause_file.touch()  # flipped while the pass is applying, once
            holder["flipped"] = holder["loop"]

    counting = Counting(after=pause_after_first_put)
    loop, _ = setup(emu, tmp_path, {"mode": "enforce", "actions": {"pool_shrink": "enforce"},
                                    "limits": {"concurrency": 1}}, transport=counting)
    holder["loop"] = loop
    start = over_pool(emu)
    report = loop.run_pass()
    assert len(counting.writes()) == 1  # the write under way finished; no other started
    skipped = [r for r in report.enforced if r.outcome == "skipped"]
    assert len(skipped) == len(start) - 1 and all("paused" in r.detail for r in skipped)
    assert len(over_pool(emu)) == len(start) - 1
    blocked = loop.run_pass()  # the next pass holds every write, and says what it would do
    assert blocked.result == "blocked" and "paused" in blocked.blocked and blocked.enforced == []
    assert sum(1 for r in blocked.would if (r.kind, r.outcome) == ("pool_shrink", "would-write")) == len(start) - 1
    assert len(counting.writes()) == 1 and loop.snapshot_counters().paused
    loop.resume("test")
    assert loop.run_pass().result == "ok" and over_pool(emu) == []
    assert len(counting.writes()) == len(start)


@pytest.mark.parametrize("fault", ["5xx", "timeout"])
def test_injected_faults_trip_the_breaker_which_holds_until_reset(emu: BifrostEmulator, tmp_path: Path,
                                                                   fault: str) -> None:
    counting = Counting()
    loop, _ = setup(emu, tmp_path, {"mode": "enforce", "actions": {"pool_shrink": "enforce"},
                                    "limits": {"concurrency": 1}, "breaker": {"max_errors": 2}}, transport=counting)
    if fault == "5xx":
        emu.inject_error("PUT", ANY, status=503, times=None)
    else:  # the write lands, no answer comes: read back, never sent again; it holds the new pool: done
        emu.inject_no_answer("PUT", ANY, apply_write=False, times=None)
    start = over_pool(emu)
    first = loop.run_pass()
    outcomes = Counter(r.outcome for r in first.enforced)
    assert outcomes["unconfirmed"] == 2 and outcomes["skipped"] == len(start) - 2  # the budget stopped the rest
    assert "breaker" in first.blocked and loop.snapshot_counters().breaker.open
    sent = len(counting.writes())
    emu.state.faults.clear()
    held = loop.run_pass()  # the gateway answers again, but the breaker holds until an operator resets it
    assert held.result == "blocked" and "breaker" in held.blocked and len(counting.writes()) == sent
    assert heal_status(loop.settings)["breaker"]["open"]
    loop.reset_breaker("test")
    assert loop.run_pass().result == "ok" and over_pool(emu) == []


def test_a_second_heal_on_the_journal_refuses_and_names_the_holder(emu: BifrostEmulator, tmp_path: Path) -> None:
    first, _ = setup(emu, tmp_path, {})
    second, _ = setup(emu, tmp_path, {})
    with first.lock:
        with pytest.raises(HealLockedError, match=r"Another heal holds the journal .*: process \d+ on host "):
            second.run(threading.Event(), passes=1)
        assert heal_status(first.settings)["running"] is not None
    assert heal_status(first.settings)["running"] is None  # the lock file may name it; nobody holds it
    assert second.run(threading.Event(), passes=1) == 1  # free again once the first let go


class Crash(BaseException):
    """Stands in for the process dying (kill -9) right after a write was answered, before its outcome is
    journaled."""


def test_a_restart_resumes_without_repeating_a_write(emu: BifrostEmulator, tmp_path: Path) -> None:
    puts: list[str] = []

    def crash_after_second_put(request: httpx.Request) -> None:
        if request.method == "PUT":
            puts.append(request.url.path)
            if len(puts) == 2:
                raise Crash()

    loop, _ = setup(emu, tmp_path, {"mode": "enforce", "actions": {"pool_shrink": "enforce"},
                                    "limits": {"concurrency": 1}}, transport=Counting(after=crash_after_second_put))
    start = over_pool(emu)
    with pytest.raises(Crash):
        loop.run_pass()
    events = Journal(loop.settings.journal).read()
    assert [e["event"] for e in events].count("heal-apply") == 1 and not any(e["event"] == "heal-applied"
                                                                             for e in events)
    counting = Counting()
    restarted, _ = setup(emu, tmp_path, {"mode": "enforce", "actions": {"pool_shrink": "enforce"},
                                         "limits": {"concurrency": 1}}, transport=counting)
    report = restarted.run_pass()
    # the crashed write landed: the resumed plan re-reads it (already done) and sends nothing for it; the
    # actions the crashed pass settled are not run again, the others are done now
    crashed = puts[1].rsplit("/", 1)[-1]
    assert [(r.outcome, r.sends) for r in report.resumed if r.subject == crashed] == [("already-done", 0)]
    assert {r.outcome for r in report.resumed if r.subject != crashed} == {"done"}
    assert over_pool(emu) == []
    every = [*puts, *(path for method, path in counting.writes() if method == "PUT")]
    assert len(every) == len(set(every)) == len(start)  # no record written twice


def test_two_heals_on_two_journals_leave_each_record_as_one_would(emu: BifrostEmulator, tmp_path: Path) -> None:
    counters = [Counting(), Counting()]
    loops = [setup(emu, tmp_path / f"heal-{i}", ENFORCE, transport=counters[i])[0] for i in range(2)]
    start = over_pool(emu)
    reports: list[Any] = run_at_once([loop.run_pass for loop in loops])
    assert over_pool(emu) == [] and not drifted(emu)
    # every record exists once, at its pool: no PUT recreated one, none was written with another value
    listing = httpx.get(f"{emu.url}/api/providers", timeout=10).json()["providers"]
    assert sorted(r["name"] for r in listing if r["name"] in start) == sorted(start)
    done = Counter(r.subject for rep in reports for r in rep.enforced if r.outcome == "done")
    settled = Counter(r.subject for rep in reports for r in rep.enforced if r.outcome in ("done", "already-done"))
    assert set(settled) == {*start, "client_config"}
    puts = Counter(path for c in counters for method, path in c.writes() if method == "PUT")
    # the re-read right before each write makes the second heal's action a no-op once the first has written;
    # two heals that re-read at the same instant can both send the same pool (harmless: the same value)
    assert all(n <= 2 for n in puts.values()) and sum(done.values()) == sum(puts.values())


def test_a_target_that_answers_garbage_is_skipped_never_guessed_at(emu: BifrostEmulator, tmp_path: Path) -> None:
    from gatewayscope.sandbox.bifrost_emulator import LIST

    counting = Counting()
    loop, _ = setup(emu, tmp_path, ENFORCE, transport=counting)
    start = over_pool(emu)
    emu.inject_garbage("GET", LIST, times=None)
    report = loop.run_pass()
    assert report.result == "ok" and report.enforced == [] and report.would == []
    assert "bifrost" in report.skipped_targets and counting.writes() == []
    emu.state.faults.clear()
    assert loop.run_pass().enforced and over_pool(emu) == [] and len(start) > 0
