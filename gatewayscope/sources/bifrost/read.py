"""Reading one Bifrost gateway into a :class:`~gatewayscope.snapshot.BifrostData`.

:class:`BifrostReader` holds the API's reads; :func:`read_bifrost` lists the provider records, reads the global
config, health and version, keeps only sanitized records and non-secret client settings, and checks whether
each distinct base URL host resolves from here.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import polars as pl

from gatewayscope.config import Policy, Target
from gatewayscope.errors import BadResponseError, HTTPStatusError
from gatewayscope.snapshot import RECORDS_SCHEMA, BifrostData, frame_from_rows
from gatewayscope.sources._gcpause import gc_paused
from gatewayscope.sources.bifrost.client import BifrostApi, describe_json
from gatewayscope.sources.bifrost.dns import DEFAULT_RESOLVER, HostResolver, base_url_host
from gatewayscope.sources.bifrost.metrics import read_runtime_metrics
from gatewayscope.sources.bifrost.redact import POOL_FIELDS, record_fingerprint, redact_url, safe_client_config

#: the gateway's defaults when a record leaves its pool unset (core DefaultConcurrency/DefaultBufferSize)
DEFAULT_CONCURRENCY = 1000
DEFAULT_BUFFER_SIZE = 5000


class BifrostReader(BifrostApi):
    """The reads of one Bifrost management API (see :class:`~gatewayscope.sources.bifrost.client.BifrostApi`)."""

    def list_providers(self) -> list[dict[str, Any]]:
        """``GET /api/providers``: every provider record (secrets masked by the gateway, keys dropped)."""
        path = "/api/providers"
        data = self._json(self.send("GET", path), "GET", path)
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
        return self._provider(self._json(self.send("GET", path), "GET", path), "GET", path)

    def get_config(self) -> dict[str, Any]:
        """``GET /api/config``: the whole answer (client_config, auth_config with a masked password, ...)."""
        path = "/api/config"
        data = self._json(self.send("GET", path), "GET", path)
        if not isinstance(data, dict) or not isinstance(data.get("client_config"), dict):
            raise self._shape_error("GET", path, 'an object with a "client_config" object', data)
        return data

    def health(self) -> str:
        """``GET /health`` (always public): the status it reports, ``"ok"`` when healthy."""
        path = "/health"
        data = self._json(self.send("GET", path), "GET", path)
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise self._shape_error("GET", path, 'an object {"status": "ok"}', data)
        return str(data["status"])

    def version(self) -> str:
        """``GET /api/version``: the build version string, as the gateway spells it."""
        path = "/api/version"
        data = self._json(self.send("GET", path), "GET", path)
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            return str(data["version"])
        if not isinstance(data, str):
            raise self._shape_error("GET", path, "a JSON string holding the version", data)
        return data


def reader_for(target: Target, *, transport: httpx.BaseTransport | None = None) -> BifrostReader:
    """A reader for ``target`` with its timeout and (resolved now) credentials."""
    return BifrostReader(**BifrostApi.arguments_for(target), transport=transport)


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
            f"Bifrost's record {name!r} has a {key} that is not a whole number ({describe_json(value)})."
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


def _read_management(target: Target, transport: httpx.BaseTransport | None
                     ) -> tuple[list[dict[str, Any]], dict[str, Any], str | None, str | None]:
    """(providers, config, health, version) from the management API."""
    with reader_for(target, transport=transport) as client:
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
    return providers, config, health, version


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

    Lists the provider records, reads the global config, health and version, the gateway's own runtime
    metrics (optional: a failure there is kept as ``runtime_error`` and the read goes on; see
    :mod:`~gatewayscope.sources.bifrost.metrics`), and checks whether each distinct base URL host resolves
    from here (``target.concurrency`` lookups at once, each bounded).
    ``resolver`` is a :class:`HostResolver`, or a plain ``lookup(host)`` callable that raises when the
    host does not resolve (wrapped in a fresh resolver without the process cache); ``now`` (epoch
    seconds, the snapshot's time) stamps and ages the DNS cache. ``policy`` is accepted for symmetry
    with the other sources; reading does not depend on it. ``fingerprints=False`` skips each record's
    plan fingerprint (a read that only reports, like the exporter's, has no use for it; a plan refuses
    such a read). Raises the client's typed errors when the listing or config fails; a failing health or
    version check is recorded in ``health``/``version``.
    """
    del policy  # the read is the same under every policy
    # the metrics come from another route (or host): read them while the management API is read
    auth = target.auth.resolve() if target.auth is not None else None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gatewayscope-bifrost-metrics") as pool:
        metrics = pool.submit(read_runtime_metrics, target, transport=transport, auth=auth)
        providers, config, health, version = _read_management(target, transport)
        runtime, runtime_error = metrics.result()
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
        runtime=runtime,
        runtime_error=runtime_error,
    )
