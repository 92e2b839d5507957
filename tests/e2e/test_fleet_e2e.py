"""A fleet, for real: ``scrape-fleet-100.yml`` in a real Prometheus, 100 gateways behind four exporters.

Four real ``gatewayscope export`` processes, each with the 25 ``[[targets]]`` of its shard (the names the
fleet file lists); the 75 rLLM targets read one real rLLM gateway (memory store, a few sessions; PyPI's 0.1.0
and upstream main, one run each), the 25
Bifrost targets the Bifrost emulator (loopback base URLs only, so no DNS is involved). Prometheus runs the
fleet file's jobs verbatim (relabeling included), with the addresses of these four exporters in place of
the example's, a 2 s interval, and without its remote_write (there is no central backend here).

What must hold: every one of the 100 gateways is scraped as its own instance, through the exporter holding
it, and reads up; every exporter reads only its own shard; the four exporters' own metrics come from their
/exporter-metrics. Every wait is bounded; every process is stopped at teardown.
"""

from __future__ import annotations

import copy
import shutil
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e._support import start_prometheus
from tests.helpers import start_server as start
from tests.helpers import wait_for as wait_until

pytestmark = pytest.mark.e2e
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "dashboards" / "prometheus" / "scrape-fleet-100.yml"
WAIT = 120.0
#: waits on Prometheus: bounded by WAIT, polled every half second
wait_for = partial(wait_until, timeout=WAIT, interval=0.5)


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert body.get("status") == "success", f"{expr}: {body}"
    return list(body["data"]["result"])


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    try:
        yield started
    finally:
        for proc in reversed(started):
            proc.stop()


def test_scrape_fleet_100_in_a_real_prometheus(processes: list[Any], gateway_flavor: Any, tmp_path: Path) -> None:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        import os

        if os.environ.get("CI"):
            pytest.fail("prometheus is not on PATH; CI installs Debian's 'prometheus' package (.ci/run)")
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus); CI runs this test")
    from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, realistic_records
    from gatewayscope.sandbox.bifrost_emulator.seed import drifted_config
    from gatewayscope.sandbox.processes import start_rllm_gateway, start_stub_worker

    worker = start_stub_worker()
    processes.append(worker)
    gateway = start_rllm_gateway(worker.url, python=gateway_flavor.python)  # the flavour's rLLM gateway
    processes.append(gateway)
    for k in range(3):
        httpx.post(f"{gateway.url}/sessions/fleet-task:{k}/v1/chat/completions", timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).raise_for_status()
    emulator = BifrostEmulator().start()
    processes.append(emulator)
    emulator.load(realistic_records(orgs=2, dead_fraction=0.0, include_broken=False), drifted_config())

    fleet = yaml.safe_load(FLEET.read_text())
    targets_job = next(j for j in fleet["scrape_configs"] if j["job_name"] == "gatewayscope-targets")
    exporter_job = next(j for j in fleet["scrape_configs"] if j["job_name"] == "gatewayscope-exporter")
    # one real exporter per shard of the file, holding exactly that shard's targets
    address_of: dict[str, str] = {}
    shards: dict[str, list[str]] = {}
    for index, group in enumerate(targets_job["static_configs"]):
        names = list(group["targets"])
        lines = ["[exporter]", "min_interval_seconds = 1", ""]
        for name in names:
            kind = "bifrost" if name.startswith("bifrost-") else "rllm"
            url = emulator.url if kind == "bifrost" else gateway.url
            lines += ["[[targets]]", f'name = "{name}"', f'kind = "{kind}"', f'url = "{url}"', ""]
        config = tmp_path / f"shard-{index}.toml"
        config.write_text("\n".join(lines))
        def argv(port: int, config: Path = config) -> list[str]:
            return [sys.executable, "-c", "from gatewayscope.cli import run; run()", "export",
                    "--config", str(config), "--listen", f"127.0.0.1:{port}"]

        proc, url = start(f"exporter-{index}", argv, "/-/healthy")
        processes.append(proc)
        address_of[group["labels"]["__exporter"]] = url.removeprefix("http://")
        shards[url.removeprefix("http://")] = names
    assert sorted(address_of) == sorted(exporter_job["static_configs"][0]["targets"])

    # the fleet file's jobs, verbatim but for the addresses, the interval and the remote_write
    config = copy.deepcopy(fleet)
    config.pop("remote_write")
    config["global"].update(scrape_interval="2s", scrape_timeout="2s", evaluation_interval="2s")
    config["rule_files"] = [str(FLEET.parent / "alerts.yml")]
    for group in next(j for j in config["scrape_configs"]
                      if j["job_name"] == "gatewayscope-targets")["static_configs"]:
        group["labels"]["__exporter"] = address_of[group["labels"]["__exporter"]]
    next(j for j in config["scrape_configs"] if j["job_name"] == "gatewayscope-exporter")["static_configs"] = [
        {"targets": sorted(shards)}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    prometheus, prometheus_url = start_prometheus(prometheus_bin, tmp_path / "prometheus.yml", tmp_path / "tsdb")
    processes.append(prometheus)

    # all 100 gateways up, each its own instance, each through the exporter holding it
    wait_for("100 gateways scraped and read up",
             lambda: len(query(prometheus_url, 'gatewayscope_up{job="gatewayscope-targets"} == 1')),
             lambda n: n == 100)
    series = query(prometheus_url, 'gatewayscope_up{job="gatewayscope-targets"}')
    assert len(series) == 100
    assert all(s["metric"]["instance"] == s["metric"]["target"] for s in series)
    sessions = query(prometheus_url, 'gatewayscope_trace_store_sessions{job="gatewayscope-targets"}')
    assert len(sessions) == 75 and all(float(s["value"][1]) >= 3 for s in sessions)
    records = query(prometheus_url, 'sum by (target) (gatewayscope_bifrost_provider_records)')
    assert len(records) == 25
    # the exporters: four, up, and each one read only its own shard
    wait_for("the four exporters' own metrics",
             lambda: len(query(prometheus_url, 'up{job="gatewayscope-exporter"} == 1')), lambda n: n == 4)
    for address, names in shards.items():
        expr = f'gatewayscope_exporter_target_reads_total{{instance="{address}",result="ok"}}'
        assert sorted(s["metric"]["target"] for s in query(prometheus_url, expr)) == sorted(names)
        wait_for(f"{address} has read its whole shard", lambda expr=expr: len(query(prometheus_url, f"{expr} > 0")),
                 lambda n, names=names: n == len(names))
