#!/usr/bin/env python3
"""Write the gatewayscope Grafana dashboards (classic JSON model) from this one description.

Run ``python dashboards/build.py`` after changing a panel; it rewrites ``grafana/overview.json`` and
``grafana/target.json`` next to it. ``tests/mixin/test_dashboards.py`` fails when the committed JSON
differs from what this script writes, so the two never drift apart.

Conventions (checked by the tests): a ``datasource`` variable of type datasource and a ``target``
variable from ``label_values(gatewayscope_up, target)``; every panel and query uses the datasource
variable (no datasource uid is written down); every panel has a unit; every ``rate()`` uses
``$__rate_interval``; every metric comes from the exporter's metric list.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
OVERVIEW_UID = "gatewayscope-overview"
TARGET_UID = "gatewayscope-target"
#: Grafana's stack sizes per parked worker (DESIGN: 2 KiB floor, 8 KiB typical), for the per-kind view
STACK_LOW, STACK_HIGH = 2048, 8192


def _drill_link() -> list[dict[str, Any]]:
    return [{
        "title": "Open ${__field.labels.target} in the per-target dashboard",
        "url": f"/d/{TARGET_UID}/gatewayscope-target?var-target=${{__field.labels.target}}"
               "&${datasource:queryparam}&${__url_time_range}",
    }]


def _query(expr: str, legend: str, ref: str, *, instant: bool = False, fmt: str | None = None) -> dict[str, Any]:
    query: dict[str, Any] = {"refId": ref, "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
    if instant:
        query["instant"] = True
        query["range"] = False
    if fmt:
        query["format"] = fmt
    return query


class Layout:
    """Places panels left to right, top to bottom, on Grafana's 24-column grid."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_height = 0
        self.next_id = 1

    def place(self, width: int, height: int) -> tuple[dict[str, int], int]:
        if self.x + width > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        pos = {"x": self.x, "y": self.y, "w": width, "h": height}
        self.x += width
        self.row_height = max(self.row_height, height)
        panel_id = self.next_id
        self.next_id += 1
        return pos, panel_id


def panel(layout: Layout, kind: str, title: str, description: str, unit: str,
          queries: list[tuple[str, str]], *, width: int = 12, height: int = 8, drill: bool = True,
          mappings: list[dict[str, Any]] | None = None, thresholds: list[tuple[float | None, str]] | None = None,
          instant: bool = False, options: dict[str, Any] | None = None, decimals: int | None = None,
          minimum: float | None = None, maximum: float | None = None,
          stack: bool = False) -> dict[str, Any]:
    """One panel (``kind``: timeseries, stat, bargauge, table) with its queries as (expr, legend) pairs."""
    pos, panel_id = layout.place(width, height)
    refs = "ABCDEFGHIJ"
    fmt = "table" if kind == "table" else None
    defaults: dict[str, Any] = {"unit": unit}
    if decimals is not None:
        defaults["decimals"] = decimals
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if mappings:
        defaults["mappings"] = mappings
    steps = thresholds or [(None, "green")]
    defaults["thresholds"] = {"mode": "absolute",
                              "steps": [{"color": color, "value": value} for value, color in steps]}
    if drill:
        defaults["links"] = _drill_link()
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0,
                              "showPoints": "never", "spanNulls": True,
                              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
        defaults["color"] = {"mode": "palette-classic"}
    elif kind in ("stat", "bargauge"):
        defaults["color"] = {"mode": "thresholds"}
    body: dict[str, Any] = {
        "id": panel_id,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": pos,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [_query(expr, legend, refs[i], instant=instant or kind in ("stat", "bargauge", "table"),
                           fmt=fmt)
                    for i, (expr, legend) in enumerate(queries)],
    }
    if kind == "timeseries":
        body["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
                           "tooltip": {"mode": "multi", "sort": "desc"}}
    elif kind == "stat":
        body["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                           "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                           "justifyMode": "auto", "orientation": "auto"}
    elif kind == "bargauge":
        body["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                           "displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True}
    elif kind == "table":
        body["options"] = {"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]}
        body["transformations"] = [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True}}}]
    if options:
        body["options"].update(options)
    return body


