"""Orphan session delete: ``apply`` deleting orphans from a 0.1.0 memory store while an agent keeps calling.

What it measures, in one run, against one gateway process:

* the store: the unmodified ``rllm-model-gateway`` 0.1.0 (memory store) in front of the stub worker,
  filled through its own chat route: 10,000 one-trace orphans, then 40,000 live sessions (50,000 in all);
* the chat probes: an agent's chat call through the same gateway, 10 a second, in its own process:
  ``agent`` asks the stub worker for 50 ms of generation (a short agent step; a real vLLM call takes
  longer, which only shrinks the ratio), ``instant`` for none (what is left is the gateway's own
  overhead, a few ms). Their p95 is measured idle first, with nothing else running;
* the deletes, in chunk pairs that alternate (so both sides meet the same store sizes, the per-delete cost
  falling as the store shrinks): **bare** sequential ``DELETE /sessions/{id}`` on one keep-alive
  connection, no other load; **ours** ``apply_plan`` (``--yes --allow-delete``, default options) of a
  plan built from a real scan with the chunk's ids as deleted-before (confirmed orphans), in a fresh child,
  while the probes run. Every delete is re-read first and journaled, as apply always does.

Targets: ours <= 1.5x the bare time; the agent probe's p95 during ours <= 2x its idle p95.

``GATEWAYSCOPE_BENCH_DELETE_RATE=20`` runs ours at ``apply --rate 20`` instead (the former fixed default),
for a comparison.

Children: ``python -m bench.session_delete plan URL IDS OUT`` / ``ours URL PLAN JOURNAL``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench import common

NAME = "orphan-session-delete"
MODULE = "bench.session_delete"
#: sessions in the store, orphans among them, chunk pairs (half the orphans go to each side)
SIZES = {"full": (50_000, 10_000, 5), "small": (10_000, 2_000, 2), "tiny": (300, 40, 1)}
PROBE_RATE = 10.0
AGENT_DELAY = 0.05
#: set to run ours at ``apply --rate R`` instead of the default pacing (for comparisons; not in the table)
RATE_ENV = "GATEWAYSCOPE_BENCH_DELETE_RATE"
TIME_TARGET = 1.5
P95_TARGET = 2.0


def _config(url: str) -> Any:
    from gatewayscope.config import Config, Policy, Target

    return Config(targets=[Target(name="rl", kind="rllm", url=url, timeout_seconds=600.0)], policy=Policy())


def _child_plan(url: str, ids_path: str, out: str) -> dict[str, Any]:
    from gatewayscope.remediate.plan import build_plan
    from gatewayscope.scan import take_snapshot

    with open(ids_path, encoding="utf-8") as handle:
        ids = json.load(handle)
    config = _config(url)
    snapshot = take_snapshot(config, also_sessions=ids)
    if not snapshot.targets[0].up:
        raise common.BenchError(f"the scan failed: {snapshot.targets[0].error}")
    plan = build_plan(snapshot, config, only=["session_delete"], deleted_ids=ids)
    plan.save(out)
    return {"actions": len(plan.actions), "warnings": plan.warnings}


def _child_ours(url: str, plan_path: str, journal_path: str, ids_path: str) -> dict[str, Any]:
    from gatewayscope.remediate.apply import ApplyOptions, apply_plan
    from gatewayscope.remediate.journal import Journal
    from gatewayscope.remediate.plan import load_plan

    plan = load_plan(plan_path)
    with open(ids_path, encoding="utf-8") as handle:
        deleted = json.load(handle)  # the evidence the plan confirmed them with: apply re-checks it
    rate = os.environ.get(RATE_ENV)  # a comparison run at a fixed pace (e.g. the former default, 20)
    options = ApplyOptions(write=True, allow_delete=True, rate=float(rate) if rate else None)
    start = time.monotonic()
    report = apply_plan(plan, _config(url), options=options, journal=Journal(journal_path), deleted_ids=deleted)
    seconds = time.monotonic() - start
    return {"seconds": seconds, "start": start, "end": start + seconds, "peak_rss": common.peak_rss_bytes(),
            "tally": report.tally()}


child_main = common.children(MODULE, "plan URL IDS OUT | ours URL PLAN JOURNAL IDS", [
    ("plan", _child_plan, (str, str, str)),
    ("ours", _child_ours, (str, str, str, str)),
])


async def _bare_deletes(port: int, ids: Sequence[str]) -> list[float]:
    from bench._support import _Connection

    conn = await _Connection.open(port)
    times = []
    try:
        for sid in ids:
            start = time.monotonic()
            status, body = await conn.request("DELETE", f"/sessions/{sid}")
            times.append(time.monotonic() - start)
            if status != 200 or json.loads(body).get("deleted") != 1:
                raise common.BenchError(f"DELETE /sessions/{sid} answered {status} {body[:100]!r}")
    finally:
        conn.close()
    return times


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


@common.register(NAME)
def orphan_session_delete(ctx: common.BenchContext) -> common.BenchResult:
    """apply's orphan deletes vs bare sequential DELETEs, and what an agent's chat call feels meanwhile."""
    from bench._support import count_sessions, fill_orphans_and_live, p95, run_gateway, start_probe, stop_probe

    n_sessions, n_orphans, pairs = SIZES[ctx.size]
    idle_seconds = ctx.pick(30.0, 10.0, 3.0)
    per_side = n_orphans // (2 * pairs)
    bare_times: list[float] = []
    ours_runs: list[dict[str, Any]] = []
    agent: dict[str, list[float]] = {"idle": [], "ours": []}
    instant: dict[str, list[float]] = {"idle": [], "ours": []}
    warnings: list[str] = []
    with run_gateway() as gateway, tempfile.TemporaryDirectory(prefix="gatewayscope-bench-") as tmp:
        orphan_ids, built = fill_orphans_and_live(gateway, n_orphans, n_sessions - n_orphans)
        chunks = [orphan_ids[i * per_side:(i + 1) * per_side] for i in range(2 * pairs)]

        def probes() -> tuple[Any, Any]:
            return (start_probe(gateway, rate=PROBE_RATE, delay=AGENT_DELAY, tag="agent"),
                    start_probe(gateway, rate=PROBE_RATE, delay=0.0, tag="instant"))

        def collect(started: tuple[Any, Any], into: str, window: tuple[float, float] | None) -> None:
            for probe, store in zip(started, (agent, instant), strict=True):
                calls = stop_probe(probe)
                store[into] += [dt for t0, dt in calls if window is None or window[0] <= t0 <= window[1]]

        started = probes()
        time.sleep(idle_seconds)
        collect(started, "idle", None)

        for pair in range(pairs):
            bare_ids, ours_ids = chunks[2 * pair], chunks[2 * pair + 1]
            ids_path = os.path.join(tmp, f"ids-{pair}.json")
            plan_path = os.path.join(tmp, f"plan-{pair}.json")
            with open(ids_path, "w", encoding="utf-8") as handle:
                # the evidence as a journal gives it: each id with the moment of its (earlier) delete, which came
                # after its one trace was written
                deleted_at = time.time()
                json.dump({sid: deleted_at for sid in ours_ids}, handle)
            planned = common.run_child(MODULE, "plan", gateway.url, ids_path, plan_path)
            if planned["actions"] != len(ours_ids):
                raise common.BenchError(f"the plan has {planned['actions']} deletes, not {len(ours_ids)}")
            warnings = planned["warnings"]

            def ours(pair: int = pair, plan_path: str = plan_path, n: int = len(ours_ids),
                     ids_path: str = ids_path) -> None:
                started = probes()
                time.sleep(1.0)  # the probes' first calls
                result = common.run_child(MODULE, "ours", gateway.url, plan_path,
                                          os.path.join(tmp, f"journal-{pair}"), ids_path)
                collect(started, "ours", (result["start"], result["end"]))
                if result["tally"]["done"] != n:
                    raise common.BenchError(f"apply did not delete every orphan: {result['tally']}")
                ours_runs.append(result)

            def bare(ids: list[str] = bare_ids) -> None:
                bare_times.extend(asyncio.run(_bare_deletes(gateway.port, ids)))

            for side in ((bare, ours) if pair % 2 == 0 else (ours, bare)):
                side()
        left = count_sessions(gateway)
    ours_s = sum(r["seconds"] for r in ours_runs)
    bare_s = sum(bare_times)
    agent_idle, agent_ours = p95(agent["idle"]), p95(agent["ours"])
    instant_idle, instant_ours = p95(instant["idle"]), p95(instant["ours"])
    pace = [w for w in warnings if "session(s)" in w]
    return common.ratio_result(
        NAME, "orphan delete, 10,000 paced deletes / bare sequential DELETEs", ours_s, bare_s, TIME_TARGET,
        peak_rss=common.peak_of(ours_runs),
        checks=[common.Check("agent chat p95", agent_ours / agent_idle, P95_TARGET, "x")],
        extras={
            "store": f"{n_sessions:,} sessions with {n_orphans:,} orphans, built through the chat route in "
                     f"{built:.0f} s; {2 * pairs * per_side:,} deleted ({pairs} chunk pairs of {per_side:,} a side), "
                     f"{left:,} sessions left (the probes' own included)",
            "bare DELETE": f"median {_ms(common.median(bare_times))}, max {_ms(max(bare_times))}",
            "agent chat (50 ms generation) p95": f"idle {_ms(agent_idle)}, during ours {_ms(agent_ours)} "
                                                 f"({len(agent['ours'])} calls)",
            "instant chat p95 (gateway overhead only)": f"idle {_ms(instant_idle)}, during ours {_ms(instant_ours)} "
                                                        f"= {instant_ours / instant_idle:.1f}x",
            "chunks ours/bare": " ".join(f"{r['seconds']:.1f}" for r in ours_runs) + " s / "
                                + f"{bare_s:.1f} s in all",
            "plan says": pace[0].split(": ", 1)[-1] if pace else "-",
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
