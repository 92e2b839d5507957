"""The fleet examples: 100 gateways behind four sharded multi-target exporters, and the central federation.

promtool (Debian's ``prometheus`` package) checks that Prometheus accepts both files; the structure tests
check what the relabeling promises: every gateway is scraped once, through the exporter holding it, as its
own instance. ``tests/e2e/test_fleet_e2e.py`` runs the same file against a real Prometheus.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.mixin.mixin_files import promtool

yaml = pytest.importorskip("yaml")

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "dashboards" / "prometheus"
FLEET = PROMETHEUS_DIR / "scrape-fleet-100.yml"
FEDERATE = PROMETHEUS_DIR / "federate-fleet.yml"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """promtool in the examples' folder; skipped where it is missing, except under CI (as in test_rules.py)."""
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=PROMETHEUS_DIR)


def fleet() -> dict[str, Any]:
    return dict(yaml.safe_load(FLEET.read_text()))


def job(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in config["scrape_configs"] if j["job_name"] == name)


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("path", [FLEET, FEDERATE], ids=lambda p: p.name)
def test_promtool_accepts_the_fleet_examples(path: Path) -> None:
    done = run("check", "config", path.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {path.name} is valid prometheus config file syntax" in done.stdout


def test_the_fleet_scrapes_100_gateways_each_through_the_exporter_holding_it() -> None:
    config = fleet()
    targets_job = job(config, "gatewayscope-targets")
    exporters = job(config, "gatewayscope-exporter")["static_configs"][0]["targets"]
    assert targets_job["metrics_path"] == "/probe"
    names = [name for group in targets_job["static_configs"] for name in group["targets"]]
    assert len(names) == 100 and len(set(names)) == 100
    assert all(re.fullmatch(r"(rl|bifrost)-\d{3}", name) for name in names)
    shards = {group["labels"]["__exporter"]: len(group["targets"]) for group in targets_job["static_configs"]}
    assert sorted(shards) == sorted(exporters) and len(exporters) == 4
    assert set(shards.values()) == {25}
    # the relabeling: name -> ?target=, name -> instance, the shard's exporter -> where the scrape goes
    relabel = [(tuple(r.get("source_labels", ())), r["target_label"]) for r in targets_job["relabel_configs"]]
    assert relabel == [(("__address__",), "__param_target"), (("__param_target",), "instance"),
                       (("__exporter",), "__address__")]
    # the exporters' own metrics without the targets' series again
    assert job(config, "gatewayscope-exporter")["metrics_path"] == "/exporter-metrics"


def test_only_the_gatewayscope_jobs_leave_the_cluster() -> None:
    config = fleet()
    assert config["global"]["external_labels"]["cluster"]
    (remote,) = config["remote_write"]
    keep = remote["write_relabel_configs"]
    assert keep == [{"source_labels": ["job"], "regex": "gatewayscope-.*", "action": "keep"}]
    jobs = [j["job_name"] for j in config["scrape_configs"]]
    assert all(re.fullmatch(keep[0]["regex"], name) for name in jobs)
    federate = yaml.safe_load(FEDERATE.read_text())["scrape_configs"][0]
    assert federate["honor_labels"] is True
    assert federate["params"]["match[]"] == ['{job=~"gatewayscope-.*"}']