UP_MAPPINGS = [{"type": "value", "options": {"0": {"text": "DOWN", "color": "red", "index": 0},
                                             "1": {"text": "UP", "color": "green", "index": 1}}}]
DRIFT_MAPPINGS = [{"type": "value", "options": {"0": {"text": "safe", "color": "green", "index": 0},
                                                "1": {"text": "DRIFT", "color": "orange", "index": 1}}}]


def variables(*, multi: bool) -> dict[str, Any]:
    """The two variables every gatewayscope dashboard has."""
    return {"list": [
        {
            "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False,
        },
        {
            "name": "target", "label": "Target", "type": "query", "datasource": DATASOURCE,
            "query": {"query": "label_values(gatewayscope_up, target)", "refId": "gatewayscope-target"},
            "definition": "label_values(gatewayscope_up, target)",
            "current": {}, "hide": 0, "includeAll": multi, "multi": multi, "allValue": ".+" if multi else None,
            "options": [], "refresh": 2, "regex": "", "sort": 1, "skipUrlSync": False,
        },
    ]}


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]], *, multi: bool,
              links: list[dict[str, Any]]) -> dict[str, Any]:
    templating = variables(multi=multi)
    for item in templating["list"]:
        if item.get("allValue") is None:
            item.pop("allValue", None)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gatewayscope"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "refresh": "1m",
        "annotations": {"list": []},
        "links": links,
        "templating": templating,
        "panels": panels,
    }


def overview() -> dict[str, Any]:
    """Every target at a glance; each panel links to the per-target dashboard."""
    sel = 'target=~"$target"'
    lay = Layout()
    panels = [
        panel(lay, "stat", "Targets up", "gatewayscope_up per target: the exporter's last read of it succeeded "
              "(UP) or it was down, answered garbage or missed the scrape deadline (DOWN).", "none",
              [(f"gatewayscope_up{{{sel}}}", "{{target}} ({{kind}})")], width=8, height=5, mappings=UP_MAPPINGS,
              thresholds=[(None, "red"), (1, "green")]),
        panel(lay, "timeseries", "Read duration", "How long each target's read took (gatewayscope_scrape_duration_"
              "seconds); a read near the scrape timeout will soon miss its deadline.", "s",
              [(f"gatewayscope_scrape_duration_seconds{{{sel}}}", "{{target}}")], width=8, height=5),
        panel(lay, "timeseries", "Age of the values", "Seconds since the read behind the served values started "
              "(at most about min_interval_seconds plus a read).", "s",
              [(f"gatewayscope_exporter_snapshot_age_seconds{{{sel}}}", "{{target}}")], width=8, height=5),
        panel(lay, "timeseries", "Orphan sessions", "One-trace sessions resurrected by straggling trace writes "
              "after their delete: confirmed (tombstoned or seen deleted) and suspected (idle, one trace).", "short",
              [(f"sum by (target, confidence) (gatewayscope_trace_store_orphan_sessions{{{sel}}})",
                "{{target}} {{confidence}}")], stack=True),
        panel(lay, "timeseries", "Orphan sessions added (last hour)", "Change of the orphan count over the "
              "last hour per target: above 0 means stragglers are still resurrecting deleted sessions.", "short",
              [(f"sum by (target) (delta(gatewayscope_trace_store_orphan_sessions{{{sel}}}[1h]))",
                "{{target}}")]),
        panel(lay, "timeseries", "Tombstones against their capacity", "Deleted session ids the guard remembers, "
              "and the most it keeps before evicting the oldest (0 capacity: unlimited or disabled).", "short",
              [(f"gatewayscope_trace_store_tombstones{{{sel}}}", "{{target}} tombstones"),
               (f"gatewayscope_trace_store_tombstone_capacity{{{sel}}}", "{{target}} capacity")], width=8),
        panel(lay, "bargauge", "Tombstone capacity used", "Tombstones over capacity for guards with a cap; "
              "near 100 % the oldest tombstones are evicted and their late writes resurrect sessions.",
              "percentunit",
              [(f"gatewayscope_trace_store_tombstones{{{sel}}} / "
                f"(gatewayscope_trace_store_tombstone_capacity{{{sel}}} > 0)", "{{target}}")],
              width=8, minimum=0, maximum=1, thresholds=[(None, "green"), (0.75, "orange"), (0.9, "red")]),
        panel(lay, "timeseries", "Dropped straggler writes", "Trace writes per second the guard dropped because "
              "their session had been deleted (each one an orphan prevented).", "wps",
              [(f"sum by (target) (rate(gatewayscope_trace_store_dropped_writes_total{{{sel}}}[$__rate_interval]))",
                "{{target}}")], width=8),
        panel(lay, "timeseries", "Parked workers by kind", "Worker goroutines Bifrost's stored provider records "
              "park from boot on, whether traffic comes or not.", "short",
              [(f"sum by (target, kind) (gatewayscope_bifrost_parked_workers{{{sel}}})", "{{target}} {{kind}}")],
              stack=True),
        panel(lay, "timeseries", "Boot memory against the limit", "Goroutine stacks the parked workers need at "
              "boot (low: 2 KiB each, high: 8 KiB each) against the gateway's memory limit. Low above the limit: "
              "the gateway will not come back after a restart.", "bytes",
              [(f"gatewayscope_bifrost_worker_stack_bytes{{{sel}}}", "{{target}} stacks ({{bound}})"),
               (f"gatewayscope_bifrost_memory_limit_bytes{{{sel}}}", "{{target}} limit")]),
        panel(lay, "timeseries", "Boot memory by kind (high bound)", f"Stacks of each kind's parked workers at "
              f"{STACK_HIGH // 1024} KiB per worker, stacked, against the memory limit.", "bytes",
              [(f"sum by (target, kind) (gatewayscope_bifrost_parked_workers{{{sel}}}) * {STACK_HIGH}",
                "{{target}} {{kind}}"),
               (f"gatewayscope_bifrost_memory_limit_bytes{{{sel}}}", "{{target}} limit")], width=8),
        panel(lay, "timeseries", "Boot memory by kind (low bound)", f"Stacks of each kind's parked workers at "
              f"{STACK_LOW // 1024} KiB per worker (the Go runtime's floor), against the memory limit.", "bytes",
              [(f"sum by (target, kind) (gatewayscope_bifrost_parked_workers{{{sel}}}) * {STACK_LOW}",
                "{{target}} {{kind}}"),
               (f"gatewayscope_bifrost_memory_limit_bytes{{{sel}}}", "{{target}} limit")], width=8),
        panel(lay, "stat", "Boot memory headroom (high bound)", "Memory limit minus the high-bound stack "
              "estimate; negative means the gateway may be killed while it boots.", "bytes",
              [(f"gatewayscope_bifrost_memory_limit_bytes{{{sel}}} - ignoring(bound) "
                f"gatewayscope_bifrost_worker_stack_bytes{{{sel}, bound=\"high\"}}", "{{target}}")],
              width=8, thresholds=[(None, "red"), (0, "green")]),
        panel(lay, "timeseries", "Records over pool by kind", "Provider records whose concurrency is above the "
              "pool policy for their kind (standard 512, custom 64 by default).", "short",
              [(f"sum by (target, kind) (gatewayscope_bifrost_records_over_pool{{{sel}}})",
                "{{target}} {{kind}}")], width=8),
        panel(lay, "stat", "Posture drift", "Client settings away from the safe posture: drop_excess_requests "
              "off, enforce_auth_on_inference on, disable_content_logging on.", "none",
              [(f"gatewayscope_bifrost_posture_drift{{{sel}}}", "{{target}} {{setting}}")], width=8,
              mappings=DRIFT_MAPPINGS, thresholds=[(None, "green"), (1, "orange")]),
        panel(lay, "timeseries", "Unreachable records", "Provider records whose base URL host does not resolve, "
              "or whose provider_status is error: they park workers for nothing.", "short",
              [(f"gatewayscope_bifrost_unreachable_records{{{sel}}}", "{{target}}")], width=8),
        panel(lay, "timeseries", "Exporter reads per second", "Reads of each target the exporter completed, by "
              "result; the minimum interval keeps this at most one per interval per target.", "ops",
              [(f"sum by (target, result) (rate(gatewayscope_exporter_target_reads_total{{{sel}}}"
                "[$__rate_interval]))", "{{target}} {{result}}")], drill=False),
        panel(lay, "timeseries", "Scrapes by source", "Where each scrape got a target's values: a new read, a "
              "read already running, the cached last read, or none in time (deadline).", "reqps",
              [(f"sum by (target, source) (rate(gatewayscope_exporter_target_scrapes_total{{{sel}}}"
                "[$__rate_interval]))", "{{target}} {{source}}")], drill=False),
    ]
    links = [{"title": "Per target", "type": "link", "url": f"/d/{TARGET_UID}/gatewayscope-target",
              "icon": "dashboard", "keepTime": True, "includeVars": True, "targetBlank": False,
              "tooltip": "The drill-down for one target", "asDropdown": False, "tags": []}]
    return dashboard(OVERVIEW_UID, "gatewayscope / Overview",
                     "Scrape health, orphan sessions, the tombstone guard, Bifrost parked workers, boot memory, "
                     "pool policy, posture drift and unreachable records for every gatewayscope target.",
                     panels, multi=True, links=links)


