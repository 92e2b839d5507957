"""Exporter ``/metrics``, warm: 20 targets of 5,000 records each, values from the per-target cache.

What it measures, in one run:

* ours, in a fresh child: an :class:`~gatewayscope.exporter.server.Exporter` with 20 targets, 10 Bifrost
  gateways of 5,000 provider records (the emulator's realistic records, served in-process through an
  httpx transport: the exporter's real read path) and 10 rLLM memory stores of 5,000 sessions (a scripted
  gateway answering like 0.1.0, 75 idle one-trace orphans each, through an httpx transport). The first
  scrape reads every target; the measured scrapes follow within ``min_interval_seconds``, so every value
  comes from the cache, as for several Prometheus replicas or a scrape interval shorter than the
  interval. One scrape is ``render(exporter.metrics_registry(budget))``, exactly what ``/metrics`` runs.
* baseline, in a fresh child: prometheus-client's ``generate_latest`` on a registry built beforehand
  (Gauges and Counters, labels set) holding the very series our scrape served (parsed from our output).

Children: ``python -m bench.exporter_scrape ours OUT TARGETS RECORDS SCRAPES`` / ``bare IN SCRAPES``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

from bench import common

NAME = "exporter-metrics-warm"
MODULE = "bench.exporter_scrape"
SIZES = {"full": (20, 5_000), "small": (20, 1_000), "tiny": (4, 100)}
RATIO_TARGET = 2.0
ORPHAN_SHARE = 0.015


# -- scripted targets (in-process transports) ---------------------------------------------------------

def emulator_transport(records: int) -> Any:
    """An httpx transport answering from an in-process Bifrost emulator holding ``records`` records."""
    import httpx

    from bench._support import bifrost_records, emulator_resolver
    from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, EmulatorOptions
    from gatewayscope.sandbox.bifrost_emulator.seed import drifted_config

    emulator = BifrostEmulator(options=EmulatorOptions(resolver=emulator_resolver, request_log_limit=10))
    emulator.load(bifrost_records(records), drifted_config())

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        reply = emulator._dispatch(request.method, request.url.raw_path.decode(), headers, request.content)
        assert reply is not None
        return httpx.Response(reply.status, content=reply.body,
                              headers=[("content-type", reply.content_type), *reply.headers])

    return httpx.MockTransport(handle)


def rllm_transport(sessions: int, now: float, *, orphan_share: float = ORPHAN_SHARE) -> Any:
    """An httpx transport answering like a 0.1.0 memory gateway with ``sessions`` sessions, the first
    ``orphan_share`` of them one-trace orphans idle for three hours (no guard, no weight versions)."""
    import httpx

    from bench._support import rollout_uid

    n_orphans = max(1, round(sessions * orphan_share))
    rows = []
    traces: dict[str, list[dict[str, Any]]] = {}
    for k in range(sessions):
        sid = f"{rollout_uid()}:{k % 8}"
        orphan = k < n_orphans
        created = now - (3 * 3600 if orphan else 60 + k % 600)
        rows.append({"session_id": sid, "trace_count": 1 if orphan else 2 + k % 7, "created_at": created,
                     "metadata": {}})
        if orphan:
            traces[sid] = [{"trace_id": f"t-{k}", "session_id": sid, "model": "Qwen/Qwen3-8B",
                            "messages": [{"role": "user", "content": "x" * 400}],
                            "prompt_token_ids": list(range(400)), "timestamp": created + 1.0,
                            "token_counts": {"prompt": 400, "completion": 8}, "metadata": {}}]
    listing = json.dumps(rows).encode()
    openapi = json.dumps({"openapi": "3.1.0", "paths": {p: {} for p in (
        "/health", "/sessions", "/sessions/{session_id}", "/traces/query")}}).encode()

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/openapi.json":
            return httpx.Response(200, content=openapi, headers={"content-type": "application/json"})
        if path == "/sessions":
            return httpx.Response(200, content=listing, headers={"content-type": "application/json"})
        if path == "/traces/query":
            wanted = json.loads(request.content)["session_ids"]
            body = [t for sid in wanted for t in traces.get(sid, [])]
            return httpx.Response(200, json=body)
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(handle)


def build_exporter(n_targets: int, records: int, *, min_interval: float) -> Any:
    """An Exporter over ``n_targets`` transports (half Bifrost, half rLLM); DNS answered by a stand-in."""
    from bench._support import static_lookup
    from gatewayscope.config import Config, Policy, Target
    from gatewayscope.exporter.server import Exporter
    from gatewayscope.exporter.settings import ExporterSettings
    from gatewayscope.sources import bifrost

    bifrost.DEFAULT_RESOLVER.lookup = static_lookup  # the scan's real path, without this machine's DNS
    now = time.time()
    targets: list[Target] = []
    transports: dict[str, Any] = {}
    for index in range(n_targets):
        if index % 2 == 0:
            name = f"bifrost-{index // 2:02d}"
            targets.append(Target(name=name, kind="bifrost", url=f"http://{name}.bench:8080", timeout_seconds=120))
            transports[name] = emulator_transport(records)
        else:
            name = f"rllm-{index // 2:02d}"
            targets.append(Target(name=name, kind="rllm", url=f"http://{name}.bench:9090", timeout_seconds=120))
            transports[name] = rllm_transport(records, now)
    settings = ExporterSettings(min_interval_seconds=min_interval)
    return Exporter(Config(targets=targets, policy=Policy()), settings, transports=transports)


# -- children -----------------------------------------------------------------------------------------

def _child_ours(out: str, n_targets: int, records: int, scrapes: int) -> dict[str, Any]:
    from gatewayscope.exporter.server import render

    exporter = build_exporter(n_targets, records, min_interval=3600.0)
    rss_built = common.current_rss_bytes()
    start = time.monotonic()
    first, _ = render(exporter.metrics_registry(600.0))
    cold = time.monotonic() - start
    up = [line for line in first.splitlines() if line.startswith(b"gatewayscope_up{")]
    if len(up) != n_targets or not all(line.endswith(b" 1.0") for line in up):
        raise common.BenchError(f"the first scrape did not read every target: {up!r}")
    times = []
    body = b""
    for _ in range(scrapes):
        start = time.monotonic()
        body, _ = render(exporter.metrics_registry(10.0))
        times.append(time.monotonic() - start)
    with open(out, "wb") as handle:
        handle.write(body)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    counters = exporter.cache.counters()
    cached = sum(entry["scrapes"]["cached"] for entry in counters.values())
    return {"seconds": common.median(times), "runs": times, "cold": cold, "peak_rss": common.peak_rss_bytes(),
            "rss_built": rss_built, "series": series, "bytes": len(body), "cached": cached}


def _child_bare(path: str, scrapes: int) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    disable_created_metrics()
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    registry = CollectorRegistry(auto_describe=False)
    series = 0
    for family in text_string_to_metric_families(text):
        labels = sorted({name for sample in family.samples for name in sample.labels},
                        key=lambda name: list(family.samples[0].labels).index(name)
                        if name in family.samples[0].labels else 99)
        kind = Counter if family.type == "counter" else Gauge
        metric = kind(family.name, family.documentation, labelnames=labels, registry=registry)
        for sample in family.samples:
            child = metric.labels(**sample.labels) if labels else metric
            if kind is Counter:
                child.inc(sample.value)  # type: ignore[union-attr]
            else:
                child.set(sample.value)  # type: ignore[union-attr]
            series += 1
    times = []
    body = b""
    for _ in range(scrapes):
        start = time.monotonic()
        body = generate_latest(registry)
        times.append(time.monotonic() - start)
    return {"seconds": common.median(times), "runs": times, "peak_rss": common.peak_rss_bytes(), "series": series,
            "bytes": len(body)}


child_main = common.children(MODULE, "ours OUT TARGETS RECORDS SCRAPES | bare IN SCRAPES", [
    ("ours", _child_ours, (str, int, int, int)),
    ("bare", _child_bare, (str, int)),
])


@common.register(NAME)
def exporter_metrics_warm(ctx: common.BenchContext) -> common.BenchResult:
    """A warm /metrics of 20 big targets vs prometheus-client rendering the same series."""
    n_targets, records = SIZES[ctx.size]
    runs = ctx.runs_or(3, 3, 1)
    scrapes = ctx.pick(30, 30, 5)
    ours_runs: list[dict[str, Any]] = []
    bare_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gatewayscope-bench-") as tmp:
        out = os.path.join(tmp, "metrics.txt")
        for _ in range(runs):
            ours_runs.append(common.run_child(MODULE, "ours", out, str(n_targets), str(records), str(scrapes)))
            bare_runs.append(common.run_child(MODULE, "bare", out, str(scrapes)))
    ours_s, bare_s = common.median_seconds(ours_runs), common.median_seconds(bare_runs)
    if bare_runs[0]["series"] != ours_runs[0]["series"]:
        raise common.BenchError(f"the baseline holds {bare_runs[0]['series']} series, "
                                f"ours served {ours_runs[0]['series']}")
    first = ours_runs[0]
    return common.ratio_result(
        NAME, "/metrics, 20 targets x 5,000 records, warm / prometheus-client generate_latest",
        ours_s, bare_s, RATIO_TARGET, peak_rss=common.peak_of(ours_runs),
        extras={
            "targets": f"{n_targets} ({n_targets // 2 + n_targets % 2} Bifrost x {records:,} records, "
                       f"{n_targets // 2} rLLM x {records:,} sessions)",
            "series": f"{first['series']:,} ({first['bytes'] / 1024:,.0f} KiB)",
            "scrapes": f"{runs} runs x {scrapes} warm scrapes (medians per run: ours "
                       + "/".join(f"{r['seconds'] * 1000:.1f}" for r in ours_runs) + ", bare "
                       + "/".join(f"{r['seconds'] * 1000:.1f}" for r in bare_runs) + " ms)",
            "first (cold) scrape": f"{common.median([r['cold'] for r in ours_runs]):.2f} s",
            "bare peak RSS": f"{common.peak_of(bare_runs) / 2**20:.0f} MB",
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
