"""A Bifrost scan end to end: read_bifrost over real HTTP against the Bifrost emulator, then the findings.

The expected numbers are worked out from the seed definitions in
``gatewayscope/sandbox/bifrost_emulator/seed.py`` (``small_records`` by hand, record by record;
``realistic_records`` by counting its record list), never from gatewayscope's own analysis. Only the
emulator's public API and its fault injection are used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gatewayscope.analysis.pools import (
    bifrost_sentence,
    bifrost_summary,
    boot_estimate,
    classify_records,
    per_kind,
    unreachable_records,
)
from gatewayscope.analysis.posture import posture_drift
from gatewayscope.config import AuthConfig, Policy, Target
from gatewayscope.errors import AuthError, BadResponseError, GatewayTimeoutError, UnreachableError
from gatewayscope.sandbox.bifrost_emulator import (
    LIST,
    STANDARD_PROVIDERS,
    BifrostEmulator,
    EmulatorOptions,
    ProviderRecord,
    realistic_records,
    seed_realistic,
    seed_small,
)
from gatewayscope.sandbox.processes import free_port
from gatewayscope.snapshot import BifrostData
from gatewayscope.sources.bifrost import BifrostClient, HostResolver, read_bifrost, record_fingerprint

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
LIMIT = 512 * MIB
ADMIN = "admin"
PASSWORD = "Emulator-Admin-Pw-42!"


@pytest.fixture
def emulator() -> Iterator[BifrostEmulator]:
    with BifrostEmulator() as emu:
        yield emu


def target_for(emu: BifrostEmulator, *, timeout: float = 5.0, auth: AuthConfig | None = None) -> Target:
    return Target(name="bifrost", kind="bifrost", url=emu.url, timeout_seconds=timeout, auth=auth)


def scan(emu: BifrostEmulator, *, timeout: float = 5.0,
         auth: AuthConfig | None = None) -> tuple[dict[str, Any], BifrostData]:
    # a fresh resolver: real DNS lookups from here, without the process-wide cache
    data = read_bifrost(target_for(emu, timeout=timeout, auth=auth), Policy(), resolver=HostResolver())
    return bifrost_summary(data, Policy(), LIMIT), data


# -- the small seed, by hand ------------------------------------------------------------------------
#
# small_records() holds twelve records:
#   standard (no custom_provider_config): openai 1000/5000, anthropic (unset: 1000/5000),
#     openrouter 512/8192, legacy-lan-gateway (unset: 1000/5000; not a built-in name and no custom
#     config, so the core cannot build it: provider_status "error", no pool, 0 parked workers)
#   custom: orgalpha__openrouter__gpt-4.1-mini, its __anthropic lane, orgalpha__deepseek__deepseek-chat,
#     its __anthropic lane, orgbeta__vllm-lan__llama3.1-8b-instruct (base URL under .invalid),
#     orgbeta__openrouter__claude-sonnet-4 at 64/1024, its __anthropic lane,
#     orgbeta__together__qwen3-coder (base URL under .invalid): seven at 1000/5000, one at 64/1024
# client_config: drifted (drop_excess_requests on, enforce_auth_on_inference and disable_content_logging off)

SMALL_STANDARD_WORKERS = 1000 + 1000 + 512 + 0  # 2,512
SMALL_CUSTOM_WORKERS = 7 * 1000 + 64  # 7,064
SMALL_WORKERS = SMALL_STANDARD_WORKERS + SMALL_CUSTOM_WORKERS  # 9,576

SMALL_SUMMARY = {
    "records": {"standard": 4, "custom": 8},
    "parked_workers": {"standard": SMALL_STANDARD_WORKERS, "custom": SMALL_CUSTOM_WORKERS},
    "queue_slots": {"standard": 5000 + 5000 + 8192 + 0, "custom": 7 * 5000 + 1024},  # 18,192 / 36,024
    # standard: openai, anthropic and legacy-lan-gateway store 1,000 > 512; custom: the seven at 1,000 > 64
    "records_over_pool": {"standard": 3, "custom": 7},
    "worker_stack_bytes": {"low": 19_611_648, "high": 78_446_592},  # 9,576 x 2,048 / x 8,192
    "memory_limit_bytes": LIMIT,
    "survives_restart": "yes",  # 74.8 MiB <= 512 MiB
    # 536,870,912 x 12 // 19,611,648 = 328 -> 329; 536,870,912 x 12 // 78,446,592 = 82 -> 83
    "records_to_limit": {"low": 329, "high": 83},
    "posture_drift": ["drop_excess_requests", "enforce_auth_on_inference", "disable_content_logging"],
    "unreachable_records": 3,  # two .invalid base URLs + legacy-lan-gateway in status error
    "pool_policy": {"standard": 512, "custom": 64, "queue_per_worker": 16},
}
# the emulator's process at its defaults: 8 KiB per goroutine, 64 MiB and 64 goroutines besides the workers
SMALL_GOROUTINES = 64 + SMALL_WORKERS  # 9,640
SMALL_RESIDENT = 64 * MIB + SMALL_GOROUTINES * 8192  # 146,079,744
SMALL_PREDICTED = 64 * MIB + SMALL_WORKERS * 8192  # the baseline + the records' workers: 145,555,456
SMALL_BOOT_MEMORY = {
    "model": "measured", "predicted_bytes": SMALL_PREDICTED, "memory_limit_bytes": LIMIT,
    "survives_restart": "yes",  # 138.8 MiB + 5 % <= 512 MiB
    # (512 - 64) MiB x 12 records / (9,576 workers x 8,192) = 71.9 -> 72
    "records_to_limit": 72,
    "measured": {"goroutines": SMALL_GOROUTINES, "stack_inuse_bytes": SMALL_GOROUTINES * 8192,
                 "resident_memory_bytes": SMALL_RESIDENT, "stack_bytes_per_goroutine": 8192.0,
                 "baseline_bytes": 64 * MIB, "other_goroutines": 64,
                 # (145,555,456 - 146,079,744) / 146,079,744: the 64 other goroutines' stacks
                 "calibration_error_ratio": round(-64 * 8192 / SMALL_RESIDENT, 6), "trusted": True},
    "reason": None,
}


def test_small_seed_findings_equal_the_hand_count(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    summary, data = scan(emulator)
    assert summary == {**SMALL_SUMMARY, "boot_memory": SMALL_BOOT_MEMORY}
    # the emulator's own worker accounting agrees
    assert emulator.parked_workers() == SMALL_WORKERS
    assert emulator.boot_memory() == (19_611_648, 78_446_592)

    unreachable = unreachable_records(data.records, data.reachability)
    assert sorted(unreachable["name"].to_list()) == [
        "legacy-lan-gateway", "orgbeta__together__qwen3-coder", "orgbeta__vllm-lan__llama3.1-8b-instruct"]
    reasons = dict(unreachable.select("name", "reason").rows())
    assert reasons["legacy-lan-gateway"] == "provider_status is error"
    assert reasons["orgbeta__together__qwen3-coder"].startswith(
        "base URL host together.orgbeta.invalid does not resolve")
    assert data.health == "ok" and data.version == "v2.2.4"

    sentence = bifrost_sentence(summary)
    assert sentence.startswith("This gateway would survive a restart within its 512.0 MiB memory limit: its 12 ")
    assert "9,576 workers" in sentence and "18.7 to 74.8 MiB" in sentence


def test_small_seed_per_record(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    _, data = scan(emulator)
    classified = classify_records(data.records, Policy())
    rows = {r["name"]: r for r in classified.iter_rows(named=True)}
    lane = rows["orgalpha__openrouter__gpt-4.1-mini__anthropic"]
    assert (lane["kind"], lane["target_pool"], lane["target_queue"], lane["over_pool"]) == ("custom", 64, 1024, True)
    small = rows["orgbeta__openrouter__claude-sonnet-4"]
    assert (small["parked_workers"], small["queue_slots"], small["over_pool"]) == (64, 1024, False)
    shared = rows["openrouter"]
    assert (shared["kind"], shared["target_pool"], shared["over_pool"]) == ("standard", 512, False)
    broken = rows["legacy-lan-gateway"]
    assert (broken["provider_status"], broken["parked_workers"], broken["concurrency"]) == ("error", 0, 1000)
    for name, row in rows.items():
        assert row["parked_workers"] == emulator.parked_workers(name), name


def test_small_seed_snapshot_holds_no_secret(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    _, data = scan(emulator)
    stored = data.records.write_json() + json.dumps(data.client_config)
    secrets = ["proxy-password-1234", "proxyuser", "127.0.0.1:3128", "BEGIN CERTIFICATE"]
    for name in emulator.record_names():
        record = emulator.get_record(name)
        assert record is not None
        secrets += [key.value.value for key in record.keys]
    for secret in secrets:
        assert secret and secret not in stored
        assert secret[:4] + "*" * 24 not in stored  # nor the masked form


def test_fingerprints_do_not_depend_on_the_secretvar_shape() -> None:
    with BifrostEmulator() as newest, BifrostEmulator(options=EmulatorOptions(legacy_secret_shape=True)) as legacy:
        seed_small(newest)
        seed_small(legacy)
        with BifrostClient(newest.url) as a, BifrostClient(legacy.url) as b:
            new_records = {r["name"]: r for r in a.list_providers()}
            old_records = {r["name"]: r for r in b.list_providers()}
    proxied = new_records["orgalpha__openrouter__gpt-4.1-mini"]["proxy_config"]
    assert proxied["url"] != old_records["orgalpha__openrouter__gpt-4.1-mini"]["proxy_config"]["url"]
    assert {n: record_fingerprint(r) for n, r in new_records.items()} == {
        n: record_fingerprint(r) for n, r in old_records.items()}


# -- the realistic seed, counted from its record list --------------------------------------------------

def test_realistic_seed_findings_equal_the_seed_definition(emulator: BifrostEmulator) -> None:
    summary_of_seed = seed_realistic(emulator)
    records = realistic_records()  # the same arguments: the same records

    def is_custom(r: ProviderRecord) -> bool:
        return r.custom_provider_config is not None or r.name.endswith("__anthropic")

    def has_pool(r: ProviderRecord) -> bool:  # the core builds custom records and built-in names only
        return r.custom_provider_config is not None or r.name in STANDARD_PROVIDERS

    def workers(r: ProviderRecord) -> int:
        return r.concurrency if has_pool(r) else 0

    custom = [r for r in records if is_custom(r)]
    standard = [r for r in records if not is_custom(r)]
    dead = [r for r in records if ".invalid" in r.base_url]
    no_pool = [r for r in records if not has_pool(r)]
    total_workers = sum(workers(r) for r in records)
    expected_low, expected_high = total_workers * 2048, total_workers * 8192

    summary, data = scan(emulator)
    assert summary["records"] == {"standard": len(standard), "custom": len(custom)}
    assert summary["parked_workers"] == {"standard": sum(workers(r) for r in standard),
                                         "custom": sum(workers(r) for r in custom)}
    assert summary["queue_slots"] == {"standard": sum(r.buffer_size for r in standard if has_pool(r)),
                                      "custom": sum(r.buffer_size for r in custom if has_pool(r))}
    assert summary["records_over_pool"] == {"standard": sum(r.concurrency > 512 for r in standard),
                                            "custom": sum(r.concurrency > 64 for r in custom)}
    assert summary["worker_stack_bytes"] == {"low": expected_low, "high": expected_high}
    expected_verdict = "yes" if expected_high <= LIMIT else "no" if expected_low > LIMIT else "at risk"
    assert summary["survives_restart"] == expected_verdict
    assert summary["records_to_limit"] == {"low": LIMIT * len(records) // expected_low + 1,
                                           "high": LIMIT * len(records) // expected_high + 1}
    assert summary["posture_drift"] == ["drop_excess_requests", "enforce_auth_on_inference",
                                        "disable_content_logging"]
    assert summary["unreachable_records"] == len(dead) + len(no_pool)

    # the seed is what the design promises: hundreds of custom records at the 1,000-worker default,
    # some dead, and a store that does not boot within 512 MiB at the high bound
    assert len(custom) >= 100 and dead and all(r.concurrency == 1000 for r in custom)
    assert expected_high > LIMIT
    # and the emulator's own accounting agrees with the count
    assert summary_of_seed.parked_workers == total_workers == emulator.parked_workers()
    assert (summary_of_seed.boot_memory_low_bytes, summary_of_seed.boot_memory_high_bytes) == (
        expected_low, expected_high)
    est = boot_estimate(classify_records(data.records, Policy()), LIMIT)
    assert est.parked_workers == total_workers
    kinds = per_kind(classify_records(data.records, Policy()))
    assert kinds["records"].sum() == len(records)


# -- boot memory from what the gateway measures ---------------------------------------------------------

@pytest.mark.parametrize("stack,baseline,others", [(8192, 64 * MIB, 64), (5 * 1024, 200 * MIB, 300),
                                                   (2048, 16 * MIB, 20), (12 * 1024, 90 * MIB, 2000)])
def test_the_measured_prediction_equals_the_emulators_boot_memory_within_5_percent(
        stack: int, baseline: int, others: int) -> None:
    """With metrics on, the prediction is the emulator's boot memory within 5 % (at a stack per goroutine the band
    does not know, and a baseline it leaves out), before and after records change; the band is far from it."""
    options = EmulatorOptions(stack_bytes_per_goroutine=stack, baseline_memory_bytes=baseline,
                              baseline_goroutines=others)
    with BifrostEmulator(options=options) as emu:
        seed_realistic(emu, orgs=6)
        summary, _ = scan(emu)
        boot = emu.boot_memory_bytes()
        memory = summary["boot_memory"]
        assert memory["model"] == "measured" and memory["measured"]["trusted"] is True
        assert abs(memory["predicted_bytes"] - boot) <= 0.05 * boot
        assert memory["measured"]["stack_bytes_per_goroutine"] == stack
        assert abs(memory["measured"]["calibration_error_ratio"]) <= 0.05
        band_low, band_high = summary["worker_stack_bytes"]["low"], summary["worker_stack_bytes"]["high"]
        assert not (abs(band_high - boot) <= 0.05 * boot and abs(band_low - boot) <= 0.05 * boot)
        # shrink three records and delete one: the next read predicts the new boot memory
        client = BifrostClient(emu.url)
        for name in [r for r in emu.record_names() if r.endswith("__anthropic")][:3]:
            record = client.get_provider(name)
            client.put_provider(name, {"network_config": {}, "custom_provider_config":
                                       record["custom_provider_config"],
                                       "concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024}})
        client.delete_provider("openai")
        client.close()
        after, _ = scan(emu)
        boot_after = emu.boot_memory_bytes()
        assert boot_after < boot
        assert abs(after["boot_memory"]["predicted_bytes"] - boot_after) <= 0.05 * boot_after


def test_with_metrics_off_the_band_as_today() -> None:
    with BifrostEmulator(options=EmulatorOptions(metrics_enabled=False)) as emu:
        seed_small(emu)
        summary, _ = scan(emu)
    memory = summary.pop("boot_memory")
    assert summary == SMALL_SUMMARY  # every figure the band gave before
    assert memory["model"] == "band" and memory["measured"] is None
    assert memory["predicted_bytes"] == SMALL_SUMMARY["worker_stack_bytes"]["high"]  # type: ignore[index]
    assert memory["survives_restart"] == "yes" and memory["records_to_limit"] == 83
    assert "answered 404" in memory["reason"] and memory["reason"].endswith("uses the 2-8 KiB band.")


@pytest.mark.parametrize("lie", [500, 60_000])
def test_a_gateway_whose_metrics_lie_is_reported_not_trusted(lie: int) -> None:
    with BifrostEmulator(options=EmulatorOptions(metrics_goroutines=lie)) as emu:
        seed_small(emu)
        summary, _ = scan(emu)
    memory = summary["boot_memory"]
    assert memory["model"] == "band" and memory["predicted_bytes"] == 78_446_592
    assert memory["measured"]["trusted"] is False and memory["measured"]["goroutines"] == lie
    assert f"they report {lie:,} goroutines where the records park 9,576 workers" in memory["reason"]
    assert "not trusted" in memory["reason"] and memory["survives_restart"] == SMALL_SUMMARY["survives_restart"]


def test_the_measured_verdict_settles_what_the_band_calls_at_risk() -> None:
    """The realistic store at 4 KiB per goroutine: under limits between the band's bounds (both "at risk" by the
    band), the measured figures say "yes" at 1.5 x the boot memory and "no" at 0.8 x."""
    with BifrostEmulator(options=EmulatorOptions(stack_bytes_per_goroutine=4096)) as emu:
        seed_realistic(emu)
        data = read_bifrost(target_for(emu), Policy(), resolver=HostResolver())
        boot = emu.boot_memory_bytes()
    for limit, measured in ((boot * 3 // 2, "yes"), (boot * 4 // 5, "no")):
        summary = bifrost_summary(data, Policy(), limit)
        assert summary["worker_stack_bytes"]["low"] < limit < summary["worker_stack_bytes"]["high"]
        assert summary["survives_restart"] == "at risk"
        assert summary["boot_memory"]["survives_restart"] == measured


# -- auth -------------------------------------------------------------------------------------------

def test_auth_off_sends_no_credentials(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    emulator.clear_requests()
    scan(emulator)
    logged = emulator.requests()
    assert {(r.method, r.path) for r in logged} >= {("GET", "/api/providers"), ("GET", "/api/config")}
    assert all("authorization" not in r.headers for r in logged)


def test_auth_on_with_the_right_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GS_BIFROST_USER", ADMIN)
    monkeypatch.setenv("GS_BIFROST_PASSWORD", PASSWORD)
    auth = AuthConfig(username_env="GS_BIFROST_USER", password_env="GS_BIFROST_PASSWORD")
    with BifrostEmulator(auth=(ADMIN, PASSWORD)) as emu:
        seed_small(emu)
        emu.clear_requests()
        summary, data = scan(emu, auth=auth)
        logged = emu.requests()
    assert summary == {**SMALL_SUMMARY, "boot_memory": SMALL_BOOT_MEMORY}  # /metrics read with the credentials
    assert data.auth_enabled is True
    assert "/metrics" in {r.path for r in logged}
    assert logged and all(r.headers.get("authorization", "").startswith("Basic ") for r in logged)


def test_auth_on_with_wrong_credentials_is_a_clear_auth_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GS_BIFROST_USER", ADMIN)
    monkeypatch.setenv("GS_BIFROST_PASSWORD", "not-the-" + PASSWORD)
    auth = AuthConfig(username_env="GS_BIFROST_USER", password_env="GS_BIFROST_PASSWORD")
    with BifrostEmulator(auth=(ADMIN, PASSWORD)) as emu:
        seed_small(emu)
        with pytest.raises(AuthError) as info:
            scan(emu, auth=auth)
    err = info.value
    assert err.status == 401 and err.message == "Unauthorized"
    text = str(err)
    assert text.startswith(f"Bifrost at {emu.url} refused the admin credentials")
    assert "username or password is wrong" in text
    assert "environment variable GS_BIFROST_USER" in text and "environment variable GS_BIFROST_PASSWORD" in text
    assert PASSWORD not in text


def test_auth_on_without_credentials_says_so() -> None:
    with BifrostEmulator(auth=(ADMIN, PASSWORD)) as emu, pytest.raises(AuthError) as info:
        scan(emu)
    assert "none are configured for this target" in str(info.value)
    assert PASSWORD not in str(info.value)


# -- a gateway that is down, slow, or answers garbage -------------------------------------------------

def test_gateway_down_is_unreachable() -> None:
    port = free_port()  # nothing listens there
    target = Target(name="bifrost", kind="bifrost", url=f"http://127.0.0.1:{port}", timeout_seconds=5.0)
    with pytest.raises(UnreachableError) as info:
        read_bifrost(target, Policy(), resolver=HostResolver())
    assert f"127.0.0.1:{port}" in str(info.value)


def test_gateway_stopped_after_start_is_unreachable() -> None:
    emu = BifrostEmulator().start()
    url = emu.url
    emu.stop()
    with BifrostClient(url) as client, pytest.raises(UnreachableError):
        client.list_providers()


def test_slow_gateway_is_a_timeout(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    emulator.inject_slow("GET", LIST, delay=10.0)
    with pytest.raises(GatewayTimeoutError) as info:
        scan(emulator, timeout=0.3)
    assert "did not answer GET /api/providers within 0.3 s" in str(info.value)


def test_listing_with_garbage_is_a_bad_response(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    emulator.inject_garbage("GET", LIST)
    with pytest.raises(BadResponseError) as info:
        scan(emulator)
    assert "not JSON" in str(info.value) and "text/html" in str(info.value)
    assert "<html>" not in str(info.value)


def test_drift_follows_an_operator_edit(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    emulator.set_client_config(drop_excess_requests=False, enforce_auth_on_inference=True,
                               disable_content_logging=True)
    _, data = scan(emulator)
    assert posture_drift(data.client_config) == []


# -- writes against the emulator -----------------------------------------------------------------------

def test_delete_shapes_against_the_emulator() -> None:
    with BifrostEmulator() as newest, BifrostEmulator(options=EmulatorOptions(legacy_delete_404=True)) as legacy:
        seed_small(newest)
        seed_small(legacy)
        with BifrostClient(newest.url) as a, BifrostClient(legacy.url) as b:
            assert a.delete_provider("orgbeta__together__qwen3-coder") == "removed"
            assert a.delete_provider("never-there") == "removed"
            assert b.delete_provider("orgbeta__together__qwen3-coder") == "removed"
            assert b.delete_provider("never-there") == "not-found"
        assert "orgbeta__together__qwen3-coder" not in newest.record_names()
        assert "orgbeta__together__qwen3-coder" not in legacy.record_names()


def test_pool_write_against_the_emulator(emulator: BifrostEmulator) -> None:
    seed_small(emulator)
    name = "orgalpha__deepseek__deepseek-chat"
    with BifrostClient(emulator.url) as client:
        fresh = client.get_provider(name)
        body = {"network_config": fresh["network_config"],
                "custom_provider_config": fresh["custom_provider_config"],
                "send_back_raw_request": fresh["send_back_raw_request"],
                "send_back_raw_response": fresh["send_back_raw_response"],
                "concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024}}
        answer = client.put_provider(name, body)
    assert answer["concurrency_and_buffer_size"] == {"concurrency": 64, "buffer_size": 1024}
    assert emulator.parked_workers(name) == 64
    assert emulator.restarts(name) == 1


def test_only_a_scan_that_keeps_its_snapshot_pays_for_plan_fingerprints(
        emulator: BifrostEmulator, tmp_path: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gatewayscope.cli import main
    from gatewayscope.config import Config
    from gatewayscope.remediate.plan import build_plan
    from gatewayscope.snapshot import Snapshot
    from gatewayscope.sources import bifrost
    from gatewayscope.sources.bifrost import read as bifrost_read

    seed_small(emulator)
    hashed: list[str] = []
    real = bifrost.record_fingerprint

    def counting(record: dict[str, Any], **kwargs: Any) -> str:
        hashed.append(record["name"])
        return real(record, **kwargs)

    monkeypatch.setattr(bifrost_read, "record_fingerprint", counting)  # where the read's rows are made
    assert main(["scan", "--bifrost", emulator.url, "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)["targets"][0]
    assert hashed == []  # a report has no use for them

    saved = tmp_path / "snap"
    assert main(["scan", "--bifrost", emulator.url, "--format", "json", "--save-snapshot", str(saved)]) == 0
    kept = json.loads(capsys.readouterr().out)["targets"][0]
    assert sorted(hashed) == sorted(emulator.record_names())
    assert kept["records_over_pool"] == plain["records_over_pool"] and kept["parked_workers"] == plain["parked_workers"]

    # the saved snapshot plans offline, each shrink carrying the fingerprint of the record as read
    snapshot = Snapshot.load(saved)
    config = Config(targets=[Target(name=snapshot.targets[0].name, kind="bifrost", url=emulator.url)], policy=Policy())
    plan = build_plan(snapshot, config)
    shrinks = [a for a in plan.actions if a.kind == "pool_shrink"]
    assert shrinks
    with BifrostClient(emulator.url) as client:
        for action in shrinks:
            assert action.fingerprint == real(client.get_provider(action.subject), exclude=bifrost.POOL_FIELDS)


def test_the_runtime_figures_survive_a_snapshot_round_trip(tmp_path: Any) -> None:
    """A saved snapshot keeps the measured figures (or the reason there are none): the analysis of a loaded
    snapshot gives the same boot memory."""
    from gatewayscope.config import Config
    from gatewayscope.scan import scan_report, take_snapshot
    from gatewayscope.snapshot import Snapshot

    with BifrostEmulator() as on, BifrostEmulator(options=EmulatorOptions(metrics_enabled=False)) as off:
        seed_small(on)
        seed_small(off)
        config = Config(targets=[Target(name="on", kind="bifrost", url=on.url),
                                 Target(name="off", kind="bifrost", url=off.url)], policy=Policy())
        snapshot = take_snapshot(config)
    loaded = Snapshot.load(snapshot.save(tmp_path / "snap"))
    assert loaded.target("on").bifrost.runtime == snapshot.target("on").bifrost.runtime is not None  # type: ignore[union-attr]
    assert loaded.target("off").bifrost.runtime_error == snapshot.target("off").bifrost.runtime_error  # type: ignore[union-attr]
    before = {t["name"]: t["boot_memory"] for t in scan_report(snapshot, config)["targets"]}
    after = {t["name"]: t["boot_memory"] for t in scan_report(loaded, config)["targets"]}
    assert before == after and before["on"]["model"] == "measured" and before["off"]["model"] == "band"
