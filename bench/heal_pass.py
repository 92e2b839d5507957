"""Heal pass: one ``gatewayscope heal`` pass (dry-run) against a bare scan of the same Bifrost emulator.

What it measures, in one run, against one emulator process:

* the store: the Bifrost emulator in its own process with N records built like its realistic seed (most of
  them over their pool, drifted posture), as ``bench.bifrost_scan`` builds it;
* ours: a heal pass in a fresh child process with the default ``[heal]`` table (dry-run, capped at 200 actions
  a pass and 100 a target): the read for a plan (with fingerprints), the findings, the plan, the caps, and the
  dry apply that re-reads each kept action's subject as an enforced pass would right before writing it, and its
  journal rows;
* baseline: what a pass cannot do without, bare, in a fresh child process: ``take_snapshot`` and the findings
  (what ``gatewayscope scan`` does).

Both sides get the DNS stand-in of ``bench._support`` (this machine's resolver loses ``.invalid`` lookups to
timeouts). Children: ``python -m bench.heal_pass ours|bare URL [STATE_DIR]``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any

from bench import common

NAME = "heal-pass"
MODULE = "bench.heal_pass"
SIZES = {"full": 5_000, "small": 1_000, "tiny": 100}
#: a pass re-reads up to its cap of subjects on top of the scan's one listing: a pass may cost this much more
RATIO_TARGET = 2.0


def _config(url: str) -> Any:
    from gatewayscope.config import Config, Policy, Target

    return Config(targets=[Target(name="bifrost", kind="bifrost", url=url, timeout_seconds=120.0)], policy=Policy())


def _child_ours(url: str, state_dir: str) -> dict[str, Any]:
    from bench._support import static_lookup
    from gatewayscope.heal.loop import HealLoop
    from gatewayscope.heal.settings import parse_heal_settings
    from gatewayscope.sources import bifrost

    bifrost.DEFAULT_RESOLVER.lookup = static_lookup
    loop = HealLoop(_config(url), parse_heal_settings({"state_dir": state_dir}))
    loop.prepare()
    start = time.monotonic()
    report = loop.run_pass()
    seconds = time.monotonic() - start
    if report.error:
        raise common.BenchError(f"the heal pass failed: {report.error}")
    return {"seconds": seconds, "peak_rss": common.peak_rss_bytes(), "would": len(report.would),
            "deferred": len(report.deferred), "result": report.result}


def _child_bare(url: str) -> dict[str, Any]:
    from bench._support import static_lookup
    from gatewayscope.analysis.findings import findings
    from gatewayscope.scan import take_snapshot
    from gatewayscope.sources import bifrost

    bifrost.DEFAULT_RESOLVER.lookup = static_lookup
    config = _config(url)
    start = time.monotonic()
    found = findings(take_snapshot(config), config)
    seconds = time.monotonic() - start
    return {"seconds": seconds, "peak_rss": common.peak_rss_bytes(), "records": found.records.height}


child_main = common.children(MODULE, "ours URL STATE_DIR | bare URL", [
    ("ours", _child_ours, (str, str)),
    ("bare", _child_bare, (str,)),
])


@common.register(NAME)
def heal_pass(ctx: common.BenchContext) -> common.BenchResult:
    """A dry-run heal pass (read for a plan, findings, plan, caps, re-reads, journal) vs a bare scan + findings."""
    from bench._support import run_emulator

    n_records = SIZES[ctx.size]
    runs = ctx.runs_or(5, 3, 1)
    with tempfile.TemporaryDirectory(prefix="gatewayscope-bench-heal-") as state, run_emulator(n_records) as emulator:

        def ours() -> dict[str, Any]:
            result = common.run_child(MODULE, "ours", emulator.url, state)
            if result["result"] != "ok" or not result["would"]:
                raise common.BenchError(f"the heal pass planned nothing: {result}")
            return result

        def bare() -> dict[str, Any]:
            result = common.run_child(MODULE, "bare", emulator.url)
            if result["records"] != n_records:
                raise common.BenchError(f"the scan read {result['records']} records, not {n_records}")
            return result

        bare(), ours()  # warm-up pair, not counted
        bare_runs, ours_runs = common.alternate(runs, bare, ours)
    ours_s, bare_s = common.median_seconds(ours_runs), common.median_seconds(bare_runs)
    first = ours_runs[0]
    return common.ratio_result(
        NAME, f"heal pass (dry-run), Bifrost {n_records:,} records: pass / bare scan + findings",
        ours_s, bare_s, RATIO_TARGET, peak_rss=common.peak_of(ours_runs),
        extras={
            "store": f"{n_records:,} records in the emulator (own process)",
            "pass": f"{first['would']:,} actions re-read (would write), {first['deferred']:,} deferred by the "
                    "caps (200 a pass, 100 a target)",
            "runs": common.runs_figure(runs, ours_runs, bare_runs, ms=True),
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
