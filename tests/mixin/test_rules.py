"""The alert rules and the scrape examples, through Debian's promtool; and the exporter's output through its linter.

promtool comes from Debian's ``prometheus`` package. Without it these tests skip, except under CI (the
``CI`` environment variable set), where they fail: CI installs it (``.ci/run``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target
from gatewayscope.exporter.collectors import METRICS
from gatewayscope.exporter.server import make_server
from gatewayscope.exporter.settings import ExporterSettings

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "dashboards" / "prometheus"
REQUIRED_ALERTS = {
    "GatewayscopeTargetDown",
    "GatewayscopeOrphanSessionsGrowing",
    "GatewayscopeTombstoneCapacityNearlyFull",
    "GatewayscopeBifrostBootMemoryOverLimit",
    "GatewayscopeBifrostPoolsOverPolicy",
    "GatewayscopeBifrostPostureDrift",
    "GatewayscopeBifrostUnreachableRecords",
}
NOTEBOOKS = {"notebooks/remediate.ipynb", "notebooks/triage.ipynb"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("promtool is not on PATH, and CI must run these tests: install Debian's 'prometheus' package "
                    "(.ci/run does: apt-get install prometheus)")
    pytest.skip("promtool is not installed (Debian: apt-get install prometheus); CI runs these tests")


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], input=stdin, capture_output=True, text=True, timeout=120,
                          cwd=PROMETHEUS_DIR)


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


# -- promtool ---------------------------------------------------------------------------------------

def test_promtool_check_rules() -> None:
    done = run("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_promtool_test_rules() -> None:
    done = run("test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("name", ["scrape-static.yml", "scrape-multi-target.yml"])
def test_promtool_check_config_of_the_scrape_examples(name: str) -> None:
    done = run("check", "config", name)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def metrics_text() -> Iterator[str]:
    """A real /metrics answer from the exporter: the Bifrost emulator (small seed) and a guarded rLLM gateway."""
    from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small

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
                                 Target(name="down", kind="bifrost", url="http://127.0.0.1:9")],
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


def test_promtool_check_metrics_on_a_real_scrape(metrics_text: str) -> None:
    exposed = set(re.findall(r"^# TYPE (\S+) ", metrics_text, flags=re.M))
    assert set(METRICS) - exposed == set(), "missing from a scrape of every kind of target"
    done = run("check", "metrics", stdin=metrics_text)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == ""


# -- the rules' own conventions ---------------------------------------------------------------------

def test_alert_names_labels_and_annotations() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(set(names)) == len(names)
    assert set(names) >= REQUIRED_ALERTS
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Gatewayscope(?:[A-Z][a-z0-9]+)+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        assert annotations["runbook_url"] == f"README.md#runbook-{name.lower()}", name
        assert annotations["notebook"] in NOTEBOOKS, name
        for metric in re.findall(r"\bgatewayscope_[a-z0-9_]+\b", rule["expr"]):
            assert metric in METRICS, f"{name}: {metric}"
    severities = {rule["alert"]: rule["labels"]["severity"] for rule in rules}
    assert severities["GatewayscopeBifrostBootMemoryOverLimit"] == "critical"


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"]
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fires == set(), "no firing test"
    assert names - quiet == set(), "no test where it stays quiet"


def test_the_readme_has_a_runbook_section_per_alert() -> None:
    readme = (ROOT / "README.md").read_text()
    if "## Alerts and runbook" not in readme:
        pytest.skip("README.md has no 'Alerts and runbook' section yet")
    for name in {rule["alert"] for rule in alert_rules()}:
        assert f"### Runbook: {name}\n" in readme, name


def test_dashboards_json_is_valid_for_the_queries_the_e2e_runs() -> None:
    # the e2e substitutes $target and $__rate_interval; make sure no other variable is used in a query
    for name in ("overview.json", "target.json"):
        dashboard = json.loads((ROOT / "dashboards" / "grafana" / name).read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                leftover = set(re.findall(r"\$\{?(\w+)", target["expr"])) - {"target", "__rate_interval"}
                assert leftover == set(), (name, panel["title"], leftover)
