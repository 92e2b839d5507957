"""A real Prometheus scrapes the real exporter, which reads real gateways; every dashboard query and alert holds.

The sandbox, made bad on purpose so every "fire when bad" alert has something to say:

* ``rllm-plain``: the unmodified rLLM gateway, driven through rollouts with real stragglers (orphans),
  and a second batch while Prometheus watches (orphans *growing*);
* ``rllm-sqlite``: the unmodified rLLM gateway with its SQLite store, read from the file: stragglers
  before the guard is installed (orphans), the guard installed with a capacity of 20 and more than 20
  deletes (tombstone capacity full), the earlier orphans backfilled with tombstones (confirmed orphans),
  and stragglers during the watch (dropped writes *increasing*);
* ``bifrost`` and ``bifrost-over``: the Bifrost emulator seeded realistic (records over pool, drifted
  posture, dead base URLs); the same gateway under two memory limits taken from the seed's own
  accounting, one between its low and high boot-memory bounds (at risk), one below the low bound (over);
* ``rllm-down``: a port where nothing listens (target down).

Prometheus (Debian's package) scrapes the exporter's ``/metrics`` (scrape-static.yml's job, which also
lists an address where nothing listens: an exporter that is down) and, through the relabeling of
scrape-multi-target.yml taken verbatim, ``/probe`` and ``/exporter-metrics``, with the alert and recording
rules loaded. Then every panel query of the three dashboards and every alert expression, exactly as
written in alerts.yml, is run through Prometheus's HTTP API and must return data; every rule must
evaluate without error and every alert must become pending or firing.

Substitutions: ``$__rate_interval`` -> ``10s`` (five scrapes at the 2 s interval; Grafana would pick at
least four scrape intervals); ``$job`` -> ``.+`` (its "All" value); ``$target`` -> ``.+`` (the overview's
"All" value) on the overview. On a kind's dashboard ``$target`` is its "All" value (the kind's targets,
as its target variable lists them) and then each target of that kind that is up in turn: every panel
must return data for every one of them, except the panels listed in EXPECTED_EMPTY for the target named
there, which must return nothing. No alert expression is modified.

Every wait is bounded; Prometheus, the exporter, the emulator and the gateways are stopped at teardown.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import DEFAULT_MEMORY_LIMIT_BYTES
from gatewayscope.sandbox.processes import ManagedProcess, free_port
from tests.e2e._support import prometheus_or_skip, rollouts, start_prometheus
from tests.helpers import start_server as start_on_free_port
from tests.helpers import wait_for as wait_until

pytestmark = pytest.mark.e2e
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
SCRAPE_INTERVAL = "2s"
RATE_INTERVAL = "10s"
TARGETS = ("rllm-plain", "rllm-sqlite", "bifrost", "bifrost-over", "rllm-down")
KIND_TARGETS = {"gatewayscope-trace-store.json": ("rllm-plain", "rllm-sqlite", "rllm-down"),
                "gatewayscope-bifrost.json": ("bifrost", "bifrost-over")}
DOWN_TARGETS = {"rllm-down"}
DASHBOARD_FILES = ("gatewayscope-overview.json", "gatewayscope-trace-store.json", "gatewayscope-bifrost.json")
#: (dashboard, panel title) -> the sandbox target for which that panel's queries return no data, on purpose.
#: rllm-plain is the unmodified rLLM gateway without the tombstone guard, and the exporter serves the
#: guard's series (tombstones, capacity, dropped writes) only where a guard is installed; the same panels
#: must show data for rllm-sqlite, whose SQLite store carries the guard.
EXPECTED_EMPTY = {
    ("gatewayscope-trace-store.json", "Tombstones"): "rllm-plain",
    ("gatewayscope-trace-store.json", "Tombstone capacity used"): "rllm-plain",
    ("gatewayscope-trace-store.json", "Dropped straggler writes"): "rllm-plain",
    ("gatewayscope-trace-store.json", "Writes kept after a fence"): "rllm-plain",
    # the exporter's heal runs in dry-run: it writes no action
    ("gatewayscope-overview.json", "Heal actions by outcome"): ".+",
}
#: the alerts of a heal that is stuck, tripped or held: a dry-run heal that passes on time is none of them (their
#: promtool unit tests fire each one)
HEAL_ALERTS = {"GatewayscopeHealBreakerOpen", "GatewayscopeHealStuck", "GatewayscopeHealBlocked"}
TOMBSTONE_CAPACITY = 20
WAIT = 90.0  # the bound on every wait for Prometheus to see something


#: waits on Prometheus: bounded by WAIT, polled every half second
wait_for = partial(wait_until, timeout=WAIT, interval=0.5)


class Prom:
    """Prometheus's HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = response.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.url}{path}", timeout=30)
        response.raise_for_status()
        return response.json()["data"]


