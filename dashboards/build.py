#!/usr/bin/env python3
"""The gatewayscope monitoring mixin: every dashboard and rule file, generated from one :class:`MixinConfig`.

``python dashboards/build.py`` writes, under ``dashboards/`` (or ``--out DIR``):

* ``grafana/gatewayscope-overview.json``, ``grafana/gatewayscope-trace-store.json`` and
  ``grafana/gatewayscope-bifrost.json``: the fleet overview and one dashboard per gateway kind, built with
  the grafana-foundation-sdk builders;
* ``prometheus/alerts.yml``: the alert rules; ``prometheus/rules.yml``: the recording rules the dashboards
  read;
* ``kubernetes/prometheusrule.yaml``: both rule files as one PrometheusRule for the Prometheus Operator;

and, with the default ``--out`` (or ``--chart DIR``), the Helm chart's ``files/rules.yaml``
(``deploy/helm/gatewayscope/``): the same groups, which the chart's PrometheusRule template includes.

``prometheus/alerts_test.yml`` (promtool unit tests) is written by hand against the default config.
``tests/mixin`` fails when a committed file differs from what this script writes for the default config.

Another setup: ``--job-selector``, ``--cluster-label``, ``--runbook-base-url`` and friends, or
``--config FILE.json`` holding :class:`MixinConfig` fields (docs/mixin.md).

Conventions (the tests check them): every query of every dashboard and rule carries the job selector;
dashboards query through their ``datasource`` variable and carry ``job`` (and, with a cluster label,
``cluster``) variables; every panel has a unit; a dashboard's ``rate()`` uses ``$__rate_interval``;
``rate``/``irate``/``increase``/``delta`` only ever see ``_total`` counters; every metric is one the
exporter serves (``gatewayscope/exporter/collectors.py``) or a ``gatewayscope:`` recording rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import bargauge as sdk_bargauge
from grafana_foundation_sdk.builders import common as sdk_common
from grafana_foundation_sdk.builders import dashboard as sdk_dashboard
from grafana_foundation_sdk.builders import prometheus as sdk_prometheus
from grafana_foundation_sdk.builders import stat as sdk_stat
from grafana_foundation_sdk.builders import table as sdk_table
from grafana_foundation_sdk.builders import timeseries as sdk_timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as dashboard_model
from grafana_foundation_sdk.models import prometheus as prometheus_model

HERE = Path(__file__).resolve().parent
#: the Helm chart whose PrometheusRule carries these rules (its files/rules.yaml is generated here)
CHART = HERE.parent / "deploy" / "helm" / "gatewayscope"
CHART_RULES = "files/rules.yaml"

#: the docs page every runbook_url points into, by default (the project's public repository)
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/gatewayscope/gatewayscope/blob/main/docs/runbooks.md"
#: the jobs of the shipped scrape examples: scrape-static.yml's "gatewayscope", and the multi-target and
#: fleet files' "gatewayscope-targets" and "gatewayscope-exporter"
DEFAULT_JOB_SELECTOR = 'job=~"gatewayscope|gatewayscope-.*"'
#: the job kube-prometheus-stack and the kube-state-metrics chart scrape it as
DEFAULT_KUBE_STATE_METRICS_SELECTOR = 'job="kube-state-metrics"'
#: kube-state-metrics' container limits, and the labels it knows a container by
KSM_LIMITS = "kube_pod_container_resource_limits"
POD_LABELS = ("namespace", "pod", "container")

_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_MATCHER = re.compile(rf'\s*({_LABEL})\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
_DURATION = re.compile(r"[0-9]+[smhdw]")


@dataclass(frozen=True)
class MixinConfig:
    """Everything a deployment may change; the one place the dashboards and the rules take selectors from."""

    #: PromQL label matchers (without braces) that select the gatewayscope jobs; in every query
    job_selector: str = DEFAULT_JOB_SELECTOR
    #: the label that tells clusters apart (e.g. "cluster"); empty: a single cluster, no cluster variable
    cluster_label: str = ""
    #: where docs/runbooks.md is served; runbook_url = this + "#" + the alert's heading anchor
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    #: dashboard uids are PREFIX-overview, PREFIX-trace-store, PREFIX-bifrost
    dashboard_uid_prefix: str = "gatewayscope"
    dashboard_tags: tuple[str, ...] = ("gatewayscope",)
    dashboard_timezone: str = "utc"
    dashboard_refresh: str = "1m"
    #: GatewayscopeOrphanSessionsGrowing: how many orphans above the last hour's lowest count fire it
    orphan_growth_threshold: int = 0
    #: the range of the recorded rates (at least four scrape intervals)
    recording_rate_window: str = "5m"
    #: PromQL label matchers (without braces) that select kube-state-metrics' series (the memory-limit join)
    kube_state_metrics_selector: str = DEFAULT_KUBE_STATE_METRICS_SELECTOR
    prometheus_rule_name: str = "gatewayscope"
    #: empty: no metadata.namespace (kubectl apply -n decides)
    prometheus_rule_namespace: str = ""
    #: metadata.labels of the PrometheusRule (match them to the Prometheus's ruleSelector)
    prometheus_rule_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "gatewayscope", "app.kubernetes.io/component": "mixin"})

    def __post_init__(self) -> None:
        matchers = selector_matchers(self.job_selector)
        if "job" not in {label for label, _, _ in matchers}:
            raise ValueError(f"job_selector must match on the job label: {self.job_selector!r}")
        selector_matchers(self.kube_state_metrics_selector)  # raises on anything but label matchers
        if self.cluster_label and not re.fullmatch(_LABEL, self.cluster_label):
            raise ValueError(f"cluster_label is not a label name: {self.cluster_label!r}")
        if self.cluster_label in {"job", "instance", "target", "kind"}:
            raise ValueError(f"cluster_label {self.cluster_label!r} is one of gatewayscope's own labels")
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", self.dashboard_uid_prefix) or \
                len(self.dashboard_uid_prefix) > 28:
            raise ValueError(f"dashboard_uid_prefix must be [a-z0-9-], at most 28 characters: "
                             f"{self.dashboard_uid_prefix!r}")
        if not self.runbook_base_url or "#" in self.runbook_base_url:
            raise ValueError(f"runbook_base_url must be a URL without a fragment: {self.runbook_base_url!r}")
        if not _DURATION.fullmatch(self.recording_rate_window):
            raise ValueError(f"recording_rate_window is not a duration: {self.recording_rate_window!r}")
        if self.orphan_growth_threshold < 0:
            raise ValueError("orphan_growth_threshold must be >= 0")
        object.__setattr__(self, "dashboard_tags", tuple(self.dashboard_tags))
        object.__setattr__(self, "prometheus_rule_labels", dict(self.prometheus_rule_labels))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> MixinConfig:
        """A config from a JSON object of field names; an unknown name is an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"unknown mixin config fields: {sorted(unknown)} (known: {sorted(names)})")
        return cls(**dict(values))


def selector_matchers(selector: str) -> list[tuple[str, str, str]]:
    """``'job="a", env=~"b"'`` -> [(label, operator, value), ...]; anything else is a ValueError."""
    matchers = []
    position = 0
    while position < len(selector):
        match = _MATCHER.match(selector, position)
        if not match:
            raise ValueError(f"not a list of PromQL label matchers: {selector!r}")
        matchers.append((match.group(1), match.group(2), match.group(3)))
        position = match.end()
        if position < len(selector):
            if selector[position] != ",":
                raise ValueError(f"not a list of PromQL label matchers: {selector!r}")
            position += 1
    if not matchers:
        raise ValueError("the job selector is empty")
    return matchers


def eq(label: str, value: str) -> str:
    """The matcher ``label="value"``."""
    return f'{label}="{value}"'


