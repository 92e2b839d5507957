"""Bifrost's management API, split by job: the HTTP plumbing and its errors (:mod:`.client`), the read that
turns a gateway into a BifrostData (:mod:`.read`), the writes apply makes (:mod:`.write`), secret redaction and
record fingerprints (:mod:`.redact`), the DNS checks of base URL hosts (:mod:`.dns`), and the gateway's own
runtime metrics (:mod:`.metrics`).

The names callers use are importable from here; each submodule loads on first use of one of its names (the
client alone loads httpx, which a scan of rLLM stores only does not need).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gatewayscope.sources.bifrost.client import (
        DROPPED_MESSAGE,
        BifrostApi,
        RequestDroppedError,
        auth_source_text,
    )
    from gatewayscope.sources.bifrost.dns import (
        DEFAULT_RESOLVER,
        DNS_CACHE_TTL_SECONDS,
        DNS_TIMEOUT_SECONDS,
        HostResolver,
        base_url_host,
    )
    from gatewayscope.sources.bifrost.metrics import (
        METRICS_MAX_BODY_BYTES,
        parse_runtime_metrics,
        read_runtime_metrics,
    )
    from gatewayscope.sources.bifrost.read import (
        DEFAULT_BUFFER_SIZE,
        DEFAULT_CONCURRENCY,
        BifrostReader,
        read_bifrost,
        reader_for,
        record_row,
    )
    from gatewayscope.sources.bifrost.redact import (
        POOL_FIELDS,
        SAFE_CLIENT_CONFIG_KEYS,
        record_fingerprint,
        redact_url,
        safe_client_config,
        sanitize_record,
        secret_hash,
    )
    from gatewayscope.sources.bifrost.write import PUT_PROVIDER_TIMEOUT, BifrostClient, client_for

__all__ = [
    "DEFAULT_BUFFER_SIZE",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_RESOLVER",
    "DNS_CACHE_TTL_SECONDS",
    "DNS_TIMEOUT_SECONDS",
    "DROPPED_MESSAGE",
    "METRICS_MAX_BODY_BYTES",
    "POOL_FIELDS",
    "PUT_PROVIDER_TIMEOUT",
    "SAFE_CLIENT_CONFIG_KEYS",
    "BifrostApi",
    "BifrostClient",
    "BifrostReader",
    "HostResolver",
    "RequestDroppedError",
    "auth_source_text",
    "base_url_host",
    "client_for",
    "parse_runtime_metrics",
    "read_bifrost",
    "read_runtime_metrics",
    "reader_for",
    "record_fingerprint",
    "record_row",
    "redact_url",
    "safe_client_config",
    "sanitize_record",
    "secret_hash",
]

#: the submodule that defines each name
_SOURCES: dict[str, str] = {
    "BifrostApi": "client",
    "BifrostClient": "write",
    "BifrostReader": "read",
    "DEFAULT_BUFFER_SIZE": "read",
    "DEFAULT_CONCURRENCY": "read",
    "DEFAULT_RESOLVER": "dns",
    "DNS_CACHE_TTL_SECONDS": "dns",
    "DNS_TIMEOUT_SECONDS": "dns",
    "DROPPED_MESSAGE": "client",
    "HostResolver": "dns",
    "METRICS_MAX_BODY_BYTES": "metrics",
    "POOL_FIELDS": "redact",
    "PUT_PROVIDER_TIMEOUT": "write",
    "RequestDroppedError": "client",
    "SAFE_CLIENT_CONFIG_KEYS": "redact",
    "auth_source_text": "client",
    "base_url_host": "dns",
    "client_for": "write",
    "parse_runtime_metrics": "metrics",
    "read_runtime_metrics": "metrics",
    "read_bifrost": "read",
    "reader_for": "read",
    "record_fingerprint": "redact",
    "record_row": "read",
    "redact_url": "redact",
    "safe_client_config": "redact",
    "sanitize_record": "redact",
    "secret_hash": "redact",
}


def __getattr__(name: str) -> Any:
    """Load a name's submodule on first use."""
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
