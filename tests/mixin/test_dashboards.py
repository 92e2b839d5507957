"""The Grafana dashboards, structurally, and dashboards/build.py: the committed files, the CLI, other configs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.exporter.collectors import CONTRACT_METRICS, METRICS
from tests.mixin.mixin_files import (
    BIFROST,
    DASHBOARD_FILES,
    DASHBOARDS,
    DEFAULT_JOB_SELECTOR,
    GRAFANA,
    KIND_OF,
    OVERVIEW,
    SELECTOR_NAME,
    TRACE_STORE,
    build_module,
    dashboard_exprs,
    load_dashboard,
    panels,
    rows,
    rules,
    run_build,
    variable_queries,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: the template variables a query may use (the e2e substitutes exactly these)
QUERY_VARIABLES = {"job", "target", "cluster", "__rate_interval"}


@pytest.fixture(params=DASHBOARD_FILES)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_dashboard(request.param)


# -- the build -------------------------------------------------------------------------------------------

def test_the_committed_files_are_what_build_py_writes() -> None:
    files = build_module().render_all()
    assert {name for name in files if name.startswith("grafana/")} == {f"grafana/{n}" for n in DASHBOARD_FILES}
    for name, text in files.items():
        assert (DASHBOARDS / name).read_text() == text, f"dashboards/{name} is stale: run python dashboards/build.py"
    # no dashboard JSON left over from an earlier layout
    assert sorted(p.name for p in GRAFANA.glob("*.json")) == sorted(DASHBOARD_FILES)


@pytest.mark.e2e  # starts a process
def test_check_flag_passes_on_the_committed_files_and_fails_on_an_empty_folder(tmp_path: Path) -> None:
    done = run_build("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    done = run_build("--check", "--out", str(tmp_path))
    assert done.returncode == 1
    assert "grafana/gatewayscope-overview.json" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e  # starts a process
def test_the_cli_builds_for_another_job_selector_and_a_cluster_label(tmp_path: Path) -> None:
    done = run_build("--job-selector", 'job="gs"', "--cluster-label", "cluster", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    for name in DASHBOARD_FILES:
        dashboard = load_dashboard(name, tmp_path / "grafana")
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert list(variables) == ["datasource", "cluster", "job", "target"]
        assert dict(variable_queries(dashboard))["cluster"] == 'label_values(up{job="gs"}, cluster)'
        assert variables["cluster"]["current"]["value"] == ["$__all"]
        for title, expr in dashboard_exprs(dashboard):
            assert 'job="gs"' in expr and 'cluster=~"$cluster"' in expr and 'job=~"$job"' in expr, (title, expr)
            assert DEFAULT_JOB_SELECTOR not in expr
        for link in dashboard["links"]:
            assert "${cluster:queryparam}" in link["url"]
    for file in ("alerts.yml", "rules.yml"):
        for rule in rules(file, tmp_path / "prometheus"):
            assert 'job="gs"' in rule["expr"], rule
            for by in re.findall(r"by \(([^)]*)\)", rule["expr"]):
                assert by.split(", ")[0] == "cluster", rule


#: the labels the memory-limit join matches kube-state-metrics' container on (one cluster)
POD_JOIN = "gateway_namespace, gateway_pod, gateway_container"


@pytest.mark.e2e  # starts a process
def test_a_json_config_file_and_flags_over_it(tmp_path: Path) -> None:
    config = tmp_path / "mixin.json"
    config.write_text(json.dumps({
        "job_selector": 'namespace="monitoring", job="gatewayscope"',
        "runbook_base_url": "https://wiki.example.com/runbooks.md",
        "dashboard_uid_prefix": "gs-prod",
        "prometheus_rule_namespace": "monitoring",
        "prometheus_rule_labels": {"release": "kube-prometheus-stack"},
    }))
    out = tmp_path / "out"
    done = run_build("--config", str(config), "--tag", "llm", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    uids = {load_dashboard(name, out / "grafana")["uid"] for name in DASHBOARD_FILES}
    assert uids == {"gs-prod-overview", "gs-prod-trace-store", "gs-prod-bifrost"}
    assert all(load_dashboard(name, out / "grafana")["tags"] == ["llm"] for name in DASHBOARD_FILES)
    overview = load_dashboard(OVERVIEW, out / "grafana")
    assert any("/d/gs-prod-trace-store/" in link["url"] for link in overview["links"])
    for rule in rules("alerts.yml", out / "prometheus"):
        assert rule["annotations"]["runbook_url"] == f"https://wiki.example.com/runbooks.md#{rule['alert'].lower()}"
        assert 'namespace="monitoring", job="gatewayscope"' in rule["expr"]
        # the selector's own labels survive every aggregation, so the recorded series match the selector too
        for by in re.findall(r"by \(([^)]*)\)", rule["expr"]):
            if by == POD_JOIN:  # the kube-state-metrics side of the memory-limit join carries no selector label
                continue
            # heal's series describe the heal process, not a target: they carry no target label
            keep = "namespace, job, instance" if rule["alert"].startswith("GatewayscopeHeal") else \
                "namespace, job, instance, target"
            assert by.startswith(keep), rule
    import yaml

    manifest = yaml.safe_load((out / "kubernetes" / "prometheusrule.yaml").read_text())
    assert manifest["metadata"] == {"name": "gatewayscope", "namespace": "monitoring",
                                    "labels": {"release": "kube-prometheus-stack"}}


@pytest.mark.parametrize("args", [
    ["--job-selector", 'instance="x"'],          # no job matcher
    ["--job-selector", "job=gatewayscope"],       # not a matcher
    ["--cluster-label", "my-cluster"],            # not a label name
    ["--runbook-base-url", "https://x/runbooks.md#top"],
])
@pytest.mark.e2e  # starts a process
def test_the_cli_refuses_a_bad_config(args: list[str], tmp_path: Path) -> None:
    done = run_build(*args, "--out", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e  # starts a process
def test_an_unknown_config_field_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "mixin.json"
    config.write_text(json.dumps({"job_selectr": 'job="x"'}))
    done = run_build("--config", str(config), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "job_selectr" in done.stderr


# -- every dashboard ---------------------------------------------------------------------------------------

def test_uids_titles_and_panel_ids() -> None:
    uids = [load_dashboard(name)["uid"] for name in DASHBOARD_FILES]
    assert uids == ["gatewayscope-overview", "gatewayscope-trace-store", "gatewayscope-bifrost"]
    assert all(len(uid) <= 40 for uid in uids)
    for name in DASHBOARD_FILES:
        ids = [panel["id"] for panel in load_dashboard(name)["panels"]]
        assert len(set(ids)) == len(ids) and 0 not in ids, name


def test_time_zone_tags_and_refresh(dashboard: dict[str, Any]) -> None:
    assert dashboard["timezone"] == "utc"
    assert dashboard["tags"] == ["gatewayscope"]
    assert dashboard["refresh"] == "1m"
    assert dashboard["schemaVersion"] >= 39


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_the_variables_and_their_current_values(name: str) -> None:
    dashboard, kind = load_dashboard(name), KIND_OF[name]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "target"]  # no cluster variable without a cluster label
    for variable in variables.values():
        assert variable["current"] and variable["current"].get("value"), variable["name"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    queries = dict(variable_queries(dashboard))
    assert queries["job"] == f"label_values(up{{{DEFAULT_JOB_SELECTOR}}}, job)"
    kind_matcher = f', kind="{kind}"' if kind else ""
    assert queries["target"] == \
        f'label_values(gatewayscope_up{{{DEFAULT_JOB_SELECTOR}, job=~"$job"{kind_matcher}}}, target)'
    for name in ("job", "target"):
        variable = variables[name]
        assert variable["datasource"] == DATASOURCE
        assert variable["multi"] and variable["includeAll"]
        assert variable["current"]["value"] == ["$__all"]
    assert variables["job"]["allValue"] == ".+"
    # a kind's "All" is the list of that kind's targets (no all value), so unlabelled metrics stay in the kind
    assert variables["target"].get("allValue") == (None if kind else ".+")


def test_units_on_every_panel(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert isinstance(unit, str) and unit, panel["title"]


def test_every_panel_queries_through_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert "__inputs" not in dashboard and "__requires" not in dashboard
    for panel in panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["refId"], panel["title"]
    text = json.dumps(dashboard)
    for uid in re.findall(r'"uid": "([^"]*)"', text):
        assert uid in {"${datasource}", dashboard["uid"]}, uid


def test_every_query_carries_the_job_selector_and_the_variables(dashboard: dict[str, Any]) -> None:
    for title, expr in dashboard_exprs(dashboard):
        assert DEFAULT_JOB_SELECTOR in expr, (title, expr)
        for selector in re.findall(r"\{([^{}]*)\}", expr.replace("{{", "").replace("}}", "")):
            if "=" not in selector:
                continue  # not a label selector (e.g. "by (...)" never has braces; legends are left out)
            assert DEFAULT_JOB_SELECTOR in selector and 'job=~"$job"' in selector, (title, selector)
    for name, query in variable_queries(dashboard):
        assert DEFAULT_JOB_SELECTOR in query, name


def test_queries_use_only_the_substituted_variables(dashboard: dict[str, Any]) -> None:
    for title, expr in dashboard_exprs(dashboard):
        leftover = set(re.findall(r"\$\{?(\w+)", expr)) - QUERY_VARIABLES
        assert leftover == set(), (title, leftover)


def test_rate_interval_in_every_dashboard_rate() -> None:
    count = 0
    for name in DASHBOARD_FILES:
        for title, expr in dashboard_exprs(load_dashboard(name)):
            for match in re.finditer(r"\b(rate|irate|increase)\(", expr):
                count += 1
                window = re.search(r"\[([^\]]+)\]", expr[match.end():])
                assert window and window.group(1) == "$__rate_interval", (name, title, expr)
    assert count > 0


def test_panels_have_titles_descriptions_and_a_grid_without_overlaps(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[x, y] = panel["title"]
        if panel["type"] != "row":
            assert panel["title"] and panel["description"], panel
    assert rows(dashboard), "every dashboard is split into rows"


# -- the metrics ----------------------------------------------------------------------------------------

def recorded() -> dict[str, str]:
    return {rule["record"]: rule["expr"] for rule in rules("rules.yml")}


def test_every_metric_exists_and_every_contract_metric_is_shown() -> None:
    records = recorded()
    seen: set[str] = set()
    for name in DASHBOARD_FILES:
        dashboard = load_dashboard(name)
        queries = [expr for _, expr in dashboard_exprs(dashboard)] + [q for _, q in variable_queries(dashboard)]
        for expr in queries:
            for metric in SELECTOR_NAME.findall(expr):
                if metric in records:
                    seen.update(SELECTOR_NAME.findall(records[metric]))
                else:
                    assert metric in METRICS or metric == "up", f"{name}: {metric} is neither served nor recorded"
                    seen.add(metric)
    missing = set(CONTRACT_METRICS) - seen - {"gatewayscope_build_info"}
    assert missing == set(), f"no panel shows {sorted(missing)}"


def test_panels_read_the_recording_rules_for_the_heavy_queries() -> None:
    records = recorded()
    used = {metric for name in DASHBOARD_FILES for _, expr in dashboard_exprs(load_dashboard(name))
            for metric in SELECTOR_NAME.findall(expr) if metric.startswith("gatewayscope:")}
    feeding = {metric for expr in records.values() for metric in SELECTOR_NAME.findall(expr) if metric in records}
    assert used <= set(records), f"panels read undefined recording rules: {sorted(used - set(records))}"
    assert used | feeding == set(records), "every recording rule is read by a panel or by another rule"
    # the fleet-wide overview has no subquery and no raw rate: those come from the recording rules
    for _, expr in dashboard_exprs(load_dashboard(OVERVIEW)):
        assert not re.search(r"\b(rate|irate|increase)\(|\[[^\]]*:[^\]]*\]", expr), expr


def test_each_kind_dashboard_shows_only_its_kind() -> None:
    foreign = {TRACE_STORE: ("gatewayscope_bifrost_",), BIFROST: ("gatewayscope_trace_store_",
                                                                   "gatewayscope:trace_store_")}
    for name, prefixes in foreign.items():
        for title, expr in dashboard_exprs(load_dashboard(name)):
            assert not any(prefix in expr for prefix in prefixes), (name, title, expr)
    trace_store = " ".join(expr for _, expr in dashboard_exprs(load_dashboard(TRACE_STORE)))
    bifrost = " ".join(expr for _, expr in dashboard_exprs(load_dashboard(BIFROST)))
    assert "gatewayscope_trace_store_orphan_sessions" in trace_store
    assert "gatewayscope_bifrost_parked_workers" in bifrost


# -- links ---------------------------------------------------------------------------------------------

def test_the_overview_and_the_kind_dashboards_link_to_each_other() -> None:
    overview, trace_store, bifrost = (load_dashboard(n) for n in (OVERVIEW, TRACE_STORE, BIFROST))
    uid = {OVERVIEW: overview["uid"], TRACE_STORE: trace_store["uid"], BIFROST: bifrost["uid"]}
    for name, dash in ((OVERVIEW, overview), (TRACE_STORE, trace_store), (BIFROST, bifrost)):
        targets = {other for other in DASHBOARD_FILES for link in dash["links"]
                   if link["url"].startswith(f"/d/{uid[other]}/")}
        assert targets == set(DASHBOARD_FILES) - {name}, name
        for link in dash["links"]:
            assert link["keepTime"] and "${datasource:queryparam}" in link["url"] and "${job:queryparam}" in link["url"]
    # a panel of the overview opens its series' target on the dashboard of that target's kind
    drills = 0
    for panel in panels(overview):
        links = panel["fieldConfig"]["defaults"].get("links", [])
        exprs = " ".join(target["expr"] for target in panel["targets"])
        kind = "trace" if "trace_store" in exprs or 'kind="rllm"' in exprs else \
            "bifrost" if "bifrost" in exprs else None
        if kind is None:
            assert links == [], panel["title"]
            continue
        expected = uid[TRACE_STORE] if kind == "trace" else uid[BIFROST]
        assert len(links) == 1, panel["title"]
        assert links[0]["url"].startswith(f"/d/{expected}/"), panel["title"]
        assert "var-target=${__field.labels.target}" in links[0]["url"] and "${__url_time_range}" in links[0]["url"]
        drills += 1
    assert drills >= 10


def test_provisioning_files() -> None:
    yaml = pytest.importorskip("yaml")
    provisioning = GRAFANA / "provisioning"
    dashboards = yaml.safe_load((provisioning / "dashboards.yaml").read_text())
    assert dashboards["apiVersion"] == 1
    provider = dashboards["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
    text = (provisioning / "dashboards.yaml").read_text()
    assert all(name in text for name in DASHBOARD_FILES)
    assert "overview.json, target.json" not in text
    datasources = yaml.safe_load((provisioning / "datasources.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert datasources["datasources"][0]["type"] == "prometheus"
