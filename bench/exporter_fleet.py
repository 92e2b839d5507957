"""Fleet scale: one real ``gatewayscope export`` process with 100 small targets; its CPU and memory per target.

What it measures, in one run:

* the targets: 50 rLLM targets reading one real ``rllm-model-gateway`` (memory store, 100 sessions) and 50
  Bifrost targets reading one Bifrost emulator process (50 records, loopback base URLs: no DNS server is
  involved), each target a name of its own in the exporter's config, as a fleet's would be;
* ours: the real exporter CLI in its own process, scraped over HTTP like Prometheus does (the timeout
  header, keep-alive). ``cold``: ``min_interval_seconds = 0``, so every scrape reads all 100 targets;
  ``warm``: ``min_interval_seconds = 3600``, every scrape after the first served from the per-target
  cache. CPU is the exporter process's own (utime + stime from /proc), memory its resident set; the
  memory per target is the difference from the same exporter with one target;
* baseline: the same 100 reads done bare (GET /sessions or GET /api/providers + json.loads, 16 threads, one
  keep-alive client), in a fresh child: what reading the fleet costs at the least.

No target in the issue: the row reports the figures (cold scrape vs bare reads is the ratio shown).

Child: ``python -m bench.exporter_fleet bare URLS_FILE`` (used by the benchmark only).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common

NAME = "exporter-fleet-100"
MODULE = "bench.exporter_fleet"
SIZES = {"full": 100, "small": 100, "tiny": 10}
SESSIONS = 100
RECORDS = 50
CONCURRENCY = 16


def _proc(pid: int) -> dict[str, float]:
    """The process's CPU seconds (user + system, all threads) and resident memory now and at its peak."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    out = {"cpu": (int(fields[11]) + int(fields[12])) / ticks}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def _config(path: Path, targets: list[tuple[str, str, str]], min_interval: float) -> None:
    lines = ["[exporter]", f"min_interval_seconds = {min_interval:g}", ""]
    for name, kind, url in targets:
        lines += ["[[targets]]", f'name = "{name}"', f'kind = "{kind}"', f'url = "{url}"', ""]
    path.write_text("\n".join(lines))


