"""Bifrost's management API, split by job: the HTTP plumbing and its errors (:mod:`.client`), the read that
turns a gateway into a BifrostData (:mod:`.read`), the writes apply makes (:mod:`.write`), secret redaction and
record fingerprints (:mod:`.redact`), and the DNS checks of base URL hosts (:mod:`.dns`).

The names callers use are importable from here.
"""

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
    "read_bifrost",
    "reader_for",
    "record_fingerprint",
    "record_row",
    "redact_url",
    "safe_client_config",
    "sanitize_record",
    "secret_hash",
]
