"""Bifrost scan: ``read_bifrost`` + ``bifrost_summary`` against the emulator holding 5,000 provider records.

What it measures, in one run, against one emulator process:

* the store: the Bifrost emulator (``gatewayscope.sandbox.bifrost_emulator``) in its own process, loaded
  with 5,000 records built like its realistic seed (org-scoped custom records, ``__anthropic`` lanes,
  15% of the org connectors with dead ``.invalid`` base URLs, the 1,000-worker default, drifted posture);
* ours: a cold scan in a fresh child process, as ``gatewayscope scan`` and the exporter read:
  ``read_bifrost(..., fingerprints=False)`` (list providers, config, health, version, turn every record
  into a sanitized row, check every distinct base-URL host) and ``bifrost_summary`` (kinds, parked
  workers, boot memory, pools, posture, unreachable records);
* baseline: a bare ``GET /api/providers`` + ``json.loads`` with httpx, in a fresh child process.

DNS: both the emulator and the scan get an instant stand-in resolver (see ``bench._support``); this
machine's resolver loses some ``.invalid`` lookups to a 5 s timeout, which would measure the network.

Also measured, as a figure: the read a plan makes (``gatewayscope plan``, a notebook scan, ``scan
--save-snapshot``), which adds each record's plan fingerprint (sha256 of its canonical sanitized JSON).

Children: ``python -m bench.bifrost_scan ours|ours-for-plan URL`` / ``bare URL``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import (
    BenchContext,
    BenchError,
    BenchResult,
    Check,
    emit,
    median,
    peak_rss_bytes,
    register,
    run_child,
)

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
    return {"seconds": seconds, "peak_rss": peak_rss_bytes(), "records": data.records.height,
            "unreachable": summary["unreachable_records"], "hosts": data.reachability.height,
            "over_pool": sum(summary["records_over_pool"].values())}


def _child_bare(url: str) -> dict[str, Any]:
    import json

    import httpx

    start = time.monotonic()
    with httpx.Client(timeout=120.0) as client:
        body = json.loads(client.get(f"{url}/api/providers").content)
    seconds = time.monotonic() - start
    return {"seconds": seconds, "peak_rss": peak_rss_bytes(), "records": len(body["providers"])}


def child_main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] in ("ours", "ours-for-plan"):
        emit(_child_ours(argv[1], fingerprints=argv[0] == "ours-for-plan"))
    elif len(argv) == 2 and argv[0] == "bare":
        emit(_child_bare(argv[1]))
    else:
        print("usage: python -m bench.bifrost_scan ours|ours-for-plan URL | bare URL", file=sys.stderr)
        return 2
    return 0


@register(NAME)
def bifrost_scan(ctx: BenchContext) -> BenchResult:
    """Our Bifrost scan + findings vs a bare GET /api/providers + parse, against one emulator."""
    from bench._support import run_emulator

    n_records = SIZES[ctx.size]
    runs = ctx.runs_or(9, 5, 1)
    started = time.monotonic()
    with run_emulator(n_records) as emulator:
        booted = time.monotonic() - started

        def ours() -> dict[str, Any]:
            result = run_child(MODULE, "ours", emulator.url)
            if result["records"] != n_records:
                raise BenchError(f"our scan read {result['records']} records, not {n_records}")
            return result

        def bare() -> dict[str, Any]:
            result = run_child(MODULE, "bare", emulator.url)
            if result["records"] != n_records:
                raise BenchError(f"the bare listing holds {result['records']} records, not {n_records}")
            return result

        def for_plan() -> dict[str, Any]:
            return run_child(MODULE, "ours-for-plan", emulator.url)

        bare(), ours()  # warm-up pair, not counted
        ours_runs: list[dict[str, Any]] = []
        bare_runs: list[dict[str, Any]] = []
        plan_runs: list[dict[str, Any]] = []
        for i in range(runs):
            for side in ((bare, ours, for_plan) if i % 2 == 0 else (for_plan, ours, bare)):
                result = side()
                (ours_runs if side is ours else bare_runs if side is bare else plan_runs).append(result)
    ours_s = median([r["seconds"] for r in ours_runs])
    bare_s = median([r["seconds"] for r in bare_runs])
    first = ours_runs[0]
    return BenchResult(
        name=NAME, row="Bifrost, 5,000 records: scan + findings / bare GET /api/providers + parse",
        ours_seconds=ours_s, baseline_seconds=bare_s,
        peak_rss_bytes=max(r["peak_rss"] for r in ours_runs),
        checks=[Check.ratio(ours_s / bare_s, RATIO_TARGET)],
        extras={
            "store": f"{n_records:,} records in the emulator (own process, up in {booted:.1f} s)",
            "findings": f"{first['over_pool']:,} over pool, {first['unreachable']:,} unreachable, "
                        f"{first['hosts']:,} hosts checked",
            "read for a plan (with fingerprints)": f"{median([r['seconds'] for r in plan_runs]) * 1000:.0f} ms, "
                                                   f"{median([r['seconds'] for r in plan_runs]) / bare_s:.2f}x",
            "runs": f"{runs} (ours " + "/".join(f"{r['seconds'] * 1000:.0f}" for r in ours_runs)
                    + ", bare " + "/".join(f"{r['seconds'] * 1000:.0f}" for r in bare_runs) + " ms)",
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
