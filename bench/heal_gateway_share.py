"""Heal's cost to the gateway: an agent's chat p95 while ``gatewayscope export --heal`` reads and repairs a 0.1.0
memory store, against its p95 with nothing else running.

What it measures, in one run, against one gateway process:

* the store: the unmodified ``rllm-model-gateway`` 0.1.0 (memory store) in front of the stub worker, filled
  through its own chat route with N sessions (full 100,000): a tenth are one-trace orphans, idle past heal's
  (short, explicitly allowed) idle threshold, the rest live sessions of two traces;
* the chat probe: an agent's call (50 ms of generation at the stub worker), 10 a second, in its own process;
  its p95 idle first, with nothing else running;
* the exporter alone first (``gatewayscope export``, same config, full 120 s), as a figure: what the reads cost;
* ours: ``gatewayscope export --heal`` as its own process (suspected deletes enforced, every other default:
  caps of 100 actions and 50 deletes a target a pass, deletes paced to heal's ``delete_share`` of the gateway's
  time), scraped every scrape interval (full 15 s) for the window (full 300 s),
  passing every interval; the probe runs meanwhile, and its p95 over the window is the row's figure.

Target: the p95 during exporter + heal <= 1.2x the idle p95.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from bench.common import BenchContext, BenchError, BenchResult, child_env, ratio_result, register

NAME = "heal-gateway-share"
#: sessions in the store (a tenth of them orphans), the scrape (and heal) interval, the window of exporter + heal
#: (at 100k sessions a pass's 50 paced deletes outlast it: the window is all pass)
SIZES = {"full": (100_000, 15.0, 300.0), "small": (10_000, 5.0, 40.0), "tiny": (300, 2.0, 8.0)}
PROBE_RATE = 10.0
AGENT_DELAY = 0.05
P95_TARGET = 1.2


def _config(path: str, url: str, state: str, interval: float) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f'[[targets]]\nname = "rl"\nkind = "rllm"\nurl = "{url}"\ntimeout_seconds = 120\n\n'
                     f"[exporter]\nmin_interval_seconds = {interval}\n\n"
                     f'[heal]\nmode = "enforce"\nstate_dir = "{state}"\ninterval_seconds = {interval}\n'
                     "first_pass_max_delay_seconds = 0\n"
                     '[heal.actions]\nsession_delete = "enforce"\n'
                     "[heal.suspected]\ndelete = true\nidle_seconds = 1\nallow_below_heartbeat = true\n")


def _metric(text: str, name: str, *labels: str) -> float:
    """The sum of the samples of ``name`` (in a text exposition) whose labels include every one of ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(\{{[^}}]*\}})? (\S+)", line)
        if match and all(label in (match.group(1) or "") for label in labels):
            total += float(match.group(2))
    return total