class _Exporter:
    """A real ``gatewayscope export`` process on a free port."""

    def __init__(self, config: Path) -> None:
        from bench._support import Child, wait_http
        from gatewayscope.sandbox.processes import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.child = Child([sys.executable, "-c", "from gatewayscope.cli import run; run()", "export",
                            "--config", str(config), "--listen", f"127.0.0.1:{port}"])
        try:
            wait_http(self.url + "/-/healthy", self.child, timeout=60.0)
        except common.BenchError:
            self.child.stop()
            raise

    def scrapes(self, client: Any, n: int, n_targets: int) -> tuple[list[float], float]:
        """``n`` scrapes of /metrics: their wall seconds, and the exporter's CPU seconds for all of them."""
        before = _proc(self.child.pid)["cpu"]
        times = []
        for _ in range(n):
            start = time.monotonic()
            body = client.get(self.url + "/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "60"}).text
            times.append(time.monotonic() - start)
            up = body.count("gatewayscope_up{")
            if up != n_targets or body.count("} 0.0\n", body.index("# HELP gatewayscope_up "),
                                             body.index("# HELP gatewayscope_scrape_duration")):
                raise common.BenchError(f"a scrape did not read every target up: {up} of {n_targets}")
        return times, _proc(self.child.pid)["cpu"] - before

    def stop(self) -> None:
        self.child.stop()


def _child_bare(urls_path: str) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    with open(urls_path, encoding="utf-8") as handle:
        urls = json.load(handle)
    client = httpx.Client(timeout=60.0, limits=httpx.Limits(max_connections=CONCURRENCY,
                                                            max_keepalive_connections=CONCURRENCY))

    def read(url: str) -> int:
        return len(json.loads(client.get(url).content))

    times = []
    for _ in range(3):
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            list(pool.map(read, urls))
        times.append(time.monotonic() - start)
    client.close()
    return {"seconds": common.median(times), "peak_rss": common.peak_rss_bytes()}


child_main = common.children(MODULE, "bare URLS_FILE", [("bare", _child_bare, (str,))])


@common.register(NAME)
def exporter_fleet(ctx: common.BenchContext) -> common.BenchResult:
    """The exporter's own CPU and memory per target, with 100 small targets."""
    import httpx

    from bench._support import fill_sessions, rollout_uid, run_emulator, run_gateway

    n_targets = SIZES[ctx.size]
    cold_scrapes = ctx.pick(5, 3, 2)
    warm_scrapes = ctx.pick(20, 10, 3)
    with run_gateway() as gateway, run_emulator(RECORDS, dead_fraction=0.0) as emulator, \
            tempfile.TemporaryDirectory(prefix="gatewayscope-bench-") as tmp:
        fill_sessions(gateway, [(f"{rollout_uid()}:{k % 8}", 1) for k in range(SESSIONS)])
        targets = [(f"rl-{i:03d}", "rllm", gateway.url) if i % 2 == 0 else
                   (f"bifrost-{i:03d}", "bifrost", emulator.url) for i in range(n_targets)]
        paths = {name: Path(tmp) / f"{name}.toml" for name in ("cold", "warm", "one")}
        _config(paths["cold"], targets, 0)
        _config(paths["warm"], targets, 3600)
        _config(paths["one"], targets[:1], 3600)
        urls_path = Path(tmp) / "urls.json"
        urls_path.write_text(json.dumps([f"{url}/sessions" if kind == "rllm" else f"{url}/api/providers"
                                         for _, kind, url in targets]))
        bare = common.run_child(MODULE, "bare", str(urls_path))
        with httpx.Client(timeout=120.0) as client:
            one = _Exporter(paths["one"])
            try:
                one.scrapes(client, 3, 1)
                one_rss = _proc(one.child.pid)["VmRSS"]
            finally:
                one.stop()
            cold = _Exporter(paths["cold"])
            try:
                cold.scrapes(client, 1, n_targets)  # imports, first DNS answers, connection pools
                cold_times, cold_cpu = cold.scrapes(client, cold_scrapes, n_targets)
                cold_mem = _proc(cold.child.pid)
            finally:
                cold.stop()
            warm = _Exporter(paths["warm"])
            try:
                first_times, first_cpu = warm.scrapes(client, 1, n_targets)
                warm_times, warm_cpu = warm.scrapes(client, warm_scrapes, n_targets)
                warm_mem = _proc(warm.child.pid)
            finally:
                warm.stop()
    cold_s = common.median(cold_times)
    per_target_rss = (warm_mem["VmRSS"] - one_rss) / max(1, n_targets - 1)
    return common.BenchResult(
        name=NAME, row="exporter fleet, 100 targets: cold read / bare reads",
        ours_seconds=cold_s, baseline_seconds=bare["seconds"],
        peak_rss_bytes=int(max(cold_mem["VmHWM"], warm_mem["VmHWM"])),
        extras={
            "targets": f"{n_targets} ({n_targets // 2} rLLM x {SESSIONS} sessions, "
                       f"{n_targets - n_targets // 2} Bifrost x {RECORDS} records), real gateways",
            "cold scrape (every target read)": f"{cold_s * 1000:.0f} ms, exporter CPU "
                                               f"{cold_cpu / cold_scrapes / n_targets * 1000:.2f} ms per target",
            "warm scrape (cached)": f"{common.median(warm_times) * 1000:.1f} ms, exporter CPU "
                                    f"{warm_cpu / warm_scrapes / n_targets * 1000:.3f} ms per target",
            "exporter RSS": f"{warm_mem['VmRSS'] / 2**20:.0f} MB with {n_targets} targets, "
                            f"{one_rss / 2**20:.0f} MB with 1: {per_target_rss / 1024:.0f} KiB per target",
            "first read of every target": f"{first_times[0] * 1000:.0f} ms, CPU {first_cpu * 1000:.0f} ms",
            "bare reads": f"{bare['seconds'] * 1000:.0f} ms for {n_targets} GETs + parse, {CONCURRENCY} threads",
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
