"""The stub worker's test protocol, in one place: the knobs a chat call carries and the stub's own routes.

A chat call tells the stub worker (:mod:`gatewayscope.sandbox.stub_worker`) how to behave with the headers
:data:`DELAY_HEADER`, :data:`TAG_HEADER` and :data:`HOLD_HEADER` (or the body fields :data:`DELAY_FIELD`,
:data:`TAG_FIELD`, :data:`HOLD_FIELD`); :func:`stub_headers` builds them. The gateway forwards them to the
worker. A driver then asks the worker, under its API path, how many tagged calls are in flight
(:data:`INFLIGHT_ROUTE`) and releases the held ones (:data:`RELEASE_ROUTE`): :class:`StubClient` and
:class:`AsyncStubClient` speak that, over an httpx client the caller owns (this module imports no httpx at
run time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import httpx

#: seconds the worker sleeps before it answers
DELAY_HEADER = "x-stub-delay"
#: the tag a call is counted (and released) under
TAG_HEADER = "x-stub-tag"
#: ``1``: after its delay the call also waits for a release of its tag
HOLD_HEADER = "x-stub-hold"
#: the same knobs as body fields of the chat call
DELAY_FIELD = "stub_delay_seconds"
TAG_FIELD = "stub_tag"
HOLD_FIELD = "stub_hold"

#: the worker's OpenAI API path (the gateway's default ``api_path``)
API_PATH = "/v1"
#: the stub's own routes, under the API path
STUB_PATH = "/stub"
INFLIGHT_ROUTE = f"{API_PATH}{STUB_PATH}/inflight"
RELEASE_ROUTE = f"{API_PATH}{STUB_PATH}/release"
#: a long poll's request outlasts its wait by this much, so the worker answers before the client gives up
LONG_POLL_MARGIN_SECONDS = 5.0


def stub_headers(*, delay: float | None = None, tag: str | None = None, hold: bool = False) -> dict[str, str]:
    """The headers of a chat call that the stub worker delays by ``delay`` seconds, counts under ``tag``
    and, with ``hold``, keeps until ``tag`` is released (a hold needs a tag)."""
    headers: dict[str, str] = {}
    if delay is not None:
        headers[DELAY_HEADER] = f"{delay:.3f}"
    if tag is not None:
        headers[TAG_HEADER] = tag
    if hold:
        headers[HOLD_HEADER] = "1"
    return headers


def stub_base(worker_url: str = "", api_path: str | None = API_PATH) -> str:
    """Where a worker's stub routes are: ``worker_url`` (empty: the client's base URL) plus its API path
    (empty or None: :data:`API_PATH`, as the gateway defaults it) plus :data:`STUB_PATH`."""
    return f"{worker_url.rstrip('/')}{api_path or API_PATH}{STUB_PATH}"


@dataclass(frozen=True)
class Inflight:
    """The worker's answer to ``GET`` :data:`INFLIGHT_ROUTE`: calls in flight and calls held (of a tag, or
    in all)."""

    inflight: int
    held: int

    @classmethod
    def from_json(cls, payload: Any) -> Inflight:
        """Read an answer; ValueError when it is not a stub worker's."""
        if not isinstance(payload, Mapping) or "inflight" not in payload:
            raise ValueError("not an answer of a stub worker (no 'inflight' count)")
        try:
            return cls(inflight=int(payload["inflight"]), held=int(payload.get("held", 0)))
        except (TypeError, ValueError) as err:
            raise ValueError(f"a stub worker's counts must be integers: {err}") from None


class _Requests:
    """The protocol's requests, built on either kind of httpx client (``build_request`` is sync on both)."""

    def __init__(self, client: httpx.Client | httpx.AsyncClient, worker_url: str = "",
                 api_path: str | None = API_PATH) -> None:
        self.client = client
        self.base = stub_base(worker_url, api_path)

    def _get_inflight(self, tag: str | None, wait: float | None, timeout: float | None) -> httpx.Request:
        params: dict[str, str] = {}
        if tag is not None:
            params["tag"] = tag
        if wait is not None:
            params["wait"] = f"{wait:.3f}"
            if timeout is None:
                timeout = wait + LONG_POLL_MARGIN_SECONDS
        return self._build("GET", "/inflight", params, timeout)

    def _post_release(self, tag: str, timeout: float | None) -> httpx.Request:
        return self._build("POST", "/release", {"tag": tag}, timeout)

    def _build(self, method: str, route: str, params: dict[str, str], timeout: float | None) -> httpx.Request:
        # no timeout given: the client's own (httpx reads an explicit None as "never time out")
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        return self.client.build_request(method, f"{self.base}{route}", params=params, **extra)


def _is_stub(response: httpx.Response) -> bool:
    return response.status_code == 200 and "inflight" in response.json()


class StubClient(_Requests):
    """The stub routes of one worker, over a sync httpx client (``worker_url`` empty: the client's base URL,
    which may be a gateway's: it proxies its bare API path to the worker)."""

    client: httpx.Client

    def is_stub(self, *, timeout: float | None = None) -> bool:
        """Whether the worker answers :data:`INFLIGHT_ROUTE` like a stub worker."""
        return _is_stub(self.client.send(self._get_inflight(None, None, timeout)))

    def inflight(self, tag: str | None = None, *, wait: float | None = None,
                 timeout: float | None = None) -> Inflight:
        """The calls in flight (tagged ``tag``, or all); with ``wait``, answered as soon as there is one
        (the worker waits at most ``wait`` seconds)."""
        response = self.client.send(self._get_inflight(tag, wait, timeout))
        response.raise_for_status()
        return Inflight.from_json(response.json())

    def release(self, tag: str, *, timeout: float | None = None) -> dict[str, Any]:
        """Let the calls held under ``tag`` answer; the worker's answer (``tag``, ``held``, ``inflight``)."""
        response = self.client.send(self._post_release(tag, timeout))
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer


class AsyncStubClient(_Requests):
    """:class:`StubClient` over an async httpx client."""

    client: httpx.AsyncClient

    async def is_stub(self, *, timeout: float | None = None) -> bool:
        """Whether the worker answers :data:`INFLIGHT_ROUTE` like a stub worker."""
        return _is_stub(await self.client.send(self._get_inflight(None, None, timeout)))

    async def inflight(self, tag: str | None = None, *, wait: float | None = None,
                       timeout: float | None = None) -> Inflight:
        """:meth:`StubClient.inflight`."""
        response = await self.client.send(self._get_inflight(tag, wait, timeout))
        response.raise_for_status()
        return Inflight.from_json(response.json())

    async def release(self, tag: str, *, timeout: float | None = None) -> dict[str, Any]:
        """:meth:`StubClient.release`."""
        response = await self.client.send(self._post_release(tag, timeout))
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer
