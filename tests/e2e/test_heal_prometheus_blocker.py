"""A Prometheus alert named as heal's blocker holds every write while it fires (a real Debian Prometheus
evaluating a real rule), and writes resume once it stops; a Prometheus that cannot be asked holds them too.

The alert's condition is a gauge a small HTTP server of the test serves and Prometheus scrapes every second;
heal's target is the Bifrost emulator, whose request log shows every write it received.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import parse_config
from gatewayscope.heal.loop import HealLoop
from gatewayscope.heal.settings import parse_heal_settings
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small
from gatewayscope.sandbox.processes import free_port
from tests.e2e._support import prometheus_or_skip, start_prometheus
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

ALERT = "GatewayscopeTestMaintenance"


class Gauge:
    """``maintenance_in_progress <value>`` on ``/metrics`` (a real HTTP server on loopback)."""

    def __init__(self) -> None:
        self.value = 0
        gauge = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = f"# TYPE maintenance_in_progress gauge\nmaintenance_in_progress {gauge.value}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Gauge:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def emu() -> Iterator[BifrostEmulator]:
    with BifrostEmulator() as emulator:
        seed_small(emulator)
        yield emulator


def firing(prometheus_url: str) -> set[str]:
    body = httpx.get(f"{prometheus_url}/api/v1/alerts", timeout=10).json()
    return {a["labels"]["alertname"] for a in body["data"]["alerts"] if a["state"] == "firing"}


def heal(emu: BifrostEmulator, state: Path, prometheus_url: str) -> HealLoop:
    raw = {"targets": [{"name": "bifrost", "kind": "bifrost", "url": emu.url}],
           "heal": {"mode": "enforce", "state_dir": str(state), "first_pass_max_delay_seconds": 0,
                    "actions": {"pool_shrink": "enforce", "posture_fix": "enforce"},
                    "blockers": {"prometheus_url": prometheus_url, "alerts": [ALERT, "SomeOtherAlert"]}}}
    config = parse_config(raw, "heal.toml")
    loop = HealLoop(config, parse_heal_settings(config.heal, "heal.toml"))
    loop.prepare()
    return loop


def writes(emu: BifrostEmulator) -> int:
    return sum(1 for r in emu.requests() if r.method != "GET")


def test_a_firing_blocker_alert_holds_every_write(emu: BifrostEmulator, tmp_path: Path) -> None:
    prometheus_bin = prometheus_or_skip()
    with Gauge() as gauge:
        (tmp_path / "rules.yml").write_text(
            f"groups:\n  - name: maintenance\n    interval: 1s\n    rules:\n      - alert: {ALERT}\n"
            "        expr: maintenance_in_progress == 1\n        for: 0s\n")
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {tmp_path / 'rules.yml'}\n"
            f"scrape_configs:\n  - job_name: maintenance\n    static_configs:\n      - targets: ['{gauge.address}']\n")
        gauge.value = 1
        prometheus, url = start_prometheus(prometheus_bin, tmp_path / "prometheus.yml", tmp_path / "tsdb")
        try:
            wait_for("the alert to fire", lambda: firing(url), lambda names: ALERT in names, timeout=60)
            loop = heal(emu, tmp_path / "heal", url)
            emu.clear_requests()
            for _ in range(2):  # every pass while it fires: blocked, nothing written, what it would do recorded
                report = loop.run_pass()
                assert report.result == "blocked" and ALERT in report.blocked["alert"], report.to_dict()
                assert report.enforced == [] and any(r.outcome == "would-write" for r in report.would)
            assert writes(emu) == 0
            assert loop.snapshot_counters().blocked["alert"] == 1

            gauge.value = 0
            wait_for("the alert to stop", lambda: firing(url), lambda names: ALERT not in names, timeout=60)
            report = loop.run_pass()
            assert report.result == "ok" and "alert" not in report.blocked
            assert report.enforced and all(r.outcome == "done" for r in report.enforced)
            assert writes(emu) == len(report.enforced)
        finally:
            prometheus.stop()


def test_a_prometheus_that_cannot_be_asked_holds_writes(emu: BifrostEmulator, tmp_path: Path) -> None:
    loop = heal(emu, tmp_path / "heal", f"http://127.0.0.1:{free_port()}")
    emu.clear_requests()
    report = loop.run_pass()
    assert report.result == "blocked" and "cannot be read" in report.blocked["alert"]
    assert report.enforced == [] and writes(emu) == 0
