"""The guard's cost in the gateway's hot path: chat throughput and p95 latency, guarded vs plain.

Four rows, one per guard and gateway: the guarded launcher (``python -m gatewayscope.guard.gateway
--store memory``) against the plain ``rllm-model-gateway --store memory``, and a SQLite gateway whose file
has the guard's triggers (``gatewayscope guard install``'s function, run while it serves) against a plain
SQLite gateway, each on rLLM 0.1.0 (this environment) and on upstream main (``.venv-upstream``, the
interpreter ``GATEWAYSCOPE_GATEWAY_PYTHON`` would name; the row is an ERROR naming ``make upstream`` when
it is not installed).

Both gateways of a row run at once, in front of one stub worker (``gatewayscope.sandbox.stub_worker``, no
generation delay: the gateway's own cost is all there is to measure). A load child sends a fixed number
of chat calls (``POST /sessions/{sid}/v1/chat/completions``, four calls per session, as an agent makes
them) at a fixed concurrency over keep-alive connections and records every call's latency. After a
warm-up load on each gateway (not counted), runs alternate plain and guarded, switching which goes first
each round, so drift of the machine falls on both sides alike. Throughput is calls over seconds of all
runs of a side; p95 over all calls of a side.

Children: ``python -m bench.guard_throughput load PORT CALLS CONCURRENCY TAG`` (used by the benchmark only).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, BenchContext, BenchError, BenchResult, Check, children, register, run_child

MODULE = "bench.guard_throughput"
#: calls per run, warm-up calls, connections
SIZES = {"full": (2000, 300, 8), "small": (600, 100, 8), "tiny": (40, 10, 4)}
THROUGHPUT_TARGET = 0.97
P95_TARGET = 1.15
UPSTREAM_VENV = REPO_ROOT / ".venv-upstream"


def upstream_python() -> str | None:
    """The upstream gateway's interpreter, when ``make upstream`` installed it."""
    python = UPSTREAM_VENV / "bin" / "python"
    return str(python) if (UPSTREAM_VENV / ".installed").exists() and python.exists() else None


# -- the load child ---------------------------------------------------------------------------------

async def _load(port: int, calls: int, concurrency: int, tag: str) -> tuple[float, list[float]]:
    from bench._support import _chat_body, _Connection

    latencies: list[float] = []
    counter = iter(range(calls))

    async def worker() -> None:
        conn = await _Connection.open(port)
        try:
            for k in counter:  # bounded: the shared iterator hands out each of the calls once
                body = _chat_body(20, k)
                start = time.monotonic()
                status, _ = await conn.request("POST", f"/sessions/tp-{tag}-{k // 4}:0/v1/chat/completions", body)
                latencies.append(time.monotonic() - start)
                if status != 200:
                    raise BenchError(f"a chat call answered {status}")
        finally:
            conn.close()

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - start, latencies


def _child_load(port: int, calls: int, concurrency: int, tag: str) -> dict[str, Any]:
    seconds, latencies = asyncio.run(_load(port, calls, concurrency, tag))
    return {"seconds": seconds, "latencies": [round(value, 6) for value in latencies]}


child_main = children(MODULE, "load PORT CALLS CONCURRENCY TAG", [("load", _child_load, (int, int, int, str))])


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
    calls, warm, concurrency = SIZES[ctx.size]
    rounds = ctx.runs_or(5, 3, 1)
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "guarded": []}
    with gateway_pair(kind, python) as (plain_port, guarded_port):
        ports = {"plain": plain_port, "guarded": guarded_port}
        for side in ports:
            run_child(MODULE, "load", str(ports[side]), str(warm), str(concurrency), f"warm-{side}-{os.getpid()}")
        for i in range(rounds):
            for side in (("plain", "guarded") if i % 2 == 0 else ("guarded", "plain")):
                runs[side].append(run_child(MODULE, "load", str(ports[side]), str(calls), str(concurrency),
                                            f"{side}-{i}-{os.getpid()}"))
    seconds = {side: sum(r["seconds"] for r in runs[side]) for side in runs}
    latencies = {side: [x for r in runs[side] for x in r["latencies"]] for side in runs}
    if any(len(latencies[side]) != rounds * calls for side in runs):
        raise BenchError("a load run lost calls")
    throughput = {side: len(latencies[side]) / seconds[side] for side in runs}
    tail = {side: p95(latencies[side]) for side in runs}
    return BenchResult(
        name=name, row=row,
        ours_seconds=seconds["guarded"] / rounds, baseline_seconds=seconds["plain"] / rounds,
        checks=[Check("throughput", throughput["guarded"] / throughput["plain"], THROUGHPUT_TARGET, "x",
                      at_least=True),
                Check("p95", tail["guarded"] / tail["plain"], P95_TARGET, "x")],
        extras={"calls/s": f"guarded {throughput['guarded']:,.0f}, plain {throughput['plain']:,.0f}",
                "p95": f"guarded {tail['guarded'] * 1000:.1f} ms, plain {tail['plain'] * 1000:.1f} ms",
                "load": f"{rounds} x {calls} calls a side at concurrency {concurrency} (warm-up {warm})",
                "runs (s)": "guarded " + "/".join(f"{r['seconds']:.2f}" for r in runs["guarded"])
                            + ", plain " + "/".join(f"{r['seconds']:.2f}" for r in runs["plain"])},
    )


# one row per guard and gateway, in the table's order: the launcher and the triggers on 0.1.0, then on upstream
for _flavour in ("0.1.0", "upstream"):
    for _kind in ("memory", "sqlite"):
        register(f"guard-chat-{_kind}-{_flavour}")(functools.partial(measure, kind=_kind, flavour=_flavour))


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
