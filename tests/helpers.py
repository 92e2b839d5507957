"""Helpers shared by the tests: bounded polling and the gateway's own view for the tests that drive real
processes, and the targets of hand-made snapshots.

Import as ``from tests.helpers import wait_for`` (pytest puts the project root on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from gatewayscope.config import AuthConfig, Config, Policy, Target
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator
from gatewayscope.sandbox.processes import ManagedProcess, start_on_free_port
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    REACHABILITY_SCHEMA,
    RECORDS_SCHEMA,
    SESSIONS_SCHEMA,
    BifrostData,
    TargetSnapshot,
    TraceStoreData,
    frame_from_rows,
)

#: the two rLLM gateway flavours the tests run on (the ``gateway_flavor`` fixtures)
PYPI = "pypi-0.1.0"
UPSTREAM = "upstream-main"
#: the fixed "now" of the tests that build snapshots by hand (2025-06-15 15:06:40 UTC)
NOW = 1_750_000_000.0
#: the repository, its docs and its README
ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], done: Callable[[T], bool], *, timeout: float = 20.0,
             interval: float = 0.05) -> T:
    """Poll ``probe`` until ``done(value)``; fail the test with the last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: still {value!r} after {timeout:.0f} s")
        time.sleep(interval)


def run_at_once(calls: Sequence[Callable[[], T]], *, timeout: float = 120.0) -> list[T | None]:
    """Each of ``calls`` in a thread of its own, all released at the same moment (a barrier); their results in
    order, None for one that raised or did not return within ``timeout`` seconds."""
    barrier = threading.Barrier(len(calls))
    results: list[T | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return results


def ci_program(name: str, package: str, ci_note: str) -> str:
    """The path of the program ``name`` (Debian's ``package``); where it is missing the test is skipped, except
    under CI (the ``CI`` variable set), where it fails, ``ci_note`` saying how CI installs it."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not on PATH, and CI must run these tests: install Debian's '{package}' package "
                    f"({ci_note})")
    pytest.skip(f"{name} is not installed (Debian: apt-get install {package}); CI runs these tests")


def gateway_sessions(url: str) -> dict[str, int]:
    """Session id -> trace count, as the rLLM gateway at ``url`` lists them."""
    return {row["session_id"]: row["trace_count"] for row in httpx.get(f"{url}/sessions", timeout=10).json()}


def guard_status(url: str) -> dict[str, Any]:
    """The guarded launcher's ``GET /guard/status``."""
    response = httpx.get(f"{url}/guard/status", timeout=10)
    response.raise_for_status()
    return dict(response.json())


def start_server(name: str, make_argv: Callable[[int], list[str]], health_path: str,
                 *, timeout: float = 60.0) -> tuple[ManagedProcess, str]:
    """Start a server on a free loopback port (retrying a lost port race) and wait for ``health_path``."""
    try:
        return start_on_free_port(name, make_argv, health_path=health_path, timeout=timeout)
    except RuntimeError as err:
        pytest.fail(f"{name} did not start: {err}")


# -- SQLite trace stores written by the gateway's own store class -------------------------------------------

def write_store(path: Path, sessions: dict[str, int], *, start: int = 0, sent_before: float = 0.0) -> None:
    """Write ``sessions`` (id -> traces) through the gateway's own SqliteTraceStore. ``sent_before``: the calls
    were dispatched that many seconds before their traces are written (their records' ``latency_ms``), as a
    straggler's was: before the delete it lands after."""
    rllm_sqlite = pytest.importorskip("rllm_model_gateway.store.sqlite_store", reason="needs rllm-model-gateway")

    async def go() -> None:
        store = rllm_sqlite.SqliteTraceStore(db_path=str(path))
        for sid, count in sessions.items():
            for i in range(start, start + count):
                data = {"trace_id": f"{sid}/{i}", "session_id": sid, "messages": [{"role": "user", "content": "x"}],
                        "prompt_token_ids": list(range(20)), "model": "stub", "timestamp": time.time(),
                        "latency_ms": sent_before * 1000.0}
                await store.store_trace(f"{sid}/{i}", sid, data)
        await store.close()

    asyncio.run(go())


def age(path: str | Path, session_ids: list[str], seconds: float) -> None:
    """Move the sessions' rows back in time, as if they had been idle that long (waits up to 10 s for a writer)."""
    with sqlite3.connect(path, timeout=10) as conn:
        for sid in session_ids:
            conn.execute("UPDATE trace_sessions SET created_at = created_at - ? WHERE session_id = ?", (seconds, sid))
            conn.execute("UPDATE traces SET created_at = created_at - ? WHERE trace_id IN "
                         "(SELECT trace_id FROM trace_sessions WHERE session_id = ?)", (seconds, sid))


def session_counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT session_id, COUNT(*) FROM trace_sessions GROUP BY session_id").fetchall())


# -- the Bifrost emulator with admin auth on ---------------------------------------------------------------

def emulator_with_auth(monkeypatch: pytest.MonkeyPatch, user: str, password: str,
                       password_env: str) -> Iterator[BifrostEmulator]:
    """The emulator with admin auth on, for a fixture to yield from; the password also in ``password_env``, where
    a config reads it from (as in production)."""
    monkeypatch.setenv(password_env, password)
    with BifrostEmulator(auth=(user, password)) as emulator:
        yield emulator


def auth_config(emu: BifrostEmulator, user: str, password_env: str) -> Config:
    """The config of one target, ``bifrost``: the emulator, as ``user`` with the password in ``password_env``."""
    target = Target(name="bifrost", kind="bifrost", url=emu.url,
                    auth=AuthConfig(username=user, password_env=password_env))
    return Config(targets=[target], policy=Policy())


def auth_config_file(emu: BifrostEmulator, path: Path, name: str, user: str, password_env: str) -> Path:
    """``auth_config`` as a config file at ``path`` (its one target named ``name``); the path."""
    path.write_text(f"""
[[targets]]
name = "{name}"
kind = "bifrost"
url = "{emu.url}"
[targets.auth]
username = "{user}"
password_env = "{password_env}"
""")
    return path


# -- the targets of hand-made snapshots ----------------------------------------------------------------------

def trace_store_target(sessions: Sequence[tuple[Any, ...]], candidate_traces: Sequence[tuple[Any, ...]] = (), *,
                       name: str = "rl", address: str = "http://127.0.0.1:9090", started_at: float = NOW,
                       duration_seconds: float = 0.01, warnings: Sequence[str] = (), **data: Any) -> TargetSnapshot:
    """An rLLM target that answered: its trace store holds ``sessions`` (SESSIONS_SCHEMA rows) and
    ``candidate_traces`` (CANDIDATE_TRACES_SCHEMA rows); ``data``: the store's other TraceStoreData fields."""
    store = TraceStoreData(sessions=frame_from_rows(list(sessions), SESSIONS_SCHEMA),
                           candidate_traces=frame_from_rows(list(candidate_traces), CANDIDATE_TRACES_SCHEMA), **data)
    return TargetSnapshot(name=name, kind="rllm", address=address, up=True, started_at=started_at,
                          duration_seconds=duration_seconds, warnings=list(warnings), trace_store=store)


def bifrost_target(records: Sequence[tuple[Any, ...]], reachability: Sequence[tuple[Any, ...]] = (), *,
                   client_config: dict[str, Any], name: str = "bifrost", address: str = "http://127.0.0.1:8080",
                   started_at: float = NOW, duration_seconds: float = 0.01, **data: Any) -> TargetSnapshot:
    """A Bifrost target that answered: ``records`` (RECORDS_SCHEMA rows), ``reachability`` (REACHABILITY_SCHEMA
    rows) and its ``client_config``; ``data``: its other BifrostData fields."""
    bifrost = BifrostData(records=frame_from_rows(list(records), RECORDS_SCHEMA), client_config=client_config,
                          reachability=frame_from_rows(list(reachability), REACHABILITY_SCHEMA), **data)
    return TargetSnapshot(name=name, kind="bifrost", address=address, up=True, started_at=started_at,
                          duration_seconds=duration_seconds, bifrost=bifrost)


def python_examples(path: Path) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of a Markdown file."""
    out: list[tuple[int, str]] = []
    block: list[str] | None = None
    start = 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if block is None and line.strip() == "```python":
            block, start = [], number + 1
        elif block is not None and line.strip() == "```":
            out.append((start, "\n".join(block)))
            block = None
        elif block is not None:
            block.append(line)
    return out