class Selectors:
    """The label matchers and aggregation labels every expression is built from."""

    def __init__(self, config: MixinConfig) -> None:
        self.config = config
        self.job = config.job_selector.strip()
        self.cluster = config.cluster_label

    def by(self, *extra: str) -> str:
        """The labels an aggregation keeps: the cluster, the selector's labels, job, instance, target, extra."""
        labels = [self.cluster] if self.cluster else []
        labels += [label for label, _, _ in selector_matchers(self.job)]
        labels += ["job", "instance", "target", *extra]
        return ", ".join(dict.fromkeys(labels))

    def rule(self, *extra: str) -> str:
        """The selector of a rule expression: the job selector (and extra matchers)."""
        return "{" + ", ".join([self.job, *extra]) + "}"

    def ksm(self, *extra: str) -> str:
        """The selector of kube-state-metrics' series (and extra matchers)."""
        return "{" + ", ".join([self.config.kube_state_metrics_selector.strip(), *extra]) + "}"

    def pod_join(self) -> str:
        """The labels the memory-limit join matches a gateway's pod on: the cluster and the gateway_ pod labels."""
        return ", ".join([*([self.cluster] if self.cluster else []), *(f"gateway_{label}" for label in POD_LABELS)])

    def variables(self, *, target: bool = True) -> list[str]:
        """The dashboard variable matchers: cluster, job and target."""
        matchers = [f'{self.cluster}=~"$cluster"'] if self.cluster else []
        matchers.append('job=~"$job"')
        if target:
            matchers.append('target=~"$target"')
        return matchers

    def panel(self, *extra: str, target: bool = True) -> str:
        """The selector of a panel query: the job selector, the dashboard's variables, extra matchers."""
        return "{" + ", ".join([self.job, *self.variables(target=target), *extra]) + "}"


# == Prometheus rules =====================================================================================

#: the notebook an alert's engineer opens (docs/notebooks.md)
TRIAGE = "notebooks/triage.ipynb"
REMEDIATE = "notebooks/remediate.ipynb"


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def runbook_url(config: MixinConfig, alert: str) -> str:
    """The runbook of ``alert``: its ``## <alert>`` section of docs/runbooks.md, served at runbook_base_url."""
    return f"{config.runbook_base_url}#{heading_anchor(alert)}"


def record_names(config: MixinConfig) -> dict[str, str]:
    """Short key -> recording rule name (level:metric:operations; level ``gatewayscope``: one series per
    gatewayscope target, keeping its cluster, job, instance and target labels)."""
    window = config.recording_rate_window
    return {
        "orphans": "gatewayscope:trace_store_orphan_sessions:sum",
        "orphan_rise": "gatewayscope:trace_store_orphan_sessions:sum_rise1h",
        "dropped": f"gatewayscope:trace_store_dropped_writes:rate{window}",
        "reads": f"gatewayscope:exporter_target_reads:rate{window}",
        "scrapes": f"gatewayscope:exporter_target_scrapes:rate{window}",
        "limit": "gatewayscope:bifrost_memory_limit_bytes:effective",
        "limit_ratio": "gatewayscope:bifrost_boot_memory_limit:ratio",
    }


def effective_limit_expr(config: MixinConfig) -> str:
    """Each Bifrost target's memory limit: its container's limit from kube-state-metrics where the target's
    ``gatewayscope_bifrost_kubernetes_info`` names a pod kube-state-metrics knows, else the configured one;
    ``limit_source`` says which ("kubernetes" or "config").

    kube-state-metrics' ``namespace``, ``pod`` and ``container`` are copied to ``gateway_namespace``,
    ``gateway_pod`` and ``gateway_container``, the labels the exporter's info series carries them under (a
    scrape's own namespace, pod and container target labels cannot collide with those), and the two sides
    join on them (and the cluster label). ``max`` collapses duplicate kube-state-metrics series (two replicas,
    a pod recreated under its old name)."""
    s = Selectors(config)
    ksm = f"{KSM_LIMITS}{s.ksm(eq('resource', 'memory'))}"
    for label in POD_LABELS:
        ksm = f'label_replace(\n  {_indent(ksm).strip()},\n  "gateway_{label}", "$1", "{label}", "(.+)"\n)'
    kubernetes = (f"max by ({s.by()}) (\n  gatewayscope_bifrost_kubernetes_info{s.rule()}\n"
                  f"  * on ({s.pod_join()}) group_left ()\n"
                  f"  max by ({s.pod_join()}) (\n{_indent(_indent(ksm))}\n  )\n)")
    configured = f"max by ({s.by()}) (\n  gatewayscope_bifrost_memory_limit_bytes{s.rule()}\n)"
    return (f'label_replace(\n{_indent(kubernetes)},\n  "limit_source", "kubernetes", "", ""\n)\n'
            f"or on ({s.by()})\n"
            f'label_replace(\n{_indent(configured)},\n  "limit_source", "config", "", ""\n)')


def recording_groups(config: MixinConfig) -> list[dict[str, Any]]:
    """The recording rules behind the dashboards' heavy queries (fleet-wide rates, the orphan rise)."""
    s = Selectors(config)
    names = record_names(config)
    window = config.recording_rate_window
    rules = [
        (names["orphans"], f"sum by ({s.by()}) (\n  gatewayscope_trace_store_orphan_sessions{s.rule()}\n)"),
        (names["orphan_rise"], f"{names['orphans']}{s.rule()}\n"
                               f"- min_over_time({names['orphans']}{s.rule()}[1h])"),
        (names["dropped"], f"sum by ({s.by()}) (\n"
                           f"  rate(gatewayscope_trace_store_dropped_writes_total{s.rule()}[{window}])\n)"),
        (names["reads"], f"sum by ({s.by('result')}) (\n"
                         f"  rate(gatewayscope_exporter_target_reads_total{s.rule()}[{window}])\n)"),
        (names["scrapes"], f"sum by ({s.by('source')}) (\n"
                           f"  rate(gatewayscope_exporter_target_scrapes_total{s.rule()}[{window}])\n)"),
        (names["limit"], effective_limit_expr(config)),
        (names["limit_ratio"], f"gatewayscope_bifrost_boot_memory_predicted_bytes{s.rule()}\n"
                               f"/ on ({s.by()}) group_left (limit_source)\n{names['limit']}{s.rule()}"),
    ]
    return [{"name": "gatewayscope.rules", "rules": [{"record": name, "expr": Expr(expr)} for name, expr in rules]}]


def _indent(expr: str) -> str:
    return "\n".join("  " + line for line in expr.splitlines())


def _figure(metric: str, format_: str, extra: str = "") -> str:
    """An alert annotation's template that shows one of the exporter's series of the alert's target."""
    selector = f'{metric}{{{extra}job=%q, instance=%q, target=%q}}'
    return (f'{{{{ with printf `{selector}` $labels.job $labels.instance $labels.target | query }}}}'
            f'{{{{ . | first | value | {format_} }}}}{{{{ end }}}}')


def _alert(config: MixinConfig, name: str, expr: str, duration: str, severity: str, summary: str,
           description: str, notebook: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": Expr(expr),
        "for": duration,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": " ".join(description.split()),
                        "runbook_url": runbook_url(config, name), "notebook": notebook},
    }


