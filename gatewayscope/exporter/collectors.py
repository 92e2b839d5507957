"""Metric families built fresh on every scrape from TargetSnapshots (a Collector is just ``collect()``).

The metric names, types and labels in :data:`METRICS` are a public contract: the dashboards, the alert
rules and users' own queries depend on them. :func:`target_samples` turns one target's values into
samples from that read's findings (:func:`gatewayscope.analysis.findings.target_findings`, the findings every
other view reads); the collectors only group the samples into families. Nothing here does I/O.

No session id, trace id, URL or secret ever becomes a label value: the only label values are target
names from the config, fixed vocabularies (kind, confidence, bound, setting, result, source, model,
status), the package version, Bifrost provider record names (capped, see :func:`record_series`), and the
Kubernetes namespace, pod and container a target's config names.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gatewayscope import __version__
from gatewayscope.config import KubernetesPod, Policy
from gatewayscope.exporter.cache import RESULTS, SOURCES, TargetResult
from gatewayscope.snapshot import TargetSnapshot

if TYPE_CHECKING:
    from gatewayscope.analysis.findings import TargetFindings

log = logging.getLogger(__name__)

#: the label value that sums every Bifrost record beyond the cap
OTHER_RECORDS = "_other"
CONFIDENCES = ("confirmed", "suspected")
BOUNDS = ("low", "high")
RECORD_KINDS = ("standard", "custom")
POSTURE_SETTINGS = ("drop_excess_requests", "enforce_auth_on_inference", "disable_content_logging")
#: the boot-memory models (gatewayscope.analysis.memory.MODELS) and the states of a target's runtime metrics
BOOT_MEMORY_MODELS = ("measured", "band")
RUNTIME_METRICS_STATUSES = ("trusted", "untrusted", "absent")
#: how a SQLite trace store was read, and why a read was full (gatewayscope.sources.rllm_sqlite_incremental's MODES
#: and FULL_REASONS, which tests/exporter checks these against: the sources load only when a target is read)
STORE_READ_MODES = ("incremental", "full", "guarded")
FULL_READ_REASONS = ("first", "interval", "file", "schema", "rows")


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: its exposition name (counters end in ``_total``), type, labels, HELP."""

    name: str
    type: str  # "gauge" | "counter"
    labels: tuple[str, ...]
    help: str
    #: True for the values read from a target (their HELP says how old they may be)
    per_target: bool = True


