"""Pool, boot-memory and reachability findings, against numbers worked out by hand."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from gatewayscope.analysis.pools import (
    BootEstimate,
    boot_estimate,
    classify_records,
    per_kind,
    unreachable_records,
)
from gatewayscope.config import CUSTOM_POOL_ENV, STANDARD_POOL_ENV, Policy, apply_env_file
from gatewayscope.snapshot import REACHABILITY_SCHEMA, RECORDS_SCHEMA, frame_from_rows

MIB = 1024 * 1024


def rec(name: str, custom: bool, concurrency: int, buffer: int, base_url: str | None = None,
        status: str = "active") -> tuple[object, ...]:
    return (name, custom, "openai" if custom else None, concurrency, buffer, base_url, status, f"fp-{name}")


#: two standard records (one over 512), three custom ones (one over 64; the __anthropic lane counts as
#: custom even without custom_provider_config)
RECORDS = frame_from_rows([
    rec("openai", False, 1000, 5000),
    rec("anthropic", False, 512, 8192),
    rec("acme__vllm__llama", True, 1000, 5000, "http://gone.invalid/v1"),
    rec("acme__openrouter__claude__anthropic", False, 64, 1024),
    rec("globex__vllm__qwen", True, 64, 1024, "https://GPU.example.com:8443/v1"),
], RECORDS_SCHEMA)


def test_classify_records_kind_pool_queue_and_stacks() -> None:
    out = classify_records(RECORDS, Policy())
    assert out.columns == [*RECORDS.columns, "kind", "target_pool", "target_queue", "over_pool", "parked_workers",
                           "queue_slots", "stack_bytes_low", "stack_bytes_high"]
    assert out["kind"].to_list() == ["standard", "standard", "custom", "custom", "custom"]
    assert out["target_pool"].to_list() == [512, 512, 64, 64, 64]
    assert out["target_queue"].to_list() == [512 * 16, 512 * 16, 64 * 16, 64 * 16, 64 * 16]  # 8192, 1024
    assert out["over_pool"].to_list() == [True, False, True, False, False]
    assert out["parked_workers"].to_list() == [1000, 512, 1000, 64, 64]
    assert out["queue_slots"].to_list() == [5000, 8192, 5000, 1024, 1024]
    # 2 KiB and 8 KiB per parked goroutine
    assert out["stack_bytes_low"].to_list() == [2_048_000, 1_048_576, 2_048_000, 131_072, 131_072]
    assert out["stack_bytes_high"].to_list() == [8_192_000, 4_194_304, 8_192_000, 524_288, 524_288]


def test_a_record_in_status_error_parks_nothing() -> None:
    # provider_status "error": the core holds no worker pool for it (e.g. a non-standard name without
    # custom_provider_config, which the core cannot build), so nothing is parked, at boot or now
    records = frame_from_rows([rec("legacy-lan-gateway", False, 1000, 5000, "http://localhost/v1", "error"),
                               rec("openai", False, 1000, 5000)], RECORDS_SCHEMA)
    out = classify_records(records, Policy())
    assert out.select("parked_workers", "queue_slots", "stack_bytes_low", "stack_bytes_high", "over_pool").rows() == [
        (0, 0, 0, 0, True),  # its stored pool is still over 512
        (1000, 5000, 2_048_000, 8_192_000, True),
    ]
    assert per_kind(out).rows()[0] == ("standard", 2, 1000, 5000, 2)


def test_classify_records_follows_the_policy() -> None:
    out = classify_records(RECORDS, Policy(standard_pool=1000, custom_pool=32, queue_per_worker=8))
    assert out["target_pool"].to_list() == [1000, 1000, 32, 32, 32]
    assert out["target_queue"].to_list() == [8000, 8000, 256, 256, 256]
    assert out["over_pool"].to_list() == [False, False, True, True, True]


def test_classify_records_with_the_platform_env_file(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text(f"{STANDARD_POOL_ENV}=abc\nexport {CUSTOM_POOL_ENV}=\"1000\"\n")
    policy = Policy()
    apply_env_file(policy, str(env))
    assert (policy.standard_pool, policy.custom_pool) == (512, 1000)  # unusable value keeps the default
    assert len(policy.warnings) == 1
    out = classify_records(RECORDS, policy)
    assert out["over_pool"].to_list() == [True, False, False, False, False]


def test_classify_records_of_an_empty_store() -> None:
    out = classify_records(frame_from_rows([], RECORDS_SCHEMA), Policy())
    assert out.height == 0 and "kind" in out.columns


def test_per_kind_sums() -> None:
    out = per_kind(classify_records(RECORDS, Policy()))
    assert out.columns == ["kind", "records", "parked_workers", "queue_slots", "over_pool"]
    assert out.rows() == [
        ("standard", 2, 1000 + 512, 5000 + 8192, 1),
        ("custom", 3, 1000 + 64 + 64, 5000 + 1024 + 1024, 1),
    ]


def test_per_kind_always_lists_both_kinds() -> None:
    assert per_kind(classify_records(frame_from_rows([], RECORDS_SCHEMA), Policy())).rows() == [
        ("standard", 0, 0, 0, 0), ("custom", 0, 0, 0, 0)]
    only_standard = frame_from_rows([rec("openai", False, 512, 8192)], RECORDS_SCHEMA)
    assert per_kind(classify_records(only_standard, Policy())).rows() == [
        ("standard", 1, 512, 8192, 0), ("custom", 0, 0, 0, 0)]


def test_boot_estimate_of_the_mixed_store() -> None:
    est = boot_estimate(classify_records(RECORDS, Policy()), 512 * MIB)
    workers = 1000 + 512 + 1000 + 64 + 64  # 2,640
    assert est == BootEstimate(
        records=5,
        parked_workers=workers,
        stack_bytes_low=workers * 2048,  # 5,406,720
        stack_bytes_high=workers * 8192,  # 21,626,880
        memory_limit_bytes=536_870_912,
        survives_restart="yes",
        # average per record: 1,081,344 low / 4,325,376 high; 536,870,912 / 1,081,344 = 496.48 -> crossed at 497
        records_to_limit_low=497,
        # 536,870,912 / 4,325,376 = 124.12 -> crossed at 125
        records_to_limit_high=125,
    )


def seed_store(count: int, workers: int) -> pl.DataFrame:
    rows = [rec(f"org{i}__vllm__m", True, workers, max(workers * 5, 1)) for i in range(count)]
    return classify_records(frame_from_rows(rows, RECORDS_SCHEMA), Policy())


def test_boot_estimate_the_seed_numbers() -> None:
    # a hundred custom records at the default 1,000 workers: 100,000 goroutines
    est = boot_estimate(seed_store(100, 1000), 512 * MIB)
    assert est.parked_workers == 100_000
    assert (est.stack_bytes_low, est.stack_bytes_high) == (204_800_000, 819_200_000)  # 195.3 / 781.3 MiB
    assert est.survives_restart == "at risk"
    # per record 2,048,000 / 8,192,000 bytes: 536,870,912 / 8,192,000 = 65.5 -> 66; / 2,048,000 = 262.1 -> 263
    assert (est.records_to_limit_low, est.records_to_limit_high) == (263, 66)
    # the same hundred at the custom pool of 64: 6,400 workers, 50 MiB at the high bound
    small = boot_estimate(seed_store(100, 64), 512 * MIB)
    assert (small.parked_workers, small.stack_bytes_high, small.survives_restart) == (6_400, 50 * MIB, "yes")
    # 300 records at 1,000: even the low bound (585.9 MiB) is over 512 MiB
    assert boot_estimate(seed_store(300, 1000), 512 * MIB).survives_restart == "no"


@pytest.mark.parametrize(("limit", "verdict"), [
    (8_192_000, "yes"),  # high bound exactly at the limit fits
    (8_191_999, "at risk"),
    (2_048_000, "at risk"),  # low bound exactly at the limit still fits
    (2_047_999, "no"),
])
def test_boot_estimate_verdict_edges(limit: int, verdict: str) -> None:
    assert boot_estimate(seed_store(1, 1000), limit).survives_restart == verdict


def test_records_to_limit_counts_the_record_that_crosses() -> None:
    # 4 records of 1,000 workers = 8,192,000 bytes each at the high bound; a 4-record limit is crossed at 5
    est = boot_estimate(seed_store(4, 1000), 4 * 8_192_000)
    assert est.records_to_limit_high == 5
    assert est.survives_restart == "yes"


def test_boot_estimate_without_records() -> None:
    est = boot_estimate(seed_store(0, 1000), 512 * MIB)
    assert (est.records, est.stack_bytes_low, est.stack_bytes_high) == (0, 0, 0)
    assert est.survives_restart == "yes"
    assert (est.records_to_limit_low, est.records_to_limit_high) == (None, None)


def test_unreachable_records() -> None:
    records = frame_from_rows([
        rec("dns", True, 64, 1024, "http://gone.invalid/v1"),
        rec("status", False, 512, 8192, None, "error"),
        rec("both", True, 64, 1024, "https://GONE.invalid:443/x", "error"),
        rec("ok", True, 64, 1024, "https://gpu.example.com/v1"),
        rec("unchecked", True, 64, 1024, "https://never-looked-up.example/v1"),
        rec("builtin", False, 512, 8192),
        rec("slow", True, 64, 1024, "http://slow.example"),
    ], RECORDS_SCHEMA)
    reach = frame_from_rows([
        ("gone.invalid", False, "no such host"),
        ("gpu.example.com", True, None),
        ("slow.example", False, "lookup timed out after 5 s"),
    ], REACHABILITY_SCHEMA)
    out = unreachable_records(records, reach)
    assert out.columns == ["name", "base_url", "host", "provider_status", "reason"]
    assert out.select("name", "host", "reason").rows() == [
        ("dns", "gone.invalid", "base URL host gone.invalid does not resolve: no such host"),
        ("status", None, "provider_status is error"),
        ("both", "gone.invalid", "base URL host gone.invalid does not resolve: no such host; provider_status is error"),
        ("slow", "slow.example", "base URL host slow.example does not resolve: lookup timed out after 5 s"),
    ]


def test_unreachable_records_of_an_empty_store() -> None:
    out = unreachable_records(frame_from_rows([], RECORDS_SCHEMA), frame_from_rows([], REACHABILITY_SCHEMA))
    assert out.height == 0
