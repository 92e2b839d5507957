"""The one HTTP layer of gatewayscope's clients: the base client, and the request path every request takes.

:class:`HttpClient` is the base of the rLLM client, the Bifrost reader and writer and the guarded gateway's
routes: one TLS context, Basic auth when a target has credentials, a pool of deadline-bounded connections
with ``TCP_NODELAY``, the timeout and the answer cap, and the one ladder that turns httpx's failures into
gatewayscope's error family (each client words the sentences).

httpx's timeouts bound each network operation, not the exchange: a server that sends one byte every few
seconds keeps a request going forever, and an answer is held in memory whole, however large. Every request
of those clients goes through :func:`exchange`, which

* bounds the whole exchange (waiting for a pooled connection, connecting, sending, the answer's headers and
  its body) by the request's timeout: the answer is streamed and the monotonic clock checked between chunks,
  and on the connections of a :func:`deadline_transport` every socket operation waits at most the time left;
* reads at most ``max_body_bytes`` of the answer: a larger declared ``Content-Length`` is refused before
  reading, and the decoded bytes are counted as they arrive, so no more than the cap and one chunk is held;
* refuses a redirect (3xx) with :class:`~gatewayscope.errors.RedirectError`, saying where it leads: no client
  follows redirects, a target's URL is the API itself.

Running out of time raises httpx's own timeout exception, which :meth:`HttpClient.send` turns into a
:class:`~gatewayscope.errors.GatewayTimeoutError`.
"""

from __future__ import annotations

import contextvars
import json
import socket
import ssl
import time
import unicodedata
from collections.abc import Iterable
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

import httpcore
import httpx

from gatewayscope.config import DEFAULT_MAX_BODY_BYTES
from gatewayscope.errors import (
    BadResponseError,
    BodyTooLargeError,
    GatewayscopeError,
    GatewayTimeoutError,
    HTTPStatusError,
    NotFoundError,
    RedirectError,
    SourceError,
    UnreachableError,
)
from gatewayscope.sources._gcpause import gc_paused
from gatewayscope.sources._tls import shared_ssl_context

#: where a too-large answer's error sends the user (the flag exists where the command line offers it)
RAISE_CAP_HINT = ("raise max_body_bytes in the target's [[targets]] table of the config file, or pass "
                  "--max-body-bytes")
#: the most characters of a redirect's Location an error message quotes
_MAX_LOCATION = 200

_Client = TypeVar("_Client", bound="HttpClient")

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


#: a request goes out as several writes (headers, then the body): Nagle's algorithm must not hold the body back
#: for the server's delayed ACK
_SOCKET_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def deadline_transport(*, verify: ssl.SSLContext, limits: httpx.Limits) -> httpx.BaseTransport:
    """httpx's transport over connections whose socket operations never outlast :func:`exchange`'s deadline."""
    transport = httpx.HTTPTransport(verify=verify, limits=limits)
    # the transport's own pool, rebuilt with the same settings over the deadline-bounded backend
    transport._pool = httpcore.ConnectionPool(
        ssl_context=verify, max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
        network_backend=_DeadlineBackend(), socket_options=_SOCKET_OPTIONS)
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


def error_message(response: httpx.Response) -> str:
    """The sentence in an error answer: its ``error``/``detail``/``message`` field, else the text."""
    try:
        body = response.json()
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python's stack
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "detail", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return json.dumps(body)[:200]


def transport_reason(err: httpx.TransportError) -> str:
    """A short reason for a transport failure: its kind and its text on one line (it names no header or body)."""
    text = " ".join(str(err).split())[:200]
    name = type(err).__name__
    return f"{name}: {text}" if text else name


