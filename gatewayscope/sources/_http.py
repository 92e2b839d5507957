"""The one request path of gatewayscope's HTTP clients: a deadline for the whole exchange, a cap on the answer.

httpx's timeouts bound each network operation, not the exchange: a server that sends one byte every few
seconds keeps a request going forever, and an answer is held in memory whole, however large. Every request
of the rLLM client, the Bifrost client and the guard's backfill goes through :func:`exchange`, which

* bounds the whole exchange (waiting for a pooled connection, connecting, sending, the answer's headers and
  its body) by the request's timeout: the answer is streamed and the monotonic clock checked between chunks,
  and on the connections of a :func:`deadline_transport` every socket operation waits at most the time left;
* reads at most ``max_body_bytes`` of the answer: a larger declared ``Content-Length`` is refused before
  reading, and the decoded bytes are counted as they arrive, so no more than the cap and one chunk is held;
* refuses a redirect (3xx) with :class:`~gatewayscope.errors.RedirectError`, saying where it leads: no client
  follows redirects, a target's URL is the API itself.

Running out of time raises httpx's own timeout exception, which each client already turns into a
:class:`~gatewayscope.errors.GatewayTimeoutError` with its own sentence.
"""

from __future__ import annotations

import contextvars
import ssl
import time
import unicodedata
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import httpcore
import httpx

from gatewayscope.errors import BadResponseError, BodyTooLargeError, RedirectError

#: where a too-large answer's error sends the user (the flag exists where the command line offers it)
RAISE_CAP_HINT = ("raise max_body_bytes in the target's [[targets]] table of the config file, or pass "
                  "--max-body-bytes")
#: the most characters of a redirect's Location an error message quotes
_MAX_LOCATION = 200

#: the monotonic time by which the exchange running in this thread (or task) must end; None outside one
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("gatewayscope_http_deadline",
                                                                        default=None)


def _time_left(timeout: float | None, expired: type[Exception]) -> float | None:
    """``timeout`` lowered to the time left before the current exchange's deadline; ``expired`` when none is."""
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake waits at most the time left."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, _time_left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own socket backend, with each connection's operations bounded by the exchange's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, _time_left(timeout, httpcore.ConnectTimeout), local_address,
                                         socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, _time_left(timeout, httpcore.ConnectTimeout), socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def deadline_transport(*, verify: ssl.SSLContext, limits: httpx.Limits) -> httpx.BaseTransport:
    """httpx's transport over connections whose socket operations never outlast :func:`exchange`'s deadline."""
    transport = httpx.HTTPTransport(verify=verify, limits=limits)
    # the transport's own pool, rebuilt with the same settings over the deadline-bounded backend
    transport._pool = httpcore.ConnectionPool(
        ssl_context=verify, max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
        network_backend=_DeadlineBackend())
    return transport


def path_segment(value: str) -> str:
    """``value`` as one path segment: every character but the unreserved ones percent-escaped (``/`` too), and
    the dot segments ``.`` and ``..`` written ``%2E`` and ``%2E%2E`` (a URL collapses a bare ``.`` or ``..``
    segment into the path around it; escaped, it reaches the server, which decodes it back).

    >>> path_segment("a/b c"), path_segment("."), path_segment(".."), path_segment("...")
    ('a%2Fb%20c', '%2E', '%2E%2E', '...')
    """
    escaped = quote(value, safe="")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def strip_control_chars(text: str, limit: int = _MAX_LOCATION) -> str:
    """``text`` safe to print: without control, formatting (bidi overrides) or line-breaking characters, and
    at most ``limit`` characters.

    >>> strip_control_chars("http://h/x\\x1b[31m\\u202e\\x07y")
    'http://h/x[31my'
    """
    cleaned = "".join(ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp"))
    return cleaned if len(cleaned) <= limit else cleaned[:limit] + "..."


def size_text(size: int) -> str:
    """A byte count for people.

    >>> size_text(512 * 1024 * 1024), size_text(1536), size_text(100)
    ('512 MiB', '1.5 KiB', '100 bytes')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} bytes"


def _too_large(who: str, where: str, limit: int, hint: str) -> BodyTooLargeError:
    return BodyTooLargeError(
        f"{who} answered {where} with more than {size_text(limit)}, the most gatewayscope reads "
        f"(max_body_bytes = {limit}); if the answer is really that large, {hint}.", limit=limit)


def _redirect(who: str, where: str, response: httpx.Response) -> RedirectError:
    raw = response.headers.get("location")
    location = strip_control_chars(raw) if raw else None
    target = f"a redirect to {location}" if location else "a redirect without a Location"
    return RedirectError(
        f"{who} answered {where} with HTTP {response.status_code}, {target}. gatewayscope follows no redirect: "
        "set the target's url to the API itself (where the redirect leads, if that is the same API).",
        status=response.status_code, location=location)


def exchange(client: httpx.Client, method: str, url: str, *, timeout: float, max_body_bytes: int, who: str,
             where: str, json_body: Any = None, raise_cap_hint: str = RAISE_CAP_HINT) -> httpx.Response:
    """Send one request and read its whole answer within ``timeout`` seconds in all and ``max_body_bytes``.

    ``who`` names the server (``"Bifrost at http://..."``) and ``where`` the request (``"GET /api/config"``)
    in error sentences. Returns the answer with its body read (decoded) whatever its status, except a
    redirect. Raises httpx's timeout exceptions when the deadline passes, httpx's transport errors as they
    come, :class:`RedirectError`, :class:`BodyTooLargeError`, and :class:`BadResponseError` for a body that
    cannot be decoded.
    """
    deadline = time.monotonic() + timeout
    request = client.build_request(method, url, json=json_body, timeout=httpx.Timeout(timeout))
    token = _deadline.set(deadline)
    try:
        response = client.send(request, stream=True, follow_redirects=False)
        try:
            if 300 <= response.status_code < 400:
                raise _redirect(who, where, response)
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_body_bytes:
                raise _too_large(who, where, max_body_bytes, raise_cap_hint)
            chunks: list[bytes] = []
            size = 0
            undecodable: str | None = None
            try:
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > max_body_bytes:
                        raise _too_large(who, where, max_body_bytes, raise_cap_hint)
                    chunks.append(chunk)
                    if time.monotonic() >= deadline:
                        raise httpx.ReadTimeout(f"the whole answer did not arrive within {timeout:g} s",
                                                request=request)
            except httpx.DecodingError as err:
                undecodable = str(err)
            if undecodable is not None:  # raised outside the handler: the error holds no reference to the request
                raise BadResponseError(f"{who} answered {where} with a body that cannot be decoded ({undecodable}).")
        finally:
            response.close()
    finally:
        _deadline.reset(token)
    # the body is decoded already: the copy carries no Content-Encoding to decode it again
    headers = [(name, value) for name, value in response.headers.raw
               if name.lower() not in (b"content-encoding", b"content-length")]
    extensions: dict[str, Any] = {key: response.extensions[key] for key in ("http_version", "reason_phrase")
                                  if key in response.extensions}
    return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks), request=request,
                          extensions=extensions)
