"""What the mixin tests share: dashboards/build.py as a module, the committed files, every expression, promtool.

Import as ``from tests.mixin.mixin_files import ...`` (pytest puts the project root on ``sys.path``).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gatewayscope.exporter.collectors import METRICS
from tests.helpers import ci_program

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
GRAFANA = DASHBOARDS / "grafana"
PROMETHEUS_DIR = DASHBOARDS / "prometheus"
BUILD_PY = DASHBOARDS / "build.py"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
OVERVIEW, TRACE_STORE, BIFROST = ("gatewayscope-overview.json", "gatewayscope-trace-store.json",
                                  "gatewayscope-bifrost.json")
DASHBOARD_FILES = (OVERVIEW, TRACE_STORE, BIFROST)
#: the gateway kind each dashboard shows (None: every kind)
KIND_OF = {OVERVIEW: None, TRACE_STORE: "rllm", BIFROST: "bifrost"}
DEFAULT_JOB_SELECTOR = 'job=~"gatewayscope|gatewayscope-.*"'
DEFAULT_RUNBOOK_BASE_URL = "https://github.com/gatewayscope/gatewayscope/blob/main/docs/runbooks.md"
RULE_FILES = ("alerts.yml", "rules.yml")
#: the PromQL functions that only make sense on counters (a gauge that drops reads as a reset or as negative)
COUNTER_FUNCTIONS = ("rate", "irate", "increase", "delta", "idelta")
#: a metric name written as a selector: name{...}
SELECTOR_NAME = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")


@functools.cache
def build_module() -> ModuleType:
    """dashboards/build.py, imported (it needs the grafana-foundation-sdk of the dev extra, Python >= 3.11)."""
    if sys.version_info < (3, 11):
        pytest.skip("dashboards/build.py needs Python >= 3.11 (grafana-foundation-sdk)")
    spec = importlib.util.spec_from_file_location("gatewayscope_mixin_build", BUILD_PY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_build(*args: str) -> subprocess.CompletedProcess[str]:
    """``python dashboards/build.py ARGS`` as a user runs it."""
    if sys.version_info < (3, 11):
        pytest.skip("dashboards/build.py needs Python >= 3.11 (grafana-foundation-sdk)")
    return subprocess.run([sys.executable, str(BUILD_PY), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def load_dashboard(name: str, folder: Path = GRAFANA) -> dict[str, Any]:
    return dict(json.loads((folder / name).read_text()))


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that shows data (rows left out, the panels of collapsed rows included)."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def rows(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] == "row"]


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every query of every panel."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def variable_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(variable name, PromQL query) of every query variable."""
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield variable["name"], query["query"] if isinstance(query, dict) else query


def rule_groups(name: str, folder: Path = PROMETHEUS_DIR) -> list[dict[str, Any]]:
    import yaml

    return list(yaml.safe_load((folder / name).read_text())["groups"])


def rules(name: str, folder: Path = PROMETHEUS_DIR) -> list[dict[str, Any]]:
    return [rule for group in rule_groups(name, folder) for rule in group["rules"]]


def rule_name(rule: dict[str, Any]) -> str:
    return str(rule.get("alert") or rule["record"])


def all_exprs(grafana: Path = GRAFANA, prometheus: Path = PROMETHEUS_DIR) -> list[tuple[str, str]]:
    """(where, expr) for every expression of every dashboard panel, dashboard variable and rule."""
    out = []
    for name in DASHBOARD_FILES:
        dashboard = load_dashboard(name, grafana)
        out += [(f"{name}: {title}", expr) for title, expr in dashboard_exprs(dashboard)]
        out += [(f"{name}: variable {var}", query) for var, query in variable_queries(dashboard)]
    for file in RULE_FILES:
        out += [(f"{file}: {rule_name(rule)}", rule["expr"]) for rule in rules(file, prometheus)]
    return out


def call_arguments(expr: str, function: str) -> list[str]:
    """The argument text of every call of ``function`` in ``expr`` (parentheses balanced)."""
    out = []
    for match in re.finditer(rf"(?<![\w:]){function}\s*\(", expr):
        depth, start = 1, match.end()
        position = start
        while depth and position < len(expr):
            depth += {"(": 1, ")": -1}.get(expr[position], 0)
            position += 1
        out.append(expr[start:position - 1])
    return out


def counter_function_misuse(expr: str) -> list[str]:
    """``function(metric)`` pairs where a counter function gets anything but a ``_total`` counter."""
    bad = []
    for function in COUNTER_FUNCTIONS:
        for argument in call_arguments(expr, function):
            names = SELECTOR_NAME.findall(argument)
            if not names:
                bad.append(f"{function}({argument}): no metric")
            for metric in names:
                spec = METRICS.get(metric)
                if not (metric.endswith("_total") and spec is not None and spec.type == "counter"):
                    bad.append(f"{function}({metric})")
    return bad


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lowercase, punctuation dropped, spaces to '-'."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def promtool() -> str:
    """Debian's promtool; skipped where it is missing, except under CI (the ``CI`` variable set)."""
    return ci_program("promtool", "prometheus", ".ci/run does: apt-get install prometheus")


def run_promtool(*args: str, cwd: Path = PROMETHEUS_DIR, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd)
