"""Applying plans to the Bifrost emulator's realistic store: the memory a plan promises is the memory freed,
and the posture fix is one read-modify-write of the whole client config.

The emulator (a real HTTP server) keeps the core's accounting: every stored record it can build parks
``concurrency`` workers, a record in ``provider_status`` error parks none, a write restarts the pool with
the new size and a delete removes it. Its ``parked_workers()`` and ``boot_memory()`` (2 and 8 KiB per
worker) are compared with what ``plan_summary`` predicted, and with a count made from the seed's own
record list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target
from gatewayscope.remediate.apply import ApplyOptions, ApplyReport, apply_plan
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import Plan, build_plan, plan_summary
from gatewayscope.sandbox.bifrost_emulator import (
    BifrostEmulator,
    realistic_records,
    seed_realistic,
    seed_small,
)
from gatewayscope.snapshot import Snapshot, TargetSnapshot
from gatewayscope.sources.bifrost import HostResolver, read_bifrost
from tests.helpers import NOW, auth_config, emulator_with_auth

KIB = 1024
ADMIN, PASSWORD, PASSWORD_ENV = "admin", "Emulator-Admin-Pw-42!", "GS_TEST_APPLY_EMU_PW"
SAFE = {"drop_excess_requests": False, "enforce_auth_on_inference": True, "disable_content_logging": True}


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[BifrostEmulator]:
    yield from emulator_with_auth(monkeypatch, ADMIN, PASSWORD, PASSWORD_ENV)


def make_plan(emu: BifrostEmulator, **kwargs: Any) -> tuple[Plan, Config]:
    config = auth_config(emu, ADMIN, PASSWORD_ENV)
    data = read_bifrost(config.targets[0], config.policy, resolver=HostResolver())  # real DNS: .invalid never resolves
    snap = Snapshot(taken_at=NOW, targets=[TargetSnapshot(
        name="bifrost", kind="bifrost", address=emu.url, up=True, started_at=NOW, duration_seconds=0.1,
        bifrost=data)])
    plan = build_plan(snap, config, created_at=NOW, **kwargs)
    emu.clear_requests()
    return plan, config


def run(plan: Plan, config: Config, tmp_path: Path, **options: Any) -> ApplyReport:
    """A real apply with a journal of its own (no waits: none of these tests meets a 5xx)."""
    journal = tmp_path / f"journal-{len(list(tmp_path.glob('journal-*')))}.jsonl"
    return apply_plan(plan, config, options=ApplyOptions(write=True, sleep=lambda _s: None, **options),
                      journal=Journal(journal))


def config_puts(emu: BifrostEmulator) -> list[Any]:
    return [json.loads(r.text()) for r in emu.requests("PUT", "/api/config")]


@pytest.mark.slow  # seconds of real time: make e2e runs it
def test_shrinking_the_realistic_store_frees_the_memory_the_plan_predicted(emu: BifrostEmulator,
                                                                           tmp_path: Path) -> None:
    seed = seed_realistic(emu)
    assert emu.parked_workers() == seed.parked_workers
    records = realistic_records()

    # 1. the resizes: every record over its kind's pool that the gateway can reach
    plan, config = make_plan(emu, only=("pool_shrink",))
    predicted = plan_summary(plan)

    def pool_of(name: str, custom: bool) -> int:
        return 64 if custom or name.endswith("__anthropic") else 512

    # counted from the seed's record list: buildable (a pool to shrink), base URL resolvable, over its pool
    reachable = [r for r in records if r.buildable and ".invalid" not in r.base_url]
    by_hand = sum(max(0, r.concurrency - pool_of(r.name, r.custom_provider_config is not None)) for r in reachable)
    assert predicted["frees_workers"] == by_hand > 10_000
    workers, (low, high) = emu.parked_workers(), emu.boot_memory()

    report = run(plan, config, tmp_path)

    assert {r.outcome for r in report.results} == {"done"}
    assert workers - emu.parked_workers() == predicted["frees_workers"]
    low_after, high_after = emu.boot_memory()
    assert (low - low_after, high - high_after) == (predicted["frees_bytes"]["low"], predicted["frees_bytes"]["high"])
    assert predicted["frees_bytes"] == {"low": by_hand * 2 * KIB, "high": by_hand * 8 * KIB}
    rows = {row["name"]: row for row in emu.state_snapshot()["records"]}
    for action in plan.actions:
        row = rows[action.subject]
        assert (row["concurrency"], row["buffer_size"]) == (action.after["concurrency"], action.after["buffer_size"])
        assert (row["parked_workers"], row["restarts"]) == (action.after["concurrency"], 1)
    untouched = set(rows) - {a.subject for a in plan.actions}
    assert untouched and all(rows[n]["restarts"] == 0 for n in untouched)

    # 2. what no resize can reach: the records whose upstream is gone, and one the core cannot build
    plan, config = make_plan(emu, include_deletes=True, only=("pool_shrink", "record_delete"))
    assert {a.kind for a in plan.actions} == {"record_delete"}  # nothing left to resize
    assert rows["legacy-lan-gateway"]["parked_workers"] == 0  # status error: parks none, frees none
    assert next(a for a in plan.actions if a.subject == "legacy-lan-gateway").details["frees_workers"] == 0
    predicted = plan_summary(plan)
    workers, (low, high) = emu.parked_workers(), emu.boot_memory()
    dead = sum(1 for r in records if r.base_url and ".invalid/" in r.base_url)
    assert predicted["frees_workers"] == sum(r.concurrency for r in records if r.base_url and ".invalid/" in r.base_url)
    assert len(plan.actions) == dead + 1

    report = run(plan, config, tmp_path, allow_delete=True)

    assert {r.outcome for r in report.results} == {"done"}
    assert workers - emu.parked_workers() == predicted["frees_workers"]
    low_after, high_after = emu.boot_memory()
    assert (low - low_after, high - high_after) == (predicted["frees_bytes"]["low"], predicted["frees_bytes"]["high"])
    assert not {a.subject for a in plan.actions} & set(emu.record_names())
    # what is left parks exactly the pools: standard 512, custom 64
    left = emu.state_snapshot()
    assert all(row["concurrency"] in (64, 512) for row in left["records"])
    assert left["totals"]["parked_workers"] == emu.parked_workers()


def test_posture_fix_is_one_put_of_the_whole_client_config(emu: BifrostEmulator, tmp_path: Path) -> None:
    seed_small(emu)  # drop_excess_requests on, enforce_auth_on_inference and disable_content_logging off
    emu.set_client_config(allowed_origins=["https://console.example"], prometheus_labels=["team"],
                          max_request_body_size_mb=50, log_retention_days=30, initial_pool_size=120,
                          header_filter_config={"allowlist": ["x-team"], "denylist": []},
                          compat={"convert_text_to_chat": False, "convert_chat_to_responses": True,
                                  "should_drop_params": True, "should_convert_params": False})
    before = emu.client_config()
    plan, config = make_plan(emu, only=("posture_fix",))
    assert [a.kind for a in plan.actions] == ["posture_fix"]

    report = run(plan, config, tmp_path)

    assert [r.outcome for r in report.results] == ["done"]
    puts = config_puts(emu)
    assert len(puts) == 1
    assert set(puts[0]) == {"client_config"}  # never auth_config (its password is masked in the read)
    assert puts[0]["client_config"] == {**before, **SAFE}  # the whole config as read, three settings changed
    assert emu.client_config() == {**before, **SAFE}
    assert [r.method for r in emu.requests()] == ["GET", "PUT"]
    assert emu.state_snapshot()["auth_enabled"] is True
    assert httpx.get(emu.url + "/api/config", auth=(ADMIN, PASSWORD), timeout=5).status_code == 200


def test_no_posture_write_when_nothing_drifted(emu: BifrostEmulator, tmp_path: Path) -> None:
    seed_small(emu)
    emu.set_client_config(**SAFE)
    plan, config = make_plan(emu)
    assert "posture_fix" not in {a.kind for a in plan.actions}
    run(plan, config, tmp_path, allow_delete=False)
    assert config_puts(emu) == []


def test_posture_fixed_or_changed_since_the_plan_is_not_written(emu: BifrostEmulator, tmp_path: Path) -> None:
    seed_small(emu)
    plan, config = make_plan(emu, only=("posture_fix",))
    emu.set_client_config(**SAFE)  # someone fixed it meanwhile
    report = run(plan, config, tmp_path)
    assert [r.outcome for r in report.results] == ["already-done"]
    assert config_puts(emu) == []

    seed_small(emu)
    plan, config = make_plan(emu, only=("posture_fix",))
    emu.set_client_config(log_retention_days=90)  # another setting changed: the plan's read is stale
    report = run(plan, config, tmp_path)
    assert [r.outcome for r in report.results] == ["stale"]
    assert config_puts(emu) == []
    assert emu.client_config()["drop_excess_requests"] is True


# -- the shrink concurrency rule: the update's transient double pools near the memory limit ----------------

MIB = 1024 * KIB
RECORDS = 8
OLD_POOL, NEW_POOL = 3000, 1000  # a custom pool of 1,000 (the policy below) for records stored at 3,000
STACK = 8 * KIB
BASELINE, OTHERS = 32 * MIB, 64


def near_limit_emulator(*, metrics: bool = True, headroom_pools: float = 2.5) -> tuple[BifrostEmulator, int]:
    """An emulator whose updates run old and new pools together for 0.5 s, with a memory limit that leaves, after
    apply's reserve (10 % of the limit), room for ``headroom_pools`` new pools on top of what it holds."""
    from gatewayscope.sandbox.bifrost_emulator import Concurrency, CustomProviderConfig, EmulatorOptions, ProviderRecord

    resident = BASELINE + (OTHERS + RECORDS * OLD_POOL) * STACK
    limit = int((resident + headroom_pools * NEW_POOL * STACK) / 0.9)
    options = EmulatorOptions(stack_bytes_per_goroutine=STACK, baseline_memory_bytes=BASELINE,
                              baseline_goroutines=OTHERS, memory_limit_bytes=limit, update_overlap=True,
                              update_overlap_seconds=0.5, metrics_enabled=metrics)
    emulator = BifrostEmulator(options=options).start()
    assert emulator.load([ProviderRecord(f"org{i}__vllm__m", concurrency_and_buffer_size=Concurrency(OLD_POOL, 48_000),
                                         custom_provider_config=CustomProviderConfig(base_provider_type="openai"))
                          for i in range(RECORDS)])
    assert emulator.resident_memory_bytes() == resident
    return emulator, limit


