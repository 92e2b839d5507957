"""The safety rules of apply (docs/remediation.md, rules 1-11), one rule at a time, against real HTTP.

Every Bifrost test runs the real Bifrost emulator (a real HTTP server on loopback) with its fault
injection, and asserts on what went over the wire (the emulator's request log, bodies included) and on
the emulator's store afterwards. Waits are recorded through ``ApplyOptions(sleep=...)`` instead of
slept, so the 250/750/2,000 ms schedule is asserted exactly and no test waits for it. Each test's
docstring names the rule it pins and what it would catch if that rule's code were removed.

Plans are made by ``build_plan`` from a real read of the emulator, then cut down to the subjects a test
is about (a Plan is plain data; apply executes whatever actions it holds).
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gatewayscope.config import AuthConfig, Config, Policy, Target
from gatewayscope.errors import PlanError
from gatewayscope.remediate.apply import (
    POOL_WRITE_TIMEOUT,
    RETRY_SCHEDULE,
    ApplyOptions,
    ApplyReport,
    apply_plan,
)
from gatewayscope.remediate.apply import protocol as apply_protocol
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import Action, Plan, build_plan
from gatewayscope.sandbox.bifrost_emulator import (
    ANY,
    BifrostEmulator,
    Concurrency,
    CustomProviderConfig,
    EmulatorOptions,
    LoggedRequest,
    NetworkConfig,
    ProviderRecord,
    default_network_config,
    redact,
    seed_small,
)
from gatewayscope.snapshot import Snapshot, TargetSnapshot
from gatewayscope.sources.bifrost import HostResolver, read_bifrost
from tests.helpers import NOW, age, session_counts, write_store

MS = 1_000_000  # nanoseconds
#: a masked secret as a listing shows it: first 4 + 24 ``*`` + last 4 (docs/sandbox.md, §1 masking)
MASK = re.compile(r"[^\"]{4}\*{24}[^\"]{4}")
#: blocks a pool write must leave out (PUT keeps them when absent; their secrets are masked in a listing)
NEVER_IN_A_POOL_WRITE = {"keys", "proxy_config", "openai_config", "prompt_cache", "store_raw_request_response"}
POOL_WRITE_KEYS = {"network_config", "custom_provider_config", "send_back_raw_request", "send_back_raw_response",
                   "concurrency_and_buffer_size"}

# the small seed's records (gatewayscope/sandbox/bifrost_emulator/seed.py, small_records)
OPENAI = "openai"  # standard, 1000/5000, openai_config, no base URL
ANTHROPIC = "anthropic"  # standard, unset pool (1000/5000)
PROXIED = "orgalpha__openrouter__gpt-4.1-mini"  # custom, proxy with password and CA PEM
PROXIED_LANE = "orgalpha__openrouter__gpt-4.1-mini__anthropic"
RAW = "orgalpha__deepseek__deepseek-chat"  # custom, send_back_raw_request/response on
RAW_LANE = "orgalpha__deepseek__deepseek-chat__anthropic"
BETA_LANE = "orgbeta__openrouter__claude-sonnet-4__anthropic"
#: a host that resolved when the plan was made and no longer resolves for the gateway
VANISHED = "vanished.example"
DNS_DEAD = "orgzeta__vllm__qwen"


def gateway_dns(host: str) -> list[str]:
    """The emulated gateway's resolver: ``.invalid`` and the vanished host do not resolve."""
    return [] if host.endswith(".invalid") or host == VANISHED else ["127.0.0.1"]


def planner_dns(host: str) -> None:
    """What gatewayscope saw when it planned: only ``.invalid`` failed (the vanished host still resolved)."""
    if host.endswith(".invalid"):
        raise OSError("no such host")


@pytest.fixture
def emu() -> Iterator[BifrostEmulator]:
    with BifrostEmulator(options=EmulatorOptions(resolver=gateway_dns)) as emulator:
        seed_small(emulator)
        emulator.put_record(ProviderRecord(
            DNS_DEAD, network_config=NetworkConfig(base_url=f"http://{VANISHED}/v1"),
            concurrency_and_buffer_size=Concurrency(1000, 5000),
            custom_provider_config=CustomProviderConfig(base_provider_type="openai", is_key_less=True)))
        yield emulator


def target_of(emu: BifrostEmulator, **kwargs: Any) -> Target:
    return Target(name="bifrost", kind="bifrost", url=emu.url, **kwargs)


def make_plan(emu: BifrostEmulator, subjects: list[str] | None = None, *, target: Target | None = None,
              include_deletes: bool = False) -> tuple[Plan, Config]:
    """Read the emulator, build the plan, keep the actions on ``subjects`` (all when None)."""
    target = target or target_of(emu)
    config = Config(targets=[target], policy=Policy())
    data = read_bifrost(target, config.policy, resolver=HostResolver(planner_dns))
    snap = Snapshot(taken_at=NOW, targets=[TargetSnapshot(
        name=target.name, kind="bifrost", address=emu.url, up=True, started_at=NOW, duration_seconds=0.1,
        bifrost=data)])
    plan = build_plan(snap, config, include_deletes=include_deletes, created_at=NOW)
    if subjects is not None:
        missing = set(subjects) - {a.subject for a in plan.actions}
        assert not missing, f"no planned action for {missing}"
        plan = Plan(created_at=plan.created_at, targets=plan.targets, policy=plan.policy, warnings=plan.warnings,
                    actions=[a for a in plan.actions if a.subject in subjects])
        plan.id = plan.compute_id()
    emu.clear_requests()  # from here on the log holds apply's traffic only
    return plan, config


class Waits:
    """An ``ApplyOptions.sleep`` that records the waits instead of sleeping (and can act during one)."""

    def __init__(self, during: Callable[[float], None] | None = None) -> None:
        self.waits: list[float] = []
        self.during = during

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.during is not None:
            self.during(seconds)