def alert_groups(config: MixinConfig) -> list[dict[str, Any]]:
    """The alert rules. They read the exporter's series only (no recording rule), so they work on their own,
    on every series recorded before them.

    GatewayscopeOrphanSessionsGrowing compares the summed orphan count with its lowest point of the last
    hour (a subquery stepping at the evaluation interval): a cleanup lowers that low point instead of
    hiding the growth after it, and moving orphans between confidences changes nothing. No rule applies
    delta/rate/increase to a gauge."""
    s = Selectors(config)
    orphans = f"gatewayscope_trace_store_orphan_sessions{s.rule()}"
    low_over = (f"gatewayscope_bifrost_worker_stack_bytes{s.rule(eq('bound', 'low'))}"
                f"\n  > ignoring(bound) gatewayscope_bifrost_memory_limit_bytes{s.rule()}")
    high_over = (f"gatewayscope_bifrost_worker_stack_bytes{s.rule(eq('bound', 'high'))}"
                 f"\n  > ignoring(bound) gatewayscope_bifrost_memory_limit_bytes{s.rule()}")
    exporter = [
        _alert(config, "GatewayscopeExporterDown",
               f"up{s.rule()} == 0\nor\nabsent(up{s.rule()})", "5m", "critical",
               "Prometheus cannot scrape the gatewayscope exporter{{ with $labels.instance }} at {{ . }}{{ end }}.",
               """{{ with $labels.instance }}The scrape of {{ . }} (job {{ $labels.job }}) has failed{{ else }}No
               gatewayscope exporter has been scraped{{ end }} for 5 minutes. Every other gatewayscope alert reads
               the exporter's series, so none of them can fire meanwhile: orphans, tombstone capacity, boot
               memory, pools and posture are all unwatched.""", TRIAGE),
        _alert(config, "GatewayscopeTargetDown", f"gatewayscope_up{s.rule()} == 0", "5m", "warning",
               "gatewayscope cannot read target {{ $labels.target }} ({{ $labels.kind }}).",
               """The exporter's reads of {{ $labels.target }} have failed for 5 minutes: the gateway is down,
               answers something unusable, rejects the exporter's credentials, or is slower than the scrape
               timeout. Its findings (orphans, pools, boot memory, posture) are not being watched meanwhile.""",
               TRIAGE),
    ]
    trace_store = [
        _alert(config, "GatewayscopeOrphanSessionsGrowing",
               f"sum by ({s.by()}) (\n  {orphans}\n)\n"
               f"- min_over_time(\n  sum by ({s.by()}) (\n    {orphans}\n  )[1h:]\n)\n"
               f"> {config.orphan_growth_threshold}", "15m", "warning",
               "Orphan sessions keep appearing in the trace store of {{ $labels.target }}.",
               """The orphan count of {{ $labels.target }} is {{ $value | humanize }} above its lowest point of
               the last hour: straggling trace writes land after their session was deleted and resurrect it as a
               permanent one-trace session. Install the tombstone guard, then delete the orphans.""", REMEDIATE),
        _alert(config, "GatewayscopeOrphanSessionsPresent", f"sum by ({s.by()}) (\n  {orphans}\n)\n> 0", "1h", "info",
               "{{ $value | humanize }} orphan sessions sit in the trace store of {{ $labels.target }}.",
               """The trace store of {{ $labels.target }} holds {{ $value | humanize }} orphan sessions (confirmed
               and suspected) that no rollout will ever delete. They skew session counts and training data;
               review and delete them.""", REMEDIATE),
        _alert(config, "GatewayscopeTombstoneCapacityNearlyFull",
               f"gatewayscope_trace_store_tombstones{s.rule()}\n"
               f"  / (gatewayscope_trace_store_tombstone_capacity{s.rule()} > 0)\n> 0.9", "15m", "warning",
               "The tombstone guard of {{ $labels.target }} is {{ $value | humanizePercentage }} full.",
               """The guard of {{ $labels.target }} remembers {{ $value | humanizePercentage }} of the tombstones it
               can keep. At the cap it evicts the oldest, and a late write for an evicted session id resurrects
               that session as an orphan again. Raise --max-tombstones of the guarded gateway at a quiet moment
               (its tombstones live in memory and a restart forgets them), or install the guard into the SQLite
               store, which keeps them without a cap.""", TRIAGE),
        _alert(config, "GatewayscopeGuardDroppingWrites",
               f"sum by ({s.by()}) (\n  increase(gatewayscope_trace_store_dropped_writes_total{s.rule()}[1h])\n)\n> 0",
               "0m", "info",
               "The tombstone guard of {{ $labels.target }} dropped straggling trace writes.",
               """The guard of {{ $labels.target }} dropped about {{ $value | humanize }} trace writes in the last
               hour because their requests reached the gateway before their sessions' latest delete (stragglers).
               Each would have left an orphan; nothing needs repair, but the rollouts that produce stragglers are
               slower than their flush-and-delete. A new use of a deleted id (the next step, a retry) is kept and
               counted apart (gatewayscope_trace_store_kept_after_fence_writes_total), never dropped.""",
               TRIAGE),
    ]
    predicted_over = (f"(\n  gatewayscope_bifrost_boot_memory_predicted_bytes{s.rule(eq('model', 'measured'))}\n"
                      f"  / on ({s.by()}) group_left (limit_source)\n  (\n"
                      f"{_indent(_indent(effective_limit_expr(config)))}\n  )\n)\n> 1")
    bifrost = [
        _alert(config, "GatewayscopeBifrostBootMemoryPredictedOverLimit", predicted_over, "5m", "critical",
               "Bifrost {{ $labels.target }} would be killed at its next restart: it would need {{ $value | "
               "humanizePercentage }} of its memory limit.",
               """Measured from its own runtime metrics, {{ $labels.target }} would need """
               + _figure("gatewayscope_bifrost_boot_memory_predicted_bytes", "humanize1024", "model=\"measured\", ")
               + """B at its next restart, {{ $value | humanizePercentage }} of {{ if eq $labels.limit_source
               "kubernetes" }}its container's memory limit in Kubernetes{{ else }}the memory limit configured for
               the target{{ end }}: """
               + _figure("gatewayscope_bifrost_measured_baseline_bytes", "humanize1024")
               + """B besides its goroutines' stacks, plus its parked workers at """
               + _figure("gatewayscope_bifrost_measured_stack_bytes_per_goroutine", "humanize1024")
               + """B of stack per goroutine (it runs """
               + _figure("gatewayscope_bifrost_goroutines", "humanize")
               + """ goroutines now; the model's calibration error is """
               + _figure("gatewayscope_bifrost_boot_memory_calibration_error_ratio", "humanizePercentage")
               + """). A restart starts every stored record's workers before it serves, so it would be killed
               while it boots. Do not restart it: shrink the pools and delete unreachable records first.""",
               REMEDIATE),
        _alert(config, "GatewayscopeBifrostBootMemoryOverLimit", low_over, "5m", "critical",
               "Bifrost {{ $labels.target }} will not come back after a restart: its parked workers alone exceed "
               "the memory limit.",
               """Even at 2 KiB per goroutine, the workers that the stored provider records of {{ $labels.target }}
               park at boot need {{ $value | humanize1024 }}B of stacks, more than the gateway's memory limit.
               The running process may be fine, but the next restart gets it killed while it boots. Shrink the
               pools and delete unreachable records now, before any restart.""", REMEDIATE),
        _alert(config, "GatewayscopeBifrostBootMemoryAtRisk",
               f"(\n{_indent(high_over)}\n)\nunless ignoring(bound)\n(\n{_indent(low_over)}\n)", "30m", "warning",
               "Bifrost {{ $labels.target }} may not survive a restart within its memory limit.",
               """At 8 KiB per goroutine, the workers that the stored provider records of {{ $labels.target }} park
               at boot need {{ $value | humanize1024 }}B of stacks, more than the memory limit (at the 2 KiB
               floor they still fit). Every new record brings the gateway closer to being killed while it
               boots.""", REMEDIATE),
        _alert(config, "GatewayscopeBifrostPoolsOverPolicy",
               f"sum by ({s.by('kind')}) (\n  gatewayscope_bifrost_records_over_pool{s.rule()}\n)\n> 0", "1h",
               "warning",
               "{{ $value | humanize }} {{ $labels.kind }} provider records of Bifrost {{ $labels.target }} are "
               "above the pool policy.",
               """{{ $value | humanize }} {{ $labels.kind }} records of {{ $labels.target }} run with a concurrency
               above the policy (standard 512, custom 64 by default), parking workers and queue slots that idle
               memory pays for. Resize them to the policy.""", REMEDIATE),
        _alert(config, "GatewayscopeBifrostPostureDrift", f"gatewayscope_bifrost_posture_drift{s.rule()} == 1",
               "15m", "warning",
               "Bifrost {{ $labels.target }}: {{ $labels.setting }} is away from the safe posture.",
               """The client setting {{ $labels.setting }} of {{ $labels.target }} has drifted from the platform's
               safe posture (drop_excess_requests off, enforce_auth_on_inference on, disable_content_logging
               on). Set it back through the management API.""", REMEDIATE),
        _alert(config, "GatewayscopeBifrostUnreachableRecords",
               f"gatewayscope_bifrost_unreachable_records{s.rule()} > 0", "1h", "warning",
               "{{ $value | humanize }} provider records of Bifrost {{ $labels.target }} point at upstreams that "
               "are gone.",
               """{{ $value | humanize }} records of {{ $labels.target }} have a base URL host that does not resolve
               from gatewayscope, or a provider_status of error. They still park their workers at every boot;
               delete them (a provision still in use sets its record up again).""", REMEDIATE),
    ]
    heal_by = ", ".join(label for label in s.by().split(", ") if label != "target")
    not_health = 'reason!="gateway-health"'
    heal = [
        _alert(config, "GatewayscopeHealBreakerOpen", f"gatewayscope_heal_breaker_open{s.rule()} == 1", "0m",
               "warning",
               "gatewayscope heal at {{ $labels.instance }} stopped writing: its breaker is open.",
               """Heal's error budget ran out: {{ with printf `gatewayscope_heal_errors_in_window{job=%q,
               instance=%q}` $labels.job $labels.instance | query }}{{ . | first | value | humanize }}{{ end }}
               refused, unconfirmed or stale outcomes in its window. Its breaker holds every write until
               an operator resets it; the passes go on and record what they would do. Find the cause in its
               journal ('gatewayscope heal status'), fix it, then 'gatewayscope heal reset'.""", REMEDIATE),
        _alert(config, "GatewayscopeHealStuck",
               f"time() - gatewayscope_heal_last_pass_timestamp_seconds{s.rule()}\n"
               f"  > 3 * gatewayscope_heal_interval_seconds{s.rule()}\n"
               f"or\n(\n  gatewayscope_heal_interval_seconds{s.rule()}\n"
               f"  unless on ({heal_by})\n  gatewayscope_heal_last_pass_timestamp_seconds{s.rule()}\n)",
               "15m", "warning",
               "gatewayscope heal at {{ $labels.instance }} has not finished a pass for three intervals.",
               """No heal pass has ended at {{ $labels.instance }} for more than three of its intervals (or none
               has ended since it started): a pass hangs on a gateway, or the heal thread died. The targets are not
               being repaired meanwhile. Check its log and 'gatewayscope heal status'.""", TRIAGE),
        _alert(config, "GatewayscopeHealBlocked",
               f"max by ({heal_by}, reason) (\n  gatewayscope_heal_blocked{s.rule(not_health)}\n)\n== 1", "6h",
               "info",
               "gatewayscope heal at {{ $labels.instance }} has written nothing for 6 hours: {{ $labels.reason }}.",
               """Every heal pass of the last 6 hours was held by {{ $labels.reason }} (paused: its pause file
               exists; breaker: its error budget ran out; window: outside every allowed window; alert: a blocker
               alert fires, or Prometheus cannot say). The passes record what they would do; nothing is
               repaired meanwhile.""", TRIAGE),
    ]
    return [{"name": "gatewayscope-exporter", "rules": exporter},
            {"name": "gatewayscope-trace-store", "rules": trace_store},
            {"name": "gatewayscope-bifrost", "rules": bifrost},
            {"name": "gatewayscope-heal", "rules": heal}]


