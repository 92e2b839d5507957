"""Writing to one Bifrost gateway: the pool and config writes apply makes, one attempt each, no retries."""

from __future__ import annotations

from typing import Any, Literal

import httpx

from gatewayscope.config import Target
from gatewayscope.sources.bifrost.client import BifrostApi
from gatewayscope.sources.bifrost.read import BifrostReader

#: a pool write's budget: the gateway's DNS check of the base URL (up to 5 s), its listing of the upstream's
#: models (up to 15 s), and a margin
PUT_PROVIDER_TIMEOUT = 30.0


class BifrostClient(BifrostReader):
    """One Bifrost management API, read and written (see
    :class:`~gatewayscope.sources.bifrost.client.BifrostApi`)."""

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
        response = self.send("PUT", path, json_body=body, timeout=timeout)
        return self._provider(self._json(response, "PUT", path), "PUT", path)

    def delete_provider(self, name: str) -> Literal["removed", "not-found"]:
        """``DELETE /api/providers/{name}``.

        Returns ``"removed"`` for the newest builds' 200 answer (a name-only record; the gateway
        no longer holds the record, whether or not it did before) and ``"not-found"`` for older
        builds' 404 ``Provider not found`` (it held no such record).
        """
        path = self.provider_path(name)
        response = self.send("DELETE", path, ok=(404,))
        if response.status_code == 404:
            return "not-found"
        data = self._json(response, "DELETE", path, allow_empty=True)
        if data is not None and not isinstance(data, dict):
            raise self._shape_error("DELETE", path, "a provider object", data)
        return "removed"

    def put_config(self, body: dict[str, Any]) -> dict[str, Any]:
        """``PUT /api/config`` with ``body`` (send the full client_config: most fields are copied as sent)."""
        path = "/api/config"
        response = self.send("PUT", path, json_body=body)
        data = self._json(response, "PUT", path, allow_empty=True)
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise self._shape_error("PUT", path, "a JSON object", data)
        return data


def client_for(target: Target, *, transport: httpx.BaseTransport | None = None) -> BifrostClient:
    """A client for ``target`` with its timeout and (resolved now) credentials."""
    return BifrostClient(**BifrostApi.arguments_for(target), transport=transport)
