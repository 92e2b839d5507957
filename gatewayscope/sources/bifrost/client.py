"""Bifrost's management API over the base HTTP client: errors, the error envelope, the record checks.

The client does one HTTP call per method and never retries (the write protocol, with its waits and read-backs,
belongs to apply). Every failure is one of gatewayscope's typed errors with a sentence:

* 401/403 -> :class:`AuthError` (says whether credentials were sent and where they come from);
* 404 -> :class:`NotFoundError`; any other error status -> :class:`HTTPStatusError`
  (``status`` and ``message`` from the gateway's error envelope);
* a request the gateway dropped because a queue was full (503 in newest builds, 400 in older ones,
  message ``request dropped: queue is full``) -> :class:`RequestDroppedError`, an HTTPStatusError
  with ``dropped = True`` (``getattr(err, "dropped", False)`` is false for every other error);
* an answer that is not JSON, or not the shape the API returns -> :class:`BadResponseError`;
* a redirect -> :class:`RedirectError` (a BadResponseError saying where it leads; none is followed);
* an answer larger than ``max_body_bytes`` -> :class:`BodyTooLargeError` (reading stops at the cap);
* no connection, or a connection dropped before an answer -> :class:`UnreachableError`;
* no whole answer within the timeout (it bounds the exchange, not each read) -> :class:`GatewayTimeoutError`.

No exception text carries a request body, a header or a response body; responses are reduced to the
envelope's message.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from gatewayscope.config import DEFAULT_MAX_BODY_BYTES, AuthConfig, Target
from gatewayscope.errors import AuthError, BadResponseError, HTTPStatusError, NotFoundError, SourceError
from gatewayscope.sources._http import HttpClient
from gatewayscope.sources.bifrost.redact import redact_url

#: the message of a request the gateway dropped because the provider's queue was full
DROPPED_MESSAGE = "request dropped: queue is full"

_MAX_MESSAGE = 400


class RequestDroppedError(HTTPStatusError):
    """The gateway dropped the request because a provider queue was full (``drop_excess_requests``).

    Newest builds answer 503, older ones 400; both carry ``request dropped: queue is full``.
    """

    kind = "dropped"
    dropped = True


def auth_source_text(auth: AuthConfig) -> str:
    """Where a target's credentials come from, by name of place (never a value).

    >>> print(auth_source_text(AuthConfig(username_env="BF_USER", password_env="BF_PASS")))
    the username from the environment variable BF_USER and the password from the environment variable BF_PASS
    >>> auth_source_text(AuthConfig(username="admin", password_file="/run/secrets/bf"))
    'the username from the config file and the password from the file /run/secrets/bf'
    >>> auth_source_text(AuthConfig(username_file="/run/secrets/user", password_file="/run/secrets/bf"))
    'the username from the file /run/secrets/user and the password from the file /run/secrets/bf'
    """
    if auth.username is not None:
        user = "the config file"
    elif auth.username_env:
        user = f"the environment variable {auth.username_env}"
    else:
        user = f"the file {auth.username_file}"
    password = f"the environment variable {auth.password_env}" if auth.password_env \
        else f"the file {auth.password_file}"
    return f"the username from {user} and the password from {password}"


class BifrostApi(HttpClient):
    """One Bifrost management API: the plumbing its reader and writer share. No retries; every failure is a
    typed error (see the module docstring).

    ``auth`` is ``(username, password)`` for Basic auth on every call (it works across versions and needs no
    session). ``auth_source`` names where those come from (see :func:`auth_source_text`) so an
    :class:`AuthError` can say so. ``transport`` is httpx's seam: tests pass an ``httpx.MockTransport``.
    """

    server = "Bifrost"

    def __init__(
        self,
        base_url: str,
        *,
        auth: tuple[str, str] | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        auth_source: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            shown = redact_url(base_url)
            raise ValueError(f"expected an http:// or https:// base URL with a host, got {shown!r}")
        if parts.username or parts.password:
            raise ValueError("the base URL must not carry credentials; pass auth=(username, password)")
        super().__init__(base_url, timeout=timeout, transport=transport, auth=auth, max_body_bytes=max_body_bytes,
                         headers={"Accept": "application/json"})
        self.auth_configured = auth is not None
        self.auth_source = auth_source

    @classmethod
    def arguments_for(cls, target: Target) -> dict[str, Any]:
        """The constructor's arguments for ``target``: its URL, timeout, answer cap and (resolved now) credentials."""
        if not target.url:
            raise SourceError(f"Target {target.name!r} has no url; a bifrost target is read over HTTP.")
        auth = target.auth.resolve() if target.auth is not None else None
        source = auth_source_text(target.auth) if target.auth is not None else None
        return {"base_url": target.url, "auth": auth, "timeout": target.timeout_seconds, "auth_source": source,
                "max_body_bytes": target.max_body_bytes}

    @staticmethod
    def provider_path(name: str) -> str:
        """The path of one provider record, the name escaped whole (``/`` and spaces included).

        >>> BifrostApi.provider_path("acme/llama 3")
        '/api/providers/acme%2Fllama%203'
        """
        return "/api/providers/" + quote(name, safe="")

    def status_error(self, response: httpx.Response, method: str, path: str) -> HTTPStatusError:
        """The error for an error status, from Bifrost's error envelope: a dropped request, refused or missing
        credentials (saying where they come from), a missing record, or any other status."""
        status = response.status_code
        message, error_type = _envelope(response)
        url = self.base_url + path
        if status in (503, 400) and (DROPPED_MESSAGE in message.lower() or error_type == "request_dropped"):
            return RequestDroppedError(status, message, url=url)
        if status in (401, 403):
            err = AuthError(status, message, url=url)
            if self.auth_configured:
                source = f" (they come from {self.auth_source})" if self.auth_source else ""
                sentence = (f"Bifrost at {self.base_url} refused the admin credentials gatewayscope sent for "
                            f"{method} {path} (HTTP {status}: {message}): the username or password is wrong"
                            f"{source}.")
            else:
                sentence = (f"Bifrost at {self.base_url} requires credentials for {method} {path} "
                            f"(HTTP {status}: {message}) and none are configured for this target: add a "
                            "[targets.auth] table with username, username_env or username_file and "
                            "password_env or password_file.")
            err.args = (sentence,)
            return err
        if status == 404:
            return NotFoundError(status, message, url=url)
        return HTTPStatusError(status, message, url=url)

    def _json(self, response: httpx.Response, method: str, path: str, *, allow_empty: bool = False) -> Any:
        if allow_empty and not response.content.strip():
            return None
        parsed, data = self.parse_json(response)  # the error below is raised outside any handler: no body in it
        if parsed:
            return data
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        raise BadResponseError(
            f"Bifrost at {self.base_url} answered {method} {path} with something that is not JSON "
            f"({kind}, {len(response.content)} bytes); is this URL a Bifrost management API?"
        )

    def _shape_error(self, method: str, path: str, expected: str, got: Any) -> BadResponseError:
        return BadResponseError(
            f"Bifrost at {self.base_url} answered {method} {path} with {describe_json(got)} where its API "
            f"returns {expected}."
        )

    def _provider(self, data: Any, method: str, path: str) -> dict[str, Any]:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise self._shape_error(method, path, "a provider object with a name", data)
        data.pop("keys", None)  # pre-1.5 builds embedded (redacted) keys: never kept
        return data


def _envelope(response: httpx.Response) -> tuple[str, str | None]:
    """(message, error type) from Bifrost's error envelope, or a short stand-in when there is none."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested deeper than the stack
        data = None
    message: str | None = None
    error_type: str | None = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            if isinstance(error.get("message"), str):
                message = error["message"]
            if isinstance(error.get("type"), str):
                error_type = error["type"]
        elif isinstance(error, str):
            message = error
        if message is None and isinstance(data.get("message"), str):
            message = data["message"]
        if error_type is None and isinstance(data.get("type"), str):
            error_type = data["type"]
    if message is None:
        message = response.reason_phrase or "no error message"
        if data is None and response.content:
            message += " (the answer is not Bifrost's JSON error envelope)"
    message = " ".join(message.split())
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    return message, error_type


def describe_json(value: Any) -> str:
    """What a JSON value is, without quoting its content."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        keys = ", ".join(sorted(str(k) for k in value)[:6])
        return f"an object with keys [{keys}]" if keys else "an empty object"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return f"a JSON {type(value).__name__}"