class Expr(str):
    """A PromQL expression in a rule file: a literal block when it is long or has several lines."""


class _YamlDumper(yaml.SafeDumper):
    """Block style, list items indented under their key, long prose folded, expressions never folded."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = ">" if " " in value and len(value) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _represent_expr(dumper: yaml.SafeDumper, value: Expr) -> yaml.Node:
    style = "|" if "\n" in value or len(value) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style=style)


_YamlDumper.add_representer(str, _represent_str)
_YamlDumper.add_representer(Expr, _represent_expr)


def to_yaml(document: Any, header: str) -> str:
    body = yaml.dump(document, Dumper=_YamlDumper, sort_keys=False, width=110, allow_unicode=True)
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.strip().splitlines())
    return comment + body


def _config_note(config: MixinConfig) -> str:
    cluster = config.cluster_label or "(none)"
    return (f"Generated by dashboards/build.py (job selector {config.job_selector}, cluster label {cluster});\n"
            "edit build.py or pass another config (docs/mixin.md), never this file.")


def render_rules(config: MixinConfig) -> dict[str, str]:
    """prometheus/alerts.yml, prometheus/rules.yml and kubernetes/prometheusrule.yaml."""
    alerts = {"groups": alert_groups(config)}
    records = {"groups": recording_groups(config)}
    metadata: dict[str, Any] = {"name": config.prometheus_rule_name}
    if config.prometheus_rule_namespace:
        metadata["namespace"] = config.prometheus_rule_namespace
    if config.prometheus_rule_labels:
        metadata["labels"] = dict(config.prometheus_rule_labels)
    manifest = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": metadata,
                "spec": {"groups": alerts["groups"] + records["groups"]}}
    note = _config_note(config)
    return {
        "prometheus/alerts.yml": to_yaml(alerts, f"""
gatewayscope alert rules (Prometheus 2.x): `rule_files: [alerts.yml]`. Unit tests: alerts_test.yml
(`promtool test rules alerts_test.yml`, from this folder). They need no recording rule.
Every alert: a CamelCase name starting with "Gatewayscope", labels.severity critical|warning|info, and
annotations summary, description, runbook_url (its section of docs/runbooks.md) and notebook.
{note}"""),
        "prometheus/rules.yml": to_yaml(records, f"""
gatewayscope recording rules: the dashboards' heavy queries, `rule_files: [rules.yml]` next to alerts.yml.
Names follow level:metric:operations; level "gatewayscope" keeps one series per gatewayscope target.
{note}"""),
        "kubernetes/prometheusrule.yaml": to_yaml(manifest, f"""
The gatewayscope alert and recording rules for the Prometheus Operator: `kubectl apply -n monitoring -f
prometheusrule.yaml`. spec.groups: alerts.yml's groups, then rules.yml's.
{note}"""),
    }


def render_chart_rules(config: MixinConfig) -> str:
    """The Helm chart's files/rules.yaml: the PrometheusRule's spec (alerts.yml's groups, then rules.yml's)."""
    return to_yaml({"groups": alert_groups(config) + recording_groups(config)}, f"""
