"""The fleet view (the last section of triage.ipynb) against a real Prometheus scraping a real exporter.

The sandbox: the unmodified rLLM gateway driven through rollouts with real stragglers (``rllm-plain``), a
second batch while Prometheus watches (its orphans *grow*); a SQLite trace store written by the gateway's own
store class with one-trace sessions that stay as they are (``rllm-file``: orphans, no growth); the Bifrost
emulator seeded realistic (all three posture settings drifted) under three memory limits taken from the
seed's own boot-memory bounds (``bifrost-over`` below the low bound, ``bifrost-risk`` between the bounds,
``bifrost-fits`` above the high one); ``rllm-down``, a port where nothing listens.

A real ``gatewayscope export`` serves them; Debian's Prometheus scrapes it through scrape-static.yml's job and
through scrape-multi-target.yml's ``/probe`` job (relabeling verbatim), so every target has two series per
metric, which the fleet view must not add up. After a few scrapes, :func:`read_fleet` must give each of the
three frames a row for each expected target, with the values the sandbox was built to have; a selector that
matches nothing gives empty frames with their columns and a sentence per metric; a query Prometheus refuses
gives its sentence. Then triage.ipynb runs under papermill with ``prometheus_url`` and its fleet section
shows the three tables.

Every wait is bounded; Prometheus, the exporter, the emulator and the gateway are stopped at teardown.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.analysis.fleet import BOOT_MEMORY_SCHEMA, ORPHAN_GROWTH_SCHEMA, POSTURE_DRIFT_SCHEMA, read_fleet
from gatewayscope.analysis.posture import SAFE_POSTURE
from gatewayscope.errors import HTTPStatusError
from gatewayscope.sandbox.processes import ManagedProcess, free_port
from tests.e2e._support import execute, rollouts, start_prometheus
from tests.helpers import start_server, write_store
from tests.helpers import wait_for as poll

pytestmark = pytest.mark.e2e
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "dashboards" / "prometheus"
SCRAPE_INTERVAL = "2s"
WAIT = 90.0  # the bound on every wait for Prometheus to see something
WINDOW = 600  # the fleet view's window here: the test's whole history fits in it
RLLM = ("rllm-plain", "rllm-file", "rllm-down")
BIFROST = ("bifrost-over", "bifrost-risk", "bifrost-fits")
FILE_ORPHANS = ("file-orphan-1", "file-orphan-2")

wait_for = partial(poll, timeout=WAIT, interval=0.5)


def prometheus_value(url: str, expr: str) -> float | None:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert body.get("status") == "success", f"{expr}: {body}"
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def exporter_config(path: Path, places: dict[str, tuple[str, str]], limits: dict[str, int]) -> None:
    lines = []
    for name, (key, where) in places.items():
        kind = "bifrost" if name.startswith("bifrost") else "rllm"
        lines += ["[[targets]]", f'name = "{name}"', f'kind = "{kind}"', f'{key} = "{where}"', "timeout_seconds = 10"]
        if name in limits:
            lines.append(f"memory_limit_bytes = {limits[name]}")
        lines.append("")
    lines += ["[policy]", "orphan_idle_seconds = 1", "", "[exporter]", "min_interval_seconds = 1", ""]
    path.write_text("\n".join(lines))


def prometheus_config(path: Path, exporter_address: str, targets: list[str]) -> None:
    """scrape-static.yml's job and scrape-multi-target.yml's jobs (relabeling verbatim), pointed here."""
    static = yaml.safe_load((PROMETHEUS_DIR / "scrape-static.yml").read_text())
    multi = yaml.safe_load((PROMETHEUS_DIR / "scrape-multi-target.yml").read_text())
    jobs = []
    for job in static["scrape_configs"] + multi["scrape_configs"]:
        job = copy.deepcopy(job)
        job["scrape_interval"] = job["scrape_timeout"] = SCRAPE_INTERVAL
        if job["metrics_path"] == "/probe":
            job["static_configs"] = [{"targets": targets}]
            for rule in job["relabel_configs"]:
                if rule.get("target_label") == "__address__":
                    rule["replacement"] = exporter_address
        else:
            job["static_configs"] = [{"targets": [exporter_address]}]
        jobs.append(job)
    config = {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "1s"}, "scrape_configs": jobs}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


@dataclass
class Fleet:
    prometheus_url: str
    config_path: Path
    plain_url: str
    bifrost_url: str
    first_orphans: int
    grown_orphans: int
    low: int
    high: int


@pytest.fixture
def fleet(rllm_gateway: Any, emulator: Any, tmp_path: Path) -> Iterator[Fleet]:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not on PATH; CI installs Debian's 'prometheus' package (.ci/run)")
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus); CI runs this test")
    from gatewayscope.sandbox.bifrost_emulator import seed_realistic

    plain = rllm_gateway("memory")
    first = rollouts(plain.url, 6, 2, guarded=False, seed=11)
    store = tmp_path / "traces.db"
    write_store(store, {**dict.fromkeys(FILE_ORPHANS, 1), "file-live": 3})
    seed = seed_realistic(emulator)
    low, high = seed.boot_memory_low_bytes, seed.boot_memory_high_bytes
    assert 0 < low < high
    config_path = tmp_path / "gatewayscope.toml"
    places = {"rllm-plain": ("url", plain.url), "rllm-file": ("path", str(store)),
              "rllm-down": ("url", f"http://127.0.0.1:{free_port()}"),
              **{name: ("url", emulator.url) for name in BIFROST}}
    exporter_config(config_path, places, {"bifrost-over": low // 2, "bifrost-risk": (low + high) // 2,
                                          "bifrost-fits": 2 * high})
    exporter, exporter_url = start_server(
        "exporter", lambda port: [sys.executable, "-c", "from gatewayscope.cli import run; run()", "export",
                                  "--config", str(config_path), "--listen", f"127.0.0.1:{port}"], "/-/healthy")
    prometheus: ManagedProcess | None = None
    try:
        # warm the exporter's reads before Prometheus's short scrape deadlines apply
        httpx.get(exporter_url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "60"}, timeout=90)
        prometheus_config(tmp_path / "prometheus.yml", exporter_url.removeprefix("http://"), list(places))
        prometheus, prometheus_url = start_prometheus(prometheus_bin, tmp_path / "prometheus.yml", tmp_path / "tsdb")
        value = partial(prometheus_value, prometheus_url)
        orphans = 'sum(gatewayscope_trace_store_orphan_sessions{{job="{job}", target="rllm-plain"}})'
        for job in ("gatewayscope", "gatewayscope-targets"):  # both views of the target, before the growth
            wait_for(f"the first orphans ({job})", lambda job=job: value(orphans.format(job=job)),
                     lambda v: v == len(first.expected_orphans))
        wait_for("a few scrapes of history", lambda: value(
            'count_over_time(gatewayscope_up{job="gatewayscope", target="rllm-plain"}[1m])'),
            lambda v: v is not None and v >= 4)
        second = rollouts(plain.url, 4, 3, guarded=False, seed=12)
        grown = len(first.expected_orphans) + len(second.expected_orphans)
        for job in ("gatewayscope", "gatewayscope-targets"):
            wait_for(f"the orphans to grow ({job})", lambda job=job: value(orphans.format(job=job)),
                     lambda v: v == grown)
        wait_for("every fleet metric of every target", lambda: value(
            'count(count by (target) (gatewayscope_trace_store_orphan_sessions or '
            'gatewayscope_bifrost_posture_drift))'), lambda v: v == len(places) - 1)
        yield Fleet(prometheus_url=prometheus_url, config_path=config_path, plain_url=plain.url,
                    bifrost_url=emulator.url, first_orphans=len(first.expected_orphans), grown_orphans=grown,
                    low=low, high=high)
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.stop()


def test_the_fleet_views_from_a_real_prometheus(fleet: Fleet, kernel_name: str,
                                                 tmp_path: Path) -> None:
    view = read_fleet(fleet.prometheus_url, window_seconds=WINDOW)
    assert view.messages == []
    assert view.grid.points <= 300

    # (a) orphan growth: rllm-plain grew by the second batch's stragglers; rllm-file did not grow; the two
    # views of each target (/metrics and /probe) count once; the down target has no orphan series at all
    growth = {row["target"]: row for row in view.orphan_growth.iter_rows(named=True)}
    assert set(growth) == {"rllm-plain", "rllm-file"}
    plain = growth["rllm-plain"]
    assert (plain["latest"], plain["window_min"]) == (fleet.grown_orphans, fleet.first_orphans)
    assert plain["growth"] == fleet.grown_orphans - fleet.first_orphans > 0
    assert (growth["rllm-file"]["latest"], growth["rllm-file"]["growth"]) == (len(FILE_ORPHANS), 0)
    assert view.orphan_growth["target"][0] == "rllm-plain"  # ranked by growth
    assert plain["lowest_at"] < plain["last_seen"]
    history = view.orphan_history.filter(target="rllm-plain")["orphans"].to_list()
    assert min(history) == fleet.first_orphans and history[-1] == fleet.grown_orphans

    # (b) boot memory: every Bifrost target, ranked by the share of its limit, with the seed's own bounds
    boot = view.boot_memory
    assert boot["target"].to_list() == ["bifrost-over", "bifrost-risk", "bifrost-fits"]
    assert boot["verdict"].to_list() == ["will not boot", "at risk", "fits"]
    assert set(boot["stack_bytes_low"]) == {fleet.low} and set(boot["stack_bytes_high"]) == {fleet.high}
    assert boot["memory_limit_bytes"].to_list() == [fleet.low // 2, (fleet.low + fleet.high) // 2, 2 * fleet.high]
    assert all(row["high_share"] == pytest.approx(fleet.high / row["memory_limit_bytes"])
               for row in boot.iter_rows(named=True))

    # (c) posture drift: the realistic seed drifts all three settings, on every Bifrost target, all window long
    posture = view.posture_drift
    assert sorted(posture.select("target", "setting").rows()) == sorted(
        (target, setting) for target in BIFROST for setting in SAFE_POSTURE)
    assert posture["drifted"].all() and posture["drifted_share"].min() == 1.0
    assert posture["drifted_since"].null_count() == 0

    # a selector that matches nothing: empty frames with their columns, a plain sentence per metric
    empty = read_fleet(fleet.prometheus_url, window_seconds=WINDOW, job_selector='job="no-such-job"')
    assert (empty.orphan_growth.schema, empty.boot_memory.schema, empty.posture_drift.schema) == (
        ORPHAN_GROWTH_SCHEMA, BOOT_MEMORY_SCHEMA, POSTURE_DRIFT_SCHEMA)
    assert all(frame.is_empty() for frame in (empty.orphan_growth, empty.boot_memory, empty.posture_drift))
    assert len(empty.messages) == 4 and all('{job="no-such-job"}' in m for m in empty.messages)

    # a query Prometheus refuses: its own sentence, no traceback
    with pytest.raises(HTTPStatusError) as refused:
        read_fleet(fleet.prometheus_url, window_seconds=WINDOW, job_selector='job=~"("')
    assert refused.value.status == 400 and "parse error" in str(refused.value)

    # triage.ipynb, run by papermill on a real kernel, shows the three tables in its fleet section
    small = tmp_path / "small.toml"
    small.write_text(f'[[targets]]\nname = "rllm-plain"\nkind = "rllm"\nurl = "{fleet.plain_url}"\n')
    notebook = execute("triage.ipynb", tmp_path / "out" / "triage.ipynb", kernel_name, config_path=str(small),
                       prometheus_url=fleet.prometheus_url, fleet_window_seconds=WINDOW)
    last = notebook.cells[-1]
    assert "fleet_report(prometheus_url" in last.source
    shown = "".join(str(output.get("data", {}).get("text/html", "")) for output in last.outputs)
    for title in ("Orphan growth per target", "Boot memory against the limit", "Posture drift by target"):
        assert title in shown
    for target in ("rllm-plain", "rllm-file", *BIFROST):
        assert f"<td>{target}</td>" in shown
    assert "will not boot" in shown and "class=\"bad\"" not in shown
    assert any("image/png" in output.get("data", {}) for output in last.outputs)
