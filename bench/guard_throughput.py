"""The guard's cost in the gateway's hot path: chat throughput and p95 latency, guarded vs plain.

Four rows, one per guard and gateway: the guarded launcher (``python -m gatewayscope.guard.gateway
--store memory``) against the plain ``rllm-model-gateway --store memory``, and a SQLite gateway whose file
has the guard's triggers (``gatewayscope guard install``'s function, run while it serves) against a plain
SQLite gateway, each on rLLM 0.1.0 (this environment) and on upstream main (``.venv-upstream``, the
interpreter ``GATEWAYSCOPE_GATEWAY_PYTHON`` would name; the row is an ERROR naming ``make upstream`` when
it is not installed).

Both gateways of a row run at once, in front of one stub worker (``gatewayscope.sandbox.stub_worker``, no
generation delay: the gateway's own cost is all there is to measure), and are loaded at once: each round,
two load children, one a gateway, send chat calls (``POST /sessions/{sid}/v1/chat/completions``, four
calls per session, as an agent makes them) at a fixed concurrency over keep-alive connections through the
same time window, and count the calls answered within it. The two sides share the machine's cores for
the whole window, so a gateway that spends more per call answers fewer calls, and whatever else the
machine does in that window falls on both sides alike (run one after the other, two identical runs of
this load differed by more than a third on this 2-core machine, ten times the effect to measure).
Throughput is a side's calls over all rounds' windows; p95 over all its calls. A warm-up window on both
comes first and is not counted.

Children: ``python -m bench.guard_throughput load PORT CONCURRENCY TAG START SECONDS`` (used by the benchmark
only; START is a ``time.monotonic()`` stamp, system-wide on Linux).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, BenchContext, BenchError, BenchResult, Check, children, register, run_child

MODULE = "bench.guard_throughput"
#: seconds of a measured window, seconds of the warm-up window, connections a side
SIZES = {"full": (8.0, 2.0, 8), "small": (3.0, 1.0, 8), "tiny": (0.5, 0.3, 4)}
#: the parent's lead before a window opens: both children have started by then
START_LEAD = 3.0
THROUGHPUT_TARGET = 0.97
P95_TARGET = 1.15
UPSTREAM_VENV = REPO_ROOT / ".venv-upstream"


def upstream_python() -> str | None:
    """The upstream gateway's interpreter, when ``make upstream`` installed it."""
    python = UPSTREAM_VENV / "bin" / "python"
    return str(python) if (UPSTREAM_VENV / ".installed").exists() and python.exists() else None


# -- the load child ---------------------------------------------------------------------------------

async def _load(port: int, concurrency: int, tag: str, start: float, seconds: float) -> dict[str, Any]:
    """Chat calls from ``start`` to ``start + seconds``: the latencies of those answered within the window."""
    from bench._support import _chat_body, _Connection

    conns = [await _Connection.open(port) for _ in range(concurrency)]
    if time.monotonic() > start:
        raise BenchError(f"the load child for port {port} was ready after its window opened")
    await asyncio.sleep(start - time.monotonic())
    end = start + seconds
    latencies: list[float] = []
    counter = itertools.count()

    async def worker(conn: Any) -> None:
        # bounded: no call starts after the window closes; one in flight then is not counted
        while time.monotonic() < end:
            k = next(counter)
            body = _chat_body(20, k)
            begun = time.monotonic()
            status, _ = await conn.request("POST", f"/sessions/tp-{tag}-{k // 4}:0/v1/chat/completions", body)
            done = time.monotonic()
            if status != 200:
                raise BenchError(f"a chat call answered {status}")
            if done <= end:
                latencies.append(done - begun)

    try:
        await asyncio.gather(*(worker(conn) for conn in conns))
    finally:
        for conn in conns:
            conn.close()
    return {"seconds": seconds, "latencies": [round(value, 6) for value in latencies]}


def _child_load(port: int, concurrency: int, tag: str, start: float, seconds: float) -> dict[str, Any]:
    return asyncio.run(_load(port, concurrency, tag, start, seconds))


child_main = children(MODULE, "load PORT CONCURRENCY TAG START SECONDS",
                      [("load", _child_load, (int, int, str, float, float))])


# -- the gateways -----------------------------------------------------------------------------------

