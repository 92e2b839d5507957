"""Keeping Bifrost's secrets out of everything gatewayscope keeps: sanitized records, fingerprints, safe settings.

Secrets never leave the Bifrost source in the clear: :func:`sanitize_record` replaces every secret-bearing
field of a provider record by a short hash of the (already masked) value, :func:`record_fingerprint` hashes
only the sanitized record, and :func:`safe_client_config` keeps only the client settings known to be safe.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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