def target() -> dict[str, Any]:
    """One target in detail (the drill-down)."""
    sel = 'target="$target"'
    lay = Layout()
    panels = [
        panel(lay, "stat", "Up", "The exporter's last read of this target succeeded (UP) or not (DOWN).", "none",
              [(f"gatewayscope_up{{{sel}}}", "{{kind}}")], width=4, height=4, mappings=UP_MAPPINGS,
              thresholds=[(None, "red"), (1, "green")], drill=False),
        panel(lay, "stat", "Read duration", "How long the read behind the values took.", "s",
              [(f"gatewayscope_scrape_duration_seconds{{{sel}}}", "read")], width=4, height=4, drill=False),
        panel(lay, "stat", "Age of the values", "Seconds since the read behind the values started.", "s",
              [(f"gatewayscope_exporter_snapshot_age_seconds{{{sel}}}", "age")], width=4, height=4, drill=False),
        panel(lay, "stat", "Reads in progress", "1 while a read of this target is running; stuck at 1 means "
              "the gateway hangs.", "none",
              [(f"gatewayscope_exporter_read_in_progress{{{sel}}}", "running")], width=4, height=4, drill=False,
              thresholds=[(None, "green"), (1, "orange")]),
        panel(lay, "timeseries", "Exporter reads and scrapes", "Reads completed by result and scrapes by where "
              "their values came from, per second.", "reqps",
              [(f"sum by (result) (rate(gatewayscope_exporter_target_reads_total{{{sel}}}[$__rate_interval]))",
                "read {{result}}"),
               (f"sum by (source) (rate(gatewayscope_exporter_target_scrapes_total{{{sel}}}[$__rate_interval]))",
                "scrape {{source}}")], width=8, height=4, drill=False),
        panel(lay, "timeseries", "Sessions and traces", "What the trace store holds.", "short",
              [(f"gatewayscope_trace_store_sessions{{{sel}}}", "sessions"),
               (f"gatewayscope_trace_store_traces{{{sel}}}", "traces")], width=8, drill=False),
        panel(lay, "timeseries", "Orphan sessions by confidence", "Confirmed: tombstoned or seen deleted before. "
              "Suspected: one trace, idle past the policy.", "short",
              [(f"gatewayscope_trace_store_orphan_sessions{{{sel}}}", "{{confidence}}")], width=8, drill=False,
              stack=True),
        panel(lay, "stat", "Oldest orphan", "Time since the newest trace of the oldest orphan session.", "s",
              [(f"gatewayscope_trace_store_oldest_orphan_age_seconds{{{sel}}}", "oldest")], width=4, drill=False),
        panel(lay, "stat", "Orphans added (last hour)", "Change of the orphan count over the last hour.", "short",
              [(f"sum(delta(gatewayscope_trace_store_orphan_sessions{{{sel}}}[1h]))", "added")], width=4,
              drill=False, thresholds=[(None, "green"), (1, "orange")]),
        panel(lay, "timeseries", "Tombstones", "Deleted session ids the guard remembers, against its capacity.",
              "short",
              [(f"gatewayscope_trace_store_tombstones{{{sel}}}", "tombstones"),
               (f"gatewayscope_trace_store_tombstone_capacity{{{sel}}}", "capacity")], width=8, drill=False),
        panel(lay, "stat", "Tombstone capacity used", "Tombstones over capacity (guards with a cap only).",
              "percentunit",
              [(f"gatewayscope_trace_store_tombstones{{{sel}}} / "
                f"(gatewayscope_trace_store_tombstone_capacity{{{sel}}} > 0)", "used")], width=8, drill=False,
              thresholds=[(None, "green"), (0.75, "orange"), (0.9, "red")]),
        panel(lay, "timeseries", "Dropped straggler writes", "Trace writes per second the guard dropped.", "wps",
              [(f"rate(gatewayscope_trace_store_dropped_writes_total{{{sel}}}[$__rate_interval])", "dropped")],
              width=8, drill=False),
        panel(lay, "timeseries", "Provider records by kind", "Stored Bifrost provider records.", "short",
              [(f"gatewayscope_bifrost_provider_records{{{sel}}}", "{{kind}}")], width=8, drill=False, stack=True),
        panel(lay, "timeseries", "Parked workers by kind", "Worker goroutines the records park from boot on.",
              "short", [(f"gatewayscope_bifrost_parked_workers{{{sel}}}", "{{kind}}")], width=8, drill=False,
              stack=True),
        panel(lay, "timeseries", "Queue slots by kind", "Queue slots the records hold.", "short",
              [(f"gatewayscope_bifrost_queue_slots{{{sel}}}", "{{kind}}")], width=8, drill=False, stack=True),
        panel(lay, "timeseries", "Boot memory against the limit", "Goroutine stacks at boot, low (2 KiB per "
              "worker) and high (8 KiB per worker) bound, against the memory limit.", "bytes",
              [(f"gatewayscope_bifrost_worker_stack_bytes{{{sel}}}", "stacks ({{bound}})"),
               (f"gatewayscope_bifrost_memory_limit_bytes{{{sel}}}", "limit")], width=12, drill=False),
        panel(lay, "bargauge", "Boot memory by kind (high bound)", f"Stacks of each kind's parked workers at "
              f"{STACK_HIGH // 1024} KiB per worker.", "bytes",
              [(f"gatewayscope_bifrost_parked_workers{{{sel}}} * {STACK_HIGH}", "{{kind}}")], width=12,
              drill=False),
        panel(lay, "table", "Records with the most parked workers", "The records the exporter gives a series "
              "(max_record_series, by parked workers); _other sums the rest per kind.", "short",
              [(f"topk(25, gatewayscope_bifrost_record_parked_workers{{{sel}}})", "{{record}}")], width=12,
              height=10, drill=False),
        panel(lay, "timeseries", "Records over pool by kind", "Records whose concurrency is above the pool "
              "policy for their kind.", "short",
              [(f"gatewayscope_bifrost_records_over_pool{{{sel}}}", "{{kind}}")], width=12, height=5,
              drill=False),
        panel(lay, "stat", "Unreachable records", "Records whose base URL does not resolve, or whose status is "
              "error.", "short", [(f"gatewayscope_bifrost_unreachable_records{{{sel}}}", "unreachable")],
              width=4, height=5, drill=False, thresholds=[(None, "green"), (1, "orange")]),
        panel(lay, "stat", "Posture drift", "Each client setting: safe or DRIFT.", "none",
              [(f"gatewayscope_bifrost_posture_drift{{{sel}}}", "{{setting}}")], width=8, height=5, drill=False,
              mappings=DRIFT_MAPPINGS, thresholds=[(None, "green"), (1, "orange")]),
    ]
    links = [{"title": "Overview", "type": "link", "url": f"/d/{OVERVIEW_UID}/gatewayscope-overview",
              "icon": "dashboard", "keepTime": True, "includeVars": False, "targetBlank": False,
              "tooltip": "Every target", "asDropdown": False, "tags": []}]
    return dashboard(TARGET_UID, "gatewayscope / Target",
                     "One gatewayscope target in detail: scrape health, the trace store and its guard, or the "
                     "Bifrost records, pools, boot memory and posture.", panels, multi=False, links=links)


def render_all() -> dict[str, str]:
    """File name (under grafana/) -> JSON text."""
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n"
            for name, build in (("overview.json", overview), ("target.json", target))}


def main(argv: list[str]) -> int:
    out = HERE / "grafana"
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
