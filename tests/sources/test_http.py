"""The clients' shared request path (gatewayscope.sources._http) against scripted transports: the body cap, the
deadline between chunks, and redirects, for the rLLM client, the Bifrost client and the guard's routes."""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gatewayscope.errors import BadResponseError, BodyTooLargeError, GatewayTimeoutError, RedirectError
from gatewayscope.guard.backfill import remote_status
from gatewayscope.sources.bifrost import BifrostClient
from gatewayscope.sources.rllm_http import RllmClient

URL = "http://gw.test:9090"
CAP = 1 << 20
CHUNK = 1 << 16


class Endless(httpx.SyncByteStream):
    """A body of CHUNK-byte pieces that ends only after ``limit`` of them, counting what was taken."""

    def __init__(self, limit: int = 100_000, pause: float = 0.0, piece: bytes = b" " * CHUNK) -> None:
        self.limit = limit
        self.pause = pause
        self.piece = piece
        self.taken = 0

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.limit):
            if self.pause:
                time.sleep(self.pause)
            self.taken += len(self.piece)
            yield self.piece


def rllm_call(transport: httpx.BaseTransport, **kwargs: Any) -> Any:
    with RllmClient(URL, transport=transport, **kwargs) as client:
        return client.request("GET", "/sessions")


def bifrost_call(transport: httpx.BaseTransport, **kwargs: Any) -> Any:
    with BifrostClient(URL, transport=transport, **kwargs) as client:
        return client.get_config()


def guard_call(transport: httpx.BaseTransport, *, max_body_bytes: int | None = None, timeout: float = 10) -> Any:
    from gatewayscope.guard import backfill

    with httpx.Client(transport=transport) as client:
        if max_body_bytes is None:
            return remote_status(URL, client=client, timeout=timeout)
        guard = backfill._GuardClient(URL, timeout=timeout, client=client, max_body_bytes=max_body_bytes)
        return guard.request("GET", "/guard/status")


CLIENTS: dict[str, Callable[..., Any]] = {"rllm": rllm_call, "bifrost": bifrost_call, "guard": guard_call}


@pytest.mark.parametrize("name", CLIENTS)
def test_an_endless_answer_is_read_no_further_than_the_cap(name: str) -> None:
    body = Endless()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, stream=body))
    with pytest.raises(BodyTooLargeError) as caught:
        CLIENTS[name](transport, max_body_bytes=CAP)
    assert body.taken <= CAP + CHUNK, "the client read past the cap"
    assert caught.value.limit == CAP
    assert "more than 1 MiB" in str(caught.value) and "max_body_bytes = 1048576" in str(caught.value)
    assert "raise max_body_bytes" in str(caught.value)


@pytest.mark.parametrize("name", CLIENTS)
def test_a_declared_length_over_the_cap_is_refused_before_reading(name: str) -> None:
    body = Endless()
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"Content-Length": str(10**12)}, stream=body))
    with pytest.raises(BodyTooLargeError, match="max_body_bytes = 1048576"):
        CLIENTS[name](transport, max_body_bytes=CAP)
    assert body.taken == 0


def test_the_cap_counts_decoded_bytes() -> None:
    bomb = gzip.compress(b"[" + b" " * (8 * CAP) + b"]")  # a few KiB on the wire
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=bomb))
    with pytest.raises(BodyTooLargeError, match="more than 1 MiB"):
        rllm_call(transport, max_body_bytes=CAP)
    small = gzip.compress(b'[{"session_id": "a:0", "trace_count": 1}]')
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=small))
    assert rllm_call(transport, max_body_bytes=CAP) == [{"session_id": "a:0", "trace_count": 1}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", CLIENTS)
def test_a_body_that_trickles_in_ends_at_the_deadline(name: str) -> None:
    """Each piece arrives well within any per-read timeout, so only a deadline for the whole exchange ends it."""
    body = Endless(limit=1000, pause=0.2, piece=b" ")
    transport = httpx.MockTransport(lambda request: httpx.Response(200, stream=body))
    with pytest.raises(GatewayTimeoutError):
        CLIENTS[name](transport, timeout=1)
    assert body.taken < 1000


@pytest.mark.parametrize("name", CLIENTS)
def test_a_redirect_says_where_to_without_control_characters(name: str) -> None:
    # bytes a real connection can carry (obs-text): bidi override, C1 CSI, line separator
    location = "https://sso.example/login\u202e\u009b[31m\u2028?next=%2F".encode()
    transport = httpx.MockTransport(lambda request: httpx.Response(302, headers=[(b"Location", location)]))
    with pytest.raises(RedirectError) as caught:
        CLIENTS[name](transport)
    message = str(caught.value)
    assert "HTTP 302, a redirect to https://sso.example/login[31m?next=%2F" in message
    assert not any(ch in message for ch in "\u202e\u009b\u2028")
    assert "not JSON" not in message
    assert caught.value.location == "https://sso.example/login[31m?next=%2F"
    assert isinstance(caught.value, BadResponseError)


def test_a_redirect_without_a_location_is_still_named() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(301))
    with pytest.raises(RedirectError, match="HTTP 301, a redirect without a Location"):
        rllm_call(transport)