_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("gatewayscope_up", "gauge", ("target", "kind"),
               "1 when the exporter's last read of the target succeeded, 0 when the target was down, answered "
               "something unusable, or missed this scrape's deadline (kind: rllm|bifrost)."),
    MetricSpec("gatewayscope_scrape_duration_seconds", "gauge", ("target",),
               "Seconds the read of the target behind these values took (for a missed deadline: how long this "
               "scrape waited)."),
    MetricSpec("gatewayscope_build_info", "gauge", ("version",),
               "Always 1; the version label is the gatewayscope version of this exporter.", per_target=False),
    MetricSpec("gatewayscope_trace_store_sessions", "gauge", ("target",),
               "Sessions the rLLM trace store lists."),
    MetricSpec("gatewayscope_trace_store_traces", "gauge", ("target",),
               "Traces the rLLM trace store holds across all its sessions."),
    MetricSpec("gatewayscope_trace_store_orphan_sessions", "gauge", ("target", "confidence"),
               "Orphan sessions in the rLLM trace store: confirmed (every trace it has was dispatched before its "
               "latest delete: its tombstone's, or one an apply journal recorded) or suspected (one trace, idle "
               "past the policy's orphan_idle_seconds, behind the current weight version where known)."),
    MetricSpec("gatewayscope_trace_store_oldest_orphan_age_seconds", "gauge", ("target",),
               "Seconds since the newest trace of the oldest orphan session was written, as of the read; 0 when "
               "there is no orphan."),
    MetricSpec("gatewayscope_trace_store_tombstones", "gauge", ("target",),
               "Deleted session ids the tombstone guard remembers (present only where the guard is installed)."),
    MetricSpec("gatewayscope_trace_store_tombstone_capacity", "gauge", ("target",),
               "Most tombstones the guard keeps before evicting the oldest; 0 means unlimited (SQLite triggers) "
               "or disabled (guarded launcher with --max-tombstones 0)."),
    MetricSpec("gatewayscope_trace_store_dropped_writes_total", "counter", ("target",),
               "Trace writes the guard dropped because their request reached the gateway before their session's "
               "latest delete (stragglers: each would have resurrected an orphan); resets when a guarded launcher "
               "restarts."),
    MetricSpec("gatewayscope_trace_store_kept_after_fence_writes_total", "counter", ("target",),
               "Trace writes the guard kept for a deleted session id because their request reached the gateway "
               "after its latest delete (new uses of the id: rLLM reuses ids across steps and retries); resets "
               "when a guarded launcher restarts."),
    MetricSpec("gatewayscope_bifrost_provider_records", "gauge", ("target", "kind"),
               "Stored Bifrost provider records, by kind (standard|custom; Anthropic lanes count as custom)."),
    MetricSpec("gatewayscope_bifrost_parked_workers", "gauge", ("target", "kind"),
               "Worker goroutines the stored records park from boot on (the sum of their concurrency; a record "
               "in provider_status error has no pool and parks none), by kind."),
    MetricSpec("gatewayscope_bifrost_queue_slots", "gauge", ("target", "kind"),
               "Queue slots the stored records hold (the sum of their buffer_size, none for a record in "
               "provider_status error), by kind."),
    MetricSpec("gatewayscope_bifrost_record_parked_workers", "gauge", ("target", "record", "kind"),
               "Worker goroutines one provider record parks; only the records with the most parked workers "
               "get a series (max_record_series), the rest are summed per kind under record=\"_other\"."),
    MetricSpec("gatewayscope_bifrost_worker_stack_bytes", "gauge", ("target", "bound"),
               "Bytes of goroutine stacks the parked workers need at boot: bound=low at 2 KiB per worker, "
               "bound=high at 8 KiB per worker."),
    MetricSpec("gatewayscope_bifrost_memory_limit_bytes", "gauge", ("target",),
               "The gateway's memory limit as configured for this target (memory_limit_bytes)."),
    MetricSpec("gatewayscope_bifrost_records_over_pool", "gauge", ("target", "kind"),
               "Provider records whose concurrency is above the pool policy for their kind."),
    MetricSpec("gatewayscope_bifrost_unreachable_records", "gauge", ("target",),
               "Provider records whose base URL host does not resolve from the exporter, or whose "
               "provider_status is error."),
    MetricSpec("gatewayscope_bifrost_posture_drift", "gauge", ("target", "setting"),
               "1 when the client setting is away from the safe posture (drop_excess_requests off, "
               "enforce_auth_on_inference on, disable_content_logging on), else 0."),
    MetricSpec("gatewayscope_bifrost_boot_memory_predicted_bytes", "gauge", ("target", "model"),
               "Memory a restart of the gateway would need, by the model used (one series per target): "
               "model=measured from the gateway's own runtime metrics (what it holds besides its goroutines' "
               "stacks, plus the parked workers at its measured stack per goroutine), model=band when there are "
               "none or they are not trusted (the parked workers at 8 KiB each, the band's high bound)."),
    MetricSpec("gatewayscope_bifrost_goroutines", "gauge", ("target",),
               "Goroutines the gateway reports running (its go_goroutines), when its runtime metrics answered."),
    MetricSpec("gatewayscope_bifrost_resident_memory_bytes", "gauge", ("target",),
               "Resident memory the gateway reports holding now (its process_resident_memory_bytes), when its "
               "runtime metrics answered."),
    MetricSpec("gatewayscope_bifrost_measured_stack_bytes_per_goroutine", "gauge", ("target",),
               "The gateway's goroutine stacks in use over its goroutines (go_memstats_stack_inuse_bytes / "
               "go_goroutines): what one parked worker costs it, in place of the 2-8 KiB band."),
    MetricSpec("gatewayscope_bifrost_measured_baseline_bytes", "gauge", ("target",),
               "What the gateway holds besides its goroutines' stacks (resident memory minus stacks in use): "
               "the part of the measured prediction that does not grow with the records."),
    MetricSpec("gatewayscope_bifrost_boot_memory_calibration_error_ratio", "gauge", ("target",),
               "The measured model applied to the running gateway (its baseline plus its records' parked workers "
               "at the measured stack) minus the resident memory it holds, over that resident memory; near 0 the "
               "records explain what it holds, negative it runs goroutines besides them."),
    MetricSpec("gatewayscope_bifrost_runtime_metrics_status", "gauge", ("target", "status"),
               "1 for the state of the gateway's runtime metrics at the last read, else 0: trusted (the measured "
               "model is used), untrusted (they do not match the records' parked workers: the band is used), "
               "absent (not read, or no usable answer: the band is used)."),
    MetricSpec("gatewayscope_bifrost_kubernetes_info", "gauge",
               ("target", "gateway_namespace", "gateway_pod", "gateway_container"),
               "Always 1: the gateway's pod as the target's [targets.kubernetes] table names it (empty labels "
               "when it names none), for joining kube-state-metrics' container memory limit; gateway_ names, "
               "so a scrape's own namespace, pod and container target labels cannot collide with them."),
    MetricSpec("gatewayscope_exporter_snapshot_age_seconds", "gauge", ("target",),
               "Seconds since the read behind this scrape's values of the target started (absent when the "
               "scrape missed its deadline)."),
    MetricSpec("gatewayscope_exporter_target_reads_total", "counter", ("target", "result"),
               "Reads of the target the exporter completed, by result (ok|error).", per_target=False),
    MetricSpec("gatewayscope_exporter_target_scrapes_total", "counter", ("target", "source"),
               "Scrapes that asked for the target, by where its values came from: read (a new read), joined "
               "(a read already running), cached (the last read, within min_interval_seconds), deadline "
               "(none in time: up 0).", per_target=False),
    MetricSpec("gatewayscope_exporter_read_in_progress", "gauge", ("target",),
               "1 while a read of the target is running (a hung gateway keeps it at 1), else 0.",
               per_target=False),
    MetricSpec("gatewayscope_exporter_store_reads_total", "counter", ("target", "mode"),
               "Reads of a SQLite trace-store target, by mode: incremental (only the rows added since the last "
               "read), full (everything), guarded (the store has the tombstone guard installed: read as the "
               "scan reads it). Only SQLite targets have it.", per_target=False),
    MetricSpec("gatewayscope_exporter_store_full_reads_total", "counter", ("target", "reason"),
               "Full reads of a SQLite trace-store target, by why the exporter could not read only what was added: "
               "first (no earlier read, or it failed), interval (full_read_interval_seconds passed), file "
               "(replaced or shrunk), schema (schema changed: VACUUM, guard install or uninstall), rows (rows "
               "up to the last read's watermark were deleted or replaced).", per_target=False),
)