# -- the sandbox ---------------------------------------------------------------------------------------

def exporter_config(path: Path, places: dict[str, tuple[str, str]], limits: dict[str, int]) -> None:
    """``places``: target name -> ("url" | "path", where)."""
    lines = []
    for name in TARGETS:
        kind = "bifrost" if name.startswith("bifrost") else "rllm"
        key, where = places[name]
        lines += ["[[targets]]", f'name = "{name}"', f'kind = "{kind}"', f'{key} = "{where}"', "timeout_seconds = 10"]
        if name in limits:
            lines.append(f"memory_limit_bytes = {limits[name]}")
        lines.append("")
    lines += [
        "[policy]",
        "orphan_idle_seconds = 1      # the sandbox's stragglers are seconds old, not hours",
        "",
        "[exporter]",
        "min_interval_seconds = 1",
        "max_record_series = 20",
        "",
        "[heal]                       # dry-run (the default table): heal's series, and no write",
        f'state_dir = "{path.parent / "heal"}"',
        "first_pass_max_delay_seconds = 0",
        "interval_seconds = 30",
        "",
    ]
    path.write_text("\n".join(lines))


def prometheus_config(path: Path, exporter_address: str, dead_address: str | None,
                      targets: Sequence[str] = TARGETS) -> None:
    """scrape-static.yml's job (plus an exporter address where nothing listens, when given) and
    scrape-multi-target.yml's jobs (relabeling verbatim) probing ``targets``, pointed here, with the alert
    and recording rules."""
    static = yaml.safe_load((DASHBOARDS / "prometheus" / "scrape-static.yml").read_text())
    multi = yaml.safe_load((DASHBOARDS / "prometheus" / "scrape-multi-target.yml").read_text())
    jobs = []
    for job in static["scrape_configs"] + multi["scrape_configs"]:
        job = copy.deepcopy(job)
        job["scrape_interval"] = SCRAPE_INTERVAL
        job["scrape_timeout"] = SCRAPE_INTERVAL
        if job["metrics_path"] == "/probe":
            job["static_configs"] = [{"targets": list(targets)}]
            for rule in job["relabel_configs"]:
                if rule.get("target_label") == "__address__":
                    rule["replacement"] = exporter_address
        elif job["job_name"] == "gatewayscope":
            job["static_configs"] = [{"targets": [exporter_address, *([dead_address] if dead_address else [])]}]
        else:
            job["static_configs"] = [{"targets": [exporter_address]}]
        jobs.append(job)
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "1s"},
        "rule_files": [str(DASHBOARDS / "prometheus" / name) for name in static["rule_files"]],
        "scrape_configs": jobs,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def load_dashboard(name: str) -> dict[str, Any]:
    return dict(json.loads((DASHBOARDS / "grafana" / name).read_text()))


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) for every query of every panel."""
    out = []
    for name in DASHBOARD_FILES:
        for panel in load_dashboard(name)["panels"]:
            for target in panel.get("targets", []):  # rows have none
                out.append((name, panel["title"], target["expr"]))
    return out


def substitute(expr: str, target: str) -> str:
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$job", ".+").replace("$target", target)


def target_values(name: str) -> str:
    """What ``$target`` becomes on dashboard ``name`` when "All" is selected."""
    variable = next(v for v in load_dashboard(name)["templating"]["list"] if v["name"] == "target")
    if variable.get("allValue"):
        return str(variable["allValue"])
    return "(" + "|".join(KIND_TARGETS[name]) + ")"  # Grafana joins the listed values into a regex


def record_names() -> list[str]:
    return [rule["record"] for group in yaml.safe_load((DASHBOARDS / "prometheus" / "rules.yml").read_text())
            ["groups"] for rule in group["rules"]]


def test_every_panel_and_alert_against_a_real_prometheus(
        rllm_gateway: Any, emulator: Any, tmp_path: Path) -> None:
    prometheus_bin = prometheus_or_skip()
    # the gateways, made bad
    from gatewayscope.guard import sqlite as sqlite_guard
    from gatewayscope.sandbox.bifrost_emulator import seed_realistic

    plain = rllm_gateway("memory")
    stored = rllm_gateway("sqlite")
    assert stored.db_path
    seed = seed_realistic(emulator)
    low, high = seed.boot_memory_low_bytes, seed.boot_memory_high_bytes
    assert 0 < low < high
    at_risk_limit = DEFAULT_MEMORY_LIMIT_BYTES if low < DEFAULT_MEMORY_LIMIT_BYTES < high else 2 * low
    first_plain = rollouts(plain.url, 10, 4, guarded=False, seed=1)
    unguarded = rollouts(stored.url, 6, 2, guarded=False, seed=2)  # orphans from before the guard
    sqlite_guard.install(stored.db_path, capacity=TOMBSTONE_CAPACITY)
    rollouts(stored.url, TOMBSTONE_CAPACITY, 3, guarded=True, seed=5)  # fills the tombstone table
    sqlite_guard.add_tombstones(stored.db_path, unguarded.expected_orphans)  # backfill: now confirmed
    assert sqlite_guard.tombstone_count(stored.db_path) == TOMBSTONE_CAPACITY

    # the exporter, as a real `gatewayscope export` process
    config_path = tmp_path / "gatewayscope.toml"
    places = {"rllm-plain": ("url", plain.url), "rllm-sqlite": ("path", stored.db_path),
              "bifrost": ("url", emulator.url), "bifrost-over": ("url", emulator.url),
              "rllm-down": ("url", f"http://127.0.0.1:{free_port()}")}
    exporter_config(config_path, places, {"bifrost": at_risk_limit, "bifrost-over": low // 2})
    exporter, exporter_url = start_on_free_port(
        "exporter",
        lambda port: [sys.executable, "-c", "from gatewayscope.cli import run; run()", "export",
                      "--config", str(config_path), "--listen", f"127.0.0.1:{port}", "--heal"],
        "/-/healthy")
    prometheus: ManagedProcess | None = None
    try:
        # warm the exporter's reads (first DNS checks) before Prometheus's short deadlines apply
        warm = httpx.get(exporter_url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "60"},
                         timeout=90)
        assert 'gatewayscope_up{kind="rllm",target="rllm-down"} 0.0' in warm.text
        for name in TARGETS[:-1]:
            assert f'target="{name}"}} 1.0' in warm.text.split("# HELP gatewayscope_up ")[1].split("# HELP")[0], name

        dead_exporter = f"127.0.0.1:{free_port()}"
        prometheus_config(tmp_path / "prometheus.yml", exporter_url.removeprefix("http://"), dead_exporter)
        data_dir = tmp_path / "tsdb"
        prometheus, prometheus_url = start_prometheus(prometheus_bin, tmp_path / "prometheus.yml", data_dir)
        prom = Prom(prometheus_url)

        # every job up, every target seen through /metrics and through /probe (instance = target name)
        wait_for("the three jobs up", lambda: sorted({r["metric"]["job"] for r in prom.query("up == 1")}),
                 lambda jobs: jobs == ["gatewayscope", "gatewayscope-exporter", "gatewayscope-targets"])
        probed = wait_for("every target probed",
                          lambda: {r["metric"]["instance"]: r["metric"]["target"]
                                   for r in prom.query('gatewayscope_up{job="gatewayscope-targets"}')},
                          lambda seen: len(seen) == len(TARGETS))
        assert probed == {name: name for name in TARGETS}
        expected_orphans = len(first_plain.expected_orphans)
        wait_for("the first orphans", lambda: prom.value(
            'sum(gatewayscope_trace_store_orphan_sessions{job="gatewayscope", target="rllm-plain"})'),
            lambda v: v == expected_orphans)
        wait_for("a few scrapes of history", lambda: prom.value(
            'count_over_time(gatewayscope_up{job="gatewayscope", target="rllm-plain"}[1m])'),
            lambda v: v is not None and v >= 4)

        # a second batch while Prometheus watches: orphans grow, the guard drops more writes
        second_plain = rollouts(plain.url, 4, 2, guarded=False, seed=3)
        rollouts(stored.url, 4, 2, guarded=True, seed=4)
        grown = expected_orphans + len(second_plain.expected_orphans)
        wait_for("the orphans to grow", lambda: prom.value(
            'sum(gatewayscope_trace_store_orphan_sessions{job="gatewayscope", target="rllm-plain"})'),
            lambda v: v == grown)
        wait_for("dropped writes to increase", lambda: prom.value(
            'increase(gatewayscope_trace_store_dropped_writes_total{job="gatewayscope", target="rllm-sqlite"}[1h])'),
            lambda v: v is not None and v > 0)

        # every dashboard's variables list what they should: a kind's dashboard only that kind's targets
        def label_values(query: str) -> set[str]:
            match = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
            assert match, query
            series = httpx.get(f"{prometheus_url}/api/v1/series", params={"match[]": match.group(1)}, timeout=30)
            return {s[match.group(2)] for s in series.json()["data"] if match.group(2) in s}

        for name in DASHBOARD_FILES:
            queries = {v["name"]: v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                       for v in load_dashboard(name)["templating"]["list"] if v["type"] == "query"}
            assert label_values(queries["job"]) == {"gatewayscope", "gatewayscope-targets", "gatewayscope-exporter"}
            targets = label_values(queries["target"].replace("$job", ".+"))
            assert targets == set(KIND_TARGETS.get(name, TARGETS)), name

        # every dashboard query returns data: for "All", and on a kind's dashboard for each of its targets
        # that is up, except EXPECTED_EMPTY (which must then return nothing)
        def missing_panels() -> list[str]:
            missing = []
            for name, title, expr in dashboard_queries():
                candidates = [target_values(name)]
                if name in KIND_TARGETS:
                    candidates += [t for t in KIND_TARGETS[name] if t not in DOWN_TARGETS]
                for candidate in candidates:
                    data = bool(prom.query(substitute(expr, candidate)))
                    if data != (EXPECTED_EMPTY.get((name, title)) != candidate):
                        missing.append(f"{name}: {title} ({candidate}): {'data' if data else 'no data'}: {expr}")
            return missing

        wait_for("every dashboard query to return data", missing_panels, lambda missing: missing == [])
        assert all(any(t == title for _, t, _ in dashboard_queries()) for _, title in EXPECTED_EMPTY)

        # every recording rule records something
        wait_for("every recording rule to record", lambda: [r for r in record_names() if not prom.query(r)],
                 lambda empty: empty == [])

        # every alert expression, as written, returns data
        rules = [rule for group in yaml.safe_load((DASHBOARDS / "prometheus" / "alerts.yml").read_text())["groups"]
                 for rule in group["rules"]]

        def quiet_alert_exprs() -> list[str]:
            return [rule["alert"] for rule in rules
                    if rule["alert"] not in HEAL_ALERTS and not prom.query(rule["expr"])]

        wait_for("every alert expression to return data", quiet_alert_exprs, lambda quiet: quiet == [])
        by_name = {rule["alert"]: prom.query(rule["expr"]) for rule in rules}
        assert {r["metric"].get("instance") for r in by_name["GatewayscopeExporterDown"]} == {dead_exporter}
        assert {r["metric"]["target"] for r in by_name["GatewayscopeTargetDown"]} == {"rllm-down"}
        assert {r["metric"]["target"] for r in by_name["GatewayscopeBifrostBootMemoryOverLimit"]} == {"bifrost-over"}
        assert {r["metric"]["target"] for r in by_name["GatewayscopeBifrostBootMemoryAtRisk"]} == {"bifrost"}
        # the measured prediction (the emulator's 8 KiB stacks and 64 MiB baseline) is over both limits; without
        # kube-state-metrics in this Prometheus, both are judged against the configured limit
        predicted_over = by_name["GatewayscopeBifrostBootMemoryPredictedOverLimit"]
        assert {r["metric"]["target"] for r in predicted_over} == {"bifrost", "bifrost-over"}
        assert {r["metric"]["limit_source"] for r in predicted_over} == {"config"}
        assert {r["metric"]["target"] for r in by_name["GatewayscopeTombstoneCapacityNearlyFull"]} == {"rllm-sqlite"}
        assert prom.value('gatewayscope_trace_store_orphan_sessions{job="gatewayscope", target="rllm-sqlite", '
                          'confidence="confirmed"}') == len(unguarded.expected_orphans)
        assert {r["metric"]["target"] for r in by_name["GatewayscopeOrphanSessionsGrowing"]} == {"rllm-plain"}
        drifted = {r["metric"]["setting"] for r in by_name["GatewayscopeBifrostPostureDrift"]}
        assert drifted == {"drop_excess_requests", "enforce_auth_on_inference", "disable_content_logging"}

        # Prometheus evaluates every rule without error, and every alert becomes pending or firing
        def rule_health() -> dict[str, str]:
            return {rule["name"]: rule["health"] for group in prom.get("/api/v1/rules")["groups"]
                    for rule in group["rules"]}

        wait_for("every rule evaluated", rule_health,
                 lambda health: set(health) == {r["alert"] for r in rules} | set(record_names())
                 and set(health.values()) == {"ok"})
        seen: set[str] = set()

        def active_alerts() -> set[str]:
            seen.update(alert["labels"]["alertname"] for alert in prom.get("/api/v1/alerts")["alerts"]
                        if alert["state"] in ("pending", "firing"))
            return set(seen)

        wait_for("every alert pending or firing", active_alerts,
                 lambda names: names - HEAL_ALERTS == {rule["alert"] for rule in rules} - HEAL_ALERTS)

        # no session id ever reached Prometheus as a label value
        uids = set(first_plain.deleted_uids) | set(second_plain.deleted_uids) | set(unguarded.deleted_uids)
        for label in ("record", "target", "instance"):
            values = set(prom.get(f"/api/v1/label/{label}/values"))
            assert not values & uids, label
            assert not any(re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", value) for value in values), label
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.stop()


def test_the_guarded_launchers_tombstones_reach_the_exporter(guarded_gateway: Any) -> None:
    from gatewayscope.config import Config, Policy, Target
    from gatewayscope.exporter.server import Exporter, render
    from gatewayscope.exporter.settings import ExporterSettings

    gateway = guarded_gateway("memory", max_tombstones=10)
    rollouts(gateway.url, 4, 1, guarded=True, seed=9)
    exporter = Exporter(Config(targets=[Target(name="guarded", kind="rllm", url=gateway.url)], policy=Policy()),
                        ExporterSettings())
    body, _ = render(exporter.metrics_registry(30.0))
    text = body.decode()
    assert 'gatewayscope_up{kind="rllm",target="guarded"} 1.0' in text
    assert 'gatewayscope_trace_store_tombstones{target="guarded"} 4.0' in text
    assert 'gatewayscope_trace_store_tombstone_capacity{target="guarded"} 10.0' in text


# -- the sandbox of `gatewayscope demo`, guarded stores included ----------------------------------------------

#: the dashboard each kind of target has (the overview shows every kind)
KIND_DASHBOARD = {"rllm": "gatewayscope-trace-store.json", "bifrost": "gatewayscope-bifrost.json"}
#: the guard's series: a panel that reads only these has data exactly for the targets with a guard
GUARD_SERIES = re.compile(r"tombstone|dropped_writes|kept_after_fence")


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard, the panels inside (collapsed) rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panels(panel)


def test_every_dashboard_panel_has_data_for_its_kind_on_the_sandbox(gateway_flavor: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox `gatewayscope demo` runs (its gateways the flavour's), its own exporter, a real Prometheus
    scraping it as the shipped scrape configs say: every query of every panel returns data, on the overview
    for all targets and on each kind's dashboard for "All" and for every target of that kind, except that a
    panel reading only the guard's series has none for the two stores without a guard (and must have data
    for both guarded ones: the guarded gateway and the SQLite file with the guard's triggers)."""
    from gatewayscope.config import load_config
    from gatewayscope.sandbox.demo import GUARDED_MEMORY, GUARDED_SQLITE, Sandbox
    from gatewayscope.sandbox.processes import GATEWAY_PYTHON_ENV

    prometheus_bin = prometheus_or_skip()
    monkeypatch.setenv(GATEWAY_PYTHON_ENV, gateway_flavor.python)
    with Sandbox(tmp_path / "sandbox", rollouts=8, stragglers=3, with_exporter=True, say=lambda _m: None) as box:
        kinds = {t.name: t.kind for t in load_config(box.run.config_path).targets}
        assert kinds == {"rllm-memory": "rllm", "rllm-sqlite": "rllm", GUARDED_MEMORY: "rllm", GUARDED_SQLITE: "rllm",
                         "bifrost": "bifrost"}
        guarded = {GUARDED_MEMORY, GUARDED_SQLITE}
        # warm the exporter's reads (the first DNS checks of the emulator's records) before Prometheus's deadlines
        warm = httpx.get(f"{box.run.exporter_url}/metrics", timeout=90,
                         headers={"X-Prometheus-Scrape-Timeout-Seconds": "60"})
        up = [f'kind="{kind}",target="{name}"}} 1.0' for name, kind in kinds.items()]
        assert all(line in warm.text for line in up), warm.text[:3000]

        prometheus_config(tmp_path / "prometheus.yml", box.run.exporter_url.removeprefix("http://"), None,
                          targets=sorted(kinds))
        prometheus, prometheus_url = start_prometheus(prometheus_bin, tmp_path / "prometheus.yml", tmp_path / "tsdb")
        try:
            prom = Prom(prometheus_url)
            wait_for("every target probed", lambda: {r["metric"]["target"] for r in prom.query(
                'gatewayscope_up{job="gatewayscope-targets"} == 1')}, lambda seen: seen == set(kinds))
            # the guard's figures reach Prometheus from both kinds of guard, and only from them
            wait_for("the guards' tombstones", lambda: {r["metric"]["target"] for r in prom.query(
                'gatewayscope_trace_store_tombstones{job="gatewayscope"} > 0')}, lambda seen: seen == guarded)
            # the orphans the late calls brought back after the cleanup, once idle past the sandbox's threshold
            # (the exporter reads no journal: to it they are suspected)
            wait_for("the orphans of the store guarded late", lambda: prom.value(
                f'sum(gatewayscope_trace_store_orphan_sessions{{job="gatewayscope", target="{GUARDED_SQLITE}"}})'),
                lambda v: v == 3)

            def candidates(name: str) -> list[tuple[str, str]]:
                """(what $target becomes, its name here): "All", then on a kind's dashboard each target of the kind
                (the overview mixes the kinds, so only "All" must fill every one of its panels)."""
                kind = next((k for k, dashboard in KIND_DASHBOARD.items() if dashboard == name), None)
                listed = sorted(t for t, k in kinds.items() if kind in (None, k))
                variable = next(v for v in load_dashboard(name)["templating"]["list"] if v["name"] == "target")
                everything = str(variable.get("allValue") or "(" + "|".join(listed) + ")")  # Grafana's "All"
                return [(everything, "All")] + ([(t, t) for t in listed] if kind else [])

            def wrong_panels() -> list[str]:
                wrong = []
                for name in DASHBOARD_FILES:
                    for panel in panels(load_dashboard(name)):
                        exprs = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
                        if any("gatewayscope_heal_" in e for e in exprs):
                            continue  # the sandbox's exporter runs no heal (test_every_panel_and_alert... does)
                        guard_only = bool(exprs) and all(GUARD_SERIES.search(e) for e in exprs)
                        for value, label in candidates(name):
                            expect = not (guard_only and label in kinds and label not in guarded)
                            for expr in exprs:
                                query = substitute(expr, value).replace("$cluster", ".*")
                                if bool(prom.query(query)) != expect:
                                    wrong.append(f"{name}: {panel['title']} ({label}): "
                                                 f"{'no data' if expect else 'data'}: {query}")
                return wrong

            wait_for("every panel to show data for its kind", wrong_panels, lambda wrong: wrong == [])
            guard_panels = {(name, p["title"]) for name in DASHBOARD_FILES for p in panels(load_dashboard(name))
                            if p.get("targets") and all(GUARD_SERIES.search(t["expr"]) for t in p["targets"])}
            assert {title for name, title in guard_panels if name == KIND_DASHBOARD["rllm"]}, guard_panels
        finally:
            prometheus.stop()
    assert not any(box.running().values())