@contextlib.contextmanager
def gateway_pair(kind: str, python: str) -> Iterator[tuple[int, int]]:
    """(plain port, guarded port): both gateways of ``kind`` run by ``python``, one stub worker behind them."""
    from bench._support import start_guarded_gateway
    from gatewayscope.guard.sqlite import install
    from gatewayscope.sandbox.processes import start_rllm_gateway, start_stub_worker

    with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmp, start_stub_worker() as worker:
        if kind == "memory":
            with start_rllm_gateway(worker.url, python=python) as plain, \
                    start_guarded_gateway(worker.url, python=python) as guarded:
                yield _port(plain.url), guarded.port
        else:
            plain_db, guarded_db = Path(tmp) / "plain.db", Path(tmp) / "guarded.db"
            with start_rllm_gateway(worker.url, store="sqlite", db_path=plain_db, python=python) as plain, \
                    start_rllm_gateway(worker.url, store="sqlite", db_path=guarded_db, python=python) as guarded:
                install(guarded_db)  # while it serves, as a user installs it
                yield _port(plain.url), _port(guarded.url)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def p95(values: Sequence[float]) -> float:
    from bench._support import p95 as percentile

    return percentile(values)


def measure(ctx: BenchContext, kind: str, flavour: str) -> BenchResult:
    name = f"guard-chat-{kind}-{flavour}"
    row = (f"chat throughput, guarded / plain gateway: "
           f"{'memory launcher' if kind == 'memory' else 'SQLite triggers'}, {flavour}")
    python = sys.executable if flavour == "0.1.0" else upstream_python()
    if python is None:
        return BenchResult(name=name, row=row, error=f"the upstream gateway is not installed in {UPSTREAM_VENV} "
                                                      "(run make upstream)")
    window, warm, concurrency = SIZES[ctx.size]
    rounds = ctx.runs_or(5, 3, 1)
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "guarded": []}
    with gateway_pair(kind, python) as (plain_port, guarded_port):
        ports = {"plain": plain_port, "guarded": guarded_port}
        together(ports, concurrency, "warm", warm)
        for i in range(rounds):
            for side, result in together(ports, concurrency, str(i), window).items():
                runs[side].append(result)
    seconds = {side: sum(r["seconds"] for r in runs[side]) for side in runs}
    latencies = {side: [x for r in runs[side] for x in r["latencies"]] for side in runs}
    if any(not latencies[side] for side in runs):
        raise BenchError("a side answered no call within its windows")
    throughput = {side: len(latencies[side]) / seconds[side] for side in runs}
    tail = {side: p95(latencies[side]) for side in runs}
    per_round = [len(guarded["latencies"]) / max(len(plain["latencies"]), 1)
                 for guarded, plain in zip(runs["guarded"], runs["plain"], strict=True)]
    return BenchResult(
        name=name, row=row,
        # a side's seconds for the plain side's number of calls: the throughput ratio as a time ratio
        ours_seconds=len(latencies["plain"]) / throughput["guarded"] / rounds,
        baseline_seconds=len(latencies["plain"]) / throughput["plain"] / rounds,
        checks=[Check("throughput", throughput["guarded"] / throughput["plain"], THROUGHPUT_TARGET, "x",
                      at_least=True),
                Check("p95", tail["guarded"] / tail["plain"], P95_TARGET, "x")],
        extras={"calls/s": f"guarded {throughput['guarded']:,.0f}, plain {throughput['plain']:,.0f}",
                "p95": f"guarded {tail['guarded'] * 1000:.1f} ms, plain {tail['plain'] * 1000:.1f} ms",
                "load": f"{rounds} windows of {window:g} s, both sides at once, {concurrency} connections a side "
                        f"(warm-up {warm:g} s)",
                "rounds (guarded / plain calls)": "/".join(f"{ratio:.2f}" for ratio in per_round)},
    )


def together(ports: dict[str, int], concurrency: int, tag: str, seconds: float) -> dict[str, dict[str, Any]]:
    """One window of load on every side at once: each side's load child's result."""
    start = time.monotonic() + START_LEAD
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(ports)) as pool:
        futures = {side: pool.submit(run_child, MODULE, "load", str(port), str(concurrency),
                                     f"{side}-{tag}-{os.getpid()}", repr(start), repr(seconds))
                   for side, port in ports.items()}
        return {side: future.result() for side, future in futures.items()}


# one row per guard and gateway, in the table's order: the launcher and the triggers on 0.1.0, then on upstream
for _flavour in ("0.1.0", "upstream"):
    for _kind in ("memory", "sqlite"):
        register(f"guard-chat-{_kind}-{_flavour}")(functools.partial(measure, kind=_kind, flavour=_flavour))


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