#: every metric the exporter can serve, by exposition name
#: what a heal inside the exporter serves (``gatewayscope export --heal``; see docs/heal.md)
HEAL_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("gatewayscope_heal_actions_total", "counter", ("target", "kind", "outcome"),
               "Actions heal applied (enforce) since it started, by target, action kind and outcome (done, "
               "refused, unconfirmed, gone, stale, already-done, or skipped: stopped by the kill switch, a window, "
               "a blocker or the error budget before it started).", per_target=False),
    MetricSpec("gatewayscope_heal_passes_total", "counter", ("result",),
               "Heal passes since it started, by result: ok, blocked (paused, breaker open, outside every window "
               "or a blocker alert firing: nothing was written) or error (the pass could not run).",
               per_target=False),
    MetricSpec("gatewayscope_heal_last_pass_timestamp_seconds", "gauge", (),
               "When the last heal pass ended (Unix seconds); absent before the first pass.", per_target=False),
    MetricSpec("gatewayscope_heal_last_pass_duration_seconds", "gauge", (),
               "Seconds the last heal pass took (read, plan, apply).", per_target=False),
    MetricSpec("gatewayscope_heal_interval_seconds", "gauge", (),
               "The configured time between two heal passes ([heal] interval_seconds).", per_target=False),
    MetricSpec("gatewayscope_heal_breaker_open", "gauge", (),
               "1 while heal's breaker holds every write (its error budget ran out; an operator resets it with "
               "'gatewayscope heal reset'), else 0.", per_target=False),
    MetricSpec("gatewayscope_heal_errors_in_window", "gauge", (),
               "Refused, unconfirmed and stale outcomes in the breaker's window since its last reset; at "
               "gatewayscope_heal_error_budget the breaker opens.", per_target=False),
    MetricSpec("gatewayscope_heal_error_budget", "gauge", (),
               "The errors the breaker's window allows before it opens ([heal.breaker] max_errors).",
               per_target=False),
    MetricSpec("gatewayscope_heal_paused", "gauge", (),
               "1 while heal's kill switch is on (its pause file exists), else 0.", per_target=False),
    MetricSpec("gatewayscope_heal_blocked", "gauge", ("reason",),
               "1 when this reason held writes in the last pass (paused, breaker, window, alert; gateway-health "
               "holds only the target whose health check failed), else 0.", per_target=False),
    MetricSpec("gatewayscope_heal_dry_run_actions", "gauge", ("target", "kind"),
               "Actions the last pass would have written but did not (their kind is in dry-run, or a block held "
               "it), by target and kind: what enforce would do.", per_target=False),
    MetricSpec("gatewayscope_heal_deferred_actions", "gauge", ("target", "kind"),
               "Actions the last pass left for a later pass because a cap (per pass, per target, per hour) was "
               "reached.", per_target=False),
    MetricSpec("gatewayscope_heal_enforced", "gauge", ("kind",),
               "1 for each action kind heal writes (mode enforce and the kind enforced), 0 for a kind it plans "
               "in dry-run.", per_target=False),
)

METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in (*_SPECS, *HEAL_SPECS)}
#: the names of heal's metrics (served only by an exporter that runs heal)
HEAL_METRICS = tuple(spec.name for spec in HEAL_SPECS)
#: the names of the public contract of every exporter (the others are the exporter's own and heal's, served only
#: with ``--heal``; all in docs/metrics.md)
CONTRACT_METRICS = tuple(name for name in METRICS
                         if not name.startswith("gatewayscope_exporter_") and name not in HEAL_METRICS)


@dataclass(frozen=True)
class Sample:
    """One value of one metric, with its labels in the spec's order."""

    name: str
    labels: tuple[str, ...]
    value: float


def _family(spec: MetricSpec, help_text: str) -> GaugeMetricFamily | CounterMetricFamily:
    if spec.type == "counter":
        base = spec.name[: -len("_total")] if spec.name.endswith("_total") else spec.name
        return CounterMetricFamily(base, help_text, labels=spec.labels)
    return GaugeMetricFamily(spec.name, help_text, labels=spec.labels)


def age_note(min_interval_seconds: float) -> str:
    """The sentence every per-target HELP ends with: how old a value may be."""
    return (f" Values come from the target's last read and may be up to min_interval_seconds "
            f"({min_interval_seconds:g} s) plus that read's duration old; "
            "gatewayscope_exporter_snapshot_age_seconds gives their age.")


