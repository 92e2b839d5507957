"""Helpers shared by the tests that drive real processes: bounded polling and the gateway's own view.

Import as ``from tests.helpers import wait_for`` (pytest puts the project root on ``sys.path``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pytest

from gatewayscope.sandbox.processes import ManagedProcess, start_on_free_port

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
