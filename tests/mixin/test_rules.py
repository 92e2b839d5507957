"""The alert and recording rules through Debian's promtool, their conventions, the runbooks, the PrometheusRule
manifest, and the exporter's output through promtool's linter.

promtool comes from Debian's ``prometheus`` package. Without it the promtool tests skip, except under CI
(the ``CI`` environment variable set), where they fail: CI installs it (``.ci/run``).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target
from gatewayscope.exporter.collectors import HEAL_METRICS, METRICS
from gatewayscope.exporter.server import make_server
from gatewayscope.exporter.settings import ExporterSettings
from tests.helpers import write_store
from tests.mixin.mixin_files import (
    DASHBOARDS,
    DEFAULT_JOB_SELECTOR,
    DEFAULT_RUNBOOK_BASE_URL,
    PROMETHEUS_DIR,
    ROOT,
    RUNBOOKS,
    SELECTOR_NAME,
    all_exprs,
    counter_function_misuse,
    github_anchors,
    rule_groups,
    rules,
    run_build,
    run_promtool,
)

yaml = pytest.importorskip("yaml")

REQUIRED_ALERTS = {
    "GatewayscopeExporterDown",
    "GatewayscopeTargetDown",
    "GatewayscopeOrphanSessionsGrowing",
    "GatewayscopeTombstoneCapacityNearlyFull",
    "GatewayscopeBifrostBootMemoryOverLimit",
    "GatewayscopeBifrostBootMemoryPredictedOverLimit",
    "GatewayscopeBifrostPoolsOverPolicy",
    "GatewayscopeBifrostPostureDrift",
    "GatewayscopeBifrostUnreachableRecords",
}
NOTEBOOKS = {"notebooks/remediate.ipynb", "notebooks/triage.ipynb"}
ORPHANS = "gatewayscope_trace_store_orphan_sessions"
#: the one series of another exporter the rules read: kube-state-metrics' container limits, through its own selector
KSM_LIMITS = "kube_pod_container_resource_limits"
KSM_SELECTOR = 'job="kube-state-metrics"'
EXTERNAL_METRICS = {KSM_LIMITS}


def alert_rules() -> list[dict[str, Any]]:
    return rules("alerts.yml")


def unit_tests() -> list[dict[str, Any]]:
    return list(yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"])


# -- promtool ---------------------------------------------------------------------------------------

@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("name", ["alerts.yml", "rules.yml"])
def test_promtool_check_rules(name: str) -> None:
    done = run_promtool("check", "rules", name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules(name))} rules found" in done.stdout


@pytest.mark.e2e  # starts a process
def test_promtool_test_rules() -> None:
    done = run_promtool("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("name", ["scrape-static.yml", "scrape-multi-target.yml"])
def test_promtool_check_config_of_the_scrape_examples(name: str) -> None:
    done = run_promtool("check", "config", name)
    assert done.returncode == 0, done.stdout + done.stderr
    # the examples load the alerts and the recording rules the dashboards read
    assert yaml.safe_load((PROMETHEUS_DIR / name).read_text())["rule_files"] == ["alerts.yml", "rules.yml"]


@pytest.mark.e2e  # starts a process
def test_the_prometheusrule_manifest_holds_exactly_both_rule_files(tmp_path: Path) -> None:
    manifest = yaml.safe_load((DASHBOARDS / "kubernetes" / "prometheusrule.yaml").read_text())
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["metadata"]["name"] == "gatewayscope"
    assert manifest["spec"]["groups"] == rule_groups("alerts.yml") + rule_groups("rules.yml")
    (tmp_path / "spec.yml").write_text(yaml.safe_dump({"groups": manifest["spec"]["groups"]}))
    done = run_promtool("check", "rules", "spec.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.e2e  # starts a process
def test_a_build_with_a_cluster_label_passes_promtool_and_the_unit_tests(tmp_path: Path) -> None:
    """The aggregations keep the cluster label; series without it (one cluster) still alert as before."""
    done = run_build("--cluster-label", "cluster", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    prometheus = tmp_path / "prometheus"
    assert "by (cluster, job, instance, target)" in (prometheus / "alerts.yml").read_text()
    shutil.copy(PROMETHEUS_DIR / "alerts_test.yml", prometheus / "alerts_test.yml")
    for args in (("check", "rules", "alerts.yml", "rules.yml"), ("test", "rules", "alerts_test.yml")):
        done = run_promtool(*args, cwd=prometheus)
        assert done.returncode == 0, done.stdout + done.stderr
    manifest = yaml.safe_load((tmp_path / "kubernetes" / "prometheusrule.yaml").read_text())
    assert manifest["spec"]["groups"] == rule_groups("alerts.yml", prometheus) + rule_groups("rules.yml", prometheus)


@pytest.fixture
def metrics_text(tmp_path: Path) -> Iterator[str]:
    """A real /metrics answer from the exporter: the Bifrost emulator (small seed), a guarded rLLM gateway and an
    unguarded SQLite trace store (the exporter's store-read counters are only a SQLite file's)."""
    from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small

    store = tmp_path / "traces.db"
    write_store(store, {"a:0": 1, "b:0": 2})

    def rllm(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/openapi.json":
            return httpx.Response(200, json={"paths": {"/sessions": {}, "/guard/status": {}}})
        if path == "/sessions":
            return httpx.Response(200, json=[{"session_id": "a:0", "trace_count": 1, "created_at": 1.0}])
        if path == "/guard/status":
            return httpx.Response(200, json={"enabled": True, "tombstones": 3, "capacity": 10, "dropped_writes": 2})
        if path == "/guard/tombstones/check":
            return httpx.Response(200, json={"tombstoned": []})
        if path == "/traces/query":
            return httpx.Response(200, json=[{"session_id": "a:0", "trace_id": "t", "timestamp": 2.0}])
        return httpx.Response(404, json={"detail": "Not Found"})

    with BifrostEmulator() as emulator:
        seed_small(emulator)
        config = Config(targets=[Target(name="rl-gateway", kind="rllm", url="http://rl.test:9090"),
                                 Target(name="bifrost", kind="bifrost", url=emulator.url),
                                 Target(name="down", kind="bifrost", url="http://127.0.0.1:9"),
                                 Target(name="rl-file", kind="rllm", path=str(store))],
                        policy=Policy())
        server = make_server(config, ExporterSettings(max_record_series=3), listen="127.0.0.1:0",
                             transports={"rl-gateway": httpx.MockTransport(rllm)}).start()
        try:
            response = httpx.get(server.url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "10"},
                                 timeout=30)
            assert response.status_code == 200
            yield response.text
        finally:
            server.stop()


@pytest.mark.e2e  # starts a process
def test_promtool_check_metrics_on_a_real_scrape(metrics_text: str) -> None:
    exposed = set(re.findall(r"^# TYPE (\S+) ", metrics_text, flags=re.M))
    # heal's metrics are served only by an exporter that runs heal (tests/heal/test_heal_exporter.py checks them)
    assert set(METRICS) - set(HEAL_METRICS) - exposed == set(), "missing from a scrape of every kind of target"
    done = run_promtool("check", "metrics", stdin=metrics_text)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == ""


# -- every expression -------------------------------------------------------------------------------

def test_every_expression_of_every_dashboard_and_rule_carries_the_job_selector() -> None:
    exprs = all_exprs()
    assert len(exprs) > 50
    for where, expr in exprs:
        assert DEFAULT_JOB_SELECTOR in expr, (where, expr)
        selectors = [s for s in re.findall(r"\{([^{}]*)\}", expr.replace("{{", "").replace("}}", "")) if "=" in s]
        assert selectors, (where, expr)
        for selector in selectors:
            if selector == f'{KSM_SELECTOR}, resource="memory"':  # kube-state-metrics' series: its own job
                assert f"{KSM_LIMITS}{{{selector}}}" in expr, (where, expr)
                continue
            assert DEFAULT_JOB_SELECTOR in selector, (where, selector)


def test_counter_functions_see_only_counters() -> None:
    """rate/irate/increase/delta/idelta only on _total counters: on a gauge, a cleanup reads as negative growth."""
    bad = [(where, misuse) for where, expr in all_exprs() for misuse in counter_function_misuse(expr)]
    assert bad == []


@pytest.mark.parametrize("expr", [
    f"sum by (target) (delta({ORPHANS}{{job=\"gatewayscope\"}}[1h]))",
    "rate(gatewayscope_up{job=\"x\"}[5m])",
    f"increase(max_over_time({ORPHANS}{{job=\"x\"}}[5m])[1h:])",
    "rate(gatewayscope:exporter_target_reads:rate5m{job=\"x\"}[5m])",
])
def test_the_counter_check_catches_a_gauge(expr: str) -> None:
    assert counter_function_misuse(expr)


def test_recording_rules_follow_the_naming_convention() -> None:
    records = rules("rules.yml")
    assert records
    for rule in records:
        name = rule["record"]
        assert re.fullmatch(r"gatewayscope:[a-z0-9_]+:[a-z0-9_]+", name), name
        for metric in SELECTOR_NAME.findall(rule["expr"]):
            assert metric in METRICS or metric in {r["record"] for r in records} or metric in EXTERNAL_METRICS, \
                (name, metric)
        if "rate(" in rule["expr"]:
            assert re.search(r":rate\d+[smh]$", name) and "_total" not in name, name


# -- the alerts' own conventions --------------------------------------------------------------------

def test_alert_names_labels_and_annotations() -> None:
    rules_ = alert_rules()
    names = [rule["alert"] for rule in rules_]
    assert len(set(names)) == len(names)
    assert set(names) >= REQUIRED_ALERTS
    for rule in rules_:
        name = rule["alert"]
        assert re.fullmatch(r"Gatewayscope(?:[A-Z][a-z0-9]+)+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        assert annotations["runbook_url"] == f"{DEFAULT_RUNBOOK_BASE_URL}#{name.lower()}", name
        assert annotations["notebook"] in NOTEBOOKS, name
        for metric in SELECTOR_NAME.findall(rule["expr"]):
            assert metric in METRICS or metric == "up" or metric in EXTERNAL_METRICS, f"{name}: {metric}"
        # alerts read the exporter's series only: they work without rules.yml and on history older than it
        assert "gatewayscope:" not in rule["expr"], name
    severities = {rule["alert"]: rule["labels"]["severity"] for rule in rules_}
    assert severities["GatewayscopeBifrostBootMemoryOverLimit"] == "critical"
    assert severities["GatewayscopeBifrostBootMemoryPredictedOverLimit"] == "critical"
    assert severities["GatewayscopeExporterDown"] == "critical"


def test_the_limit_join_is_the_same_in_the_recording_rule_and_the_alert() -> None:
    """The alert inlines the effective-limit expression (alerts need no recording rule); it must be the rule's."""
    record = next(rule["expr"] for rule in rules("rules.yml")
                  if rule["record"] == "gatewayscope:bifrost_memory_limit_bytes:effective")
    alert = next(rule["expr"] for rule in alert_rules()
                 if rule["alert"] == "GatewayscopeBifrostBootMemoryPredictedOverLimit")
    assert " ".join(record.split()) in " ".join(alert.split())
    assert "on (gateway_namespace, gateway_pod, gateway_container) group_left ()" in record
    assert 'model="measured"' in alert


def test_the_limit_join_with_and_without_kube_state_metrics_both_have_unit_tests() -> None:
    cases = [case for case in unit_tests()
             if any(check["alertname"] == "GatewayscopeBifrostBootMemoryPredictedOverLimit"
                    for check in case["alert_rule_test"])]
    with_ksm = [case for case in cases if any(KSM_LIMITS in series["series"] for series in case["input_series"])]
    without = [case for case in cases if not any(KSM_LIMITS in series["series"] for series in case["input_series"])]
    sources = {alert["exp_labels"].get("limit_source") for case in cases for check in case["alert_rule_test"]
               for alert in check.get("exp_alerts") or []}
    assert with_ksm and without and sources == {"kubernetes", "config"}


def test_exporter_down_covers_a_failed_scrape_and_a_missing_job() -> None:
    expr = next(rule["expr"] for rule in alert_rules() if rule["alert"] == "GatewayscopeExporterDown")
    assert f"up{{{DEFAULT_JOB_SELECTOR}}} == 0" in expr and f"absent(up{{{DEFAULT_JOB_SELECTOR}}})" in expr
    firing = [alert["exp_labels"] for case in unit_tests() for check in case["alert_rule_test"]
              if check["alertname"] == "GatewayscopeExporterDown" for alert in check.get("exp_alerts") or []]
    assert any("instance" in labels for labels in firing), "no unit test of up == 0"
    assert {"severity": "critical"} in firing, "no unit test of absent(up)"


