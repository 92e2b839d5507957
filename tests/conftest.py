"""Shared pytest fixtures.

Real processes on loopback (see ``gatewayscope.sandbox.processes``): every fixture picks free ports, waits
a bounded time for its process to answer, and stops everything it started at teardown, also when the test
fails.

* ``stub_worker`` (session): the stub inference worker's base URL.
* ``rllm_gateway`` (function): a factory ``rllm_gateway(store="memory" | "sqlite", *, db_path=None,
  open_store=True)`` that starts the real, unmodified ``rllm-model-gateway`` in front of the stub worker
  and returns a :class:`~gatewayscope.sandbox.processes.RllmGatewayProcess` (``.url``, ``.db_path``,
  ``.process``, ``.store``). SQLite databases go under the test's ``tmp_path`` unless ``db_path`` is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from gatewayscope.sandbox.processes import RllmGatewayProcess, start_rllm_gateway, start_stub_worker


class RllmGatewayFactory(Protocol):
    """The type of the ``rllm_gateway`` fixture."""

    def __call__(self, store: str = "memory", *, db_path: str | Path | None = None,
                 open_store: bool = True) -> RllmGatewayProcess: ...


@pytest.fixture(scope="session")
def stub_worker() -> Iterator[str]:
    """Start the stub inference worker once per test session; yields its base URL."""
    pytest.importorskip("uvicorn", reason="the stub worker needs the 'gateway' extra")
    worker = start_stub_worker()
    try:
        yield worker.url
    finally:
        worker.stop()


@pytest.fixture
def rllm_gateway(stub_worker: str, tmp_path: Path) -> Iterator[RllmGatewayFactory]:
    """A factory that starts unmodified rLLM gateways in front of the stub worker; all stopped at teardown."""
    pytest.importorskip("rllm_model_gateway", reason="needs the 'gateway' extra (rllm-model-gateway)")
    started: list[RllmGatewayProcess] = []

    def start(store: str = "memory", *, db_path: str | Path | None = None,
              open_store: bool = True) -> RllmGatewayProcess:
        if store == "sqlite" and db_path is None:
            db_path = tmp_path / f"gateway-traces-{len(started)}.db"
        gateway = start_rllm_gateway(stub_worker, store=store, db_path=db_path, open_store=open_store)
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in reversed(started):
            gateway.stop()


# -- the guarded gateway (gatewayscope.guard.gateway) -------------------------------------------------


class GuardedGatewayFactory(Protocol):
    """The type of the ``guarded_gateway`` fixture."""

    def __call__(self, store: str = "memory", *, max_tombstones: int | None = None,
                 db_path: str | Path | None = None, open_store: bool = True,
                 via_cli: bool = False) -> RllmGatewayProcess: ...


@pytest.fixture
def guarded_gateway(stub_worker: str, tmp_path: Path) -> Iterator[GuardedGatewayFactory]:
    """A factory that starts gatewayscope's guarded gateway (``python -m gatewayscope.guard.gateway``, or
    ``gatewayscope gateway`` with ``via_cli``) in front of the stub worker, with the same flags as the
    ``rllm_gateway`` fixture plus ``--max-tombstones`` (the launcher's default when None). Returns a
    :class:`~gatewayscope.sandbox.processes.RllmGatewayProcess`; everything is stopped at teardown."""
    import sys

    import httpx

    from gatewayscope.sandbox.processes import ManagedProcess, free_port, python_argv

    pytest.importorskip("rllm_model_gateway", reason="needs the 'gateway' extra (rllm-model-gateway)")
    started: list[RllmGatewayProcess] = []

    def start(store: str = "memory", *, max_tombstones: int | None = None,
              db_path: str | Path | None = None, open_store: bool = True,
              via_cli: bool = False) -> RllmGatewayProcess:
        if store == "sqlite" and db_path is None:
            db_path = tmp_path / f"guarded-traces-{len(started)}.db"
        last: RuntimeError | None = None
        for _attempt in range(3):  # a free port can be taken between picking and binding it
            port = free_port()
            flags = ["--host", "127.0.0.1", "--port", str(port), "--store", store, "--worker", stub_worker,
                     "--log-level", "warning"]
            if db_path is not None:
                flags += ["--db-path", str(db_path)]
            if max_tombstones is not None:
                flags += ["--max-tombstones", str(max_tombstones)]
            argv = ([sys.executable, "-c", "from gatewayscope.cli import run; run()", "gateway", *flags]
                    if via_cli else python_argv("gatewayscope.guard.gateway", *flags))
            proc = ManagedProcess(f"guarded-gateway-{store}", argv)
            url = f"http://127.0.0.1:{port}"
            gateway = RllmGatewayProcess(url=url, process=proc, store=store, worker_url=stub_worker,
                                         db_path=str(db_path) if db_path is not None else None)
            started.append(gateway)
            try:
                proc.wait_http(url + "/health")
                if open_store:  # see start_rllm_gateway: 0.1.0's SQLite store opens lazily, unguarded
                    httpx.get(f"{url}/sessions", params={"limit": 1}, timeout=30.0).raise_for_status()
            except (RuntimeError, httpx.HTTPError) as err:
                proc.stop()
                last = RuntimeError(f"the guarded gateway did not start ({err}):\n{proc.output()[-4000:]}")
                continue
            return gateway
        assert last is not None
        raise last

    try:
        yield start
    finally:
        for gateway in reversed(started):
            gateway.stop()
