"""Bifrost scan: ``read_bifrost`` + ``bifrost_summary`` against the emulator holding 5,000 provider records.

What it measures, in one run, against one emulator process:

* the store: the Bifrost emulator (``gatewayscope.sandbox.bifrost_emulator``) in its own process, loaded
  with 5,000 records built like its realistic seed (org-scoped custom records, ``__anthropic`` lanes,
  15% of the org connectors with dead ``.invalid`` base URLs, the 1,000-worker default, drifted posture);
* ours: a cold scan in a fresh child process, as ``gatewayscope scan`` and the exporter read:
  ``read_bifrost(..., fingerprints=False)`` (list providers, config, health, version, the gateway's own
  runtime metrics beside them, turn every record into a sanitized row, check every distinct base-URL host)
  and ``bifrost_summary`` (kinds, parked workers, boot memory measured and as the band, pools, posture,
  unreachable records);
* baseline: the two answers the scan cannot do without, bare, in a fresh child process: ``GET /api/providers``
  + ``json.loads`` with httpx, and beside it (in a second thread, as the scan reads them) ``GET /metrics``.
  Also measured, as a figure: the listing alone (the baseline before the scan read the metrics).

DNS: both the emulator and the scan get an instant stand-in resolver (see ``bench._support``); this
machine's resolver loses some ``.invalid`` lookups to a 5 s timeout, which would measure the network.

Also measured, as a figure: the read a plan makes (``gatewayscope plan``, a notebook scan, ``scan
--save-snapshot``), which adds each record's plan fingerprint (sha256 of its canonical sanitized JSON).

Children: ``python -m bench.bifrost_scan ours|ours-for-plan URL`` / ``bare|bare-listing URL``.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

from bench import common

NAME = "bifrost-scan"
MODULE = "bench.bifrost_scan"
SIZES = {"full": 5_000, "small": 1_000, "tiny": 100}
RATIO_TARGET = 1.3


def _child_ours(url: str, fingerprints: bool = False) -> dict[str, Any]:
    from bench._support import static_lookup
    from gatewayscope.analysis.pools import bifrost_summary
    from gatewayscope.config import Policy, Target
    from gatewayscope.sources.bifrost import read_bifrost

    target = Target(name="bench", kind="bifrost", url=url, timeout_seconds=120.0)
    policy = Policy()
    start = time.monotonic()
    data = read_bifrost(target, policy, resolver=static_lookup, now=time.time(), fingerprints=fingerprints)
    summary = bifrost_summary(data, policy, target.memory_limit_bytes)
    seconds = time.monotonic() - start
    return {"seconds": seconds, "peak_rss": common.peak_rss_bytes(), "records": data.records.height,
            "unreachable": summary["unreachable_records"], "hosts": data.reachability.height,
            "over_pool": sum(summary["records_over_pool"].values()), "runtime_error": data.runtime_error}


def _child_bare(url: str, with_metrics: bool = True) -> dict[str, Any]:
    import json
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    start = time.monotonic()
    with httpx.Client(timeout=120.0) as client, ThreadPoolExecutor(max_workers=1) as pool:
        metrics = pool.submit(client.get, f"{url}/metrics") if with_metrics else None
        body = json.loads(client.get(f"{url}/api/providers").content)
        metrics_bytes = len(metrics.result().raise_for_status().content) if metrics is not None else 0
    seconds = time.monotonic() - start
    return {"seconds": seconds, "peak_rss": common.peak_rss_bytes(), "records": len(body["providers"]),
            "metrics_bytes": metrics_bytes}


child_main = common.children(MODULE, "ours|ours-for-plan URL | bare|bare-listing URL", [
    ("ours", _child_ours, (str,)),
    ("ours-for-plan", functools.partial(_child_ours, fingerprints=True), (str,)),
    ("bare", _child_bare, (str,)),
    ("bare-listing", functools.partial(_child_bare, with_metrics=False), (str,)),
])


@common.register(NAME)
def bifrost_scan(ctx: common.BenchContext) -> common.BenchResult:
    """Our Bifrost scan + findings vs a bare GET /api/providers + parse beside GET /metrics, against one
    emulator."""
    from bench._support import run_emulator

    n_records = SIZES[ctx.size]
    runs = ctx.runs_or(9, 5, 1)
    started = time.monotonic()
    with run_emulator(n_records) as emulator:
        booted = time.monotonic() - started

        def ours() -> dict[str, Any]:
            result = common.run_child(MODULE, "ours", emulator.url)
            if result["records"] != n_records:
                raise common.BenchError(f"our scan read {result['records']} records, not {n_records}")
            if result["runtime_error"] is not None:  # a scan without the metrics read would measure less
                raise common.BenchError(f"our scan read no runtime metrics: {result['runtime_error']}")
            return result

        def bare() -> dict[str, Any]:
            result = common.run_child(MODULE, "bare", emulator.url)
            if result["records"] != n_records:
                raise common.BenchError(f"the bare listing holds {result['records']} records, not {n_records}")
            return result

        def for_plan() -> dict[str, Any]:
            return common.run_child(MODULE, "ours-for-plan", emulator.url)

        def listing_only() -> dict[str, Any]:
            return common.run_child(MODULE, "bare-listing", emulator.url)

        bare(), ours()  # warm-up pair, not counted
        bare_runs, ours_runs, plan_runs, listing_runs = common.alternate(runs, bare, ours, for_plan, listing_only)
    ours_s, bare_s = common.median_seconds(ours_runs), common.median_seconds(bare_runs)
    first = ours_runs[0]
    return common.ratio_result(
        NAME, "Bifrost, 5,000 records: scan + findings / bare GET /api/providers + parse, GET /metrics",
        ours_s, bare_s, RATIO_TARGET, peak_rss=common.peak_of(ours_runs),
        extras={
            "store": f"{n_records:,} records in the emulator (own process, up in {booted:.1f} s)",
            "findings": f"{first['over_pool']:,} over pool, {first['unreachable']:,} unreachable, "
                        f"{first['hosts']:,} hosts checked",
            "read for a plan (with fingerprints)": f"{common.median_seconds(plan_runs) * 1000:.0f} ms, "
                                                   f"{common.median_seconds(plan_runs) / bare_s:.2f}x",
            "bare listing alone": f"{common.median_seconds(listing_runs) * 1000:.0f} ms (ours "
                                  f"{ours_s / common.median_seconds(listing_runs):.2f}x); the metrics "
                                  f"answer {bare_runs[0]['metrics_bytes']:,} bytes",
            "runs": common.runs_figure(runs, ours_runs, bare_runs, ms=True),
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