def families(samples: Iterable[Sample], *, min_interval_seconds: float) -> list[Metric]:
    """Group samples into metric families, in :data:`METRICS` order; families without samples are left out."""
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        if sample.name not in METRICS:
            raise KeyError(f"{sample.name} is not one of the exporter's metrics")
        by_name.setdefault(sample.name, []).append(sample)
    out: list[Metric] = []
    for name, spec in METRICS.items():
        if name not in by_name:
            continue
        help_text = spec.help + (age_note(min_interval_seconds) if spec.per_target else "")
        family = _family(spec, help_text)
        for sample in by_name[name]:
            family.add_metric(list(sample.labels), sample.value)
        out.append(family)
    return out


# -- one target ---------------------------------------------------------------------------------

def record_series(classified: pl.DataFrame, max_series: int) -> list[tuple[str, str, int]]:
    """(record, kind, parked workers): the ``max_series`` records with the most, then ``_other`` per kind.

    Ties are broken by record name so the same records keep their series from scrape to scrape.

    >>> frame = pl.DataFrame({"name": ["a", "b", "c", "d"], "kind": ["custom", "custom", "standard", "custom"],
    ...                       "parked_workers": [10, 1000, 512, 1000]})
    >>> record_series(frame, 2)
    [('b', 'custom', 1000), ('d', 'custom', 1000), ('_other', 'standard', 512), ('_other', 'custom', 10)]
    """
    ordered = classified.select("name", "kind", "parked_workers").sort(
        ["parked_workers", "name"], descending=[True, False], nulls_last=True
    )
    top = ordered.head(max_series)
    rest = ordered.slice(max_series)
    series = [(str(name), str(kind), int(workers or 0)) for name, kind, workers in top.iter_rows()]
    for kind in RECORD_KINDS:
        part = rest.filter(pl.col("kind") == kind)
        if part.height:
            series.append((OTHER_RECORDS, kind, int(part["parked_workers"].sum() or 0)))
    return series


class FindingsCache:
    """The findings of each target's last read, kept until the next read replaces it.

    A read (a TargetSnapshot) never changes once made, and its findings depend only on it, the policy,
    the target and ``max_record_series``, which are fixed for an exporter's life. So every scrape served
    from the per-target cache (several Prometheus replicas, a scrape interval shorter than
    ``min_interval_seconds``) re-serves them instead of running the analysis again. One entry per
    target name, holding the snapshot it was computed from (compared by identity). Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[TargetSnapshot, tuple[bool, list[Sample]]]] = {}

    def get(self, name: str, snapshot: TargetSnapshot,
            compute: Callable[[], tuple[bool, list[Sample]]]) -> tuple[bool, list[Sample]]:
        with self._lock:
            entry = self._entries.get(name)
        if entry is not None and entry[0] is snapshot:
            return entry[1]
        value = compute()
        with self._lock:
            self._entries[name] = (snapshot, value)
        return value


def _findings(result: TargetResult, policy: Policy, max_record_series: int) -> tuple[bool, list[Sample]]:
    """(up, findings samples) of one target's read; analysis failures are caught and reported down."""
    from gatewayscope.analysis import findings

    target, snap = result.target, result.snapshot
    if not snap.up:
        return False, []
    try:
        found = findings.target_findings(snap, policy, now=snap.started_at,
                                         memory_limit_bytes=target.memory_limit_bytes)
        if target.kind == "rllm" and found.orphans is not None:
            return True, _trace_store_samples(found)
        if target.kind == "bifrost" and found.records is not None:
            return True, _bifrost_samples(found, max_record_series, target.kubernetes)
        return False, []
    except Exception:
        log.exception("analysing the read of %s failed; reporting it down", target.name)
        return False, []