def run(plan: Plan, config: Config, journal_path: Path, **options: Any) -> tuple[ApplyReport, Waits]:
    waits = options.pop("sleep", None) or Waits()
    deleted_ids = options.pop("deleted_ids", None)
    options.setdefault("write", True)
    report = apply_plan(plan, config, options=ApplyOptions(sleep=waits, **options), journal=Journal(journal_path),
                        deleted_ids=deleted_ids)
    return report, waits


def outcomes(report: ApplyReport) -> dict[str, str]:
    return {r.subject: r.outcome for r in report.results}


def path_of(name: str) -> str:
    return "/api/providers/" + quote(name, safe="")


def wire(emu: BifrostEmulator, method: str | None = None, name: str | None = None) -> list[LoggedRequest]:
    return [r for r in emu.requests(method) if name is None or r.path == path_of(name)]


def writes(emu: BifrostEmulator) -> list[LoggedRequest]:
    return [r for r in emu.requests() if r.method not in ("GET", "HEAD")]


def listing(emu: BifrostEmulator, name: str) -> dict[str, Any]:
    """The record as the API shows it, read by another client (not logged: cleared after)."""
    body = httpx.get(emu.url + path_of(name), timeout=5).json()
    assert isinstance(body, dict)
    return body


def other_process_deletes(emu: BifrostEmulator, name: str) -> None:
    httpx.delete(emu.url + path_of(name), timeout=5).raise_for_status()


def other_process_writes(emu: BifrostEmulator, name: str, *, concurrency: int, timeout: int = 300) -> None:
    """Another writer sets a record's pool (and its request timeout), sending back its own blocks."""
    record = listing(emu, name)
    body = {k: record[k] for k in ("network_config", "custom_provider_config", "send_back_raw_request",
                                   "send_back_raw_response") if k in record}
    body["network_config"] = dict(body["network_config"], default_request_timeout_in_seconds=timeout)
    body["concurrency_and_buffer_size"] = {"concurrency": concurrency, "buffer_size": concurrency * 16}
    httpx.put(emu.url + path_of(name), json=body, timeout=5).raise_for_status()


def journal_events(path: Path) -> list[dict[str, Any]]:
    return Journal(path).read()


# -- rule 1: dry run by default; deletes need their own confirmation ---------------------------------------

