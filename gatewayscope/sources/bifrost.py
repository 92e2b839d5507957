"""Bifrost's management API: a small typed client, and the read that turns a gateway into a BifrostData.

The client does one HTTP call per method and never retries (the write protocol, with its waits and
read-backs, belongs to apply). Every failure is one of gatewayscope's typed errors with a sentence:

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
envelope's message. Secrets never leave this module in the clear: :func:`sanitize_record` replaces
every secret-bearing field of a provider record by a short hash of the (already masked) value, and
:func:`read_bifrost` keeps only sanitized records and non-secret client settings.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import polars as pl

from gatewayscope.analysis.pools import base_url_host
from gatewayscope.config import DEFAULT_MAX_BODY_BYTES, AuthConfig, Policy, Target
from gatewayscope.errors import (
    AuthError,
    BadResponseError,
    GatewayTimeoutError,
    HTTPStatusError,
    NotFoundError,
    SourceError,
    UnreachableError,
)
from gatewayscope.snapshot import REACHABILITY_SCHEMA, RECORDS_SCHEMA, BifrostData, frame_from_rows
from gatewayscope.sources._gcpause import gc_paused
from gatewayscope.sources._http import deadline_transport, exchange
from gatewayscope.sources._tls import shared_ssl_context

#: a pool write's budget (seed 002): base URL DNS check 5 s + upstream model listing 15 s + margin
PUT_PROVIDER_TIMEOUT = 30.0
#: the gateway's defaults when a record leaves its pool unset (core DefaultConcurrency/DefaultBufferSize)
DEFAULT_CONCURRENCY = 1000
DEFAULT_BUFFER_SIZE = 5000
#: the message of a request the gateway dropped because the provider's queue was full
DROPPED_MESSAGE = "request dropped: queue is full"
#: a DNS check of one base URL host gives up after this long
DNS_TIMEOUT_SECONDS = 5.0
#: a DNS answer is reused for this long within one process
DNS_CACHE_TTL_SECONDS = 60.0

_MAX_MESSAGE = 400

#: client_config settings safe to keep in a snapshot (no URLs, tokens, secrets or header values)
SAFE_CLIENT_CONFIG_KEYS = frozenset({
    "drop_excess_requests", "initial_pool_size", "prometheus_labels", "enable_logging",
    "disable_content_logging", "retain_content_in_object_storage",
    "allow_per_request_content_storage_override", "allow_per_request_raw_override", "allow_direct_keys",
    "disable_db_pings_in_health", "log_retention_days", "enforce_auth_on_inference",
    "dual_credential_conflict_behavior", "enforce_governance_header", "enforce_scim_auth",
    "max_request_body_size_mb", "compat", "mcp_agent_depth", "mcp_tool_execution_timeout",
    "mcp_code_mode_binding_level", "mcp_tool_sync_interval", "mcp_disable_auto_tool_inject",
    "mcp_enable_temp_token_auth", "async_job_result_ttl", "hide_deleted_virtual_keys_in_filters",
    "routing_chain_max_depth", "mcp_server_auth_mode", "dump_errors_in_console_logs",
})

#: field names whose value is a secret wherever they appear in a record (SecretVar values, proxy
#: credentials, CA PEMs, key material); replaced by a hash of what the gateway sent
_SECRET_FIELDS = frozenset({
    "value", "password", "username", "url", "ca_cert_pem", "api_key", "token", "secret", "client_secret",
    "access_key", "secret_key", "session_token", "private_key", "auth_credentials", "headers",
})
#: fields dropped outright (pre-1.5 builds embedded redacted keys in provider responses)
_DROPPED_FIELDS = frozenset({"keys"})
#: runtime observations, not configuration: left out of a record's fingerprint
_VOLATILE_FIELDS = ("provider_status", "status", "description")


class RequestDroppedError(HTTPStatusError):
    """The gateway dropped the request because a provider queue was full (``drop_excess_requests``).

    Newest builds answer 503, older ones 400; both carry ``request dropped: queue is full``.
    """

    kind = "dropped"
    dropped = True


# -- secrets --------------------------------------------------------------------------------------

def secret_hash(value: Any) -> str:
    """A short stable hash of a (masked) secret, so a fingerprint notices a change without keeping it.

    Accepts every SecretVar shape the gateway has used: the newest ``{"value", "ref", "type"}``,
    the legacy ``{"value", "env_var", "from_env"}`` and a bare string.

    >>> masked = "sk-a************************wxyz"
    >>> secret_hash(masked) == secret_hash({"value": masked, "type": "plain_text"})
    True
    >>> secret_hash("") == secret_hash(None)
    True
    >>> secret_hash("abc").startswith("sha256:")
    True
    """
    if isinstance(value, dict):
        ref = value.get("ref") or value.get("env_var") or ""
        if not ref and value.get("from_env"):
            ref = "env"
        secret = value.get("value") or ""
    elif value is None:
        secret, ref = "", ""
    elif isinstance(value, str):
        secret, ref = value, ""
    else:
        return _short_hash(json.dumps(value, sort_keys=True, default=str))
    if type(secret) is str and type(ref) is str:
        # exactly json.dumps({"value": secret, "ref": ref}, sort_keys=True), without building an encoder
        canonical = '{"ref": ' + _json_string(ref) + ', "value": ' + _json_string(secret) + "}"
    else:
        canonical = json.dumps({"value": secret, "ref": ref}, sort_keys=True)
    return _short_hash(canonical)


#: a str as json.dumps writes it (ensure_ascii: the C encoder's own function)
_json_string = json.encoder.encode_basestring_ascii


def _short_hash(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=4096)  # pure; a listing repeats the same few hundred base URLs
def redact_url(url: str | None) -> str | None:
    """A URL with any userinfo and query string replaced, so it can be shown and stored.

    >>> redact_url("https://user:pw@api.example.com:8443/v1?key=abc")
    'https://<redacted>@api.example.com:8443/v1?<redacted>'
    >>> redact_url("http://10.0.0.5:8000/v1")
    'http://10.0.0.5:8000/v1'
    """
    if not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "<redacted>@" + netloc.rsplit("@", 1)[1]
    query = "<redacted>" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


#: leaves _scrub can share with its input: immutable, so the copy it returns stays independent
_IMMUTABLE_LEAVES = (str, int, float, bool, type(None))
_LEAF_TYPES = frozenset(_IMMUTABLE_LEAVES)


def _scrub_dict(node: dict[str, Any], skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """:func:`_scrub` of a dict, leaving out the keys in ``skip`` too (a fingerprint's volatile fields)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_FIELDS or key in skip:
            continue
        if key in _SECRET_FIELDS and value not in (None, "", {}):
            out[key] = secret_hash(value)
        elif type(value) in _LEAF_TYPES:  # most of a record: no call per leaf
            out[key] = value
        else:
            out[key] = _scrub(value)
    return out


def _scrub(node: Any) -> Any:
    """A copy of ``node`` without ``keys`` and with every secret-named field hashed.

    Dicts and lists are rebuilt and immutable JSON leaves shared, so the input is never changed and no
    separate deep copy is needed (one is made only for an unusual mutable leaf).
    """
    if isinstance(node, dict):
        return _scrub_dict(node)
    if isinstance(node, list):
        return [_scrub(item) for item in node]
    return node if isinstance(node, _IMMUTABLE_LEAVES) else copy.deepcopy(node)


def sanitize_record(record: dict[str, Any]) -> dict[str, Any]:
    """A provider record with nothing secret left in it, safe to log, store and fingerprint.

    Drops any ``keys`` (pre-1.5 builds embedded them); replaces by a short hash of what the gateway
    sent: the proxy's url/username/password/ca_cert_pem, ``network_config.ca_cert_pem``, every
    ``extra_headers`` value (they may hold auth headers; the header names stay) and every ``value``
    field anywhere; strips userinfo and query from ``network_config.base_url``. The input is not changed.

    >>> record = {"name": "acme__m", "keys": [{"value": "sk-1************************abcd"}],
    ...           "network_config": {"base_url": "https://u:p@h.example/v1",
    ...                              "extra_headers": {"Authorization": "Bearer xyz"}},
    ...           "proxy_config": {"type": "http", "password": "<REDACTED>",
    ...                            "url": {"value": "http****************4321", "type": "plain_text"}}}
    >>> clean = sanitize_record(record)
    >>> "keys" in clean, clean["network_config"]["base_url"], clean["proxy_config"]["type"]
    (False, 'https://<redacted>@h.example/v1', 'http')
    >>> "xyz" in json.dumps(clean), "4321" in json.dumps(clean)
    (False, False)
    """
    return _sanitized(record)


def _sanitized(record: dict[str, Any], skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """:func:`sanitize_record` without the top-level keys in ``skip``."""
    clean = _scrub_dict(record, skip)  # a fresh copy: the network block changed below is the copy's
    network = clean.get("network_config")
    if isinstance(network, dict):
        if isinstance(network.get("base_url"), str):
            network["base_url"] = redact_url(network["base_url"])
        headers = network.get("extra_headers")
        if isinstance(headers, dict):
            network["extra_headers"] = {name: secret_hash(value) for name, value in headers.items()}
    return clean


#: the part of a record a pool write changes
POOL_FIELDS = ("concurrency_and_buffer_size",)


def record_fingerprint(record: dict[str, Any], *, exclude: Iterable[str] = ()) -> str:
    """sha256 of the sanitized record's JSON (sorted keys), without runtime status fields.

    Left out: ``provider_status``, ``status``, ``description`` (observations of the moment, not
    configuration) and any top-level field named in ``exclude`` (apply leaves out what its action
    changes, e.g. ``concurrency_and_buffer_size``). Equal configurations give equal fingerprints
    whichever SecretVar shape the gateway used for a masked secret.

    >>> a = {"name": "x", "concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024},
    ...      "provider_status": "active"}
    >>> b = dict(a, provider_status="error")
    >>> record_fingerprint(a) == record_fingerprint(b)
    True
    >>> c = dict(a, concurrency_and_buffer_size={"concurrency": 1000, "buffer_size": 5000})
    >>> record_fingerprint(a) == record_fingerprint(c)
    False
    >>> record_fingerprint(a, exclude=["concurrency_and_buffer_size"]) == record_fingerprint(
    ...     c, exclude=["concurrency_and_buffer_size"])
    True
    """
    skip = _VOLATILE_SET | frozenset(exclude)
    payload = _FINGERPRINT_JSON.encode(_sanitized(record, skip))
    return hashlib.sha256(payload.encode()).hexdigest()


_VOLATILE_SET = frozenset(_VOLATILE_FIELDS)
#: the canonical JSON a fingerprint hashes (one encoder, built once)
_FINGERPRINT_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def safe_client_config(client_config: dict[str, Any]) -> dict[str, Any]:
    """The non-secret part of ``client_config``: known settings only, no URLs, tokens or header values.

    >>> safe_client_config({"drop_excess_requests": True, "webhook_config": {"url": "https://h/x?t=s"}})
    {'drop_excess_requests': True}
    """
    return {k: copy.deepcopy(v) for k, v in client_config.items() if k in SAFE_CLIENT_CONFIG_KEYS}


# -- the client -----------------------------------------------------------------------------------

def auth_source_text(auth: AuthConfig) -> str:
    """Where a target's credentials come from, by name of place (never a value).

    >>> print(auth_source_text(AuthConfig(username_env="BF_USER", password_env="BF_PASS")))
    the username from the environment variable BF_USER and the password from the environment variable BF_PASS
    >>> auth_source_text(AuthConfig(username="admin", password_file="/run/secrets/bf"))
    'the username from the config file and the password from the file /run/secrets/bf'
    """
    user = f"the environment variable {auth.username_env}" if auth.username is None and auth.username_env \
        else "the config file"
    password = f"the environment variable {auth.password_env}" if auth.password_env \
        else f"the file {auth.password_file}"
    return f"the username from {user} and the password from {password}"


class BifrostClient:
    """One Bifrost management API, over httpx. No retries; every failure is a typed error.

    ``auth`` is ``(username, password)`` for Basic auth on every call (the contract's advice: it works
    across versions and needs no session). ``auth_source`` names where those come from (see
    :func:`auth_source_text`) so an :class:`AuthError` can say so. ``transport`` is httpx's seam:
    tests pass an ``httpx.MockTransport``.
    """

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
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.auth_configured = auth is not None
        self.auth_source = auth_source
        self.max_body_bytes = max_body_bytes
        self._client = httpx.Client(
            auth=httpx.BasicAuth(*auth) if auth is not None else None,
            timeout=httpx.Timeout(self.timeout),
            transport=transport if transport is not None else deadline_transport(
                verify=shared_ssl_context(), limits=httpx.Limits()),
            verify=shared_ssl_context(),
            follow_redirects=False,
            headers={"Accept": "application/json"},
        )

    # -- plumbing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> BifrostClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def provider_path(name: str) -> str:
        """The path of one provider record, the name escaped whole (``/`` and spaces included).

        >>> BifrostClient.provider_path("acme/llama 3")
        '/api/providers/acme%2Fllama%203'
        """
        return "/api/providers/" + quote(name, safe="")

    def _request(self, method: str, path: str, *, body: Any = None, timeout: float | None = None,
                 ok: tuple[int, ...] = ()) -> httpx.Response:
        url = self.base_url + path
        where = f"{method} {path}"
        failure: SourceError | None = None
        try:
            # the timeout bounds the whole exchange; the answer is read up to max_body_bytes (see _http)
            response = exchange(self._client, method, url, json_body=body,
                                timeout=self.timeout if timeout is None else timeout,
                                max_body_bytes=self.max_body_bytes, who=f"Bifrost at {self.base_url}", where=where)
        except httpx.TimeoutException:
            seconds = timeout if timeout is not None else self.timeout
            failure = GatewayTimeoutError(
                f"Bifrost at {self.base_url} did not answer {where} within {seconds:g} s."
            )
        except httpx.TransportError as err:
            failure = UnreachableError(
                f"Bifrost at {self.base_url} could not be reached for {where} ({_transport_reason(err)})."
            )
        if failure is not None:
            # raised outside the handler so it holds no reference to httpx's request (its auth header)
            raise failure
        if response.status_code >= 400 and response.status_code not in ok:
            raise self._status_error(response, method, path)
        return response

    def _status_error(self, response: httpx.Response, method: str, path: str) -> HTTPStatusError:
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
                            "[targets.auth] table with username or username_env and password_env or "
                            "password_file.")
            err.args = (sentence,)
            return err
        if status == 404:
            return NotFoundError(status, message, url=url)
        return HTTPStatusError(status, message, url=url)

    def _json(self, response: httpx.Response, method: str, path: str, *, allow_empty: bool = False) -> Any:
        if allow_empty and not response.content.strip():
            return None
        try:
            with gc_paused():  # a listing is ~100,000 fresh containers and no cycle (see _gcpause)
                return response.json()
        except (ValueError, UnicodeDecodeError):
            pass  # raised below, outside the handler, so the error holds no copy of the body
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        raise BadResponseError(
            f"Bifrost at {self.base_url} answered {method} {path} with something that is not JSON "
            f"({kind}, {len(response.content)} bytes); is this URL a Bifrost management API?"
        )

    def _shape_error(self, method: str, path: str, expected: str, got: Any) -> BadResponseError:
        return BadResponseError(
            f"Bifrost at {self.base_url} answered {method} {path} with {_describe(got)} where its API "
            f"returns {expected}."
        )

    def _provider(self, data: Any, method: str, path: str) -> dict[str, Any]:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise self._shape_error(method, path, "a provider object with a name", data)
        data.pop("keys", None)  # pre-1.5 builds embedded (redacted) keys: never kept
        return data

    # -- reads ------------------------------------------------------------------------------------

    def list_providers(self) -> list[dict[str, Any]]:
        """``GET /api/providers``: every provider record (secrets masked by the gateway, keys dropped)."""
        path = "/api/providers"
        data = self._json(self._request("GET", path), "GET", path)
        if not isinstance(data, dict) or "providers" not in data:
            raise self._shape_error("GET", path, 'an object {"providers": [...], "total": N}', data)
        providers = data["providers"]
        if providers is None:
            return []
        if not isinstance(providers, list):
            raise self._shape_error("GET", path, "a list of providers", providers)
        return [self._provider(item, "GET", path) for item in providers]

    def get_provider(self, name: str) -> dict[str, Any]:
        """``GET /api/providers/{name}``; :class:`NotFoundError` when the gateway holds no such record."""
        path = self.provider_path(name)
        return self._provider(self._json(self._request("GET", path), "GET", path), "GET", path)

    def get_config(self) -> dict[str, Any]:
        """``GET /api/config``: the whole answer (client_config, auth_config with a masked password, ...)."""
        path = "/api/config"
        data = self._json(self._request("GET", path), "GET", path)
        if not isinstance(data, dict) or not isinstance(data.get("client_config"), dict):
            raise self._shape_error("GET", path, 'an object with a "client_config" object', data)
        return data

    def health(self) -> str:
        """``GET /health`` (always public): the status it reports, ``"ok"`` when healthy."""
        path = "/health"
        data = self._json(self._request("GET", path), "GET", path)
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise self._shape_error("GET", path, 'an object {"status": "ok"}', data)
        return str(data["status"])

    def version(self) -> str:
        """``GET /api/version``: the build version string, as the gateway spells it."""
        path = "/api/version"
        data = self._json(self._request("GET", path), "GET", path)
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            return str(data["version"])
        if not isinstance(data, str):
            raise self._shape_error("GET", path, "a JSON string holding the version", data)
        return data

    # -- writes (used by apply; one attempt each, no retries) -------------------------------------

    def put_provider(
        self, name: str, body: dict[str, Any], *, timeout: float = PUT_PROVIDER_TIMEOUT
    ) -> dict[str, Any]:
        """``PUT /api/providers/{name}`` (an upsert!) with ``body``; returns the record the gateway answers.

        ``timeout`` defaults to 30 s: the gateway checks the base URL's DNS (up to 5 s) and lists the
        upstream's models (up to 15 s) before it answers. ``body`` must not carry ``keys``.
        """
        if "keys" in body:
            raise ValueError("put_provider never sends keys; they are managed under /api/providers/{p}/keys")
        path = self.provider_path(name)
        response = self._request("PUT", path, body=body, timeout=timeout)
        return self._provider(self._json(response, "PUT", path), "PUT", path)

    def delete_provider(self, name: str) -> Literal["removed", "not-found"]:
        """``DELETE /api/providers/{name}``.

        Returns ``"removed"`` for the newest builds' 200 answer (a name-only record; the gateway
        no longer holds the record, whether or not it did before) and ``"not-found"`` for older
        builds' 404 ``Provider not found`` (it held no such record).
        """
        path = self.provider_path(name)
        response = self._request("DELETE", path, ok=(404,))
        if response.status_code == 404:
            return "not-found"
        data = self._json(response, "DELETE", path, allow_empty=True)
        if data is not None and not isinstance(data, dict):
            raise self._shape_error("DELETE", path, "a provider object", data)
        return "removed"

    def put_config(self, body: dict[str, Any]) -> dict[str, Any]:
        """``PUT /api/config`` with ``body`` (send the full client_config: most fields are copied as sent)."""
        path = "/api/config"
        response = self._request("PUT", path, body=body)
        data = self._json(response, "PUT", path, allow_empty=True)
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise self._shape_error("PUT", path, "a JSON object", data)
        return data


def _envelope(response: httpx.Response) -> tuple[str, str | None]:
    """(message, error type) from Bifrost's error envelope, or a short stand-in when there is none."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
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


def _describe(value: Any) -> str:
    """What a JSON value is, without quoting its content."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        keys = ", ".join(sorted(str(k) for k in value)[:6])
        return f"an object with keys [{keys}]" if keys else "an empty object"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return f"a JSON {type(value).__name__}"


def _transport_reason(err: httpx.TransportError) -> str:
    """A short reason for a transport failure (the exception's own text names no header or body)."""
    text = " ".join(str(err).split())[:200]
    name = type(err).__name__
    return f"{name}: {text}" if text else name


# -- DNS reachability -----------------------------------------------------------------------------

def _system_lookup(host: str) -> None:
    socket.getaddrinfo(host, None)


@dataclass
class _Answer:
    resolves: bool
    error: str | None
    at: float


class HostResolver:
    """Checks whether hosts resolve, concurrently, each lookup bounded, answers cached for a short TTL.

    ``lookup(host)`` raises ``OSError`` (or anything) when the host does not resolve; the default is
    ``socket.getaddrinfo``. A lookup still running after ``timeout`` seconds is abandoned (its
    daemon thread finishes on its own) and the host counts as not resolving.
    """

    def __init__(self, lookup: Callable[[str], Any] | None = None, *, timeout: float = DNS_TIMEOUT_SECONDS,
                 ttl: float = DNS_CACHE_TTL_SECONDS) -> None:
        self.lookup = lookup or _system_lookup
        self.timeout = timeout
        self.ttl = ttl
        self._cache: dict[str, _Answer] = {}
        self._lock = threading.Lock()

    def _resolve(self, host: str) -> tuple[bool, str | None]:
        try:
            self.lookup(host)
        except socket.gaierror as err:
            return False, err.strerror or str(err)
        except Exception as err:  # any failure means "does not resolve from here"
            return False, str(err) or type(err).__name__
        return True, None

    def _lookup_all(self, hosts: list[str], concurrency: int) -> list[tuple[bool, str | None]]:
        """Look ``hosts`` up on at most ``concurrency`` daemon threads at a time, each lookup bounded by
        ``timeout``: one still running then is abandoned (its thread finishes on its own and leaves the
        queue to a fresh thread), and its host counts as not resolving. A few threads serve every host,
        instead of one thread per lookup."""
        results: dict[int, tuple[bool, str | None]] = {}
        queue = deque(enumerate(hosts))
        running: dict[int, float] = {}  # index -> when its lookup started (monotonic)
        cond = threading.Condition()

        def worker() -> None:
            while True:
                with cond:
                    if not queue:
                        return
                    index, host = queue.popleft()
                    running[index] = time.monotonic()
                outcome = self._resolve(host)
                with cond:
                    abandoned = running.pop(index, None) is None
                    if not abandoned:
                        results[index] = outcome
                    cond.notify_all()
                if abandoned:
                    return

        def spawn() -> None:
            threading.Thread(target=worker, name="gatewayscope-dns", daemon=True).start()

        for _ in range(max(1, min(concurrency, len(hosts)))):
            spawn()
        with cond:
            while len(results) < len(hosts):
                now = time.monotonic()
                for index, started in list(running.items()):
                    if now - started >= self.timeout:
                        del running[index]
                        results[index] = (False, f"lookup timed out after {self.timeout:g} s")
                        spawn()
                wake = min(running.values(), default=now) + self.timeout
                cond.wait(timeout=max(0.001, wake - now))
        return [results[index] for index in range(len(hosts))]

    def check(self, hosts: Iterable[str], *, concurrency: int = 8, now: float | None = None) -> pl.DataFrame:
        """A REACHABILITY_SCHEMA frame for the distinct ``hosts``, looked up ``concurrency`` at a time.

        ``now`` (epoch seconds, default the wall clock) stamps new answers and ages cached ones.
        """
        stamp = time.time() if now is None else now
        wanted = sorted({h for h in hosts if h})
        answers: dict[str, _Answer] = {}
        missing: list[str] = []
        with self._lock:
            for host in wanted:
                cached = self._cache.get(host)
                if cached is not None and 0 <= stamp - cached.at < self.ttl:
                    answers[host] = cached
                else:
                    missing.append(host)
        if missing:
            results = self._lookup_all(missing, concurrency)
            with self._lock:
                for host, (resolves, error) in zip(missing, results, strict=True):
                    answer = _Answer(resolves, error, stamp)
                    self._cache[host] = answer
                    answers[host] = answer
        rows = [(host, answers[host].resolves, answers[host].error) for host in wanted]
        return frame_from_rows(rows, REACHABILITY_SCHEMA)


#: the process-wide resolver (and cache) read_bifrost uses unless told otherwise
DEFAULT_RESOLVER = HostResolver()


# -- the read -------------------------------------------------------------------------------------

def _int_field(block: Any, key: str, default: int, name: str) -> int:
    if not isinstance(block, dict):
        return default
    value = block.get(key)
    if type(value) is int:  # the usual answer
        return value
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise BadResponseError(
            f"Bifrost's record {name!r} has a {key} that is not a whole number ({_describe(value)})."
        )
    return int(value)


def record_row(record: dict[str, Any], *, fingerprint: bool = True) -> dict[str, Any]:
    """One RECORDS_SCHEMA row from a provider record as the API returns it (secrets never copied).

    ``fingerprint=False`` leaves the row's ``fingerprint`` null: the hash of the sanitized record costs
    about as much as the rest of the row, and only a plan needs it.

    >>> row = record_row({"name": "acme__m", "custom_provider_config": {"base_provider_type": "openai"},
    ...                   "network_config": {"base_url": "http://h.example/v1"},
    ...                   "concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024},
    ...                   "provider_status": "active"})
    >>> keys = ("name", "is_custom", "base_provider_type", "concurrency", "buffer_size", "base_url")
    >>> {k: row[k] for k in keys}
    {'name': 'acme__m', 'is_custom': True, 'base_provider_type': 'openai', 'concurrency': 64, \
'buffer_size': 1024, 'base_url': 'http://h.example/v1'}
    """
    name = record["name"]
    custom = record.get("custom_provider_config")
    is_custom = isinstance(custom, dict)
    pool = record.get("concurrency_and_buffer_size")
    network = record.get("network_config")
    base_url = network.get("base_url") if isinstance(network, dict) else None
    status = record.get("provider_status")
    return {
        "name": name,
        "is_custom": is_custom,
        "base_provider_type": (custom or {}).get("base_provider_type") if is_custom else None,
        "concurrency": _int_field(pool, "concurrency", DEFAULT_CONCURRENCY, name),
        "buffer_size": _int_field(pool, "buffer_size", DEFAULT_BUFFER_SIZE, name),
        "base_url": redact_url(base_url) if isinstance(base_url, str) and base_url else None,
        "provider_status": status if isinstance(status, str) else None,
        # everything but the pool itself, so a plan can tell "changed since planned" from "resized"
        "fingerprint": record_fingerprint(record, exclude=POOL_FIELDS) if fingerprint else None,
    }


def client_for(target: Target, *, transport: httpx.BaseTransport | None = None) -> BifrostClient:
    """A client for ``target`` with its timeout and (resolved now) credentials."""
    if not target.url:
        raise SourceError(f"Target {target.name!r} has no url; a bifrost target is read over HTTP.")
    auth = target.auth.resolve() if target.auth is not None else None
    source = auth_source_text(target.auth) if target.auth is not None else None
    return BifrostClient(target.url, auth=auth, timeout=target.timeout_seconds, transport=transport,
                         auth_source=source, max_body_bytes=target.max_body_bytes)


def read_bifrost(
    target: Target,
    policy: Policy,
    *,
    transport: httpx.BaseTransport | None = None,
    resolver: HostResolver | Callable[[str], Any] | None = None,
    now: float | None = None,
    fingerprints: bool = True,
) -> BifrostData:
    """Read one Bifrost gateway into a :class:`BifrostData` (sanitized records, safe client settings).

    Lists the provider records, reads the global config, health and version, and checks whether each
    distinct base URL host resolves from here (``target.concurrency`` lookups at once, each bounded).
    ``resolver`` is a :class:`HostResolver`, or a plain ``lookup(host)`` callable that raises when the
    host does not resolve (wrapped in a fresh resolver without the process cache); ``now`` (epoch
    seconds, the snapshot's time) stamps and ages the DNS cache. ``policy`` is accepted for symmetry
    with the other sources; reading does not depend on it. ``fingerprints=False`` skips each record's
    plan fingerprint (a read that only reports, like the exporter's, has no use for it; a plan refuses
    such a read). Raises the client's typed errors when the listing or config fails; a failing health or
    version check is recorded in ``health``/``version``.
    """
    del policy  # the read is the same under every policy
    with client_for(target, transport=transport) as client:
        providers = client.list_providers()
        config = client.get_config()
        try:
            health: str | None = client.health()
        except (HTTPStatusError, BadResponseError) as err:
            health = f"unhealthy: {err}"
        try:
            version: str | None = client.version()
        except (HTTPStatusError, BadResponseError):
            version = None
    with gc_paused():
        records = frame_from_rows([record_row(record, fingerprint=fingerprints) for record in providers],
                                  RECORDS_SCHEMA)
    # each distinct base URL once: a listing repeats a few hundred of them over thousands of records
    urls = records.select(pl.col("base_url").unique())
    hosts = urls.select(base_url_host(pl.col("base_url")).alias("host"))["host"].drop_nulls().to_list()
    if isinstance(resolver, HostResolver):
        checker = resolver
    elif resolver is not None:
        checker = HostResolver(resolver)
    else:
        checker = DEFAULT_RESOLVER
    reachability = checker.check(hosts, concurrency=target.concurrency, now=now)
    auth_config = config.get("auth_config")
    auth_enabled = auth_config.get("is_enabled") if isinstance(auth_config, dict) else None
    return BifrostData(
        records=records,
        client_config=safe_client_config(config["client_config"]),
        reachability=reachability,
        version=version,
        health=health,
        auth_enabled=auth_enabled if isinstance(auth_enabled, bool) else None,
    )