def shrink_plan(emu: BifrostEmulator, limit: int) -> tuple[Plan, Config]:
    target = Target(name="bifrost", kind="bifrost", url=emu.url, memory_limit_bytes=limit)
    config = Config(targets=[target], policy=Policy(custom_pool=NEW_POOL, queue_per_worker=16))
    data = read_bifrost(target, config.policy, resolver=HostResolver())
    snap = Snapshot(taken_at=NOW, targets=[TargetSnapshot(
        name="bifrost", kind="bifrost", address=emu.url, up=True, started_at=NOW, duration_seconds=0.1,
        bifrost=data)])
    plan = build_plan(snap, config, created_at=NOW, only=("pool_shrink",))
    assert len(plan.actions) == RECORDS
    return plan, config


def test_without_the_rule_resizing_every_record_at_once_kills_the_gateway() -> None:
    """The same eight writes apply would send, all at once: their new pools start before the old ones retire,
    the transient passes the limit, and the gateway is killed."""
    import threading

    from gatewayscope.remediate.apply import pool_write_body
    from gatewayscope.sources.bifrost import BifrostClient

    emu, limit = near_limit_emulator()
    try:
        plan, _ = shrink_plan(emu, limit)
        client = BifrostClient(emu.url, timeout=10)
        bodies = [(a.subject, pool_write_body(client.get_provider(a.subject), a.after)) for a in plan.actions]
        start = threading.Barrier(RECORDS)
        errors: list[Exception] = []

        def write(name: str, body: Any) -> None:
            start.wait(timeout=10)
            try:
                client.put_provider(name, body)
            except Exception as err:  # the gateway is killed under some of them: no answer
                errors.append(err)
        threads = [threading.Thread(target=write, args=item) for item in bodies]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        client.close()
        assert emu.dead and errors
        assert "over the memory limit" in str(emu.runtime()["death_reason"])
    finally:
        emu.stop()


