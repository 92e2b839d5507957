"""The boot-memory model (gatewayscope.analysis.memory) on figures worked out by hand: the measured prediction,
its calibration error, the trust checks at their boundaries, the verdict's margin, and the band fallback."""

from __future__ import annotations

import pytest

from gatewayscope.analysis.memory import (
    BAND,
    MEASURED,
    MeasuredFigures,
    boot_memory,
    boot_memory_sentence,
    goroutine_tolerance,
    measured_figures,
)
from gatewayscope.analysis.pools import BootEstimate
from gatewayscope.snapshot import RuntimeMetrics

MIB = 1024 * 1024


def estimate(workers: int = 10_000, records: int = 10, limit: int = 512 * MIB) -> BootEstimate:
    low, high = workers * 2048, workers * 8192
    verdict = "yes" if high <= limit else "no" if low > limit else "at risk"
    return BootEstimate(records=records, parked_workers=workers, stack_bytes_low=low, stack_bytes_high=high,
                        memory_limit_bytes=limit, survives_restart=verdict,
                        records_to_limit_low=limit * records // low + 1,
                        records_to_limit_high=limit * records // high + 1)


def runtime(goroutines: int, stack: int, baseline: int) -> RuntimeMetrics:
    return RuntimeMetrics(url="http://gw/metrics", goroutines=goroutines, stack_inuse_bytes=goroutines * stack,
                          resident_memory_bytes=baseline + goroutines * stack)


def test_the_measured_prediction_by_hand() -> None:
    # 10,000 workers + 500 other goroutines at 6 KiB, 100 MiB besides the stacks
    memory = boot_memory(estimate(), runtime(10_500, 6144, 100 * MIB), None)
    assert memory.model == MEASURED and memory.reason is None
    assert memory.measured is not None
    assert memory.measured.stack_bytes_per_goroutine == 6144
    assert memory.measured.baseline_bytes == 100 * MIB
    assert memory.predicted_bytes == 100 * MIB + 10_000 * 6144
    resident = 100 * MIB + 10_500 * 6144
    assert memory.measured.calibration_error_ratio == pytest.approx(-500 * 6144 / resident)
    # (512 - 100) MiB x 10 records / (10,000 x 6,144) = 70.3 -> 71
    assert memory.records_to_limit == 71 and memory.survives_restart == "yes"


@pytest.mark.parametrize("limit,verdict", [
    (100 * MIB + 10_000 * 6144 - 1, "no"),   # one byte short
    (100 * MIB + 10_000 * 6144, "at risk"),  # fits, but not by the 5 % margin
    (int((100 * MIB + 10_000 * 6144) * 1.05) + 1, "yes"),
])
def test_the_measured_verdict_keeps_a_margin(limit: int, verdict: str) -> None:
    memory = boot_memory(estimate(limit=limit), runtime(10_000, 6144, 100 * MIB), None)
    assert memory.survives_restart == verdict


def test_a_large_calibration_error_widens_the_margin() -> None:
    predicted = 100 * MIB + 10_000 * 6144
    limit = int(predicted * 1.08)  # 8 % of room: enough at a 5 % margin, not at a 10 % calibration error
    calm = boot_memory(estimate(limit=limit), runtime(10_000, 6144, 100 * MIB), None)
    busy_goroutines = 10_000 + 3_000  # 3,000 requests in flight: within the trust slack
    busy = boot_memory(estimate(limit=limit), runtime(busy_goroutines, 6144, 100 * MIB), None)
    assert calm.survives_restart == "yes"
    assert busy.measured is not None and abs(busy.measured.calibration_error_ratio) > 0.08
    assert busy.survives_restart == "at risk"


def test_a_baseline_over_the_limit_crosses_it_at_zero_records() -> None:
    memory = boot_memory(estimate(limit=50 * MIB), runtime(10_000, 4096, 60 * MIB), None)
    assert memory.survives_restart == "no" and memory.records_to_limit == 0


@pytest.mark.parametrize("workers,fewest,most", [(0, 0, 1000), (1000, 936, 2000), (100_000, 99_000, 150_000)])
def test_the_goroutine_tolerance(workers: int, fewest: int, most: int) -> None:
    assert goroutine_tolerance(workers) == (fewest, most)


@pytest.mark.parametrize("goroutines,trusted", [(935, False), (936, True), (2000, True), (2001, False)])
def test_trust_at_the_goroutine_boundaries(goroutines: int, trusted: bool) -> None:
    assert measured_figures(runtime(goroutines, 8192, 10 * MIB), 1000).trusted is trusted


@pytest.mark.parametrize("metrics,reason", [
    (RuntimeMetrics(url="u", goroutines=1000, stack_inuse_bytes=1000 * 1024, resident_memory_bytes=50 * MIB),
     "1,024 bytes each, below Go's 2,048-byte minimum"),
    (RuntimeMetrics(url="u", goroutines=1000, stack_inuse_bytes=1000 * 8192, resident_memory_bytes=MIB),
     "less than the 8,192,000 bytes of stacks in use"),
    (runtime(50_000, 8192, 10 * MIB), "they report 50,000 goroutines where the records park 1,000 workers"),
])
def test_untrusted_figures_give_the_band_and_the_reason(metrics: RuntimeMetrics, reason: str) -> None:
    memory = boot_memory(estimate(workers=1000), metrics, None)
    assert memory.model == BAND and memory.measured is not None and memory.measured.trusted is False
    assert memory.predicted_bytes == 1000 * 8192  # the band's high bound
    assert memory.reason is not None and reason in memory.reason and "not trusted" in memory.reason
    assert memory.survives_restart == estimate(workers=1000).survives_restart


def test_no_metrics_is_the_band_with_the_reads_reason() -> None:
    memory = boot_memory(estimate(), None, "http://gw/metrics answered 404; the boot estimate uses the 2-8 KiB band.")
    assert (memory.model, memory.measured, memory.predicted_bytes) == (BAND, None, 10_000 * 8192)
    assert boot_memory_sentence(memory.to_json()) == (
        "Runtime metrics: http://gw/metrics answered 404; the boot estimate uses the 2-8 KiB band.")


def test_the_sentence_says_over_the_limit() -> None:
    memory = boot_memory(estimate(limit=64 * MIB), runtime(10_000, 8192, 64 * MIB), None)
    sentence = boot_memory_sentence(memory.to_json())
    assert "a restart would need 142.1 MiB, over its 64.0 MiB memory limit;" in sentence
    assert "crossed at" not in sentence


def trusted(resident: int, stack: float = 8192.0) -> MeasuredFigures:
    return MeasuredFigures(goroutines=1000, stack_inuse_bytes=1000 * int(stack), resident_memory_bytes=resident,
                           stack_bytes_per_goroutine=stack, baseline_bytes=0, other_goroutines=0,
                           calibration_error_ratio=0.0, trusted=True, untrusted_reason=None)


@pytest.mark.parametrize("pools,requested,expected", [
    ([1000] * 8, 8, 3),       # headroom 30.4 MiB: three 7.8 MiB pools fit, four do not
    ([1000] * 8, 2, 2),       # never more than asked
    ([4000, 100, 100], 8, 1),  # the largest (31.25 MiB) does not fit: one at a time
    ([64] * 4, 8, 4),
])
def test_shrink_concurrency_fits_the_largest_new_pools_in_the_headroom(pools: list[int], requested: int,
                                                                      expected: int) -> None:
    from gatewayscope.analysis.memory import shrink_concurrency

    # limit 512 MiB, reserve 51.2 MiB: 512 - 430.4 - 51.2 = 30.4 MiB of headroom
    limit = 512 * MIB
    resident = limit - round(0.1 * limit) - round(30.4 * MIB)
    assert shrink_concurrency(pools, requested=requested, memory_limit_bytes=limit,
                              measured=trusted(resident)).concurrency == expected


def test_shrink_concurrency_without_trusted_figures_is_one() -> None:
    from dataclasses import replace

    from gatewayscope.analysis.memory import shrink_concurrency

    untrusted = replace(trusted(10 * MIB), trusted=False, untrusted_reason="lies")
    result = shrink_concurrency([1] * 8, requested=8, memory_limit_bytes=512 * MIB, measured=untrusted)
    assert result.concurrency == 1 and "unknown" in result.reason
