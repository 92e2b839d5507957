"""Fixtures shared by the HTTP benchmarks: a Bifrost emulator in its own process, a real rLLM gateway
filled through its own HTTP API, a chat-latency probe, and a DNS stand-in.

Everything here runs real processes on loopback and caches nothing: a memory store lives and dies with
its gateway, an emulator with its process. The module is private (``discover`` skips ``_`` names);
its children run as ``python -m bench._support emulator ...`` and ``python -m bench._support probe ...``.

Why a DNS stand-in: this machine's resolver drops a share of the lookups of ``.invalid`` names and each
such lookup takes its full 5 s timeout, so the Bifrost benchmarks would measure the network's luck. A
scan is given :func:`static_lookup` (``.invalid`` never resolves, everything else does: what a working
resolver answers at once), and the emulator :func:`emulator_resolver`. Both sides of every ratio run
without real DNS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import BenchError, child_command, child_env

MODULE = "bench._support"


# -- DNS --------------------------------------------------------------------------------------------

def static_lookup(host: str) -> None:
    """A resolver that answers at once: names under ``.invalid`` do not exist, every other name does."""
    if host.rstrip(".").endswith(".invalid"):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def emulator_resolver(host: str) -> list[str]:
    """The emulator's base-URL check, without the network: ``.invalid`` has no address, the rest is loopback."""
    return [] if host.rstrip(".").endswith(".invalid") else ["127.0.0.1"]


# -- processes --------------------------------------------------------------------------------------

def wait_http(url: str, proc: Any, *, timeout: float = 60.0) -> None:
    """Wait until ``url`` answers 200 (raise BenchError with the process's exit when it dies first)."""
    import httpx

    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{url}: the process exited with {proc.returncode} before answering")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError as err:
            last = str(err)
        time.sleep(0.05)
    raise BenchError(f"{url} did not answer within {timeout:.0f} s ({last})")


class Child:
    """A helper process (an emulator, a gateway, a probe) in its own process group, stopped on exit."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        import subprocess
        import tempfile

        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env or child_env(), start_new_session=True)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def poll(self) -> int | None:
        return self.proc.poll()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except Exception:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=grace)
        self._log.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the Bifrost emulator ---------------------------------------------------------------------------

def bifrost_records(count: int, *, dead_fraction: float = 0.15, rng_seed: int = 4574) -> list[Any]:
    """``count`` provider records shaped like the realistic seed (org-scoped custom records, Anthropic
    lanes, dead base URLs under ``.invalid``, the 1,000-worker default), built like the seed module does."""
    from gatewayscope.sandbox.bifrost_emulator import realistic_records

    orgs = max(1, count // 12)
    while True:
        records = realistic_records(orgs=orgs, connectors=6, models=5, dead_fraction=dead_fraction,
                                    rng_seed=rng_seed)
        if len(records) >= count:
            # keep the unbuildable record (the seed's last) among them
            return [*records[:count - 1], records[-1]]
        orgs = orgs * 2


@dataclass
class Emulator:
    url: str
    child: Child
    records: int


@contextlib.contextmanager
def run_emulator(records: int, *, dead_fraction: float = 0.15, latency: float = 0.0) -> Iterator[Emulator]:
    """The Bifrost emulator in its own process with ``records`` records (and ``latency`` s on every
    provider and config call, through its own ``slow`` fault)."""
    from gatewayscope.sandbox.processes import free_port

    port = free_port()
    argv = child_command(MODULE, "emulator", str(port), str(records), repr(dead_fraction), repr(latency))
    with Child(argv) as child:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/health", child, timeout=120.0)
        except BenchError as err:
            raise BenchError(f"{err}\n{child.output()[-2000:]}") from None
        yield Emulator(url=url, child=child, records=records)


def _child_emulator(port: int, records: int, dead_fraction: float, latency: float) -> None:
    from gatewayscope.sandbox.bifrost_emulator import ANY, BifrostEmulator, EmulatorOptions
    from gatewayscope.sandbox.bifrost_emulator import server as emulator_server
    from gatewayscope.sandbox.bifrost_emulator.seed import drifted_config

    # Bifrost is a Go server, and Go sets TCP_NODELAY on every connection, so the emulator must too, or the
    # benchmark measures Nagle's algorithm: the stdlib handler writes the headers and the body in two
    # segments, and on a keep-alive connection each answer would wait for the client's delayed ACK, a cost
    # every client that reuses its connection (ours does, as any HTTP client) would pay and Bifrost never
    # charges (docs/performance.md, "Figures behind the code").
    emulator_server._Handler.disable_nagle_algorithm = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    emulator = BifrostEmulator(port=port, options=EmulatorOptions(resolver=emulator_resolver,
                                                                   request_log_limit=1000))
    emulator.load(bifrost_records(records, dead_fraction=dead_fraction), drifted_config())
    if latency > 0:  # the emulator's own fault: wait, then answer (every provider, keys and config route)
        emulator.inject_slow(ANY, ANY, delay=latency, times=None)
    emulator.start()
    parent = os.getppid()
    try:
        while not stop.wait(0.5):
            if os.getppid() != parent:
                break
    finally:
        emulator.stop()


# -- the rLLM gateway --------------------------------------------------------------------------------

@dataclass
class Gateway:
    url: str
    port: int
    gateway: Any
    worker: Any


@contextlib.contextmanager
def run_gateway() -> Iterator[Gateway]:
    """The unmodified ``rllm-model-gateway`` (memory store) in front of the stub worker, both on loopback."""
    from gatewayscope.sandbox.processes import start_rllm_gateway, start_stub_worker

    with start_stub_worker() as worker, start_rllm_gateway(worker.url) as gateway:
        yield Gateway(url=gateway.url, port=int(gateway.url.rsplit(":", 1)[1]), gateway=gateway, worker=worker)


def guarded_gateway_argv(port: int, worker_url: str, *, store: str = "memory", db_path: str | None = None,
                        python: str | None = None) -> list[str]:
    """The guarded launcher (``python -m gatewayscope.guard.gateway``) with the gateway's own flags, run by
    ``python`` (default: the interpreter that runs the rLLM gateway, ``$GATEWAYSCOPE_GATEWAY_PYTHON``)."""
    from gatewayscope.sandbox.processes import gateway_python, python_argv

    argv = python_argv("gatewayscope.guard.gateway", "--host", "127.0.0.1", "--port", str(port), "--store", store,
                       "--worker", worker_url, "--log-level", "warning", python=python or gateway_python())
    return argv + (["--db-path", db_path] if db_path else [])


@contextlib.contextmanager
def start_guarded_gateway(worker_url: str, *, store: str = "memory", db_path: str | None = None,
                          python: str | None = None) -> Iterator[Gateway]:
    """The guarded launcher in front of ``worker_url`` (its store opened before anything else writes)."""
    import httpx

    from gatewayscope.sandbox.processes import start_on_free_port

    proc, url = start_on_free_port(
        "guarded-gateway", lambda p: guarded_gateway_argv(p, worker_url, store=store, db_path=db_path, python=python),
        health_path="/health", timeout=60.0)
    try:
        httpx.get(f"{url}/sessions", params={"limit": 1}, timeout=60.0).raise_for_status()
        yield Gateway(url=url, port=int(url.rsplit(":", 1)[1]), gateway=proc, worker=None)
    finally:
        proc.stop()


@contextlib.contextmanager
def run_guarded_gateway() -> Iterator[Gateway]:
    """The guarded launcher (memory store) in front of the stub worker, both on loopback."""
    from gatewayscope.sandbox.processes import start_stub_worker

    with start_stub_worker() as worker, start_guarded_gateway(worker.url) as gateway:
        yield gateway


def rollout_uid() -> str:
    """An rLLM-style task uuid (the task's rollouts are ``f"{uid}:{idx}"``)."""
    return str(uuid.uuid4())


_WORDS = ("the", "agent", "reads", "a", "file", "and", "then", "calls", "tool", "with", "result", "so",
          "answer", "is", "done", "step", "next", "plan", "check", "value", "output", "input")


def _chat_body(words: int, seed: int) -> bytes:
    text = " ".join(_WORDS[(seed + i * 7) % len(_WORDS)] for i in range(words))
    return json.dumps({"model": "gatewayscope-stub", "max_tokens": 8,
                       "messages": [{"role": "system", "content": "You are a helpful agent."},
                                    {"role": "user", "content": text}]}).encode()


class _Connection:
    """One keep-alive HTTP/1.1 connection for a client that must cost less than the gateway it feeds."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> _Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def request(self, method: str, path: str, body: bytes = b"", headers: str = "") -> tuple[int, bytes]:
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{headers}\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError(f"{method} {path}: the gateway closed the connection")
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"transfer-encoding":
                raise ConnectionError("chunked answers are not expected here")
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def _fill(port: int, calls: list[tuple[str, int]], connections: int) -> None:
    queue = list(reversed(calls))

    async def worker() -> None:
        conn = await _Connection.open(port)
        try:
            while queue:
                sid, seed = queue.pop()
                status, body = await conn.request("POST", f"/sessions/{sid}/v1/chat/completions",
                                                  _chat_body(12 + seed % 24, seed))
                if status != 200:
                    raise BenchError(f"a chat call for {sid} answered {status}: {body[:200]!r}")
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(connections)))


def fill_sessions(gateway: Gateway, sessions: Sequence[tuple[str, int]], *, connections: int = 4) -> float:
    """Create every ``(session_id, calls)`` through the gateway's own chat route (one trace per call,
    calls of one session in order); return the seconds it took. Four connections is what the 0.1.0
    gateway serves fastest on two cores (its proxy's connection pool gets slower with more)."""
    rounds: list[list[tuple[str, int]]] = []
    for index, (sid, calls) in enumerate(sessions):
        for k in range(calls):
            while len(rounds) <= k:
                rounds.append([])
            rounds[k].append((sid, index + k))
    started = time.monotonic()
    for batch in rounds:  # the k-th call of every session after all (k-1)-th ones: traces stay in order
        asyncio.run(_fill(gateway.port, batch, connections))
    return time.monotonic() - started


def count_sessions(gateway: Gateway) -> int:
    import httpx

    body = httpx.get(f"{gateway.url}/sessions", timeout=600.0).json()
    return len(body)


# -- the chat probe -----------------------------------------------------------------------------------

def fill_orphans_and_live(gateway: Gateway, n_orphans: int, n_live: int, *,
                          live_calls: int = 1) -> tuple[list[str], float]:
    """Fill ``gateway`` through its chat route with ``n_orphans`` one-trace orphans (rollouts 0-3 of tasks of their
    own, as stragglers are left), then ``n_live`` live sessions of ``live_calls`` traces each (rollouts 0-7);
    return the orphans' ids and the seconds it took."""
    orphans = [f"{rollout_uid()}:{k % 4}" for k in range(n_orphans)]
    live = [f"{rollout_uid()}:{k % 8}" for k in range(n_live)]
    built = fill_sessions(gateway, [(sid, 1) for sid in orphans])
    built += fill_sessions(gateway, [(sid, live_calls) for sid in live])
    return orphans, built


def start_probe(gateway: Gateway, *, rate: float, delay: float, tag: str) -> Child:
    """A child that sends one chat call ``rate`` times a second through the gateway (``delay`` s of
    generation at the stub worker) until SIGTERM, then prints every call's (start, seconds)."""
    return Child(child_command(MODULE, "probe", str(gateway.port), repr(rate), repr(delay), tag))


def stop_probe(probe: Child) -> list[tuple[float, float]]:
    """Stop a probe and return its calls as (monotonic start, latency seconds)."""
    if probe.poll() is None:
        os.killpg(probe.pid, signal.SIGTERM)
    try:
        probe.proc.wait(timeout=60.0)
    except Exception:
        raise BenchError("the chat probe did not stop within 60 s") from None
    lines = [line for line in probe.output().splitlines() if line.startswith("{")]
    if probe.returncode != 0 or not lines:
        raise BenchError(f"the chat probe failed (exit {probe.returncode}): {probe.output()[-2000:]}")
    probe.stop()
    return [(float(t0), float(dt)) for t0, dt in json.loads(lines[-1])["calls"]]


async def _probe(port: int, rate: float, delay: float, tag: str, stopping: list[bool]) -> list[list[float]]:
    from gatewayscope.sandbox.stub_protocol import stub_headers

    calls: list[list[float]] = []
    interval = 1.0 / rate
    headers = "".join(f"{name}: {value}\r\n" for name, value in stub_headers(delay=delay).items()) if delay > 0 else ""
    conn = await _Connection.open(port)
    parent = os.getppid()
    try:
        next_at = time.monotonic()
        for k in range(10_000_000):
            if stopping or os.getppid() != parent:
                break
            sid = f"probe-{tag}-{k // 4}:0"  # an agent's session: a few calls each
            body = _chat_body(20, k)
            start = time.monotonic()
            status, _ = await conn.request("POST", f"/sessions/{sid}/v1/chat/completions", body, headers)
            elapsed = time.monotonic() - start
            if status != 200:
                raise BenchError(f"a probe call answered {status}")
            calls.append([round(start, 6), round(elapsed, 6)])
            if k == 0:
                print("ready", flush=True)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        conn.close()
    return calls


def _child_probe(port: int, rate: float, delay: float, tag: str) -> dict[str, Any]:
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    return {"calls": asyncio.run(_probe(port, rate, delay, tag, stopping))}


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (inclusive method; the largest value for fewer than 20)."""
    if not values:
        raise ValueError("p95 of nothing")
    if len(values) < 20:
        return max(values)
    return float(statistics.quantiles(values, n=20, method="inclusive")[-1])


def child_main(argv: Sequence[str]) -> int:
    if len(argv) == 5 and argv[0] == "emulator":
        _child_emulator(int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4]))
    elif len(argv) == 5 and argv[0] == "probe":
        print(json.dumps(_child_probe(int(argv[1]), float(argv[2]), float(argv[3]), argv[4])), flush=True)
    else:
        print("usage: python -m bench._support emulator PORT RECORDS DEAD_FRACTION LATENCY | "
              "probe PORT RATE DELAY TAG", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
