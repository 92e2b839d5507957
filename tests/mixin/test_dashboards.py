"""The Grafana dashboards, structurally: uids, variables, units, rate intervals, data sources, metric names."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.exporter.collectors import CONTRACT_METRICS, METRICS

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "dashboards" / "grafana"
DASHBOARD_FILES = ("overview.json", "target.json")
METRIC_NAME = re.compile(r"\bgatewayscope_[a-z0-9_]+\b")


def load(name: str) -> dict[str, Any]:
    return json.loads((GRAFANA / name).read_text())


@pytest.fixture(params=DASHBOARD_FILES)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows


def exprs(dash: dict[str, Any]) -> Iterator[str]:
    for panel in panels(dash):
        for target in panel.get("targets", []):
            yield target["expr"]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")


def test_the_committed_json_is_what_build_py_writes() -> None:
    spec = importlib.util.spec_from_file_location("gatewayscope_dashboards_build", ROOT / "dashboards" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, text in module.render_all().items():
        assert (GRAFANA / name).read_text() == text, f"{name} is stale: run python dashboards/build.py"


def test_uids_are_unique() -> None:
    uids = [load(name)["uid"] for name in DASHBOARD_FILES]
    assert len(set(uids)) == len(uids)
    assert all(uid and len(uid) <= 40 for uid in uids)
    for name in DASHBOARD_FILES:
        ids = [panel["id"] for panel in panels(load(name))]
        assert len(set(ids)) == len(ids), name


def test_the_two_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "target"}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    target = variables["target"]
    assert target["type"] == "query"
    assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    query = target["query"]["query"] if isinstance(target["query"], dict) else target["query"]
    assert query == "label_values(gatewayscope_up, target)"


def test_units_on_every_panel(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert isinstance(unit, str) and unit, panel["title"]


def test_every_panel_queries_through_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    for path, value in walk(dashboard):
        if path.endswith(".datasource") and isinstance(value, dict):
            assert value.get("uid") == "${datasource}", path
        if path.endswith(".datasource") and isinstance(value, str):
            assert value.startswith("$"), path
        if path.endswith(".uid") and ".datasource" in path:
            assert value == "${datasource}", path


def test_rate_interval_in_every_rate(dashboard: dict[str, Any]) -> None:
    count = 0
    for expr in exprs(dashboard):
        for match in re.finditer(r"\b(rate|irate|increase)\(", expr):
            count += 1
            # the range of this call: the first [...] after it
            window = re.search(r"\[([^\]]+)\]", expr[match.end():])
            assert window and window.group(1) == "$__rate_interval", expr
    assert count > 0


def test_every_metric_exists_and_every_contract_metric_is_shown() -> None:
    seen: set[str] = set()
    for name in DASHBOARD_FILES:
        for expr in exprs(load(name)):
            for metric in METRIC_NAME.findall(expr):
                assert metric in METRICS, f"{name}: {metric} is not one of the exporter's metrics"
                seen.add(metric)
        variables = load(name)["templating"]["list"]
        for variable in variables:
            definition = variable.get("definition", "")
            for metric in METRIC_NAME.findall(definition):
                assert metric in METRICS
    missing = set(CONTRACT_METRICS) - seen - {"gatewayscope_build_info"}
    assert missing == set(), f"no panel shows {sorted(missing)}"


def test_panels_have_titles_descriptions_and_sane_grid(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        assert panel["title"] and panel["description"]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0


def test_overview_links_to_the_per_target_dashboard() -> None:
    overview, target = load("overview.json"), load("target.json")
    links = [link["url"] for panel in panels(overview)
             for link in panel["fieldConfig"]["defaults"].get("links", [])]
    assert links and all(f"/d/{target['uid']}/" in url and "var-target=${__field.labels.target}" in url
                         for url in links)
    assert any(f"/d/{target['uid']}/" in link["url"] for link in overview["links"])
    assert any(f"/d/{overview['uid']}/" in link["url"] for link in target["links"])
    target_var = {v["name"]: v for v in overview["templating"]["list"]}["target"]
    assert target_var["multi"] and target_var["includeAll"]


def test_provisioning_files() -> None:
    yaml = pytest.importorskip("yaml")
    dashboards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards.yaml").read_text())
    assert dashboards["apiVersion"] == 1
    provider = dashboards["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert datasources["datasources"][0]["type"] == "prometheus"
