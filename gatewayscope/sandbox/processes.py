"""Start and stop the real programs the sandbox and the tests run on loopback.

Every process is started in its own process group and stopped (SIGTERM, then SIGKILL
after a grace period) by :meth:`ManagedProcess.stop`, so nothing outlives its owner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ManagedProcess:
    """A child process with its output captured to a file, stopped as a group (the file removed then)."""

    #: how much of the output stays readable after the process is stopped
    KEPT_OUTPUT_BYTES = 4 * 1024 * 1024

    def __init__(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(tempfile.mkstemp(prefix=f"gatewayscope-{name}-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._final_output: str | None = None
        merged_env = dict(os.environ)
        if env:
            merged_env.update(env)
        self.popen = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=merged_env,
            cwd=str(cwd) if cwd else None, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        """What the process printed so far (for error messages and test failures); after :meth:`stop`, the
        last ``KEPT_OUTPUT_BYTES`` of it (the log file is gone by then)."""
        if self._final_output is not None:
            return self._final_output
        if not self._log.closed:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_http(self, url: str, *, timeout: float = 30.0, expect_status: int = 200) -> None:
        """Wait until ``url`` answers ``expect_status``; raise RuntimeError with the log if it never does."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n"
                                   f"{self.output()[-4000:]}")
            try:
                response = httpx.get(url, timeout=1.0)
                if response.status_code == expect_status:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as err:
                last = str(err)
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {url} within {timeout:.0f} s ({last}):\n"
                           f"{self.output()[-4000:]}")

    def stop(self, grace: float = 5.0) -> None:
        """Stop the whole process group; safe to call twice."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=grace)
        if not self._log.closed:
            self._log.close()
        if self._final_output is None:
            # the log file goes with the process: keep its tail for whoever asks for the output afterwards
            try:
                with open(self.log_path, "rb") as log:
                    log.seek(max(0, os.path.getsize(self.log_path) - self.KEPT_OUTPUT_BYTES))
                    self._final_output = log.read().decode(errors="replace")
            except OSError:
                self._final_output = ""
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: names the Python interpreter that runs the rLLM gateway when the caller does not pass one (for example
#: another virtual environment's ``bin/python`` with another rllm-model-gateway); unset: the one running us
GATEWAY_PYTHON_ENV = "GATEWAYSCOPE_GATEWAY_PYTHON"


def python_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -m module args...`` with ``python`` or else the interpreter running us (the venv's)."""
    return [python or sys.executable, "-m", module, *args]


def gateway_python() -> str:
    """The interpreter that runs the rLLM gateway: ``$GATEWAYSCOPE_GATEWAY_PYTHON``, else the one running us."""
    return os.environ.get(GATEWAY_PYTHON_ENV) or sys.executable


def rllm_gateway_argv(port: int, worker_url: str, *, store: str = "memory", db_path: str | None = None,
                      host: str = "127.0.0.1", python: str | None = None) -> list[str]:
    """The unmodified ``rllm-model-gateway`` launch command, run by ``python`` (default: :func:`gateway_python`)."""
    argv = python_argv("rllm_model_gateway", "--host", host, "--port", str(port), "--store", store,
                       "--worker", worker_url, "--log-level", "warning", python=python or gateway_python())
    if db_path:
        argv += ["--db-path", db_path]
    return argv


def guarded_gateway_argv(port: int, worker_url: str, *, store: str = "memory", db_path: str | None = None,
                         host: str = "127.0.0.1", max_tombstones: int | None = None,
                         python: str | None = None) -> list[str]:
    """The guarded launcher's command (``python -m gatewayscope.guard.gateway``: rLLM's app with the tombstone
    guard inside), with :func:`rllm_gateway_argv`'s flags plus ``--max-tombstones`` (its default when None)."""
    argv = python_argv("gatewayscope.guard.gateway", "--host", host, "--port", str(port), "--store", store,
                       "--worker", worker_url, "--log-level", "warning", python=python or gateway_python())
    if db_path:
        argv += ["--db-path", db_path]
    if max_tombstones is not None:
        argv += ["--max-tombstones", str(max_tombstones)]
    return argv


def stub_worker_argv(port: int, *, host: str = "127.0.0.1", model: str | None = None) -> list[str]:
    """The launch command of the stub inference worker (:mod:`gatewayscope.sandbox.stub_worker`)."""
    argv = python_argv("gatewayscope.sandbox.stub_worker", "--host", host, "--port", str(port))
    if model:
        argv += ["--model", model]
    return argv


@dataclass
class StubWorkerProcess:
    """A running stub worker: its base URL (give it to the gateway's ``--worker``) and its process."""

    url: str
    process: ManagedProcess

    def stop(self) -> None:
        """Stop the worker; safe to call twice."""
        self.process.stop()

    def __enter__(self) -> StubWorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RllmGatewayProcess:
    """A running, unmodified rLLM model gateway on loopback."""

    url: str
    process: ManagedProcess
    store: str
    worker_url: str
    db_path: str | None = None

    def stop(self) -> None:
        """Stop the gateway (it drains its pending trace writes on SIGTERM); safe to call twice."""
        self.process.stop()

    def __enter__(self) -> RllmGatewayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_on_free_port(name: str, make_argv: Callable[[int], list[str]], *, host: str = "127.0.0.1",
                       port: int | None = None, health_path: str, timeout: float, attempts: int = 3,
                       register: Callable[[ManagedProcess], None] | None = None) -> tuple[ManagedProcess, str]:
    """Start a server on ``port`` (or a free one, retrying a lost port race); wait for its health URL.

    ``register`` is given every process as soon as it is started, before the wait, so an owner that is
    interrupted meanwhile can still stop it.
    """
    tries = 1 if port is not None else max(1, attempts)
    last: RuntimeError | None = None
    for _ in range(tries):
        chosen = port if port is not None else free_port(host)
        proc = ManagedProcess(name, make_argv(chosen))
        if register is not None:
            register(proc)
        url = f"http://{host}:{chosen}"
        try:
            proc.wait_http(url + health_path, timeout=timeout)
        except RuntimeError as err:
            proc.stop()
            last = err
            continue
        return proc, url
    assert last is not None
    raise last


def start_stub_worker(*, host: str = "127.0.0.1", port: int | None = None, model: str | None = None,
                      timeout: float = 30.0) -> StubWorkerProcess:
    """Start the stub worker (on a free port unless ``port``) and wait until ``/health`` answers."""
    proc, url = start_on_free_port("stub-worker", lambda p: stub_worker_argv(p, host=host, model=model),
                                    host=host, port=port, health_path="/health", timeout=timeout)
    return StubWorkerProcess(url=url, process=proc)


def start_rllm_gateway(worker_url: str, *, store: str = "memory", db_path: str | Path | None = None,
                       host: str = "127.0.0.1", port: int | None = None, timeout: float = 30.0,
                       open_store: bool = True, python: str | None = None,
                       guarded: bool = False, max_tombstones: int | None = None, name: str | None = None,
                       register: Callable[[ManagedProcess], None] | None = None) -> RllmGatewayProcess:
    """Start the unmodified ``rllm-model-gateway`` in front of ``worker_url``; wait until ``/health`` answers.

    ``store`` is ``"memory"`` or ``"sqlite"``; SQLite needs an explicit ``db_path`` (the gateway's default
    would write to ``~/.rllm``). ``python`` is the interpreter whose ``rllm_model_gateway`` runs (default:
    ``$GATEWAYSCOPE_GATEWAY_PYTHON``, else the one running us). With ``guarded`` the gateway is gatewayscope's
    guarded launcher (:func:`guarded_gateway_argv`, ``max_tombstones`` its cap) run by that interpreter, which
    must then import gatewayscope too. ``name`` names the process (in errors and logs); ``register`` is as
    for :func:`start_on_free_port`.

    With ``open_store`` (the default) one ``GET /sessions?limit=1`` opens the store before anything else
    does: 0.1.0's SQLite store opens its connection lazily and unguarded, so concurrent first writes on a
    cold gateway open several connections that then lock each other out ("database is locked" after the
    20 s busy timeout), losing traces and deletes. Pass ``open_store=False`` to keep the gateway cold.
    """
    if store not in ("memory", "sqlite"):
        raise ValueError(f"store must be 'memory' or 'sqlite', not {store!r}")
    if store == "sqlite" and db_path is None:
        raise ValueError("a SQLite gateway needs db_path (its default is ~/.rllm/gateway_traces.db)")
    db = str(db_path) if db_path is not None else None

    def argv(p: int) -> list[str]:
        if guarded:
            return guarded_gateway_argv(p, worker_url, store=store, db_path=db, host=host,
                                        max_tombstones=max_tombstones, python=python)
        return rllm_gateway_argv(p, worker_url, store=store, db_path=db, host=host, python=python)

    proc, url = start_on_free_port(name or f"{'guarded' if guarded else 'rllm'}-gateway-{store}", argv,
                                   host=host, port=port, health_path="/health", timeout=timeout,
                                   register=register)
    if open_store:
        try:
            httpx.get(f"{url}/sessions", params={"limit": 1}, timeout=timeout).raise_for_status()
        except httpx.HTTPError as err:
            proc.stop()
            raise RuntimeError(f"the rLLM gateway at {url} could not open its {store} store ({err}):\n"
                               f"{proc.output()[-4000:]}") from err
    return RllmGatewayProcess(url=url, process=proc, store=store, worker_url=worker_url, db_path=db)
