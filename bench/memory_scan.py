"""Memory-store scans through the REST API: the unguarded 0.1.0 gateway and the guarded launcher.

Two rows, each against one gateway process in front of the stub worker, filled through its own chat
route (one call = one trace; there is no other way to write a trace): first the orphans (1.5% of the
sessions, one trace each), then, 2 s later, the live sessions. The scan's ``now`` is 7,200 s (the
default idle threshold) plus 1 s after the last orphan, so exactly the orphans are idle past the
threshold and the live one-trace sessions (rollouts in their first call) are not. A memory store cannot
be cached: it is built in every run, and the build time is printed.

* ours, both rows: ``read_trace_store_http(target, Policy(), now=...)`` (OpenAPI probe, guard probe, the
  listing and the candidates' traces through ``POST /traces/query``, or what the guard serves instead: the
  candidates with their trace summaries) + ``find_orphans`` + ``trace_store_summary``, in a fresh child
  process;
* ``memory-store-scan`` (the unmodified ``rllm-model-gateway`` 0.1.0): baseline a bare ``GET /sessions``
  + ``json.loads`` and a bare ``POST /traces/query`` of the candidates (the orphans' ids) + ``json.loads``,
  in a fresh child: the floor any scan of 0.1.0 pays, since 0.1.0 returns traces only whole;
* ``memory-store-scan-guarded`` (the guarded launcher, ``python -m gatewayscope.guard.gateway --store
  memory``): baseline a bare ``GET /sessions`` + ``json.loads``, in a fresh child.

Figures are means of alternating runs (see the comment in the benchmark: the gateway's own garbage
collection makes every side's times bimodal), with the best run of each side shown as well.

Children: ``python -m bench.memory_scan ours URL NOW`` / ``bare URL [IDS_FILE]`` (used by the benchmark only).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from bench import common

NAME = "memory-store-scan"
GUARDED_NAME = "memory-store-scan-guarded"
MODULE = "bench.memory_scan"
SESSIONS = (100_000, 10_000, 600)
ORPHAN_SHARE = 0.015
IDLE = 7200.0
#: unguarded 0.1.0: scan / (bare listing + bare trace query of the candidates)
RATIO_TARGET = 1.05
#: guarded launcher: scan / bare listing
GUARDED_RATIO_TARGET = 0.2
#: a run this much slower than its side's best took a gateway GC pause (a pause outlasts a pause-free run)
PAUSED = 1.5


def _child_ours(url: str, now: float) -> dict[str, Any]:
    from gatewayscope.analysis.orphans import find_orphans, trace_store_summary
    from gatewayscope.config import Policy, Target
    from gatewayscope.sources.rllm_http import read_trace_store_http

    target = Target(name="bench", kind="rllm", url=url, timeout_seconds=600.0)
    policy = Policy()
    start = time.monotonic()
    data = read_trace_store_http(target, policy, now=now)
    orphans = find_orphans(data, policy, now)
    summary = trace_store_summary(data, orphans, now)
    seconds = time.monotonic() - start
    return {"seconds": seconds, "peak_rss": common.peak_rss_bytes(), "sessions": summary["sessions"],
            "suspected": summary["orphans"]["suspected"], "candidates": data.candidate_traces.height,
            "rss_imported": common.current_rss_bytes()}


def _child_bare(url: str, ids_file: str | None = None) -> dict[str, Any]:
    import httpx

    ids = json.loads(Path(ids_file).read_text()) if ids_file else None
    start = time.monotonic()
    traces: list[Any] = []
    with httpx.Client(timeout=600.0) as client:
        rows = json.loads(client.get(f"{url}/sessions").content)
        if ids is not None:
            traces = json.loads(client.post(f"{url}/traces/query", json={"session_ids": ids}).content)
    seconds = time.monotonic() - start
    return {"seconds": seconds, "peak_rss": common.peak_rss_bytes(), "sessions": len(rows), "traces": len(traces)}


child_main = common.children(MODULE, "ours URL NOW | bare URL [IDS_FILE]", [
    ("ours", _child_ours, (str, float)),
    ("bare", _child_bare, (str,)),
    ("bare", _child_bare, (str, str)),
])


def measure(ctx: common.BenchContext, name: str, row: str, launch: Callable[[], AbstractContextManager[Any]], *,
            query_candidates: bool, target: float) -> common.BenchResult:
    """Fill the gateway ``launch`` starts, then alternate our scan and the bare baseline against it."""
    from bench._support import fill_sessions, rollout_uid

    n_sessions = ctx.scaled(*SESSIONS, least=100)
    runs = ctx.runs_or(16, 5, 1)
    n_orphans = max(1, round(n_sessions * ORPHAN_SHARE))
    # task groups of 8 rollouts; the orphans are 1-4 stragglers of some groups (as the seed's race leaves them)
    orphan_ids = [f"{rollout_uid()}:{k % 4}" for k in range(n_orphans)]
    live_ids = [f"{rollout_uid()}:{k}" for _ in range(0, n_sessions - n_orphans, 8) for k in range(8)]
    live_ids = live_ids[:n_sessions - n_orphans]
    with launch() as gateway, tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        ids_file = Path(tmp) / "candidates.json"
        ids_file.write_text(json.dumps(orphan_ids))
        bare_args = [gateway.url, str(ids_file)] if query_candidates else [gateway.url]
        built = fill_sessions(gateway, [(sid, 1) for sid in orphan_ids])
        orphans_done = time.time()
        time.sleep(2.0)
        built += fill_sessions(gateway, [(sid, 1) for sid in live_ids])
        now = orphans_done + IDLE + 1.0

        def ours() -> dict[str, Any]:
            result = common.run_child(MODULE, "ours", gateway.url, repr(now))
            if result["sessions"] != n_sessions or result["suspected"] != n_orphans:
                raise common.BenchError(f"our scan found {result['sessions']} sessions and {result['suspected']} "
                                        f"orphans; the store holds {n_sessions} and {n_orphans}")
            return result

        def bare() -> dict[str, Any]:
            result = common.run_child(MODULE, "bare", *bare_args)
            if result["sessions"] != n_sessions or result["traces"] != (n_orphans if query_candidates else 0):
                raise common.BenchError(f"the bare reads returned {result['sessions']} sessions and {result['traces']} "
                                        f"traces, not {n_sessions} and {n_orphans if query_candidates else 0}")
            return result

        bare(), ours()  # warm-up pair (the gateway's first big listing), not counted
        summarized = None if query_candidates else _summarized(gateway.url, now)
        bare_runs, ours_runs = common.alternate(runs, bare, ours)
    # means, not medians: the gateway pauses for a generation-2 collection of its heap on about every other
    # big listing, whoever asks, and a pause can outlast a whole pause-free scan, so each side's times are
    # bimodal and a median picks a mode by luck; a mean over many alternating runs shares the pauses out
    # as they fall (the figures: docs/performance.md, "Figures behind the code"). The pause-free ratio
    # (best run of each side) and how many runs of each side took a pause are shown too.
    ours_s = statistics.fmean(r["seconds"] for r in ours_runs)
    bare_s = statistics.fmean(r["seconds"] for r in bare_runs)
    best_ours, best_bare = min(r["seconds"] for r in ours_runs), min(r["seconds"] for r in bare_runs)
    paused_ours = sum(r["seconds"] > PAUSED * best_ours for r in ours_runs)
    paused_bare = sum(r["seconds"] > PAUSED * best_bare for r in bare_runs)
    return common.ratio_result(
        name, row.format(sessions=n_sessions), ours_s, bare_s, target, peak_rss=common.peak_of(ours_runs),
        extras={
            "store": f"{n_sessions:,} sessions ({n_orphans:,} orphans), built through the gateway's chat route "
                     f"in {built:.0f} s ({n_sessions / built:,.0f} calls/s)",
            "runs": common.runs_figure(runs, ours_runs, bare_runs),
            "means of runs": f"best run ours {best_ours:.2f} s, bare {best_bare:.2f} s, "
                             f"{best_ours / best_bare:.2f}x",
            "runs with a gateway GC pause": f"ours {paused_ours}/{runs}, bare {paused_bare}/{runs}",
            "bare peak RSS": f"{common.peak_of(bare_runs) / 2**20:.0f} MB",
            "candidates read": f"{ours_runs[0]['candidates']:,}",
            **({} if summarized is None else {"candidates the launcher summarized": f"{summarized:,}"}),
        },
    )


def _summarized(url: str, now: float) -> int:
    """How many candidates the launcher serves with their trace summaries (the rest the scan reads whole)."""
    import httpx

    count = 0
    after = None
    with httpx.Client(base_url=url, timeout=600.0) as client:
        for _ in range(1000):  # bounded: pages of up to 10,000 candidates
            page = client.post("/guard/index", json={"idle_before": now - IDLE, "after": after,
                                                     "summaries": True}).json()
            count += sum("summaries" in candidate for candidate in page["candidates"])
            after = page["next"]
            if after is None:
                break
    return count


@common.register(NAME)
def memory_store_scan(ctx: common.BenchContext) -> common.BenchResult:
    """Our REST scan of the unguarded 0.1.0 gateway vs its floor: the bare listing + the candidates' traces."""
    from bench._support import run_gateway

    return measure(ctx, NAME, "{sessions:,}-session memory store, unguarded 0.1.0: scan / (bare listing + "
                   "bare trace query of the candidates)", run_gateway, query_candidates=True, target=RATIO_TARGET)


@common.register(GUARDED_NAME)
def memory_store_scan_guarded(ctx: common.BenchContext) -> common.BenchResult:
    """Our REST scan of a memory store behind the guarded launcher vs a bare GET /sessions + parse."""
    from bench._support import run_guarded_gateway

    return measure(ctx, GUARDED_NAME, "{sessions:,}-session memory store via the guarded launcher: scan / bare "
                   "GET /sessions + parse", run_guarded_gateway, query_candidates=False,
                   target=GUARDED_RATIO_TARGET)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