@pytest.mark.slow  # seconds of real time: make e2e runs it
def test_with_the_rule_apply_resizes_within_the_headroom_and_the_gateway_never_exceeds_its_limit(
        tmp_path: Path) -> None:
    emu, limit = near_limit_emulator()
    try:
        plan, config = shrink_plan(emu, limit)
        report = run(plan, config, tmp_path, concurrency=RECORDS)  # asked for all eight at once
        runtime = emu.runtime()
    finally:
        emu.stop()
    assert report.shrink_concurrency["bifrost"]["concurrency"] == 2  # 2.5 new pools of headroom
    assert "holds the new pools of the 2 largest resizes" in report.shrink_concurrency["bifrost"]["reason"]
    assert all(r.outcome == "done" for r in report.results), [(r.subject, r.outcome, r.detail) for r in report.results]
    assert not runtime["dead"] and runtime["deaths"] == 0
    assert runtime["peak_resident_memory_bytes"] <= limit
    # the transients did run (the peak is above what the old pools alone held), and the pools are resized
    assert runtime["peak_resident_memory_bytes"] > BASELINE + (OTHERS + RECORDS * OLD_POOL) * STACK
    assert runtime["running_workers"] == RECORDS * NEW_POOL
    events = [e for e in Journal(next(tmp_path.glob("journal-*.jsonl"))).read() if e["event"] == "shrink-concurrency"]
    assert [(e["target"], e["concurrency"]) for e in events] == [("bifrost", 2)]


@pytest.mark.parametrize("metrics,headroom,reason", [
    (False, 2.5, "headroom is unknown"),   # no runtime metrics: nothing to measure the headroom by
    (True, 0.5, "does not hold even the largest new pool"),
])
@pytest.mark.slow  # seconds of real time: make e2e runs it
def test_unknown_or_small_headroom_is_one_record_at_a_time(tmp_path: Path, metrics: bool, headroom: float,
                                                            reason: str) -> None:
    emu, limit = near_limit_emulator(metrics=metrics, headroom_pools=headroom)
    try:
        plan, config = shrink_plan(emu, limit)
        report = run(plan, config, tmp_path, concurrency=RECORDS)
        runtime = emu.runtime()
    finally:
        emu.stop()
    assert report.shrink_concurrency["bifrost"]["concurrency"] == 1
    assert reason in report.shrink_concurrency["bifrost"]["reason"]
    # one new pool at a time fits in what the reserve keeps free: every resize lands and the gateway lives
    assert all(r.outcome == "done" for r in report.results)
    assert not runtime["dead"] and runtime["peak_resident_memory_bytes"] <= limit