def test_rule1_dry_run_is_the_default_and_sends_no_write(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 1. Without ``yes`` apply reads every subject and writes nothing (no PUT, POST or DELETE on the
    wire, no journal line, the store and its pools unchanged). Catches: the ``if not options.write`` guard in
    any executor removed, or a dry run journaling outcomes that would make the plan 'already applied'."""
    plan, config = make_plan(emu, include_deletes=True)
    assert {a.kind for a in plan.actions} == {"posture_fix", "pool_shrink", "record_delete"}
    before = emu.state_snapshot()
    journal = tmp_path / "journal.jsonl"

    report = apply_plan(plan, config, options=ApplyOptions(sleep=Waits()), journal=Journal(journal))

    assert report.dry_run and report.exit_code == 0
    assert {r.outcome for r in report.results} == {"would-write"}
    assert len(report.results) == len(plan.actions)
    assert writes(emu) == []
    assert {r.method for r in emu.requests()} == {"GET"}
    assert not journal.exists()
    after = emu.state_snapshot()
    assert after["records"] == before["records"] and after["posture"] == before["posture"]


def test_rule1_deletes_need_allow_delete(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 1 (the destructive half). With ``yes`` but not ``allow_delete`` every record delete is
    'skipped', no DELETE is sent, the records stay, and no outcome is journaled for them (so a later run
    with ``allow_delete`` still does them). Catches: the allow-delete check removed, or a skipped delete
    journaled as settled."""
    plan, config = make_plan(emu, include_deletes=True)
    deletes = {a.id for a in plan.actions if a.kind == "record_delete"}
    assert len(deletes) == 3
    journal = tmp_path / "journal.jsonl"

    report, _ = run(plan, config, journal)

    skipped = {r.action_id for r in report.results if r.outcome == "skipped"}
    assert skipped == deletes
    assert all("--allow-delete" in r.detail for r in report.skipped)
    assert wire(emu, "DELETE") == []
    assert all(emu.get_record(a.subject) is not None for a in plan.actions if a.id in deletes)
    settled = Journal(journal).outcomes(plan.id)
    assert deletes.isdisjoint(settled) and len(settled) == len(plan.actions) - 3
    assert report.exit_code == 1  # something was left undone

    # the deletes are still open: the same plan with allow_delete runs exactly them
    again, _ = run(plan, config, journal, allow_delete=True)
    assert {r.action_id for r in again.results} == deletes
    assert {r.outcome for r in again.results} == {"done"}
    assert {r.path for r in wire(emu, "DELETE")} == {path_of(a.subject) for a in plan.actions if a.id in deletes}


# -- rule 2: re-read right before writing --------------------------------------------------------------------

def test_rule2_reread_settles_gone_stale_and_already_done_without_writing(emu: BifrostEmulator,
                                                                          tmp_path: Path) -> None:
    """Rule 2. Between plan and apply one record is deleted, one is changed (its request timeout), one is
    resized by someone else. Apply writes only the untouched one: the deleted record is 'gone' and is NOT
    recreated (PUT is an upsert), the changed one is 'stale' and keeps the other writer's config, the
    resized one is 'already-done'. Catches: the re-read removed (the PUT would recreate the deleted record
    and overwrite the newer config), or the fingerprint comparison removed (stale written)."""
    plan, config = make_plan(emu, [OPENAI, RAW, RAW_LANE, BETA_LANE])
    other_process_deletes(emu, RAW)
    other_process_writes(emu, RAW_LANE, concurrency=1000, timeout=600)
    other_process_writes(emu, BETA_LANE, concurrency=64)
    emu.clear_requests()

    report, _ = run(plan, config, tmp_path / "journal.jsonl")

    assert outcomes(report) == {OPENAI: "done", RAW: "gone", RAW_LANE: "stale", BETA_LANE: "already-done"}
    assert [r.path for r in wire(emu, "PUT")] == [path_of(OPENAI)]
    assert emu.get_record(RAW) is None, "a gone record was recreated"
    lane = emu.get_record(RAW_LANE)
    assert lane is not None and lane.concurrency == 1000
    assert lane.network_config is not None and lane.network_config.default_request_timeout_in_seconds == 600
    assert emu.parked_workers(OPENAI) == 512
    assert next(r for r in report.results if r.subject == RAW).sends == 0


def test_rule2_record_deleted_after_planning_by_its_read_is_gone(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 2 (a delete racing the plan). The record is deleted after planning by another process that
    reads it first (``inject_delete_after_read``), then apply comes: its own re-read finds nothing, so it
    settles 'gone' and sends no PUT. Catches: writing from the plan's old read."""
    plan, config = make_plan(emu, [RAW])
    emu.inject_delete_after_read(RAW)
    httpx.get(emu.url + path_of(RAW), timeout=5).raise_for_status()  # the other process's read
    emu.clear_requests()

    report, _ = run(plan, config, tmp_path / "journal.jsonl")

    assert outcomes(report) == {RAW: "gone"}
    assert [(r.method, r.status) for r in emu.requests()] == [("GET", 404)]
    assert emu.get_record(RAW) is None


def test_rule2_sessions_are_reread_before_each_delete(tmp_path: Path) -> None:
    """Rule 2 for sessions (a real SQLite trace store written by the gateway's own store class). After the
    plan, one orphan gains a trace (it may be live: 'stale', kept), one is deleted by someone else
    ('already-done'); the others are deleted ('done'), including an orphan the plan confirmed from an
    earlier delete although the scan never read its traces. Catches: the re-read removed (a session
    that came alive would be deleted), and a fingerprint that can never match (every confirmed-by-delete
    orphan 'stale')."""
    db = tmp_path / "traces.db"
    write_store(db, {"idle:0": 1, "came-back:0": 1, "revived:0": 1, "taken:0": 1, "live:0": 1, "busy:0": 3})
    age(db, ["idle:0", "revived:0", "taken:0", "busy:0"], 3 * 3600)
    deleted = {"came-back:0": time.time()}  # an earlier delete, after every trace it had then
    plan, config = sqlite_plan(db, deleted_ids=deleted, include_suspected=True)
    assert sorted(a.subject for a in plan.actions) == ["came-back:0", "idle:0", "revived:0", "taken:0"]
    # the read named it (its traces are what the fence check needs), so the plan pins them
    assert next(a for a in plan.actions if a.subject == "came-back:0").details["trace_ids"] == ["came-back:0/0"]
    write_store(db, {"revived:0": 1}, start=1)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM trace_sessions WHERE session_id = 'taken:0'")

    report, _ = run(plan, config, tmp_path / "journal.jsonl", allow_delete=True, deleted_ids=deleted)

    assert outcomes(report) == {"idle:0": "done", "came-back:0": "done", "revived:0": "stale",
                                "taken:0": "already-done"}
    assert session_counts(db) == {"revived:0": 2, "live:0": 1, "busy:0": 3}


# -- rule 3: the write is built from the fresh read, no masked secret, never keys -----------------------------

def test_rule3_pool_write_sends_back_what_put_resets_and_nothing_masked(emu: BifrostEmulator,
                                                                        tmp_path: Path) -> None:
    """Rule 3 (and what a PUT resets when a block is omitted: docs/sandbox.md, §2.5). Every pool PUT
    carries exactly network_config, custom_provider_config (custom records), send_back_raw_request/response
    and the new pool: the first three exactly as read, never keys, proxy_config, openai_config, prompt_cache
    or store_raw_request_response, and no masked value (4+24*+4 or <REDACTED>) anywhere. The stored proxy
    secrets, keys, openai/prompt-cache blocks and raw switches survive. A record whose network block holds a
    CA certificate (masked in every listing) is refused without a PUT. Catches: sending the record as read
    (masked secrets, keys), or leaving out what PUT resets when absent (network_config,
    custom_provider_config, send_back_raw_*)."""
    emu.put_record(ProviderRecord(
        "orgzeta__store__m", network_config=NetworkConfig(base_url="http://localhost:18080/v1",
                                                          extra_headers={"X-Org-Id": "orgzeta"},
                                                          default_request_timeout_in_seconds=600, max_retries=2,
                                                          retry_backoff_initial_ns=250 * MS,
                                                          retry_backoff_max_ns=4000 * MS),
        concurrency_and_buffer_size=Concurrency(1000, 5000), store_raw_request_response=True,
        prompt_cache={"enabled": True, "ttl": "5m"},
        custom_provider_config=CustomProviderConfig(base_provider_type="openai", is_key_less=True,
                                                    allowed_requests={"chat_completion": True})))
    pem_network = default_network_config()
    pem_network.base_url = "http://localhost:18080/pem"
    pem_network.ca_cert_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    emu.put_record(ProviderRecord("orgzeta__pem__m", network_config=pem_network,
                                  concurrency_and_buffer_size=Concurrency(1000, 5000),
                                  custom_provider_config=CustomProviderConfig(base_provider_type="openai")))
    subjects = [OPENAI, ANTHROPIC, PROXIED, RAW, "orgzeta__store__m", "orgzeta__pem__m"]
    as_read = {name: listing(emu, name) for name in subjects}
    stored_before = {name: emu.get_record(name) for name in subjects}
    plan, config = make_plan(emu, subjects)

    report, _ = run(plan, config, tmp_path / "journal.jsonl")

    assert outcomes(report) == {**dict.fromkeys(subjects, "done"), "orgzeta__pem__m": "refused"}
    assert "CA certificate" in next(r for r in report.results if r.subject == "orgzeta__pem__m").detail
    puts = wire(emu, "PUT")
    assert sorted(r.path for r in puts) == sorted(path_of(n) for n in subjects if n != "orgzeta__pem__m")
    for request in puts:
        text = request.text()
        assert not MASK.search(text) and "redacted" not in text.lower(), text
        body = json.loads(text)
        name = next(n for n in subjects if path_of(n) == request.path)
        read = as_read[name]
        assert NEVER_IN_A_POOL_WRITE.isdisjoint(body)
        assert set(body) == POOL_WRITE_KEYS - ({"custom_provider_config"} - set(read))
        assert body["network_config"] == read["network_config"]
        assert body.get("custom_provider_config") == read.get("custom_provider_config")
        assert (body["send_back_raw_request"], body["send_back_raw_response"]) == (
            read["send_back_raw_request"], read["send_back_raw_response"])
        assert body["concurrency_and_buffer_size"] == next(
            a.after for a in plan.actions if a.subject == name)

    for name in subjects:
        after, before = emu.get_record(name), stored_before[name]
        assert after is not None and before is not None
        assert after.keys == before.keys
        assert after.proxy_config == before.proxy_config  # secrets included, unmasked
        assert after.openai_config == before.openai_config and after.prompt_cache == before.prompt_cache
        assert after.store_raw_request_response == before.store_raw_request_response
        assert (after.send_back_raw_request, after.send_back_raw_response) == (
            before.send_back_raw_request, before.send_back_raw_response)
        assert after.custom_provider_config == before.custom_provider_config
        # an unset network block was sent back as the gateway renders it (its defaults): same effect
        assert listing(emu, name)["network_config"] == as_read[name]["network_config"]
    proxied = emu.get_record(PROXIED)
    assert proxied is not None and proxied.proxy_config is not None and proxied.proxy_config.password is not None
    assert proxied.proxy_config.password.value == "proxy-password-1234"
    assert emu.get_record(RAW).send_back_raw_request is True  # type: ignore[union-attr]


# -- rule 4: a pool write gets 30 s -----------------------------------------------------------------------------

def test_rule4_pool_write_waits_its_own_timeout_not_the_targets(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 4. A pool write may take DNS 5 s + model listing 15 s: apply gives it 30 s by default, apart
    from the target's (shorter) timeout. Here the target allows 0.3 s, the PUT is answered after 1 s and
    lands only then: with its own timeout the answer arrives and the action is 'done' from the answer.
    Catches: the PUT sent with the target's timeout (it would time out, read back the old pool and end
    'unconfirmed')."""
    assert ApplyOptions().pool_write_timeout == POOL_WRITE_TIMEOUT == 30.0
    plan, config = make_plan(emu, [RAW], target=target_of(emu, timeout_seconds=0.3))
    emu.inject_slow("PUT", RAW, delay=1.0, apply_write=False)

    report, _ = run(plan, config, tmp_path / "journal.jsonl", pool_write_timeout=5.0)

    result = report.results[0]
    assert (result.outcome, result.detail, result.sends) == ("done", "now 64 workers", 1)
    assert [(r.method, r.status, r.outcome) for r in wire(emu, "PUT")] == [("PUT", 200, "answered")]
    assert emu.parked_workers(RAW) == 64


# -- rule 5: 5xx: wait 250/750/2000 ms, re-read each time, send again only if still needed -----------------------

def test_rule5_5xx_then_success_waits_rereads_and_sends_again(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 5. One 500, then success: one 250 ms wait, a re-read, a second send built from it: 'done' with
    2 sends. Catches: no wait, or a resend without the re-read in between."""
    plan, config = make_plan(emu, [RAW])
    emu.inject_error("PUT", RAW, status=500, times=1)

    report, waits = run(plan, config, tmp_path / "journal.jsonl")

    assert (report.results[0].outcome, report.results[0].sends) == ("done", 2)
    assert waits.waits == [0.25]
    assert [(r.method, r.status) for r in emu.requests()] == [("GET", 200), ("PUT", 500), ("GET", 200), ("PUT", 200)]
    assert emu.parked_workers(RAW) == 64


def test_rule5_5xx_every_time_follows_the_schedule_then_unconfirmed(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 5. A gateway that answers 500 every time: waits of exactly 250, 750 and 2,000 ms, a re-read
    after each, 4 sends in all, then 'unconfirmed'. Catches: another schedule, unbounded retries, or a
    give-up reported as anything but unconfirmed."""
    assert tuple(RETRY_SCHEDULE) == (0.25, 0.75, 2.0)
    plan, config = make_plan(emu, [RAW])
    emu.inject_error("PUT", RAW, status=503, message="Failed to update provider: store busy", times=None)

    report, waits = run(plan, config, tmp_path / "journal.jsonl")

    assert (report.results[0].outcome, report.results[0].sends) == ("unconfirmed", 4)
    assert waits.waits == [0.25, 0.75, 2.0]
    methods = [r.method for r in emu.requests()]
    assert methods == ["GET", "PUT", "GET", "PUT", "GET", "PUT", "GET", "PUT", "GET"]  # the last GET: read back
    assert emu.parked_workers(RAW) == 1000


def test_rule5_5xx_then_the_record_is_deleted_is_gone_never_recreated(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 5. A 500, and during the 250 ms wait another process deletes the record: the re-read finds it
    gone, so the outcome is 'gone', there is no PUT after the deletion and the record does not exist
    afterwards. Catches: a blind resend after a 5xx (the seed's bug: the upsert recreated a deleted
    record without keys)."""
    plan, config = make_plan(emu, [RAW])
    emu.inject_error("PUT", RAW, status=500, times=1)
    waits = Waits(during=lambda _s: other_process_deletes(emu, RAW))

    report, _ = run(plan, config, tmp_path / "journal.jsonl", sleep=waits)

    assert outcomes(report) == {RAW: "gone"}
    assert waits.waits == [0.25]
    log = [(r.method, r.status) for r in emu.requests()]
    assert log == [("GET", 200), ("PUT", 500), ("DELETE", 200), ("GET", 404)]
    assert emu.get_record(RAW) is None and RAW not in emu.record_names()


def test_rule5_5xx_for_a_write_that_landed_is_done_without_a_resend(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 5. The gateway stored the write but answered 500: the re-read after the wait shows the new pool,
    which settles it 'done' with a single PUT. Catches: resending because the answer was a 5xx."""
    plan, config = make_plan(emu, [RAW])
    emu.inject_error("PUT", RAW, status=500, apply_write=True, times=1)

    report, waits = run(plan, config, tmp_path / "journal.jsonl")

    assert (report.results[0].outcome, report.results[0].sends) == ("done", 1)
    assert waits.waits == [0.25]
    assert len(wire(emu, "PUT")) == 1
    assert emu.restarts(RAW) == 1


def test_rule5_and_6_hold_for_the_config_write_and_the_record_delete(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rules 5 and 6 for the other two Bifrost writes. The posture PUT meets a 500: one 250 ms wait, a
    re-read, a second PUT of the whole client config. A record DELETE meets a 500 (wait, re-read, send
    again: a DELETE never recreates anything); another DELETE lands but its connection is dropped: the
    read-back finds it gone, 'done', never sent twice."""
    plan, config = make_plan(emu, ["client_config", "orgbeta__vllm-lan__llama3.1-8b-instruct",
                                   "orgbeta__together__qwen3-coder"], include_deletes=True)
    emu.inject_error("PUT", "@config", status=500, times=1)
    emu.inject_error("DELETE", "orgbeta__vllm-lan__llama3.1-8b-instruct", status=500, times=1)
    emu.inject_no_answer("DELETE", "orgbeta__together__qwen3-coder", mode="close", apply_write=True)

    report, waits = run(plan, config, tmp_path / "journal.jsonl", allow_delete=True, concurrency=1)

    assert [(r.subject, r.outcome, r.sends) for r in report.results] == [
        ("client_config", "done", 2),
        ("orgbeta__together__qwen3-coder", "done", 1),
        ("orgbeta__vllm-lan__llama3.1-8b-instruct", "done", 2)]
    assert waits.waits == [0.25, 0.25]
    assert [r.status for r in emu.requests("PUT", "/api/config")] == [500, 200]
    assert [r.outcome for r in wire(emu, "DELETE", "orgbeta__together__qwen3-coder")] == ["dropped"]
    assert emu.state_snapshot()["posture"] == {"drop_excess_requests": False, "enforce_auth_on_inference": True,
                                               "disable_content_logging": True}
    assert not {"orgbeta__together__qwen3-coder", "orgbeta__vllm-lan__llama3.1-8b-instruct"} & set(
        emu.record_names())


# -- rule 6: no answer: read back, never send again -------------------------------------------------------------

def test_rule6_slow_answer_that_was_applied_is_done_by_read_back(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 6. The write lands but its answer comes after the pool-write timeout: apply reads back, finds
    the new pool and says 'done', with exactly 1 PUT. Catches: treating a timeout like a 5xx (waits and
    a second PUT) or like a failure ('unconfirmed' for a record that holds the new pool)."""
    plan, config = make_plan(emu, [PROXIED])
    emu.inject_slow("PUT", PROXIED, delay=1.5, apply_write=True)

    report, waits = run(plan, config, tmp_path / "journal.jsonl", pool_write_timeout=0.3)

    result = report.results[0]
    assert (result.outcome, result.sends) == ("done", 1)
    assert "holds the new pool" in result.detail
    assert waits.waits == []
    assert len(wire(emu, "PUT")) == 1
    assert emu.parked_workers(PROXIED) == 64


@pytest.mark.parametrize(("mode", "landed", "expected"), [
    ("hang", False, "unconfirmed"),
    ("hang", True, "done"),
    ("close", True, "done"),
    ("close", False, "unconfirmed"),
])
def test_rule6_no_answer_is_read_back_and_never_sent_again(emu: BifrostEmulator, tmp_path: Path, mode: str,
                                                           landed: bool, expected: str) -> None:
    """Rule 6. The gateway takes the PUT and answers nothing (hangs past the timeout, or drops the
    connection): apply reads the record back and never sends again: 'done' when the write landed,
    'unconfirmed' when it did not. Catches: a resend after no answer (the first write may still be under
    way), or a missing read-back."""
    plan, config = make_plan(emu, [RAW])
    emu.inject_no_answer("PUT", RAW, mode=mode, hang_seconds=2.0, apply_write=landed)

    report, waits = run(plan, config, tmp_path / "journal.jsonl", pool_write_timeout=0.3)

    assert (report.results[0].outcome, report.results[0].sends) == (expected, 1)
    assert len(wire(emu, "PUT")) == 1
    assert waits.waits == []
    assert emu.parked_workers(RAW) == (64 if landed else 1000)
    assert [r.method for r in emu.requests()] == ["GET", "PUT", "GET"]


# -- rule 7: a 400 refusal ---------------------------------------------------------------------------------------

def test_rule7_dns_refusal_is_refused_and_names_the_delete(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 7. The record's base URL resolved when planned but no longer resolves for the gateway: its PUT
    is refused with 400 'Invalid base URL: failed to resolve hostname'. Outcome 'refused', sent once
    (never retried), the record keeps its workers, and the detail names the remedy
    ``DELETE /api/providers/<name>`` (nothing deleted). Catches: retrying a 400, a refusal counted as
    anything else, or the remedy left out."""
    plan, config = make_plan(emu, [DNS_DEAD])
    assert plan.actions[0].details["has_base_url"] is True

    report, waits = run(plan, config, tmp_path / "journal.jsonl")

    result = report.results[0]
    assert (result.outcome, result.sends) == ("refused", 1)
    assert "Invalid base URL: failed to resolve hostname: lookup vanished.example: no such host" in result.detail
    assert "keeps its workers" in result.detail
    assert f"DELETE /api/providers/{DNS_DEAD}" in result.detail
    assert waits.waits == []
    assert [(r.method, r.status) for r in wire(emu, "PUT")] == [("PUT", 400)]
    assert wire(emu, "DELETE") == []
    assert emu.parked_workers(DNS_DEAD) == 1000


def test_rule7_refused_built_in_record_only_keeps_its_workers(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 7. A built-in record (no base URL, every organization's key) refused with a 400 (here a stored
    retry backoff the gateway's own validation rejects) gets 'refused' and 'keeps its workers', and no
    delete remedy. Catches: advising to delete a shared built-in record."""
    network = default_network_config()
    network.retry_backoff_initial_ns = 50 * MS
    stored = emu.get_record(OPENAI)
    assert stored is not None
    emu.put_record(replace(stored, network_config=network))
    plan, config = make_plan(emu, [OPENAI])
    assert plan.actions[0].details["has_base_url"] is False

    report, _ = run(plan, config, tmp_path / "journal.jsonl")

    result = report.results[0]
    assert result.outcome == "refused"
    assert result.detail == ("Invalid retry backoff: retry backoff initial must be at least 100ms (400); "
                             "it keeps its workers")
    assert "DELETE" not in result.detail
    assert emu.parked_workers(OPENAI) == 1000


# -- rule 8: never two actions on one subject --------------------------------------------------------------------

def test_rule8_a_plan_with_two_actions_on_one_subject_is_refused(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 8. A hand-made plan (built as an object, so no file hash stands in the way) with a resize and
    a delete of the same record is refused before anything is read or written. Catches: the duplicate
    check removed (the delete and the resize would race, and the PUT could recreate the deleted record)."""
    plan, config = make_plan(emu, [RAW])
    shrink = plan.actions[0]
    delete = Action(id="a00002", kind="record_delete", target=shrink.target, subject=shrink.subject,
                    before=dict(shrink.before), after={"exists": False}, reason="hand-made",
                    fingerprint=shrink.fingerprint)
    bad = Plan(created_at=plan.created_at, targets=plan.targets, policy=plan.policy, actions=[shrink, delete])
    bad.id = bad.compute_id()
    journal = tmp_path / "journal.jsonl"

    with pytest.raises(PlanError, match="two actions on one subject"):
        apply_plan(bad, config, options=ApplyOptions(write=True, allow_delete=True, sleep=Waits()),
                   journal=Journal(journal))

    assert emu.requests() == []
    assert not journal.exists()
    assert emu.parked_workers(RAW) == 1000


# -- rule 9: bounded concurrency, rate limit, max-errors stop, progress, the tally line --------------------------

class CountingTransport(httpx.HTTPTransport):
    """Real HTTP, counting the PUTs in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "PUT":
            return super().handle_request(request)
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            response = super().handle_request(request)
            response.read()
            return response
        finally:
            with self._lock:
                self.in_flight -= 1


def test_rule9_concurrency_is_bounded(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 9 (bounded concurrency). Seven slow PUTs with ``concurrency=2``: never more than two in flight,
    and two at once do happen. Catches: the bound removed (all seven at once) or ignored (one at a time)."""
    plan, config = make_plan(emu, [OPENAI, ANTHROPIC, PROXIED, PROXIED_LANE, RAW, RAW_LANE, BETA_LANE])
    emu.inject_slow("PUT", ANY, delay=0.3, times=None)
    transport = CountingTransport()
    seen: list[str] = []

    report = apply_plan(plan, config, options=ApplyOptions(write=True, concurrency=2, sleep=Waits()),
                        journal=Journal(tmp_path / "journal.jsonl"), transports={"bifrost": transport},
                        on_result=lambda r: seen.append(r.action_id))

    assert {r.outcome for r in report.results} == {"done"}
    assert transport.peak == 2
    assert len(wire(emu, "PUT")) == 7
    assert sorted(seen) == [a.id for a in plan.actions]  # progress: one call per action


def test_rule9_rate_limit_spaces_the_writes(emu: BifrostEmulator, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 9 (rate limit). ``rate=4`` spaces the writes 250 ms apart: the limiter asks the injected sleep
    for exactly 0.25 s before every write but the first (on a fake clock that the sleep advances).
    Catches: the limiter removed or not consulted before each write."""
    clock = [1000.0]
    monkeypatch.setattr(apply_protocol, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time,
                                                              sleep=time.sleep))

    def advance(seconds: float) -> None:
        clock[0] += seconds

    plan, config = make_plan(emu, [OPENAI, ANTHROPIC, RAW, RAW_LANE, BETA_LANE])
    report, waits = run(plan, config, tmp_path / "journal.jsonl", rate=4.0, concurrency=1,
                        sleep=Waits(during=advance))

    assert {r.outcome for r in report.results} == {"done"}
    assert waits.waits == [0.25] * 4
    assert len(wire(emu, "PUT")) == 5


def test_rule9_max_errors_stops_and_leaves_the_rest_skipped(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 9 (max-errors stop). The first write is refused; with ``max_errors=1`` nothing else is started:
    the later actions are 'skipped' (no request for them, no outcome journaled) and the closing tally
    line still lists all six outcomes with zeros. Catches: the stop removed (later records written anyway)
    or skipped actions journaled as settled (they could never be resumed)."""
    plan, config = make_plan(emu, [ANTHROPIC, OPENAI, RAW, RAW_LANE])
    emu.inject_error("PUT", ANTHROPIC, status=400, message="Concurrency must be less than or equal to buffer size")
    journal = tmp_path / "journal.jsonl"

    report, _ = run(plan, config, journal, concurrency=1, max_errors=1)

    assert [r.outcome for r in report.results] == ["refused", "skipped", "skipped", "skipped"]
    assert report.stopped_early == "stopped after 1 error(s) (--max-errors 1)"
    assert report.tally_line() == "0 done, 1 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"
    assert {r.path for r in emu.requests()} == {path_of(ANTHROPIC)}
    assert set(Journal(journal).outcomes(plan.id)) == {plan.actions[0].id}
    assert report.exit_code == 1


def test_rule9_the_tally_line_counts_every_outcome(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 9 (the closing line): one action of each outcome gives
    ``1 done, 1 refused, 1 unconfirmed, 1 gone, 1 stale, 1 already-done``, in that order."""
    plan, config = make_plan(emu, [OPENAI, DNS_DEAD, ANTHROPIC, RAW, RAW_LANE, BETA_LANE])
    emu.inject_error("PUT", ANTHROPIC, status=500, times=None)
    other_process_deletes(emu, RAW)
    other_process_writes(emu, RAW_LANE, concurrency=1000, timeout=600)
    other_process_writes(emu, BETA_LANE, concurrency=64)

    report, _ = run(plan, config, tmp_path / "journal.jsonl")

    assert outcomes(report) == {OPENAI: "done", DNS_DEAD: "refused", ANTHROPIC: "unconfirmed", RAW: "gone",
                                RAW_LANE: "stale", BETA_LANE: "already-done"}
    assert report.tally_line() == "1 done, 1 refused, 1 unconfirmed, 1 gone, 1 stale, 1 already-done"
    assert report.exit_code == 1


# -- rule 10: the journal, single use, resume ------------------------------------------------------------------

def test_rule10_every_attempt_and_outcome_is_journaled_without_secrets(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 10 (the journal). Against a gateway with admin auth: every write attempt (two for the action
    that met a 500) and one outcome per action are in the journal, flushed before apply returns, and the
    journal holds no secret: not the admin password, no key, no proxy secret, no masked value. Catches:
    attempts or outcomes not journaled, or request/response bodies copied into it."""
    password = "Journal-Admin-Pw-5150!"
    monkeypatch.setenv("GS_TEST_JOURNAL_PW", password)
    with BifrostEmulator(auth=("admin", password), options=EmulatorOptions(resolver=gateway_dns)) as emu:
        seed_small(emu)
        target = target_of(emu, auth=AuthConfig(username="admin", password_env="GS_TEST_JOURNAL_PW"))
        plan, config = make_plan(emu, target=target, include_deletes=True)
        secrets = {password}
        for name in emu.record_names():
            stored = emu.get_record(name)
            assert stored is not None
            secrets.update(k.value.value for k in stored.keys)
            if stored.proxy_config is not None:
                secrets.update(s.value for s in (stored.proxy_config.url, stored.proxy_config.username,
                                                 stored.proxy_config.password) if s is not None)
        secrets.discard("")
        emu.inject_error("PUT", PROXIED, status=500, times=1)
        journal = tmp_path / "journal.jsonl"

        report, _ = run(plan, config, journal, allow_delete=True)

        assert {r.outcome for r in report.results} == {"done"}
        events = journal_events(journal)
        assert (events[0]["event"], events[-1]["event"]) == ("apply-start", "apply-end")
        assert events[-1]["tally"] == report.tally()
        for action in plan.actions:
            mine = [e for e in events if e.get("action_id") == action.id]
            sends = 2 if action.subject == PROXIED else 1
            assert [e["event"] for e in mine] == ["attempt"] * sends + ["outcome"]
            assert [e["send"] for e in mine[:-1]] == list(range(1, sends + 1))
            assert mine[-1]["outcome"] == "done" and mine[-1]["plan_id"] == plan.id
            assert mine[-1]["subject"] == action.subject and mine[-1]["sends"] == sends

        text = journal.read_text()
        assert len(secrets) > 5
        assert [s for s in secrets if s in text or redact(s) in text] == []
        assert not MASK.search(text) and "redacted" not in text.lower() and "BEGIN CERT" not in text


def test_rule10_a_plan_is_single_use(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 10 (single use). Applying an applied plan again does nothing (not even a read) and says so.
    Catches: a second run re-executing settled actions (a plan must not be replayed over newer state)."""
    plan, config = make_plan(emu, [OPENAI, RAW])
    journal = tmp_path / "journal.jsonl"
    first, _ = run(plan, config, journal)
    assert {r.outcome for r in first.results} == {"done"}
    lines = journal.read_text()
    emu.clear_requests()

    second, _ = run(plan, config, journal)

    assert second.already_applied and second.results == []
    assert [r.outcome for r in second.previous] == ["done", "done"]
    assert second.tally_line() == "2 done, 0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"
    assert second.exit_code == 0
    assert emu.requests() == []
    assert journal.read_text() == lines


def test_rule10_an_interrupted_apply_resumes_with_the_rest(emu: BifrostEmulator, tmp_path: Path) -> None:
    """Rule 10 (resume). A run stopped by its max-errors limit leaves three actions open; the next run of
    the same plan with the same journal does exactly those three (and never touches the settled one),
    and its tally counts both runs. Catches: a resume that redoes settled actions or forgets open ones."""
    plan, config = make_plan(emu, [ANTHROPIC, OPENAI, RAW, RAW_LANE])
    emu.inject_error("PUT", ANTHROPIC, status=400, message="Buffer size must be greater than 0")
    journal = tmp_path / "journal.jsonl"
    first, _ = run(plan, config, journal, concurrency=1, max_errors=1)
    assert [r.outcome for r in first.results] == ["refused", "skipped", "skipped", "skipped"]
    emu.clear_requests()

    second, _ = run(plan, config, journal)

    assert [(r.subject, r.outcome) for r in second.previous] == [(ANTHROPIC, "refused")]
    assert [(r.subject, r.outcome) for r in second.results] == [(OPENAI, "done"), (RAW, "done"), (RAW_LANE, "done")]
    assert wire(emu, name=ANTHROPIC) == []
    assert sorted(r.path for r in wire(emu, "PUT")) == sorted(path_of(n) for n in (OPENAI, RAW, RAW_LANE))
    assert second.tally_line() == "3 done, 1 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"
    assert len(Journal(journal).outcomes(plan.id)) == 4


def test_rule10_resume_from_a_journal_cut_mid_apply(emu: BifrostEmulator, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 10 (resume after a crash), through the CLI. The journal of a run killed mid-way holds outcomes
    for two actions, an attempt without outcome for the third and a torn last line: ``gatewayscope apply``
    resumes, does only the two open actions, says so, and a third run says the plan was already applied.
    Catches: a torn line breaking the resume, or settled actions redone."""
    from gatewayscope.cli import main

    monkeypatch.delenv("GATEWAYSCOPE_CONFIG", raising=False)
    plan, _ = make_plan(emu, [ANTHROPIC, OPENAI, RAW, RAW_LANE])
    plan_path = plan.save(tmp_path / "plan.json")
    journal = Journal(tmp_path / "plan.journal.jsonl")
    first, second, third, fourth = plan.actions
    journal.append("apply-start", plan_id=plan.id, actions=4, resumed=0, allow_delete=False)
    for action in (first, second):
        journal.append("attempt", plan_id=plan.id, action_id=action.id, kind=action.kind, target=action.target,
                       subject=action.subject, send=1, what="PUT")
        journal.append("outcome", plan_id=plan.id, action_id=action.id, kind=action.kind, target=action.target,
                       subject=action.subject, outcome="done", detail="", sends=1)
    journal.append("attempt", plan_id=plan.id, action_id=third.id, kind=third.kind, target=third.target,
                   subject=third.subject, send=1, what="PUT")
    with open(journal.path, "a") as handle:
        handle.write('{"event": "outcome", "plan_id": "' + plan.id[:10])  # the crash tore this line

    assert main(["apply", str(plan_path), "--yes"]) == 0

    out = capsys.readouterr().out
    assert "Resumed: 2 action(s) were settled by an earlier run" in out
    # the two open resizes of one gateway: their concurrency under the memory-headroom rule, said once
    assert out.count("bifrost: pool resizes ") == 1, out
    assert out.rstrip().endswith("4 done, 0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done")
    assert sorted(r.path for r in wire(emu, "PUT")) == sorted(path_of(a.subject) for a in (third, fourth))
    emu.clear_requests()
    assert main(["apply", str(plan_path), "--yes"]) == 0
    assert f"Plan {plan.id} was already applied" in capsys.readouterr().out
    assert emu.requests() == []


# -- rule 11: tombstones first, then deletes (the order apply keeps) --------------------------------------------

def sqlite_plan(db: Path, **kwargs: Any) -> tuple[Plan, Config]:
    from gatewayscope.scan import take_snapshot

    config = Config(targets=[Target(name="store", kind="rllm", path=str(db))], policy=Policy())
    # a guarded store is read from its orphan index: the deleted ids are named to the read
    snapshot = take_snapshot(config, also_sessions=kwargs.get("deleted_ids", ()))
    return build_plan(snapshot, config, created_at=NOW, **kwargs), config


def test_tombstones_land_before_any_delete_and_a_failed_backfill_stops_the_deletes(tmp_path: Path) -> None:
    """Rule 11. Tombstones first, then deletes (apply's phase order). On a store with the SQLite
    guard the backfill's outcome is journaled before the first delete attempt. If the backfill fails (the
    guard was removed after planning), the deletes of that target are skipped, not run unprotected."""
    from gatewayscope.guard import sqlite as sqlite_guard

    for uninstall_after_plan in (False, True):
        db = tmp_path / f"traces-{uninstall_after_plan}.db"
        write_store(db, {"a:0": 1, "b:0": 1, "live:0": 2})
        age(db, ["a:0", "b:0"], 3 * 3600)
        sqlite_guard.install(db)
        # confirmed orphans (deleted before): their tombstones are recorded ahead of the deletes
        deleted = dict.fromkeys(("a:0", "b:0"), time.time())
        plan, config = sqlite_plan(db, deleted_ids=deleted)
        assert [a.kind for a in plan.actions] == ["tombstone_backfill", "session_delete", "session_delete"]
        if uninstall_after_plan:
            sqlite_guard.uninstall(db)
        journal = tmp_path / f"journal-{uninstall_after_plan}.jsonl"

        report, _ = run(plan, config, journal, allow_delete=True, deleted_ids=deleted)

        events = [(e["event"], e["kind"]) for e in journal_events(journal) if e.get("kind")]
        if not uninstall_after_plan:
            assert [r.outcome for r in report.results] == ["done", "done", "done"]
            assert events.index(("outcome", "tombstone_backfill")) < events.index(("attempt", "session_delete"))
            assert session_counts(db) == {"live:0": 2}
            with sqlite3.connect(db) as conn:
                assert sqlite_guard.tombstoned_among(conn, ["a:0", "b:0", "live:0"]) == ["a:0", "b:0"]
        else:
            assert [r.outcome for r in report.results] == ["refused", "skipped", "skipped"]
            assert all("tombstones were not recorded first" in r.detail for r in report.skipped)
            assert ("attempt", "session_delete") not in events
            assert session_counts(db) == {"a:0": 1, "b:0": 1, "live:0": 2}