def test_the_orphan_growth_unit_test_is_the_cleanup_scenario_from_the_gauge_alone() -> None:
    """10 orphans deleted at 30 m, then one new one every 10 minutes: firing by 30 minutes after growth resumes."""
    cases = [case for case in unit_tests()
             if any(check["alertname"] == "GatewayscopeOrphanSessionsGrowing" for check in case["alert_rule_test"])]
    cleanup = [case for case in cases if "cleanup" in case["name"]
               and all(series["series"].startswith(ORPHANS + "{") for series in case["input_series"])]
    assert cleanup, "no unit test of growth after a cleanup fed only the orphan gauge"
    fires = [check for case in cleanup for check in case["alert_rule_test"] if check.get("exp_alerts")]
    assert fires and min(int(check["eval_time"].rstrip("m")) for check in fires) <= 60
    never = [case for case in cases if all(not check.get("exp_alerts") for check in case["alert_rule_test"])]
    assert never and any("decreasing" in case["name"] and "flat" in case["name"] for case in never)


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in unit_tests():
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fires == set(), "no firing test"
    assert names - quiet == set(), "no test where it stays quiet"


# -- runbooks ---------------------------------------------------------------------------------------

def test_every_runbook_url_resolves_to_a_heading_of_docs_runbooks_md() -> None:
    assert DEFAULT_RUNBOOK_BASE_URL.endswith("/docs/runbooks.md")
    anchors = github_anchors(RUNBOOKS.read_text())
    for rule in alert_rules():
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == DEFAULT_RUNBOOK_BASE_URL, rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: docs/runbooks.md has no heading for #{anchor}"
        assert f"\n## {rule['alert']}\n" in RUNBOOKS.read_text(), rule["alert"]


def test_the_anchor_rules() -> None:
    assert github_anchors("## GatewayscopeExporterDown\n# Runbook: Foo (bar), baz!\n") == {
        "gatewayscopeexporterdown", "runbook-foo-bar-baz"}


def test_the_exporter_docs_list_every_alert_and_link_the_runbooks() -> None:
    """The alert table is in docs/exporter.md ("## Alerts and runbook"); the README keeps no runbook."""
    exporter_md = (ROOT / "docs" / "exporter.md").read_text()
    assert "\n## Alerts and runbook\n" in exporter_md, "docs/exporter.md has no '## Alerts and runbook' section"
    section = exporter_md.split("\n## Alerts and runbook\n", 1)[1].split("\n## ", 1)[0]
    assert "(runbooks.md)" in section and "(mixin.md)" in section, "the section must link the runbooks and the mixin"
    readme = (ROOT / "README.md").read_text()
    assert "### Runbook:" not in readme, "the runbooks live in docs/runbooks.md"
    for rule in alert_rules():
        assert f"| {rule['alert']} | {rule['labels']['severity']} |" in section, rule["alert"]
