"""Every HTTP client against real servers that misbehave on loopback: each request ends within its deadline
and reads at most ``max_body_bytes``, whatever the server does.

A server that drips one byte at a time never trips httpx's per-read timeout, and a huge answer is held
whole; the clients bound the whole exchange and cap the answer (gatewayscope.sources._http). The tests
assert that each command *finished* (a worker thread joined within a generous bound, under pytest-timeout)
and what it said, never how long it took.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.cli import main
from gatewayscope.errors import GatewayTimeoutError, RedirectError
from gatewayscope.guard.backfill import backfill_tombstones, lift, remote_status
from tests.hostile import drip_body, drip_head, endless_chunked, hostile, huge_length, redirect

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: how long a test waits for a command that must end on its own (its deadlines are a few seconds)
FINISH_WITHIN = 60.0


def finishes(call: Callable[[], Any]) -> Any:
    """Run ``call`` in a thread; fail unless it returns (or raises) within FINISH_WITHIN seconds."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # handed to the test below
            outcome["error"] = err

    thread = threading.Thread(target=run, name="hostile-client", daemon=True)
    thread.start()
    thread.join(FINISH_WITHIN)
    assert not thread.is_alive(), f"still running after {FINISH_WITHIN:.0f} s: the deadline did not hold"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = finishes(lambda: main(["scan", "--format", "json", *args]))
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("behaviour", [drip_body, drip_head], ids=["drip-body", "drip-headers"])
@pytest.mark.parametrize("flag", ["--trace-store", "--bifrost"])
def test_scan_of_a_dripping_server_ends_with_a_timeout(behaviour: Callable[[], Any], flag: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with hostile(behaviour()) as server:
        code, report = scan(capsys, flag, server.url, "--timeout", "2")
    assert code == 1
    (entry,) = report["targets"]
    assert not entry["up"] and entry["error_kind"] == "timeout"
    assert "in time" in entry["error"] or "within 2 s" in entry["error"]


def test_scan_refuses_an_answer_declared_larger_than_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    with hostile(huge_length()) as server:
        code, report = scan(capsys, "--trace-store", server.url)
    assert code == 1
    (entry,) = report["targets"]
    assert entry["error_kind"] == "too_large"
    assert "more than 512 MiB" in entry["error"] and "max_body_bytes = 536870912" in entry["error"]


def test_scan_stops_reading_an_endless_answer_at_the_configured_cap(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with hostile(endless_chunked()) as server:
        config = tmp_path / "gatewayscope.toml"
        config.write_text(f'[[targets]]\nname = "gw"\nkind = "rllm"\nurl = "{server.url}"\n'
                          "max_body_bytes = 1048576\n")
        code, report = scan(capsys, "--config", str(config))
    assert code == 1
    (entry,) = report["targets"]
    assert entry["error_kind"] == "too_large"
    assert "more than 1 MiB" in entry["error"] and "max_body_bytes = 1048576" in entry["error"]
    assert "raise max_body_bytes" in entry["error"]


@pytest.mark.parametrize("flag", ["--trace-store", "--bifrost"])
def test_scan_says_a_redirect_is_a_redirect_and_where_to(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with hostile(redirect("https://login.example/sso?next=%2Fsessions")) as server:
        code, report = scan(capsys, flag, server.url)
    assert code == 1
    (entry,) = report["targets"]
    assert entry["error_kind"] == "redirect"
    assert "HTTP 302, a redirect to https://login.example/sso?next=%2Fsessions" in entry["error"]
    assert "not JSON" not in entry["error"]


def test_guard_routes_of_a_dripping_server_end_with_a_timeout() -> None:
    with hostile(drip_body()) as server:
        for call in (lambda: backfill_tombstones(server.url, ["a:0"], timeout=2),
                     lambda: lift(server.url, "a:0", timeout=2),
                     lambda: remote_status(server.url, timeout=2)):
            with pytest.raises(GatewayTimeoutError, match="no whole answer within 2 s"):
                finishes(call)


def test_guard_routes_say_a_redirect_is_a_redirect() -> None:
    with hostile(redirect("http://127.0.0.1:1/elsewhere")) as server, \
            pytest.raises(RedirectError, match="a redirect to http://127.0.0.1:1/elsewhere"):
        finishes(lambda: remote_status(server.url, timeout=5))
