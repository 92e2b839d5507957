"""Bifrost boot memory from what the gateway measures: the measured model, its calibration, the band fallback.

Pure: figures in, figures out, no I/O and no clock. The model, from one read of the gateway's runtime
metrics (``go_goroutines`` G, ``go_memstats_stack_inuse_bytes`` S, ``process_resident_memory_bytes`` R) and
its provider records (W: the workers the records park, :func:`~gatewayscope.analysis.pools.classify_records`):

* **stack per goroutine** s = S / G, what a goroutine of this gateway really holds (the band guesses 2-8 KiB);
* **baseline** B = R - G x s = R - S, what the gateway holds besides its goroutines' stacks (heap, runtime,
  binary); it is measured on the running gateway, so it includes what traffic grew, and errs high for a boot;
* **predicted boot memory** P = B + W x s: a restart starts every stored record's workers before it serves
  anything, so it needs the baseline plus the records' parked workers at the measured stack;
* **calibration error** (P - R) / R: the model applied to the gateway as it runs now (the same records, the
  same pools) against what it holds now. It is -(G - W) x s / R: negative when the gateway runs goroutines
  besides the records' workers (its HTTP server and runtime, requests in flight, a leak), whose stacks the
  boot prediction leaves out. Near 0 means the records explain what the gateway holds.

The figures are **trusted** only when they describe this gateway's workers: G between W minus
max(:data:`SHORTFALL_MIN`, :data:`SHORTFALL_RATIO` x W) and W plus max(:data:`SLACK_MIN`, :data:`SLACK_RATIO` x W),
s at least Go's smallest stack (:data:`GO_MIN_STACK_BYTES`), and R at least S. Metrics that fail a check
are reported with the reason and the band is used, as it is when no metrics answered.

The measured verdict: "no" when P is over the memory limit, "at risk" when P plus a margin (the larger of
:data:`MEASURED_MARGIN` and the calibration error's size, of P) is over it, "yes" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gatewayscope.snapshot import RuntimeMetrics

if TYPE_CHECKING:  # pools builds on this module (its summary holds the prediction)
    from gatewayscope.analysis.pools import BootEstimate

MEASURED = "measured"
BAND = "band"
MODELS = (MEASURED, BAND)
#: Go's smallest goroutine stack: no Go process reports less per goroutine
GO_MIN_STACK_BYTES = 2048
#: goroutines a gateway may run besides its records' workers (server, runtime, requests in flight)
SLACK_MIN = 1000
SLACK_RATIO = 0.5
#: fewer goroutines than parked workers (a read in the middle of a provider update)
SHORTFALL_MIN = 64
SHORTFALL_RATIO = 0.01
#: the least headroom a measured "yes" keeps below the limit, as a fraction of the prediction
MEASURED_MARGIN = 0.05
#: of the memory limit, kept free while records are resized (requests and the runtime allocate meanwhile)
SHRINK_RESERVE_RATIO = 0.1
_MIB = 1024 * 1024


@dataclass(frozen=True)
class MeasuredFigures:
    """What the gateway measured, and what the model makes of it."""

    goroutines: int
    stack_inuse_bytes: int
    resident_memory_bytes: int
    stack_bytes_per_goroutine: float
    baseline_bytes: int
    #: goroutines besides the records' parked workers (G - W; negative: fewer than the records say)
    other_goroutines: int
    #: (baseline + W x s - R) / R
    calibration_error_ratio: float
    trusted: bool
    #: why the figures are not trusted (None when they are)
    untrusted_reason: str | None


@dataclass(frozen=True)
class BootMemory:
    """The boot-memory prediction of one gateway and the model that made it.

    ``model`` is "measured" (trusted runtime metrics) or "band" (none, or not trusted: ``reason`` says why).
    ``predicted_bytes``: the measured prediction, or the band's high bound (8 KiB per parked worker).
    ``survives_restart`` and ``records_to_limit`` follow the model (with the band: as
    :class:`~gatewayscope.analysis.pools.BootEstimate` judges them). ``measured`` holds the figures whenever
    metrics answered, trusted or not.
    """

    model: str
    predicted_bytes: int
    memory_limit_bytes: int
    parked_workers: int
    survives_restart: str
    records_to_limit: int | None
    measured: MeasuredFigures | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        measured = None
        if self.measured is not None:
            m = self.measured
            measured = {"goroutines": m.goroutines, "stack_inuse_bytes": m.stack_inuse_bytes,
                        "resident_memory_bytes": m.resident_memory_bytes,
                        "stack_bytes_per_goroutine": round(m.stack_bytes_per_goroutine, 1),
                        "baseline_bytes": m.baseline_bytes, "other_goroutines": m.other_goroutines,
                        "calibration_error_ratio": round(m.calibration_error_ratio, 6), "trusted": m.trusted}
        return {"model": self.model, "predicted_bytes": self.predicted_bytes,
                "memory_limit_bytes": self.memory_limit_bytes, "survives_restart": self.survives_restart,
                "records_to_limit": self.records_to_limit, "measured": measured, "reason": self.reason}


def goroutine_tolerance(parked_workers: int) -> tuple[int, int]:
    """(fewest, most) goroutines a gateway whose records park ``parked_workers`` may report and be trusted.

    >>> goroutine_tolerance(9576)
    (9480, 14364)
    >>> goroutine_tolerance(0)
    (0, 1000)
    """
    shortfall = max(SHORTFALL_MIN, math.ceil(SHORTFALL_RATIO * parked_workers))
    slack = max(SLACK_MIN, math.ceil(SLACK_RATIO * parked_workers))
    return max(0, parked_workers - shortfall), parked_workers + slack


def measured_figures(runtime: RuntimeMetrics, parked_workers: int) -> MeasuredFigures:
    """The model's figures from one read of the runtime metrics, and whether they can be trusted.

    >>> from gatewayscope.snapshot import RuntimeMetrics
    >>> runtime = RuntimeMetrics(url="u", goroutines=9640, stack_inuse_bytes=9640 * 8192,
    ...                          resident_memory_bytes=64 * 2**20 + 9640 * 8192)
    >>> m = measured_figures(runtime, 9576)
    >>> m.stack_bytes_per_goroutine, m.baseline_bytes, m.other_goroutines, round(m.calibration_error_ratio, 4)
    (8192.0, 67108864, 64, -0.0036)
    >>> measured_figures(runtime, 100).untrusted_reason
    'they report 9,640 goroutines where the records park 100 workers (trusted: 36 to 1,100)'
    """
    goroutines = round(runtime.goroutines)
    stacks = round(runtime.stack_inuse_bytes)
    resident = round(runtime.resident_memory_bytes)
    per_goroutine = stacks / goroutines if goroutines > 0 else 0.0
    baseline = resident - stacks
    predicted_now = baseline + parked_workers * per_goroutine
    calibration = (predicted_now - resident) / resident if resident > 0 else 0.0
    fewest, most = goroutine_tolerance(parked_workers)
    reason: str | None = None
    if goroutines <= 0:
        reason = "they report no goroutines"
    elif not fewest <= goroutines <= most:
        reason = (f"they report {goroutines:,} goroutines where the records park {parked_workers:,} workers "
                  f"(trusted: {fewest:,} to {most:,})")
    elif per_goroutine < GO_MIN_STACK_BYTES:
        reason = (f"they report {stacks:,} bytes of stacks for {goroutines:,} goroutines, {per_goroutine:,.0f} "
                  f"bytes each, below Go's {GO_MIN_STACK_BYTES:,}-byte minimum")
    elif resident < stacks:
        reason = f"they report {resident:,} bytes resident, less than the {stacks:,} bytes of stacks in use"
    return MeasuredFigures(goroutines=goroutines, stack_inuse_bytes=stacks, resident_memory_bytes=resident,
                           stack_bytes_per_goroutine=per_goroutine, baseline_bytes=baseline,
                           other_goroutines=goroutines - parked_workers, calibration_error_ratio=calibration,
                           trusted=reason is None, untrusted_reason=reason)


def _records_to_limit(baseline: int, workers: int, records: int, per_worker: float, limit: int) -> int | None:
    """Smallest whole N with baseline + N x (workers / records) x per_worker > limit."""
    if records <= 0 or workers <= 0 or per_worker <= 0:
        return None
    if baseline > limit:
        return 0
    return math.floor((limit - baseline) * records / (workers * per_worker)) + 1


def boot_memory(estimate: BootEstimate, runtime: RuntimeMetrics | None, runtime_error: str | None) -> BootMemory:
    """The boot-memory prediction of a gateway: the measured model when its metrics answered and are trusted,
    else the band of ``estimate`` with the reason.

    >>> from gatewayscope.analysis.pools import BootEstimate
    >>> estimate = BootEstimate(records=12, parked_workers=9576, stack_bytes_low=9576 * 2048,
    ...                         stack_bytes_high=9576 * 8192, memory_limit_bytes=512 * 2**20,
    ...                         survives_restart="yes", records_to_limit_low=329, records_to_limit_high=83)
    >>> band = boot_memory(estimate, None, "no metrics; the boot estimate uses the 2-8 KiB band.")
    >>> band.model, band.predicted_bytes, band.survives_restart, band.records_to_limit
    ('band', 78446592, 'yes', 83)
    """
    limit = estimate.memory_limit_bytes
    workers = estimate.parked_workers
    measured = measured_figures(runtime, workers) if runtime is not None else None
    if measured is None or not measured.trusted:
        reason = runtime_error
        if measured is not None:
            url = runtime.url if runtime is not None else ""
            reason = f"the metrics at {url} are not trusted: {measured.untrusted_reason}; the boot estimate uses " \
                     "the 2-8 KiB band."
        return BootMemory(model=BAND, predicted_bytes=estimate.stack_bytes_high, memory_limit_bytes=limit,
                          parked_workers=workers, survives_restart=estimate.survives_restart,
                          records_to_limit=estimate.records_to_limit_high, measured=measured, reason=reason)
    per_worker = measured.stack_bytes_per_goroutine
    predicted = round(measured.baseline_bytes + workers * per_worker)
    margin = max(MEASURED_MARGIN, abs(measured.calibration_error_ratio)) * predicted
    if predicted > limit:
        verdict = "no"
    elif predicted + margin > limit:
        verdict = "at risk"
    else:
        verdict = "yes"
    return BootMemory(model=MEASURED, predicted_bytes=predicted, memory_limit_bytes=limit, parked_workers=workers,
                      survives_restart=verdict,
                      records_to_limit=_records_to_limit(measured.baseline_bytes, workers, estimate.records,
                                                         per_worker, limit),
                      measured=measured, reason=None)


def _mib(value: float) -> str:
    return f"{value / _MIB:,.1f} MiB"


def boot_memory_sentence(figures: dict[str, Any]) -> str:
    """One sentence on the measured figures (or why there are none), from the ``boot_memory`` dict of a
    scan report's target (:meth:`BootMemory.to_json`).

    >>> figures = {"model": "measured", "predicted_bytes": 145555456, "memory_limit_bytes": 536870912,
    ...            "survives_restart": "yes", "records_to_limit": 72, "reason": None,
    ...            "measured": {"goroutines": 9640, "resident_memory_bytes": 146079744,
    ...                         "stack_bytes_per_goroutine": 8192.0, "baseline_bytes": 67108864,
    ...                         "calibration_error_ratio": -0.003589, "trusted": True}}
    >>> print(boot_memory_sentence(figures))
    Measured: the gateway holds 139.3 MiB (9,640 goroutines at 8.0 KiB of stack each, 64.0 MiB besides their \
stacks); a restart would need 138.8 MiB, within its 512.0 MiB memory limit, and the limit is crossed at 72 \
records of this average size; the model predicts the running gateway within 0.4%.
    """
    measured = figures.get("measured")
    if figures.get("model") != MEASURED or not measured:
        reason = figures.get("reason") or "no runtime metrics were read; the boot estimate uses the 2-8 KiB band."
        return f"Runtime metrics: {reason}"
    limit = _mib(int(figures["memory_limit_bytes"]))
    verdict = {"yes": f"within its {limit} memory limit",
               "no": f"over its {limit} memory limit"}.get(figures["survives_restart"],
                                                          f"too close to its {limit} memory limit to be sure")
    crossing = figures.get("records_to_limit")
    tail = (f", and the limit is crossed at {int(crossing):,} records of this average size"
            if crossing is not None and figures["survives_restart"] != "no" else "")
    return (f"Measured: the gateway holds {_mib(measured['resident_memory_bytes'])} "
            f"({measured['goroutines']:,} goroutines at {measured['stack_bytes_per_goroutine'] / 1024:,.1f} KiB of "
            f"stack each, {_mib(measured['baseline_bytes'])} besides their stacks); a restart would need "
            f"{_mib(figures['predicted_bytes'])}, {verdict}{tail}; the model predicts the running gateway within "
            f"{abs(float(measured['calibration_error_ratio'])):.1%}.")


@dataclass(frozen=True)
class ShrinkConcurrency:
    """How many records of one gateway apply resizes at once, and why."""

    concurrency: int
    reason: str
    #: the memory the transients may use: limit - resident - reserve (None: unknown)
    headroom_bytes: int | None = None


def shrink_concurrency(new_pools: Sequence[int], *, requested: int, memory_limit_bytes: int,
                       measured: MeasuredFigures | None) -> ShrinkConcurrency:
    """How many pool resizes of one gateway may run at once so that their transient stays within its memory.

    A provider update may start the record's new pool before its old one retires (the newest core;
    the emulator's ``update_overlap``): for a moment the record runs both. Its old pool is already in what
    the gateway holds, so k resizes at once add their k new pools: the k largest of ``new_pools`` (workers)
    at the measured stack per goroutine must fit in the headroom, the limit minus the resident memory minus a
    reserve of :data:`SHRINK_RESERVE_RATIO` of the limit. Without trusted measured figures the headroom is
    unknown, and when not even the largest new pool fits it is too small: one record at a time.

    >>> m = MeasuredFigures(goroutines=10_064, stack_inuse_bytes=10_064 * 8192, resident_memory_bytes=400 * _MIB,
    ...                     stack_bytes_per_goroutine=8192.0, baseline_bytes=0, other_goroutines=64,
    ...                     calibration_error_ratio=0.0, trusted=True, untrusted_reason=None)
    >>> shrink_concurrency([64] * 10, requested=8, memory_limit_bytes=512 * _MIB, measured=m).concurrency
    8
    >>> shrink_concurrency([4000, 4000, 4000], requested=8, memory_limit_bytes=512 * _MIB, measured=m).concurrency
    1
    >>> print(shrink_concurrency([64], requested=4, memory_limit_bytes=512 * _MIB, measured=None).reason)
    one record at a time: the gateway's memory headroom is unknown (no trusted runtime metrics)
    """
    requested = max(1, requested)
    if measured is None or not measured.trusted:
        return ShrinkConcurrency(1, "one record at a time: the gateway's memory headroom is unknown (no trusted "
                                    "runtime metrics)")
    per_worker = measured.stack_bytes_per_goroutine
    headroom = memory_limit_bytes - measured.resident_memory_bytes - round(SHRINK_RESERVE_RATIO * memory_limit_bytes)
    costs = sorted((max(0, n) * per_worker for n in new_pools), reverse=True)
    fits, total = 0, 0.0
    for cost in costs:
        if total + cost > headroom:
            break
        total += cost
        fits += 1
    room = f"{max(0, headroom) / _MIB:,.1f} MiB of headroom (the limit less the resident memory and a reserve)"
    if fits == 0:
        return ShrinkConcurrency(1, f"one record at a time: {room} does not hold even the largest new pool at "
                                    f"{per_worker:,.0f} bytes per worker", headroom)
    concurrency = min(requested, fits)
    return ShrinkConcurrency(concurrency, f"{concurrency} at a time: {room} holds the new pools of the "
                                          f"{fits:,} largest resizes at {per_worker:,.0f} bytes per worker", headroom)
