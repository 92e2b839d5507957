"""The ``gatewayscope_heal_*`` metrics of a heal that runs inside the exporter (``gatewayscope export --heal``).

Their names, types and labels are part of the exporter's contract (``HEAL_SPECS`` in
:mod:`gatewayscope.exporter.collectors`, docs/metrics.md). The label values are target names from the config and
fixed vocabularies (action kinds, outcomes, pass results, block reasons): never a session id or a record name.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from gatewayscope.exporter.collectors import Sample, families
from gatewayscope.heal.loop import BLOCK_REASONS, PASS_RESULTS, HealLoop
from gatewayscope.remediate.kinds import ACTION_KINDS


class HealCollector:
    """A Collector over one :class:`~gatewayscope.heal.loop.HealLoop` (its counters are read on each collect)."""

    def __init__(self, loop: HealLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        counters = self.loop.snapshot_counters()
        settings = self.loop.settings
        samples = [Sample("gatewayscope_heal_actions_total", key, float(n))
                   for key, n in sorted(counters.actions.items())]
        samples += [Sample("gatewayscope_heal_passes_total", (result,), float(counters.passes.get(result, 0)))
                    for result in PASS_RESULTS]
        if counters.last_pass_at is not None:
            samples.append(Sample("gatewayscope_heal_last_pass_timestamp_seconds", (), counters.last_pass_at))
        if counters.last_pass_duration is not None:
            samples.append(Sample("gatewayscope_heal_last_pass_duration_seconds", (), counters.last_pass_duration))
        samples.append(Sample("gatewayscope_heal_interval_seconds", (), settings.interval_seconds))
        breaker = counters.breaker
        samples += [
            Sample("gatewayscope_heal_breaker_open", (), 1.0 if breaker is not None and breaker.open else 0.0),
            Sample("gatewayscope_heal_errors_in_window", (), float(breaker.errors if breaker is not None else 0)),
            Sample("gatewayscope_heal_error_budget", (), float(settings.breaker.max_errors)),
            Sample("gatewayscope_heal_paused", (), 1.0 if counters.paused else 0.0),
        ]
        samples += [Sample("gatewayscope_heal_blocked", (reason,), float(counters.blocked.get(reason, 0)))
                    for reason in BLOCK_REASONS]
        samples += [Sample("gatewayscope_heal_dry_run_actions", key, float(n))
                    for key, n in sorted(counters.would.items())]
        samples += [Sample("gatewayscope_heal_deferred_actions", key, float(n))
                    for key, n in sorted(counters.deferred.items())]
        samples += [Sample("gatewayscope_heal_enforced", (kind,), 1.0 if settings.kind_mode(kind) == "enforce" else 0.0)
                    for kind in ACTION_KINDS if settings.kind_mode(kind) != "off"]
        yield from families(samples, min_interval_seconds=0.0)