class HttpClient:
    """One gateway's HTTP API: what every client of gatewayscope shares.

    The shared TLS context (:func:`~gatewayscope.sources._tls.shared_ssl_context`), Basic ``auth`` when given,
    a pool of at most ``max_connections`` connections (httpx's default pool when None) over deadline-bounded
    sockets with ``TCP_NODELAY`` (:func:`deadline_transport`), no redirects followed, ``timeout`` seconds for
    each whole exchange and ``max_body_bytes`` for each answer (see :func:`exchange`). ``transport`` replaces the
    pool (httpx's seam: tests pass a ``MockTransport``); ``client`` replaces the whole httpx client (the caller's,
    which :meth:`close` leaves open).

    :meth:`send` is the one place httpx's failures become gatewayscope's errors:

    * ``httpx.TimeoutException`` -> :class:`~gatewayscope.errors.GatewayTimeoutError` (``timeout_sentence``);
    * any other ``httpx.TransportError`` -> :class:`~gatewayscope.errors.UnreachableError`
      (``unreachable_sentence``);
    * any other ``httpx.HTTPError`` -> :class:`~gatewayscope.errors.SourceError` (``failed_sentence``);
    * an error status (4xx, 5xx) -> :meth:`status_error`, with the answer's own message.

    A client names its server (:attr:`server`) and words the sentences: each is a ``str.format`` template over
    ``who`` (the server and its URL), ``base_url``, ``method``, ``path``, ``where`` (method and path), ``url``,
    ``seconds`` (the timeout), ``error`` (the exception's text), ``error_type`` (its class) and ``reason``
    (:func:`transport_reason`). Every error is raised outside the handler of httpx's exception, so it holds no
    reference to httpx's request (its auth header) or the answer.
    """

    #: the server in sentences: ``who`` is "{server} at {base_url}"
    server: ClassVar[str] = "The gateway"
    timeout_sentence: ClassVar[str] = "{who} did not answer {where} within {seconds:g} s."
    unreachable_sentence: ClassVar[str] = "{who} could not be reached for {where} ({reason})."
    failed_sentence: ClassVar[str] = "{method} {url} failed: {error}"
    #: what an error status names as its ``url``
    status_url: ClassVar[str] = "{method} {url}"

    def __init__(self, base_url: str, *, timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 client: httpx.Client | None = None, auth: tuple[str, str] | None = None,
                 max_connections: int | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 headers: dict[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_body_bytes = max_body_bytes
        self._own = client is None
        if client is None:
            limits = (httpx.Limits() if max_connections is None
                      else httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))
            verify = shared_ssl_context()
            client = httpx.Client(
                auth=httpx.BasicAuth(*auth) if auth is not None else None,
                timeout=httpx.Timeout(self.timeout),
                transport=transport if transport is not None else deadline_transport(verify=verify, limits=limits),
                verify=verify, limits=limits, follow_redirects=False, headers=headers)
        self._client = client

    @property
    def who(self) -> str:
        """The server and its URL, as sentences name it."""
        return f"{self.server} at {self.base_url}"

    def close(self) -> None:
        """Close the connection pool (not a client the caller passed)."""
        if self._own:
            self._client.close()

    def __enter__(self: _Client) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sentence(self, template: str, method: str, path: str, **fields: Any) -> str:
        return template.format(who=self.who, base_url=self.base_url, method=method, path=path,
                               where=f"{method} {path}", url=self.base_url + path, **fields)

    def send(self, method: str, path: str, *, json_body: Any = None, timeout: float | None = None,
             ok: tuple[int, ...] = ()) -> httpx.Response:
        """One request to ``path`` (below the base URL); its answer, its body read, unless it failed.

        ``timeout`` (default the client's) bounds the whole exchange. An error status raises :meth:`status_error`
        unless it is in ``ok``; every other failure raises as the table above says.
        """
        seconds = self.timeout if timeout is None else timeout
        failure: GatewayscopeError | None = None
        try:
            response = exchange(self._client, method, self.base_url + path, json_body=json_body, timeout=seconds,
                                max_body_bytes=self.max_body_bytes, who=self.who, where=f"{method} {path}")
        except httpx.TimeoutException:
            failure = GatewayTimeoutError(self._sentence(self.timeout_sentence, method, path, seconds=seconds))
        except httpx.TransportError as err:
            failure = UnreachableError(self._sentence(self.unreachable_sentence, method, path, error=err,
                                                      error_type=type(err).__name__, reason=transport_reason(err)))
        except httpx.HTTPError as err:
            failure = SourceError(self._sentence(self.failed_sentence, method, path, error=err))
        if failure is not None:
            raise failure
        if response.status_code >= 400 and response.status_code not in ok:
            raise self.status_error(response, method, path)
        return response

    def status_error(self, response: httpx.Response, method: str, path: str) -> HTTPStatusError:
        """The error for an answer with an error status: :class:`NotFoundError` for 404, else
        :class:`HTTPStatusError`, with the answer's own message (:func:`error_message`)."""
        error_type = NotFoundError if response.status_code == 404 else HTTPStatusError
        return error_type(response.status_code, error_message(response),
                          url=self._sentence(self.status_url, method, path))

    @staticmethod
    def parse_json(response: httpx.Response) -> tuple[bool, Any]:
        """``(True, value)`` for an answer whose body is JSON, ``(False, None)`` otherwise (the caller says what
        is wrong, outside any handler). A large answer makes many fresh containers and no cycle: parsed with
        the cyclic collector paused (see :mod:`~gatewayscope.sources._gcpause`)."""
        try:
            with gc_paused():
                return True, response.json()
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested deeper than the stack
            return False, None