def target_samples(result: TargetResult, policy: Policy, *, max_record_series: int,
                   cache: FindingsCache | None = None) -> list[Sample]:
    """Every sample of one target: up, duration, age, and its findings when the read succeeded.

    Analysis failures (a bug, an unforeseen shape) are caught here: the target is reported with
    ``gatewayscope_up 0`` and no findings, and the other targets are unaffected. With ``cache``, the
    findings of a read already analysed are reused (see :class:`FindingsCache`).
    """
    target, snap = result.target, result.snapshot
    name = target.name
    head = [Sample("gatewayscope_scrape_duration_seconds", (name,), float(snap.duration_seconds))]
    if result.age_seconds is not None:
        head.append(Sample("gatewayscope_exporter_snapshot_age_seconds", (name,), max(0.0, result.age_seconds)))
    if cache is None:
        up, findings = _findings(result, policy, max_record_series)
    else:
        up, findings = cache.get(name, snap, lambda: _findings(result, policy, max_record_series))
    return [Sample("gatewayscope_up", (name, target.kind), 1.0 if up else 0.0), *head, *findings]


def _trace_store_samples(found: TargetFindings) -> list[Sample]:
    name, summary = found.name, found.summary
    samples = [
        Sample("gatewayscope_trace_store_sessions", (name,), float(summary["sessions"])),
        Sample("gatewayscope_trace_store_traces", (name,), float(summary["traces"])),
        *(Sample("gatewayscope_trace_store_orphan_sessions", (name, confidence),
                 float(summary["orphans"][confidence])) for confidence in CONFIDENCES),
        Sample("gatewayscope_trace_store_oldest_orphan_age_seconds", (name,),
               max(0.0, float(summary["oldest_orphan_age_seconds"] or 0.0))),
    ]
    if found.guard is not None:
        samples += [
            Sample("gatewayscope_trace_store_tombstones", (name,), float(found.guard.tombstones)),
            Sample("gatewayscope_trace_store_tombstone_capacity", (name,), float(found.guard.capacity)),
            Sample("gatewayscope_trace_store_dropped_writes_total", (name,), float(found.guard.dropped_writes)),
            Sample("gatewayscope_trace_store_kept_after_fence_writes_total", (name,),
                   float(found.guard.kept_after_fence)),
        ]
    return samples


def _bifrost_samples(found: TargetFindings, max_record_series: int,
                     kubernetes: KubernetesPod | None = None) -> list[Sample]:
    assert found.records is not None
    name, summary = found.name, found.summary
    drift = set(found.posture_drift)
    samples: list[Sample] = []
    for kind in RECORD_KINDS:
        samples += [
            Sample("gatewayscope_bifrost_provider_records", (name, kind), float(summary["records"][kind])),
            Sample("gatewayscope_bifrost_parked_workers", (name, kind), float(summary["parked_workers"][kind])),
            Sample("gatewayscope_bifrost_queue_slots", (name, kind), float(summary["queue_slots"][kind])),
            Sample("gatewayscope_bifrost_records_over_pool", (name, kind),
                   float(summary["records_over_pool"][kind])),
        ]
    samples += [Sample("gatewayscope_bifrost_record_parked_workers", (name, record, kind), float(workers))
                for record, kind, workers in record_series(found.records, max_record_series)]
    samples += [Sample("gatewayscope_bifrost_worker_stack_bytes", (name, bound),
                       float(summary["worker_stack_bytes"][bound])) for bound in BOUNDS]
    samples += [
        Sample("gatewayscope_bifrost_memory_limit_bytes", (name,), float(summary["memory_limit_bytes"])),
        Sample("gatewayscope_bifrost_unreachable_records", (name,), float(summary["unreachable_records"])),
    ]
    samples += [Sample("gatewayscope_bifrost_posture_drift", (name, setting), 1.0 if setting in drift else 0.0)
                for setting in POSTURE_SETTINGS]
    return samples + _boot_memory_samples(found, kubernetes)


def _boot_memory_samples(found: TargetFindings, kubernetes: KubernetesPod | None) -> list[Sample]:
    """The prediction of the model used, the measured figures whenever the runtime metrics answered, their
    state, and the pod labels."""
    name, memory = found.name, found.memory
    pod = (kubernetes.namespace, kubernetes.pod, kubernetes.container) if kubernetes else ("", "", "")
    samples = [Sample("gatewayscope_bifrost_kubernetes_info", (name, *pod), 1.0)]
    if memory is None:
        return samples
    samples.append(Sample("gatewayscope_bifrost_boot_memory_predicted_bytes", (name, memory.model),
                          float(memory.predicted_bytes)))
    measured = memory.measured
    status = "absent" if measured is None else "trusted" if measured.trusted else "untrusted"
    samples += [Sample("gatewayscope_bifrost_runtime_metrics_status", (name, state), 1.0 if state == status else 0.0)
                for state in RUNTIME_METRICS_STATUSES]
    if measured is not None:
        samples += [
            Sample("gatewayscope_bifrost_goroutines", (name,), float(measured.goroutines)),
            Sample("gatewayscope_bifrost_resident_memory_bytes", (name,), float(measured.resident_memory_bytes)),
            Sample("gatewayscope_bifrost_measured_stack_bytes_per_goroutine", (name,),
                   float(measured.stack_bytes_per_goroutine)),
            Sample("gatewayscope_bifrost_measured_baseline_bytes", (name,), float(measured.baseline_bytes)),
            Sample("gatewayscope_bifrost_boot_memory_calibration_error_ratio", (name,),
                   float(measured.calibration_error_ratio)),
        ]
    return samples


# -- collectors ---------------------------------------------------------------------------------

class TargetsCollector:
    """The metrics of the given targets' values for one scrape (``/metrics`` and ``/probe``)."""

    def __init__(self, results: Sequence[TargetResult], policy: Policy, *, max_record_series: int,
                 min_interval_seconds: float, cache: FindingsCache | None = None) -> None:
        self.results = list(results)
        self.policy = policy
        self.max_record_series = max_record_series
        self.min_interval_seconds = min_interval_seconds
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        samples: list[Sample] = []
        for result in self.results:
            samples += target_samples(result, self.policy, max_record_series=self.max_record_series,
                                      cache=self.cache)
        yield from families(samples, min_interval_seconds=self.min_interval_seconds)


class ExporterCollector:
    """The exporter's own metrics: build info and, per target, reads, scrapes and whether a read is running;
    per SQLite target, its reads by mode and its full reads by reason.

    ``counters`` is :meth:`gatewayscope.exporter.cache.TargetCache.counters` (called on every collect).
    """

    def __init__(self, counters: Callable[[], dict[str, dict[str, Any]]], *, version: str = __version__) -> None:
        self.counters = counters
        self.version = version

    def collect(self) -> Iterator[Metric]:
        samples = [Sample("gatewayscope_build_info", (self.version,), 1.0)]
        for name, entry in sorted(self.counters().items()):
            samples += [Sample("gatewayscope_exporter_target_reads_total", (name, result),
                               float(entry["reads"].get(result, 0))) for result in RESULTS]
            samples += [Sample("gatewayscope_exporter_target_scrapes_total", (name, source),
                               float(entry["scrapes"].get(source, 0))) for source in SOURCES]
            samples.append(Sample("gatewayscope_exporter_read_in_progress", (name,), float(entry["in_flight"])))
            store = entry.get("store_reads")
            if store is not None:
                samples += [Sample("gatewayscope_exporter_store_reads_total", (name, mode),
                                   float(store.get("modes", {}).get(mode, 0))) for mode in STORE_READ_MODES]
                samples += [Sample("gatewayscope_exporter_store_full_reads_total", (name, reason),
                                   float(store.get("reasons", {}).get(reason, 0))) for reason in FULL_READ_REASONS]
        yield from families(samples, min_interval_seconds=0.0)