def _measure(gateway: Any, config: str, interval: float, window: float, *,
             heal: bool) -> tuple[list[float], list[float], str, str]:
    """The probe's latencies while ``gatewayscope export`` (``--heal`` when ``heal``) runs for ``window`` seconds,
    scraped every ``interval``; and the scrape times, the last scrape's text and the exporter's stderr."""
    import httpx

    from bench._support import start_probe, stop_probe, wait_http
    from gatewayscope.sandbox.processes import free_port

    port = free_port()
    exporter = subprocess.Popen([sys.executable, "-c", "from gatewayscope.cli import run; run()", "export",
                                 "--config", config, "--listen", f"127.0.0.1:{port}", *(["--heal"] if heal else [])],
                                env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    scrapes: list[float] = []
    last = ""
    err = ""
    try:
        wait_http(f"{url}/-/healthy", exporter)
        probe = start_probe(gateway, rate=PROBE_RATE, delay=AGENT_DELAY, tag="agent")
        start = time.monotonic()
        stop = threading.Event()

        def scrape() -> None:
            nonlocal last
            while not stop.is_set():
                began = time.monotonic()
                last = httpx.get(f"{url}/metrics", timeout=120,
                                 headers={"X-Prometheus-Scrape-Timeout-Seconds": str(interval)}).text
                scrapes.append(time.monotonic() - began)
                stop.wait(max(0.0, interval - (time.monotonic() - began)))

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        time.sleep(window)
        stop.set()
        scraper.join(timeout=180)
        during = [dt for t0, dt in stop_probe(probe) if t0 >= start]
        # the counts as the window ends (a pass still running then is not counted)
        last = httpx.get(f"{url}/exporter-metrics", timeout=120).text
    finally:
        exporter.terminate()
        try:
            _, err = exporter.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            exporter.kill()
    if not last:
        raise BenchError(f"no scrape of the exporter succeeded: {err[-500:]}")
    return during, scrapes, last, err


def _orphans_listed(gateway: Any, orphans: list[str]) -> int:
    """How many of the ``orphans`` the gateway still lists."""
    import httpx

    listed = {entry["session_id"] for entry in httpx.get(f"{gateway.url}/sessions", timeout=600.0).json()}
    return len(listed.intersection(orphans))


@register(NAME)
def heal_gateway_share(ctx: BenchContext) -> BenchResult:
    """The agent's chat p95 during exporter + heal passes / idle, on a 0.1.0 memory store."""
    from bench._support import fill_orphans_and_live, p95, run_gateway, start_probe, stop_probe

    n_sessions, interval, window = SIZES[ctx.size]
    idle_window = ctx.pick(30.0, 15.0, 4.0)
    alone_window = ctx.pick(120.0, 40.0, 8.0)
    with run_gateway() as gateway, tempfile.TemporaryDirectory(prefix="gatewayscope-bench-heal-") as tmp:
        orphans, built = fill_orphans_and_live(gateway, n_sessions // 10, n_sessions - n_sessions // 10, live_calls=2)
        time.sleep(1.5)  # the orphans idle past heal's threshold
        probe = start_probe(gateway, rate=PROBE_RATE, delay=AGENT_DELAY, tag="agent")
        time.sleep(idle_window)
        idle = [dt for _, dt in stop_probe(probe)]

        config = os.path.join(tmp, "gatewayscope.toml")
        _config(config, gateway.url, os.path.join(tmp, "heal"), interval)
        alone, _, _, _ = _measure(gateway, config, interval, alone_window, heal=False)
        before = _orphans_listed(gateway, orphans)
        during, scrapes, last, _ = _measure(gateway, config, interval, window, heal=True)
        removed = before - _orphans_listed(gateway, orphans)  # the gateway's word, not heal's counters
    passes = _metric(last, "gatewayscope_heal_passes_total")
    deleted = _metric(last, "gatewayscope_heal_actions_total", 'kind="session_delete"', 'outcome="done"')
    if removed < 1:
        raise BenchError(f"heal deleted no orphan within the {window:.0f} s window: the p95 covers no repair")
    idle_p95, during_p95 = p95(idle), p95(during)
    return ratio_result(
        NAME, f"exporter + heal on a {n_sessions:,}-session 0.1.0 memory store: agent chat p95 during / idle",
        during_p95, idle_p95, P95_TARGET,
        extras={
            "store": f"{n_sessions:,} sessions ({len(orphans):,} one-trace orphans), built through the chat route "
                     f"in {built:.0f} s",
            "heal": f"{removed:,} orphans deleted in {window:.0f} s by the gateway's count, {passes:.0f} passes "
                    f"ended ({deleted:.0f} deletes counted at their ends; scraped and passing every {interval:g} s)",
            "scrapes": f"{len(scrapes)}, slowest {max(scrapes or [0.0]) * 1000:,.0f} ms",
            "agent chat p95": f"idle {idle_p95 * 1000:.1f} ms ({len(idle)} calls), exporter alone "
                              f"{p95(alone) * 1000:.1f} ms ({p95(alone) / idle_p95:.2f}x), exporter + heal "
                              f"{during_p95 * 1000:.1f} ms ({len(during)} calls)",
        },
    )
