"""The fence's two measured facts: how close the SQLite guard's dispatch estimate is, and what ``guard run`` costs
a Python process that never builds a gateway.

* ``dispatch-estimate-0.1.0`` / ``-upstream``: the SQLite triggers cannot see when a request reached the gateway,
  so they take ``timestamp - latency_ms / 1000`` from the trace record (gatewayscope.orphan_rule.dispatched_at).
  A child serves the real gateway app (the flavour's own interpreter) with the in-process guard, which stamps
  each request's arrival, around a store that records, per trace, the estimate minus the stamp; it sends plain
  and streaming calls through a stub worker with a generation delay. The row prints the margin's percentiles:
  it must never be below 0 (an estimate earlier than the arrival could drop a new use); its p99, reported, is
  how long before a delete a straggler's request can arrive and still be kept (unsure, so kept). "ours" is the
  measuring run's wall time: the row has no baseline.
* ``guard-run-startup``: ``python -c pass`` with the hook ``guard run`` puts on ``PYTHONPATH`` (and
  ``GATEWAYSCOPE_GUARD_ATTACH=1``) against the same without it, fresh processes, alternating, medians.

Children: ``python -m bench.guard_fence estimate WORKER_URL CALLS`` (run by the flavour's interpreter).
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.guard_throughput import upstream_python

MODULE = "bench.guard_fence"
#: calls of each kind (plain, streaming) a side
CALLS = {"full": 400, "small": 150, "tiny": 20}
#: the stub worker's generation delay per call, so the latency is a real one
DELAY_SECONDS = 0.01
STARTUP_TARGET = 1.05
HOOK = Path(__file__).resolve().parent.parent / "gatewayscope" / "guard" / "_autoattach"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _child_estimate(worker_url: str, calls: int) -> dict[str, Any]:
    """Serve the guarded gateway app in this process and measure estimate minus arrival for each trace."""
    import httpx
    import uvicorn
    from rllm_model_gateway.models import GatewayConfig
    from rllm_model_gateway.store.memory_store import MemoryTraceStore

    from gatewayscope.guard.gateway import build_app
    from gatewayscope.guard.memory import REQUEST_ARRIVAL
    from gatewayscope.orphan_rule import dispatched_at_of
    from gatewayscope.sandbox.processes import free_port
    from gatewayscope.sandbox.stub_protocol import stub_headers

    margins: dict[str, list[float]] = {"plain": [], "stream": []}

    class Recorder(MemoryTraceStore):  # type: ignore[misc]
        async def store_trace(self, trace_id: str, session_id: str, data: dict[str, Any]) -> None:
            arrival, estimate = REQUEST_ARRIVAL.get(), dispatched_at_of(data)
            if arrival is not None and estimate is not None:
                margins["stream" if session_id.startswith("stream") else "plain"].append(estimate - arrival)
            await super().store_trace(trace_id, session_id, data)

    port = free_port()
    config = GatewayConfig(host="127.0.0.1", port=port, store_worker="memory",
                           workers=[{"url": worker_url, "worker_id": "0"}])
    app = build_app(config, store=Recorder())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise common.BenchError("the gateway did not start")
        time.sleep(0.05)

    async def load() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            async def one(kind: str, k: int) -> None:
                body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": f"call {k}"}],
                                        "max_tokens": 16}
                headers = stub_headers(delay=DELAY_SECONDS)
                if kind == "stream":
                    body.update(stream=True, stream_options={"include_usage": True})
                    async with client.stream("POST", f"/sessions/stream-{k}:0/v1/chat/completions", json=body,
                                             headers=headers) as resp:
                        async for _ in resp.aiter_lines():
                            pass
                else:
                    (await client.post(f"/sessions/plain-{k}:0/v1/chat/completions", json=body,
                                       headers=headers)).raise_for_status()

            for start in range(0, calls, 8):
                await asyncio.gather(*(one(kind, k) for kind in ("plain", "stream")
                                       for k in range(start, min(calls, start + 8))))
            (await client.post("/admin/flush")).raise_for_status()

    asyncio.run(load())
    time.sleep(0.5)  # the last fire-and-forget writes land
    server.should_exit = True
    thread.join(timeout=20)
    return {kind: [round(v * 1000, 4) for v in values] for kind, values in margins.items()}


child_main = common.children(MODULE, "estimate WORKER_URL CALLS", [("estimate", _child_estimate, (str, int))])


def measure_estimate(ctx: common.BenchContext, flavour: str) -> common.BenchResult:
    import json

    from gatewayscope.sandbox.processes import start_stub_worker

    name = f"dispatch-estimate-{flavour}"
    row = f"the SQLite guard's dispatch estimate minus the request's arrival (ms), {flavour}"
    python = sys.executable if flavour == "0.1.0" else upstream_python()
    if python is None:
        return common.BenchResult(name=name, row=row, error="the upstream gateway is not installed (run make upstream)")
    calls = CALLS[ctx.size]
    begin = time.monotonic()
    with start_stub_worker() as worker:
        done = subprocess.run([python, "-m", MODULE, "estimate", worker.url, str(calls)], capture_output=True,
                              text=True, timeout=900, env=common.child_env(), check=False)
    seconds = time.monotonic() - begin
    if done.returncode != 0:
        raise common.BenchError(f"{MODULE} estimate exited with {done.returncode}: {done.stderr[-1500:]}")
    margins: dict[str, list[float]] = json.loads([ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1])
    if any(len(values) < calls for values in margins.values()):
        raise common.BenchError(f"only {', '.join(f'{len(v)} {k}' for k, v in margins.items())} traces were measured")
    every = [v for values in margins.values() for v in values]
    extras = {kind: (f"p50 {_percentile(values, 0.5):.2f}, p99 {_percentile(values, 0.99):.2f}, "
                     f"max {max(values):.2f}, min {min(values):.3f}") for kind, values in margins.items()}
    extras["load"] = f"{calls} plain and {calls} streaming calls, {DELAY_SECONDS * 1000:.0f} ms at the worker each"
    return common.BenchResult(name=name, row=row, ours_seconds=seconds,
                              checks=[common.Check("min", min(every), 0.0, "ms", at_least=True)], extras=extras)


def _start(env: dict[str, str]) -> float:
    begin = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, timeout=60, check=False)
    seconds = time.monotonic() - begin
    if done.returncode != 0 or done.stderr:
        raise common.BenchError(f"python -c pass failed ({done.returncode}): {done.stderr[-500:]!r}")
    return seconds


@common.register("guard-run-startup")
def guard_run_startup(ctx: common.BenchContext) -> common.BenchResult:
    """``python -c pass`` under guard run's hook vs plain."""
    import tempfile

    runs = ctx.runs_or(41, 21, 5)
    with tempfile.TemporaryDirectory(prefix="gatewayscope-pyc-") as pycache:
        # both sides with their bytecode cached, as an installed package has it (pip compiles at install), in a
        # folder of the run's own, whatever PYTHONDONTWRITEBYTECODE the caller has
        plain_env = {k: v for k, v in os.environ.items()
                     if k not in ("PYTHONPATH", "GATEWAYSCOPE_GUARD_ATTACH", "PYTHONDONTWRITEBYTECODE")}
        plain_env["PYTHONPYCACHEPREFIX"] = pycache
        hooked_env = {**plain_env, "PYTHONPATH": str(HOOK), "GATEWAYSCOPE_GUARD_ATTACH": "1"}
        _start(plain_env), _start(hooked_env)
        ours, bare = common.alternate(runs, functools.partial(_start, hooked_env), functools.partial(_start, plain_env))
    ours_s, bare_s = common.median(ours), common.median(bare)
    return common.ratio_result(
        "guard-run-startup", "python -c pass under guard run's hook / without it", ours_s, bare_s, STARTUP_TARGET,
        extras={"runs": f"{runs} a side, medians {ours_s * 1000:.1f} ms / {bare_s * 1000:.1f} ms"})


for _flavour in ("0.1.0", "upstream"):
    common.register(f"dispatch-estimate-{_flavour}")(functools.partial(measure_estimate, flavour=_flavour))


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