The spec of the gatewayscope chart's PrometheusRule (templates/prometheusrule.yaml includes this file as it is,
so the alerts' own {{{{ $labels }}}} templates stay untouched): the groups of alerts.yml, then rules.yml.
{_config_note(config)}""")


# == Grafana dashboards =====================================================================================

DATASOURCE = dashboard_model.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: Go's goroutine stack sizes per parked worker: 2 KiB floor, 8 KiB typical (the exporter's two bounds)
STACK_LOW, STACK_HIGH = 2048, 8192
ALL = dashboard_model.VariableOption(selected=True, text=["All"], value=["$__all"])

UP_MAPPINGS = [dashboard_model.ValueMap(options={
    "0": dashboard_model.ValueMappingResult(text="DOWN", color="red", index=0),
    "1": dashboard_model.ValueMappingResult(text="UP", color="green", index=1)})]
DRIFT_MAPPINGS = [dashboard_model.ValueMap(options={
    "0": dashboard_model.ValueMappingResult(text="safe", color="green", index=0),
    "1": dashboard_model.ValueMappingResult(text="DRIFT", color="orange", index=1)})]


@dataclass(frozen=True)
class Board:
    """One dashboard: its file, uid and title, and the gateway kind it shows (None: every kind)."""

    file: str
    slug: str
    title: str
    kind: str | None

    def uid(self, config: MixinConfig) -> str:
        return f"{config.dashboard_uid_prefix}-{self.slug}"

    def url(self, config: MixinConfig) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")
        return f"/d/{self.uid(config)}/{slug}"


OVERVIEW = Board("gatewayscope-overview.json", "overview", "gatewayscope / Overview", None)
TRACE_STORE = Board("gatewayscope-trace-store.json", "trace-store", "gatewayscope / Trace store", "rllm")
BIFROST = Board("gatewayscope-bifrost.json", "bifrost", "gatewayscope / Bifrost", "bifrost")
BOARDS = (OVERVIEW, TRACE_STORE, BIFROST)


def _query(expr: str, legend: str, ref: str, *, instant: bool, table: bool) -> sdk_prometheus.Dataquery:
    query = sdk_prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    if instant:
        query = query.instant()
    if table:
        query = query.format(prometheus_model.PromQueryFormat.TABLE)
    return query


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> sdk_dashboard.ThresholdsConfig:
    return sdk_dashboard.ThresholdsConfig().mode(dashboard_model.ThresholdsMode.ABSOLUTE).steps(
        [dashboard_model.Threshold(value=value, color=color) for value, color in steps])


def _reduce_last() -> sdk_common.ReduceDataOptions:
    return sdk_common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


class Page:
    """Builds one dashboard with the SDK: variables, links, rows and panels (ids in order, grid by the SDK)."""

    def __init__(self, config: MixinConfig, board: Board, description: str) -> None:
        self.config = config
        self.board = board
        self.s = Selectors(config)
        self.next_id = 1
        self.builder = (sdk_dashboard.Dashboard(board.title)
                        .uid(board.uid(config))
                        .description(description)
                        .tags(list(config.dashboard_tags))
                        .editable()
                        .tooltip(dashboard_model.DashboardCursorSync.CROSSHAIR)
                        .time("now-6h", "now")
                        .timezone(config.dashboard_timezone)
                        .refresh(config.dashboard_refresh)
                        .version(1)
                        .annotations([]))
        for variable in self._variables():
            self.builder = self.builder.with_variable(variable)
        for other in BOARDS:
            if other is not board:
                self.builder = self.builder.link(self._board_link(other))

    # -- variables and links ------------------------------------------------------------------------------

    def _variables(self) -> list[Builder[dashboard_model.VariableModel]]:
        s, cluster = self.s, self.config.cluster_label
        variables: list[Builder[dashboard_model.VariableModel]] = [
            sdk_dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .current(dashboard_model.VariableOption(selected=True, text="default", value="default"))]

        def query_variable(name: str, label: str, query: str, *, all_value: str | None) -> Builder[Any]:
            variable = (sdk_dashboard.QueryVariable(name).label(label).datasource(DATASOURCE)
                        .query(query).multi(True).include_all(True).current(ALL)
                        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
                        .sort(dashboard_model.VariableSort.ALPHABETICAL_ASC))
            return variable.all_value(all_value) if all_value is not None else variable

        up_matchers = [s.job]
        if cluster:
            variables.append(query_variable("cluster", "Cluster", f"label_values(up{{{s.job}}}, {cluster})",
                                            all_value=".*"))
            up_matchers.append(f'{cluster}=~"$cluster"')
        variables.append(query_variable("job", "Job", f"label_values(up{{{', '.join(up_matchers)}}}, job)",
                                        all_value=".+"))
        target_matchers = [*up_matchers, 'job=~"$job"']
        if self.board.kind:
            target_matchers.append(f'kind="{self.board.kind}"')
        # a kind's dashboard has no all value: "All" is the list of that kind's targets, so the metrics
        # without a kind label (read duration, the exporter's counters) stay within the kind
        variables.append(query_variable(
            "target", "Target", f"label_values(gatewayscope_up{{{', '.join(target_matchers)}}}, target)",
            all_value=None if self.board.kind else ".+"))
        return variables

    def _carry(self) -> str:
        """The query string that carries the data source, cluster and job into a linked dashboard."""
        params = ["${datasource:queryparam}"]
        if self.config.cluster_label:
            params.append("${cluster:queryparam}")
        params.append("${job:queryparam}")
        return "&".join(params)

    def _board_link(self, other: Board) -> sdk_dashboard.DashboardLink:
        tooltip = "Every target" if other.kind is None else f"The {other.title.split(' / ')[1]} targets in detail"
        return (sdk_dashboard.DashboardLink(other.title.split(" / ")[1]).type(dashboard_model.DashboardLinkType.LINK)
                .url(f"{other.url(self.config)}?{self._carry()}").icon("dashboard").tooltip(tooltip)
                .keep_time(True).include_vars(False).target_blank(False).as_dropdown(False).tags([]))

    def drill(self, other: Board) -> list[sdk_dashboard.DashboardLink]:
        """A data link from a series to its target on the dashboard of its kind."""
        return [sdk_dashboard.DashboardLink(f"Open ${{__field.labels.target}} in {other.title}")
                .url(f"{other.url(self.config)}?var-target=${{__field.labels.target}}&{self._carry()}"
                     "&${__url_time_range}")]

    # -- selectors ------------------------------------------------------------------------------------

    def sel(self, *extra: str, target: bool = True) -> str:
        return self.s.panel(*extra, target=target)

    # -- rows and panels ------------------------------------------------------------------------------

    def _id(self) -> int:
        panel_id = self.next_id
        self.next_id += 1
        return panel_id

    def row(self, title: str) -> None:
        self.builder = self.builder.with_row(sdk_dashboard.Row(title).id(self._id()))

    def _common(self, panel: Any, title: str, description: str, unit: str, queries: Sequence[tuple[str, str]],
                *, width: int, height: int, instant: bool, table: bool, links: list[Any] | None,
                thresholds: Sequence[tuple[float | None, str]] | None, mappings: list[Any] | None,
                minimum: float | None, maximum: float | None, no_value: str | None) -> Any:
        refs = "ABCDEFGHIJ"
        panel = (panel.id(self._id()).title(title).description(description).datasource(DATASOURCE)
                 .span(width).height(height).unit(unit)
                 .targets([_query(expr, legend, refs[i], instant=instant, table=table)
                           for i, (expr, legend) in enumerate(queries)])
                 .thresholds(_thresholds(thresholds or [(None, "green")])))
        if links:
            panel = panel.data_links(links)
        if mappings:
            panel = panel.mappings(mappings)
        if minimum is not None:
            panel = panel.min(minimum)
        if maximum is not None:
            panel = panel.max(maximum)
        if no_value is not None:
            panel = panel.no_value(no_value)
        return panel

    def timeseries(self, title: str, description: str, unit: str, queries: Sequence[tuple[str, str]], *,
                   width: int = 12, height: int = 8, stack: bool = False, links: list[Any] | None = None,
                   thresholds: Sequence[tuple[float | None, str]] | None = None,
                   no_value: str | None = None) -> None:
        panel = self._common(sdk_timeseries.Panel(), title, description, unit, queries, width=width,
                             height=height, instant=False, table=False, links=links, thresholds=thresholds,
                             mappings=None, minimum=None, maximum=None, no_value=no_value)
        panel = (panel.line_width(1).fill_opacity(10 if stack else 0)
                 .show_points(common_model.VisibilityMode.NEVER).span_nulls(True)
                 .stacking(sdk_common.StackingConfig()
                           .mode(common_model.StackingMode.NORMAL if stack else common_model.StackingMode.NONE)
                           .group("A"))
                 .color_scheme(sdk_dashboard.FieldColor().mode(dashboard_model.FieldColorModeId.PALETTE_CLASSIC))
                 .legend(sdk_common.VizLegendOptions().display_mode(common_model.LegendDisplayMode.TABLE)
                         .placement(common_model.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull"]))
                 .tooltip(sdk_common.VizTooltipOptions().mode(common_model.TooltipDisplayMode.MULTI)
                          .sort(common_model.SortOrder.DESCENDING)))
        self.builder = self.builder.with_panel(panel)

    def stat(self, title: str, description: str, unit: str, queries: Sequence[tuple[str, str]], *,
             width: int = 8, height: int = 8, links: list[Any] | None = None,
             thresholds: Sequence[tuple[float | None, str]] | None = None, mappings: list[Any] | None = None,
             no_value: str | None = None) -> None:
        panel = self._common(sdk_stat.Panel(), title, description, unit, queries, width=width, height=height,
                             instant=True, table=False, links=links, thresholds=thresholds, mappings=mappings,
                             minimum=None, maximum=None, no_value=no_value)
        panel = (panel.color_scheme(sdk_dashboard.FieldColor().mode(dashboard_model.FieldColorModeId.THRESHOLDS))
                 .reduce_options(_reduce_last())
                 .color_mode(common_model.BigValueColorMode.BACKGROUND)
                 .graph_mode(common_model.BigValueGraphMode.NONE)
                 .text_mode(common_model.BigValueTextMode.VALUE_AND_NAME)
                 .justify_mode(common_model.BigValueJustifyMode.AUTO)
                 .orientation(common_model.VizOrientation.AUTO))
        self.builder = self.builder.with_panel(panel)

    def bargauge(self, title: str, description: str, unit: str, queries: Sequence[tuple[str, str]], *,
                 width: int = 8, height: int = 8, links: list[Any] | None = None,
                 thresholds: Sequence[tuple[float | None, str]] | None = None, minimum: float | None = None,
                 maximum: float | None = None, no_value: str | None = None) -> None:
        panel = self._common(sdk_bargauge.Panel(), title, description, unit, queries, width=width,
                             height=height, instant=True, table=False, links=links, thresholds=thresholds,
                             mappings=None, minimum=minimum, maximum=maximum, no_value=no_value)
        panel = (panel.color_scheme(sdk_dashboard.FieldColor().mode(dashboard_model.FieldColorModeId.THRESHOLDS))
                 .reduce_options(_reduce_last())
                 .display_mode(common_model.BarGaugeDisplayMode.GRADIENT)
                 .orientation(common_model.VizOrientation.HORIZONTAL)
                 .show_unfilled(True))
        self.builder = self.builder.with_panel(panel)

    def table(self, title: str, description: str, unit: str, queries: Sequence[tuple[str, str]], *,
              width: int = 12, height: int = 10) -> None:
        hidden = {"Time": True, "__name__": True, "job": True, "instance": True}
        if self.config.cluster_label:
            hidden[self.config.cluster_label] = True
        panel = self._common(sdk_table.Panel(), title, description, unit, queries, width=width, height=height,
                             instant=True, table=True, links=None, thresholds=None, mappings=None,
                             minimum=None, maximum=None, no_value=None)
        panel = (panel.show_header(True)
                 .sort_by([sdk_common.TableSortByFieldState().display_name("Value").desc(True)])
                 .with_transformation(dashboard_model.DataTransformerConfig(
                     id_val="organize", options={"excludeByName": hidden})))
        self.builder = self.builder.with_panel(panel)

    def render(self) -> str:
        return json.dumps(self.builder.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def _scrape_health(page: Page, kind: str) -> None:
    """The first row of a kind's dashboard: is each target read, how fast, how fresh, and by whom."""
    sel = page.sel()
    page.row("Scrape health")
    page.stat("Up", "The exporter's last read of each target succeeded (UP) or not (DOWN).", "none",
              [(f"gatewayscope_up{page.sel(eq('kind', kind))}", "{{target}}")], width=4, height=5,
              mappings=UP_MAPPINGS, thresholds=[(None, "red"), (1, "green")])
    page.stat("Read duration", "How long the read behind the values took.", "s",
              [(f"gatewayscope_scrape_duration_seconds{sel}", "{{target}}")], width=4, height=5)
    page.stat("Age of the values", "Seconds since the read behind the values started.", "s",
              [(f"gatewayscope_exporter_snapshot_age_seconds{sel}", "{{target}}")], width=4, height=5)
    page.stat("Reads in progress", "1 while a read of the target is running; stuck at 1 means the gateway "
              "hangs.", "none", [(f"gatewayscope_exporter_read_in_progress{sel}", "{{target}}")], width=4,
              height=5, thresholds=[(None, "green"), (1, "orange")])
    page.timeseries("Exporter reads and scrapes", "Reads completed by result and scrapes by where their values "
                    "came from, per second.", "reqps",
                    [(f"sum by (target, result) (rate(gatewayscope_exporter_target_reads_total{sel}"
                      "[$__rate_interval]))", "{{target}} read {{result}}"),
                     (f"sum by (target, source) (rate(gatewayscope_exporter_target_scrapes_total{sel}"
                      "[$__rate_interval]))", "{{target}} scrape {{source}}")], width=8, height=5)


def overview(config: MixinConfig) -> str:
    """Every target at a glance; each kind's panels link to that kind's dashboard."""
    page = Page(config, OVERVIEW, "Scrape health, orphan sessions and their growth, the tombstone guard, Bifrost "
                "parked workers, boot memory, pool policy, posture drift and unreachable records for every "
                "gatewayscope target; each panel opens its target on the dashboard of its kind.")
    names = record_names(config)
    sel = page.sel()
    rllm, bifrost = page.drill(TRACE_STORE), page.drill(BIFROST)
    page.row("Targets")
    page.stat("Trace stores up", "gatewayscope_up of each rLLM target: the exporter's last read of it succeeded "
              "(UP) or it was down, answered garbage or missed the scrape deadline (DOWN).", "none",
              [(f"gatewayscope_up{page.sel(eq('kind', 'rllm'))}", "{{target}}")], width=6,
              height=5, mappings=UP_MAPPINGS, thresholds=[(None, "red"), (1, "green")], links=rllm)
    page.stat("Bifrost gateways up", "gatewayscope_up of each Bifrost target.", "none",
              [(f"gatewayscope_up{page.sel(eq('kind', 'bifrost'))}", "{{target}}")], width=6,
              height=5, mappings=UP_MAPPINGS, thresholds=[(None, "red"), (1, "green")], links=bifrost)
    page.timeseries("Read duration", "How long each target's read took (gatewayscope_scrape_duration_seconds); a "
                    "read near the scrape timeout will soon miss its deadline.", "s",
                    [(f"gatewayscope_scrape_duration_seconds{sel}", "{{target}}")], width=6, height=5)
    page.timeseries("Age of the values", "Seconds since the read behind the served values started (at most "
                    "about min_interval_seconds plus a read).", "s",
                    [(f"gatewayscope_exporter_snapshot_age_seconds{sel}", "{{target}}")], width=6, height=5)

    page.row("rLLM trace stores")
    page.timeseries("Orphan sessions", "One-trace sessions resurrected by straggling trace writes after their "
                    "delete: confirmed (tombstoned or seen deleted) and suspected (idle, one trace).", "short",
                    [(f"sum by (target, confidence) (gatewayscope_trace_store_orphan_sessions{sel})",
                      "{{target}} {{confidence}}")], stack=True, links=rllm)
    page.timeseries("Orphan growth (above the last hour's low)", "How far each target's orphan count is above "
                    "its lowest point of the last hour: above 0, stragglers are resurrecting deleted sessions "
                    "again (a cleanup lowers the low point instead of showing as negative growth).", "short",
                    [(f"{names['orphan_rise']}{sel}", "{{target}}")], links=rllm,
                    thresholds=[(None, "green"), (1, "orange")])
    page.timeseries("Tombstones against their capacity", "Deleted session ids the guard remembers, and the most "
                    "it keeps before evicting the oldest (0 capacity: unlimited or disabled).", "short",
                    [(f"gatewayscope_trace_store_tombstones{sel}", "{{target}} tombstones"),
                     (f"gatewayscope_trace_store_tombstone_capacity{sel}", "{{target}} capacity")], width=8,
                    links=rllm)
    page.bargauge("Tombstone capacity used", "Tombstones over capacity for guards with a cap; near 100 % the "
                  "oldest tombstones are evicted and their late writes resurrect sessions.", "percentunit",
                  [(f"gatewayscope_trace_store_tombstones{sel} / (gatewayscope_trace_store_tombstone_capacity{sel}"
                    " > 0)", "{{target}}")], minimum=0, maximum=1, links=rllm,
                  thresholds=[(None, "green"), (0.75, "orange"), (0.9, "red")])
    page.timeseries("Dropped straggler writes", "Trace writes per second the guard dropped because their "
                    f"session had been deleted (each one an orphan prevented; {config.recording_rate_window} "
                    "rate).", "wps", [(f"{names['dropped']}{sel}", "{{target}}")], width=8, links=rllm)

    page.row("Bifrost gateways")
    page.timeseries("Parked workers by kind", "Worker goroutines Bifrost's stored provider records park from "
                    "boot on, whether traffic comes or not.", "short",
                    [(f"sum by (target, kind) (gatewayscope_bifrost_parked_workers{sel})", "{{target}} {{kind}}")],
                    stack=True, links=bifrost)
    page.timeseries("Boot memory against the limit", "Goroutine stacks the parked workers need at boot (low: "
                    "2 KiB each, high: 8 KiB each) against the gateway's memory limit. Low above the limit: the "
                    "gateway will not come back after a restart.", "bytes",
                    [(f"gatewayscope_bifrost_worker_stack_bytes{sel}", "{{target}} stacks ({{bound}})"),
                     (f"gatewayscope_bifrost_memory_limit_bytes{sel}", "{{target}} limit")], links=bifrost)
    page.timeseries("Boot memory by kind (high bound)", f"Stacks of each kind's parked workers at "
                    f"{STACK_HIGH // 1024} KiB per worker, stacked, against the memory limit.", "bytes",
                    [(f"sum by (target, kind) (gatewayscope_bifrost_parked_workers{sel}) * {STACK_HIGH}",
                      "{{target}} {{kind}}"),
                     (f"gatewayscope_bifrost_memory_limit_bytes{sel}", "{{target}} limit")], width=8, links=bifrost)
    page.timeseries("Boot memory by kind (low bound)", f"Stacks of each kind's parked workers at "
                    f"{STACK_LOW // 1024} KiB per worker (the Go runtime's floor), against the memory limit.",
                    "bytes",
                    [(f"sum by (target, kind) (gatewayscope_bifrost_parked_workers{sel}) * {STACK_LOW}",
                      "{{target}} {{kind}}"),
                     (f"gatewayscope_bifrost_memory_limit_bytes{sel}", "{{target}} limit")], width=8, links=bifrost)
    page.stat("Boot memory headroom (high bound)", "Memory limit minus the high-bound stack estimate; negative "
              "means the gateway may be killed while it boots.", "bytes",
              [(f"gatewayscope_bifrost_memory_limit_bytes{sel} - ignoring(bound) "
                f"gatewayscope_bifrost_worker_stack_bytes{page.sel(eq('bound', 'high'))}",
                "{{target}}")], thresholds=[(None, "red"), (0, "green")], links=bifrost)
    page.timeseries("Records over pool by kind", "Provider records whose concurrency is above the pool policy "
                    "for their kind (standard 512, custom 64 by default).", "short",
                    [(f"sum by (target, kind) (gatewayscope_bifrost_records_over_pool{sel})", "{{target}} {{kind}}")],
                    width=8, links=bifrost)
    page.stat("Predicted boot memory against the limit", "The boot memory predicted from each gateway's own "
              "runtime metrics (or the band's high bound without them) over its effective memory limit (the "
              "container's from kube-state-metrics, else the configured one); above 100 % a restart is killed.",
              "percentunit", [(f"{names['limit_ratio']}{sel}", "{{target}} ({{model}})")],
              thresholds=[(None, "green"), (0.9, "orange"), (1, "red")], links=bifrost)
    page.stat("Posture drift", "Client settings away from the safe posture: drop_excess_requests off, "
              "enforce_auth_on_inference on, disable_content_logging on.", "none",
              [(f"gatewayscope_bifrost_posture_drift{sel}", "{{target}} {{setting}}")], mappings=DRIFT_MAPPINGS,
              thresholds=[(None, "green"), (1, "orange")], links=bifrost)
    page.timeseries("Unreachable records", "Provider records whose base URL host does not resolve, or whose "
                    "provider_status is error: they park workers for nothing.", "short",
                    [(f"gatewayscope_bifrost_unreachable_records{sel}", "{{target}}")], width=8, links=bifrost)

    page.row("Exporter")
    page.stat("Exporter scraped", "Prometheus's own up of every gatewayscope scrape: 0 (DOWN) or missing "
              "silences every gatewayscope alert (GatewayscopeExporterDown).", "none",
              [(f"up{page.sel(target=False)}", "{{job}} {{instance}}")], mappings=UP_MAPPINGS,
              thresholds=[(None, "red"), (1, "green")])
    page.timeseries("Exporter reads per second", "Reads of each target the exporter completed, by result "
                    f"({config.recording_rate_window} rate); the minimum interval keeps this at most one per "
                    "interval per target.", "ops", [(f"{names['reads']}{sel}", "{{target}} {{result}}")], width=8)
    page.timeseries("Scrapes by source", "Where each scrape got a target's values: a new read, a read already "
                    "running, the cached last read, or none in time (deadline); "
                    f"{config.recording_rate_window} rate.", "reqps",
                    [(f"{names['scrapes']}{sel}", "{{target}} {{source}}")], width=8)

    # heal's series describe the heal process (an exporter run with --heal); only its per-action ones name a target
    heal = page.sel(target=False)
    page.row("Heal")
    page.stat("Heal breaker and kill switch", "1 while heal's breaker is open (its error budget ran out; "
              "'gatewayscope heal reset' closes it) or its pause file exists (the kill switch): no write starts.",
              "none", [(f"gatewayscope_heal_breaker_open{heal}", "{{instance}} breaker open"),
                       (f"gatewayscope_heal_paused{heal}", "{{instance}} paused")],
              thresholds=[(None, "green"), (1, "red")], width=6)
    page.stat("Since the last heal pass", "Seconds since the last heal pass ended, against its interval "
              "(GatewayscopeHealStuck fires past three intervals).", "s",
              [(f"time() - gatewayscope_heal_last_pass_timestamp_seconds{heal}", "{{instance}} since the last"),
               (f"gatewayscope_heal_interval_seconds{heal}", "{{instance}} interval"),
               (f"gatewayscope_heal_last_pass_duration_seconds{heal}", "{{instance}} last pass took")], width=6)
    page.stat("Heal error budget", "Refused, unconfirmed and stale outcomes in the breaker's window, against the "
              "errors it allows before it opens.", "short",
              [(f"gatewayscope_heal_errors_in_window{heal}", "{{instance}} errors"),
               (f"gatewayscope_heal_error_budget{heal}", "{{instance}} budget")], width=6)
    page.stat("Heal blocked", "The reasons that held writes in the last pass (paused, breaker, window, alert; "
              "gateway-health holds only the target whose health check failed), and the kinds heal enforces.",
              "none", [(f"gatewayscope_heal_blocked{heal}", "{{instance}} {{reason}}"),
                       (f"gatewayscope_heal_enforced{heal}", "{{instance}} enforces {{kind}}")], width=6)
    # counts since the heal process started (a fleet-wide overview reads no raw rate; a restart starts over)
    page.timeseries("Heal passes", "Heal passes since the process started, by result (ok; blocked: nothing was "
                    "written; error: the pass could not run).", "short",
                    [(f"sum by (instance, result) (gatewayscope_heal_passes_total{heal})", "{{instance}} {{result}}")],
                    width=8)
    page.timeseries("Heal actions by outcome", "Actions heal wrote since the process started, by target, kind "
                    "and outcome.", "short",
                    [(f"sum by (target, kind, outcome) (gatewayscope_heal_actions_total{sel})",
                      "{{target}} {{kind}} {{outcome}}")], width=8)
    page.timeseries("Heal would do and deferred", "What the last pass would have written but did not (dry-run, "
                    "or held by a block), and what the caps left for a later pass, by target and kind.", "short",
                    [(f"gatewayscope_heal_dry_run_actions{sel}", "{{target}} {{kind}} would do"),
                     (f"gatewayscope_heal_deferred_actions{sel}", "{{target}} {{kind}} deferred")], width=8)
    return page.render()


