"""Apply: 2,000 Bifrost pool shrinks with 50 ms of latency on every call, against the ideal.

What it measures, in one run:

* the gateway: the Bifrost emulator in its own process, with 2,000 reachable custom/standard records at
  the 1,000-worker default (and the seed's one unbuildable record), and its own ``slow`` fault armed on
  every provider and config route: each call waits 50 ms, then is answered. A fresh emulator per run;
* the plan: ``build_plan(..., only=["pool_shrink"])`` from a real scan (not timed): 2,000 actions;
* ours, in a fresh child: ``apply_plan(plan, config, options=ApplyOptions(write=True, concurrency=16),
  journal=...)``: the whole safety protocol (re-read each record, check its fingerprint, build the PUT
  from the fresh read, journal every attempt and outcome with fsync). Every action must end ``done``;
* baseline: the ideal, calls x latency / concurrency, where calls counts the reads and writes apply
  makes per action (1 GET + 1 PUT): 4,000 x 50 ms / 16 = 12.5 s. Also measured, as a figure: a bare
  client sending the same GET + PUT pairs from 16 threads (no protocol, no journal).

Children: ``python -m bench.apply_shrink plan URL OUT`` / ``ours URL PLAN JOURNAL N`` /
``bare URL PLAN N`` (used by the benchmark only).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

from bench import common

NAME = "apply-pool-shrinks"
MODULE = "bench.apply_shrink"
SIZES = {"full": 2_000, "small": 400, "tiny": 40}
LATENCY = 0.05
CONCURRENCY = 16
CALLS_PER_ACTION = 2  # the fresh read, then the write
RATIO_TARGET = 1.25


#: the emulated gateway holds about 15 GiB at the full size (2,000 records x 1,000 workers x 8 KiB of stack): a
#: memory limit with room for it, so apply's memory-headroom rule lets the resizes run CONCURRENCY at once
MEMORY_LIMIT_BYTES = 64 << 30


def _config(url: str) -> Any:
    from gatewayscope.config import Config, Policy, Target

    return Config(targets=[Target(name="bifrost", kind="bifrost", url=url, timeout_seconds=60.0,
                                  memory_limit_bytes=MEMORY_LIMIT_BYTES)], policy=Policy())


def _child_plan(url: str, out: str) -> dict[str, Any]:
    from bench._support import static_lookup
    from gatewayscope.remediate.plan import build_plan
    from gatewayscope.scan import take_snapshot
    from gatewayscope.sources import bifrost

    bifrost.DEFAULT_RESOLVER.lookup = static_lookup
    config = _config(url)
    snapshot = take_snapshot(config)
    if not snapshot.targets[0].up:
        raise common.BenchError(f"the scan failed: {snapshot.targets[0].error}")
    plan = build_plan(snapshot, config, only=["pool_shrink"])
    plan.save(out)
    return {"actions": len(plan.actions)}


def _child_ours(url: str, plan_path: str, journal_path: str, concurrency: int) -> dict[str, Any]:
    from gatewayscope.remediate.apply import ApplyOptions, apply_plan
    from gatewayscope.remediate.journal import Journal
    from gatewayscope.remediate.plan import load_plan

    plan = load_plan(plan_path)
    config = _config(url)
    start = time.monotonic()
    cpu = time.process_time()
    report = apply_plan(plan, config, options=ApplyOptions(write=True, concurrency=concurrency),
                        journal=Journal(journal_path))
    seconds = time.monotonic() - start
    return {"seconds": seconds, "cpu": time.process_time() - cpu, "peak_rss": common.peak_rss_bytes(),
            "tally": report.tally(), "sends": sum(r.sends for r in report.results),
            "shrink_concurrency": report.shrink_concurrency.get("bifrost", {}).get("concurrency")}


def _child_bare(url: str, plan_path: str, concurrency: int) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import quote

    import httpx

    with open(plan_path, encoding="utf-8") as handle:
        actions = json.load(handle)["actions"]
    client = httpx.Client(base_url=url, timeout=60.0,
                          limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency))

    def shrink(action: dict[str, Any]) -> int:
        path = "/api/providers/" + quote(action["subject"], safe="")
        record = client.get(path).json()
        body = {k: record[k] for k in ("network_config", "custom_provider_config", "send_back_raw_request",
                                       "send_back_raw_response") if record.get(k) is not None}
        body["concurrency_and_buffer_size"] = dict(action["after"])
        return client.put(path, json=body).status_code

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        statuses = list(pool.map(shrink, actions))
    seconds = time.monotonic() - start
    client.close()
    return {"seconds": seconds, "ok": sum(1 for s in statuses if s == 200), "peak_rss": common.peak_rss_bytes()}


child_main = common.children(MODULE, "plan URL OUT | ours URL PLAN JOURNAL N | bare URL PLAN N", [
    ("plan", _child_plan, (str, str)),
    ("ours", _child_ours, (str, str, str, int)),
    ("bare", _child_bare, (str, str, int)),
])


@common.register(NAME)
def apply_pool_shrinks(ctx: common.BenchContext) -> common.BenchResult:
    """apply on 2,000 pool shrinks at 50 ms a call vs calls x latency / concurrency."""
    from bench._support import run_emulator

    n_actions = SIZES[ctx.size]
    runs = ctx.runs_or(3, 3, 1)
    records = n_actions + 1  # the seed's unbuildable record is never shrunk
    ideal = n_actions * CALLS_PER_ACTION * LATENCY / CONCURRENCY
    ours_runs: list[dict[str, Any]] = []
    bare_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gatewayscope-bench-") as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        with run_emulator(records, dead_fraction=0.0, latency=LATENCY) as emulator:
            planned = common.run_child(MODULE, "plan", emulator.url, plan_path)["actions"]
        if planned != n_actions:
            raise common.BenchError(f"the plan has {planned} pool shrinks, not {n_actions}")
        for i in range(runs):
            with run_emulator(records, dead_fraction=0.0, latency=LATENCY) as emulator:
                journal = os.path.join(tmp, f"journal-{i}.jsonl")
                result = common.run_child(MODULE, "ours", emulator.url, plan_path, journal, str(CONCURRENCY))
            if result["tally"]["done"] != n_actions:
                raise common.BenchError(f"apply did not shrink every record: {result['tally']}")
            if result["shrink_concurrency"] != CONCURRENCY:  # the memory-headroom rule must not throttle here
                raise common.BenchError(f"apply resized {result['shrink_concurrency']} at a time, not {CONCURRENCY}")
            ours_runs.append(result)
            with run_emulator(records, dead_fraction=0.0, latency=LATENCY) as emulator:
                bare = common.run_child(MODULE, "bare", emulator.url, plan_path, str(CONCURRENCY))
            if bare["ok"] != n_actions:
                raise common.BenchError(f"the bare client's writes failed: {bare['ok']} of {n_actions} answered 200")
            bare_runs.append(bare)
    ours_s, bare_s = common.median_seconds(ours_runs), common.median_seconds(bare_runs)
    return common.ratio_result(
        NAME, "apply, 2,000 pool shrinks / ideal", ours_s, ideal, RATIO_TARGET, peak_rss=common.peak_of(ours_runs),
        extras={
            "ideal": f"{n_actions:,} actions x {CALLS_PER_ACTION} calls x {LATENCY * 1000:.0f} ms / {CONCURRENCY}",
            "runs": f"{runs} (ours " + "/".join(f"{r['seconds']:.2f}" for r in ours_runs) + " s)",
            "bare client (GET+PUT, no protocol)": f"{bare_s:.2f} s, {bare_s / ideal:.2f}x ideal",
            "apply CPU": f"{common.median([r['cpu'] for r in ours_runs]):.1f} s",
            "tally": ", ".join(f"{n} {k}" for k, n in ours_runs[-1]["tally"].items() if n),
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