def trace_store(config: MixinConfig) -> str:
    """The rLLM trace stores in detail: scrape health, sessions and orphans, the tombstone guard."""
    page = Page(config, TRACE_STORE, "The rLLM trace-store targets in detail: scrape health, sessions, orphan "
                "sessions and their growth, and the tombstone guard.")
    names = record_names(config)
    sel = page.sel()
    _scrape_health(page, "rllm")
    page.row("Trace store")
    page.timeseries("Sessions and traces", "What the trace store holds.", "short",
                    [(f"gatewayscope_trace_store_sessions{sel}", "{{target}} sessions"),
                     (f"gatewayscope_trace_store_traces{sel}", "{{target}} traces")], width=8)
    page.timeseries("Orphan sessions by confidence", "Confirmed: tombstoned or seen deleted before. Suspected: "
                    "one trace, idle past the policy.", "short",
                    [(f"gatewayscope_trace_store_orphan_sessions{sel}", "{{target}} {{confidence}}")], width=8,
                    stack=True)
    page.stat("Oldest orphan", "Time since the newest trace of the oldest orphan session.", "s",
              [(f"gatewayscope_trace_store_oldest_orphan_age_seconds{sel}", "{{target}}")], width=4)
    page.stat("Orphan growth (last hour)", "How far the orphan count is above its lowest point of the last "
              "hour (what GatewayscopeOrphanSessionsGrowing watches).", "short",
              [(f"{names['orphan_rise']}{sel}", "{{target}}")], width=4, thresholds=[(None, "green"), (1, "orange")])
    page.row("Tombstone guard")
    no_guard = "no guard"
    page.timeseries("Tombstones", "Deleted session ids the guard remembers, against its capacity (no data: no "
                    "guard installed).", "short",
                    [(f"gatewayscope_trace_store_tombstones{sel}", "{{target}} tombstones"),
                     (f"gatewayscope_trace_store_tombstone_capacity{sel}", "{{target}} capacity")], width=8,
                    no_value=no_guard)
    page.stat("Tombstone capacity used", "Tombstones over capacity (guards with a cap only).", "percentunit",
              [(f"gatewayscope_trace_store_tombstones{sel} / (gatewayscope_trace_store_tombstone_capacity{sel} > 0)",
                "{{target}}")], thresholds=[(None, "green"), (0.75, "orange"), (0.9, "red")], no_value=no_guard)
    page.timeseries("Dropped straggler writes", "Trace writes per second the guard dropped: their requests reached "
                    "the gateway before their session's latest delete (stragglers).", "wps",
                    [(f"sum by (target) (rate(gatewayscope_trace_store_dropped_writes_total{sel}"
                      "[$__rate_interval]))", "{{target}}")], width=8, no_value=no_guard)
    page.timeseries("Writes kept after a fence", "Trace writes per second the guard kept for a deleted session id "
                    "because they came after its latest delete: new uses of the id (rLLM's next step, a retry). "
                    "Kept, never dropped.", "wps",
                    [(f"sum by (target) (rate(gatewayscope_trace_store_kept_after_fence_writes_total{sel}"
                      "[$__rate_interval]))", "{{target}}")], width=8, no_value=no_guard)
    return page.render()


def bifrost(config: MixinConfig) -> str:
    """The Bifrost gateways in detail: records and pools, boot memory, the heaviest records, posture."""
    page = Page(config, BIFROST, "The Bifrost targets in detail: scrape health, provider records, parked workers "
                "and queue slots, boot memory against the limit, the heaviest records, posture drift.")
    sel = page.sel()
    _scrape_health(page, "bifrost")
    page.row("Records and pools")
    page.timeseries("Provider records by kind", "Stored Bifrost provider records.", "short",
                    [(f"gatewayscope_bifrost_provider_records{sel}", "{{target}} {{kind}}")], width=6, stack=True)
    page.timeseries("Parked workers by kind", "Worker goroutines the records park from boot on.", "short",
                    [(f"gatewayscope_bifrost_parked_workers{sel}", "{{target}} {{kind}}")], width=6, stack=True)
    page.timeseries("Queue slots by kind", "Queue slots the records hold.", "short",
                    [(f"gatewayscope_bifrost_queue_slots{sel}", "{{target}} {{kind}}")], width=6, stack=True)
    page.timeseries("Records over pool by kind", "Records whose concurrency is above the pool policy for their "
                    "kind.", "short", [(f"gatewayscope_bifrost_records_over_pool{sel}", "{{target}} {{kind}}")],
                    width=6)
    page.row("Boot memory")
    page.timeseries("Boot memory against the limit", "Goroutine stacks at boot, low (2 KiB per worker) and high "
                    "(8 KiB per worker) bound, against the memory limit.", "bytes",
                    [(f"gatewayscope_bifrost_worker_stack_bytes{sel}", "{{target}} stacks ({{bound}})"),
                     (f"gatewayscope_bifrost_memory_limit_bytes{sel}", "{{target}} limit")])
    page.bargauge("Boot memory by kind (high bound)", f"Stacks of each kind's parked workers at "
                  f"{STACK_HIGH // 1024} KiB per worker.", "bytes",
                  [(f"gatewayscope_bifrost_parked_workers{sel} * {STACK_HIGH}", "{{target}} {{kind}}")], width=6)
    page.stat("Boot memory headroom (high bound)", "Memory limit minus the high-bound stack estimate; negative "
              "means the gateway may be killed while it boots.", "bytes",
              [(f"gatewayscope_bifrost_memory_limit_bytes{sel} - ignoring(bound) "
                f"gatewayscope_bifrost_worker_stack_bytes{page.sel(eq('bound', 'high'))}",
                "{{target}}")], width=6, thresholds=[(None, "red"), (0, "green")])
    names = record_names(config)
    page.row("Boot memory, measured")
    page.timeseries("Predicted boot memory beside the band", "What a restart would need by the model used "
                    "(measured: what the gateway holds besides its goroutines' stacks plus the parked workers at "
                    "its measured stack per goroutine; band: 8 KiB per worker when no trusted metrics answer), the "
                    "band's two bounds, and the memory limit: the container's from kube-state-metrics where the "
                    "target names its pod, else the configured one.", "bytes",
                    [(f"gatewayscope_bifrost_boot_memory_predicted_bytes{sel}", "{{target}} predicted ({{model}})"),
                     (f"gatewayscope_bifrost_worker_stack_bytes{sel}", "{{target}} band ({{bound}})"),
                     (f"{names['limit']}{sel}", "{{target}} limit ({{limit_source}})")])
    page.stat("Predicted boot memory against the limit", "The prediction over the effective memory limit; above "
              "100 % the next restart is killed while it boots (GatewayscopeBifrostBootMemoryPredictedOverLimit).",
              "percentunit", [(f"{names['limit_ratio']}{sel}", "{{target}} ({{model}}, {{limit_source}})")],
              width=6, thresholds=[(None, "green"), (0.9, "orange"), (1, "red")])
    page.stat("Runtime metrics", "The state of each gateway's own runtime metrics: trusted (the measured model "
              "is used), untrusted (they do not match the records' parked workers) or absent (not read, or no "
              "usable answer); the band is used unless trusted.", "none",
              [(f"gatewayscope_bifrost_runtime_metrics_status{sel} == 1", "{{target}} {{status}}")], width=6)
    page.timeseries("Goroutines and parked workers", "Goroutines the gateway reports, against the workers its "
                    "records park: far apart, its metrics are not trusted.", "short",
                    [(f"gatewayscope_bifrost_goroutines{sel}", "{{target}} goroutines"),
                     (f"sum by (target) (gatewayscope_bifrost_parked_workers{sel})", "{{target}} parked workers")],
                    width=8)
    page.timeseries("Resident memory and baseline", "What the gateway holds now, and what it holds besides its "
                    "goroutines' stacks (the part that does not grow with the records).", "bytes",
                    [(f"gatewayscope_bifrost_resident_memory_bytes{sel}", "{{target}} resident"),
                     (f"gatewayscope_bifrost_measured_baseline_bytes{sel}", "{{target}} baseline")], width=8)
    page.stat("Stack per goroutine", "Measured: stacks in use over goroutines (the band assumes 2 to 8 KiB).",
              "bytes", [(f"gatewayscope_bifrost_measured_stack_bytes_per_goroutine{sel}", "{{target}}")], width=4)
    page.stat("Calibration error", "How far the measured model's prediction for the running gateway is from what "
              "it holds now (its size); near 0 the model can be trusted.", "percentunit",
              [(f"abs(gatewayscope_bifrost_boot_memory_calibration_error_ratio{sel})", "{{target}}")], width=4,
              thresholds=[(None, "green"), (0.05, "orange"), (0.2, "red")])
    page.row("Records")
    page.table("Records with the most parked workers", "The records the exporter gives a series "
               "(max_record_series, by parked workers); _other sums the rest per kind.", "short",
               [(f"topk(25, gatewayscope_bifrost_record_parked_workers{sel})", "{{record}}")])
    page.stat("Unreachable records", "Records whose base URL does not resolve, or whose status is error.",
              "short", [(f"gatewayscope_bifrost_unreachable_records{sel}", "{{target}}")], width=4, height=10,
              thresholds=[(None, "green"), (1, "orange")])
    page.stat("Posture drift", "Each client setting: safe or DRIFT.", "none",
              [(f"gatewayscope_bifrost_posture_drift{sel}", "{{target}} {{setting}}")], height=10,
              mappings=DRIFT_MAPPINGS, thresholds=[(None, "green"), (1, "orange")])
    return page.render()


# == output =================================================================================================

def render_all(config: MixinConfig | None = None) -> dict[str, str]:
    """Path under the output folder -> text, for every generated file."""
    config = config or MixinConfig()
    files = {f"grafana/{board.file}": build(config)
             for board, build in ((OVERVIEW, overview), (TRACE_STORE, trace_store), (BIFROST, bifrost))}
    files.update(render_rules(config))
    return files


def parse_args(argv: Sequence[str]) -> tuple[MixinConfig, Path, Path | None, bool]:
    parser = argparse.ArgumentParser(prog="python dashboards/build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="a JSON object of MixinConfig fields (docs/mixin.md)")
    parser.add_argument("--job-selector", help=f"PromQL label matchers of the gatewayscope jobs "
                        f"(default {DEFAULT_JOB_SELECTOR})")
    parser.add_argument("--cluster-label", help="the label that tells clusters apart (default: none)")
    parser.add_argument("--runbook-base-url", help=f"where docs/runbooks.md is served "
                        f"(default {DEFAULT_RUNBOOK_BASE_URL})")
    parser.add_argument("--uid-prefix", dest="dashboard_uid_prefix", help="dashboard uid prefix")
    parser.add_argument("--tag", dest="dashboard_tags", action="append", help="a dashboard tag (repeatable)")
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: dashboards/)")
    parser.add_argument("--chart", type=Path,
                        help="the Helm chart folder whose files/rules.yaml to write (default: deploy/helm/gatewayscope "
                             "with the default --out, none with another)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a file under --out (or the chart's) differs from the build")
    args = parser.parse_args(list(argv))
    values: dict[str, Any] = json.loads(args.config.read_text()) if args.config else {}
    for name in ("job_selector", "cluster_label", "runbook_base_url", "dashboard_uid_prefix", "dashboard_tags"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    try:
        config = MixinConfig.from_mapping(values)
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    chart = args.chart if args.chart is not None else (CHART if args.out == HERE else None)
    return config, args.out, chart, args.check


def main(argv: Sequence[str]) -> int:
    config, out, chart, check = parse_args(argv)
    stale = []
    files = {out / name: text for name, text in render_all(config).items()}
    if chart is not None:
        files[chart / CHART_RULES] = render_chart_rules(config)
    for path, text in files.items():
        name = str(path.relative_to(out)) if path.is_relative_to(out) else str(path)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print("stale (run python dashboards/build.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
