"""Tombstone backfill and lift, for a SQLite trace store or a guarded gateway's HTTP routes.

Backfill records tombstones for ids known to be deleted (orphans about to be deleted, ids from a file)
and deletes nothing. Record the tombstone first, then delete the session: a straggler that lands
between the two is dropped instead of resurrecting it.

A target is either the path of the gateway's SQLite file (the guard's triggers installed with
``gatewayscope guard install``) or the http(s) URL of a guarded gateway (``gatewayscope gateway``),
whose routes are:

* ``GET /guard/status`` -> ``{"enabled", "tombstones", "capacity", "dropped_writes", "evicted",
  "top_droppers": [{"session_id", "dropped"}]}``
* ``POST /guard/tombstones`` ``{"session_ids": [...]}`` -> ``{"added", "already", "tombstones"}``
* ``POST /guard/tombstones/check`` ``{"session_ids": [...]}`` -> ``{"tombstoned": [...]}``
* ``DELETE /guard/tombstones/{session_id}`` -> ``{"lifted": bool}``

The unmodified ``rllm-model-gateway`` has none of these (404): the error says to run it with
``gatewayscope gateway`` instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from gatewayscope._files import MAX_IDS_BYTES, read_text
from gatewayscope.config import DEFAULT_MAX_BODY_BYTES, is_remote_address
from gatewayscope.errors import BadResponseError, GatewayscopeError, NotFoundError
from gatewayscope.guard import sqlite as sqlite_guard
from gatewayscope.guard.common import DEFAULT_TIMEOUT
from gatewayscope.sources._batches import batches
from gatewayscope.sources._http import HttpClient, path_segment

#: session ids per POST to a guarded gateway
HTTP_BATCH = 5_000


@dataclass
class BackfillResult:
    """Tombstones recorded now (``new``), ids that had one already, and the target's total afterwards."""

    new: int
    already: int
    total: int | None = None

    @property
    def message(self) -> str:
        """One sentence for the user."""
        text = f"{self.new:,} new tombstones, {self.already:,} already tombstoned"
        if self.total is not None:
            text += f"; {self.total:,} tombstones in total"
        return text + "."


def read_ids_stream(stream: BinaryIO) -> list[str]:
    """Session ids from a stream (stdin), as :func:`read_ids_file` reads a file: at most ``MAX_IDS_BYTES`` of
    UTF-8 text, else GatewayscopeError (a stream such as ``/dev/zero`` would fill memory)."""
    raw = stream.read(MAX_IDS_BYTES + 1)
    if len(raw) > MAX_IDS_BYTES:
        raise GatewayscopeError(f"The ids on stdin are more than {MAX_IDS_BYTES // 2**20} MiB; give a file of "
                                "session ids, one per line, in parts.")
    try:
        return _ids(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise GatewayscopeError("The ids on stdin are not UTF-8 text; give session ids, one per line.") from None


def _ids(text: str) -> list[str]:
    return [sid for sid in (line.strip() for line in text.splitlines()) if sid and not sid.startswith("#")]


def read_ids_file(path: str | Path) -> list[str]:
    """Session ids from a text file: one per line, whitespace stripped, blank lines and ``#`` comments
    skipped (a line whose first non-blank character is ``#``). Raises GatewayscopeError when unreadable."""
    try:
        text = read_text(path, limit=MAX_IDS_BYTES)
    except FileNotFoundError:
        raise GatewayscopeError(f"{path}: no such ids file (one session id per line).") from None
    except IsADirectoryError:
        raise GatewayscopeError(f"{path} is a folder; give a text file of session ids, one per line.") from None
    except UnicodeDecodeError:
        raise GatewayscopeError(f"{path} is not UTF-8 text; give a text file of session ids, one per line.") \
            from None
    except OSError as err:
        raise GatewayscopeError(f"Cannot read the ids file {path}: {err.strerror or err}.") from None
    return _ids(text)


# -- HTTP ----------------------------------------------------------------------------------------


class _GuardClient(HttpClient):
    """The guarded gateway's ``/guard`` routes, errors mapped to the family by :class:`HttpClient`.

    Each request's timeout bounds the whole exchange and its answer is read up to ``max_body_bytes`` (see
    :func:`gatewayscope.sources._http.exchange`); ``client`` is the httpx seam (the caller's, left open)."""

    server = "The guarded gateway"
    timeout_sentence = ("{method} {url} got no whole answer within {seconds:g} s; raise the timeout if the gateway "
                        "is busy, or check that it is healthy.")
    unreachable_sentence = "Cannot reach {base_url} ({error}); is the gateway running?"
    status_url = "{url}"

    def __init__(self, base_url: str, *, timeout: float, client: httpx.Client | None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        super().__init__(base_url, timeout=timeout, client=client, max_body_bytes=max_body_bytes)

    def request(self, method: str, path: str, *, json_body: Any = None) -> Any:
        """One request; its parsed JSON, or a typed error with a sentence."""
        response = self.send(method, path, json_body=json_body)
        parsed, body = self.parse_json(response)
        if not parsed:
            raise BadResponseError(f"{method} {self.base_url}{path} did not answer JSON: {response.text[:200]!r}")
        return body

    def require_guard(self) -> dict[str, Any]:
        """``GET /guard/status``; a clear error when the gateway has no guard routes."""
        try:
            body = self.request("GET", "/guard/status")
        except NotFoundError:
            raise GatewayscopeError(
                f"{self.base_url} has no tombstone guard (GET /guard/status: 404): it is an unguarded "
                "gateway. Run it with 'gatewayscope gateway' (same flags) instead of 'rllm-model-gateway', "
                "or point at its SQLite file after 'gatewayscope guard install PATH'."
            ) from None
        if not isinstance(body, dict) or not isinstance(body.get("tombstones"), int):
            raise BadResponseError(f"GET {self.base_url}/guard/status did not return the guard's status object.")
        return body


def _clean(session_ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(sid for sid in (str(s).strip() for s in session_ids) if sid))


def _backfill_http(url: str, ids: list[str], *, timeout: float, client: httpx.Client | None) -> BackfillResult:
    guard = _GuardClient(url, timeout=timeout, client=client)
    try:
        status = guard.require_guard()
        total: int | None = int(status["tombstones"])
        new = already = 0
        for batch in batches(ids, HTTP_BATCH):
            body = guard.request("POST", "/guard/tombstones", json_body={"session_ids": batch})
            if not isinstance(body, dict) or not all(isinstance(body.get(k), int) for k in ("added", "already")):
                raise BadResponseError(f"POST {guard.base_url}/guard/tombstones did not return "
                                       '{"added": n, "already": m, "tombstones": total}.')
            new += body["added"]
            already += body["already"]
            total = body["tombstones"] if isinstance(body.get("tombstones"), int) else None
        return BackfillResult(new=new, already=already, total=total)
    finally:
        guard.close()


def backfill_tombstones(target: str, session_ids: Iterable[str], *, timeout: float = DEFAULT_TIMEOUT,
                        client: httpx.Client | None = None) -> BackfillResult:
    """Record tombstones for ``session_ids`` at ``target`` (a SQLite path or a guarded gateway URL).

    Ids are stripped, blanks dropped and duplicates counted once. Idempotent: ids that already carry a
    tombstone count as ``already``. Nothing is deleted. Over HTTP the ids go ``HTTP_BATCH`` per request
    (``client`` is the httpx seam; ``timeout`` is per request); on SQLite ``timeout`` is the busy timeout.
    """
    ids = _clean(session_ids)
    if is_remote_address(target):
        return _backfill_http(target, ids, timeout=timeout, client=client)
    new, already = sqlite_guard.add_tombstones(target, ids, busy_timeout=timeout)
    return BackfillResult(new=new, already=already, total=sqlite_guard.tombstone_count(target, busy_timeout=timeout))


def lift(target: str, session_id: str, *, timeout: float = DEFAULT_TIMEOUT,
         client: httpx.Client | None = None) -> bool:
    """Lift the tombstone of ``session_id`` at ``target`` (SQLite path or guarded gateway URL).

    The remedy for an rLLM retry that reuses a deleted uid. Returns False when it had no tombstone.
    """
    if not is_remote_address(target):
        return sqlite_guard.lift_tombstone(target, session_id, busy_timeout=timeout)
    guard = _GuardClient(target, timeout=timeout, client=client)
    try:
        guard.require_guard()
        body = guard.request("DELETE", f"/guard/tombstones/{path_segment(session_id)}")
        if not isinstance(body, dict) or not isinstance(body.get("lifted"), bool):
            raise BadResponseError(f"DELETE {guard.base_url}/guard/tombstones/... did not return "
                                   '{"lifted": true|false}.')
        return bool(body["lifted"])
    finally:
        guard.close()


def remote_status(url: str, *, timeout: float = DEFAULT_TIMEOUT, client: httpx.Client | None = None) -> dict[str, Any]:
    """The guarded gateway's ``GET /guard/status`` body (a clear error when the gateway is unguarded)."""
    guard = _GuardClient(url, timeout=timeout, client=client)
    try:
        return guard.require_guard()
    finally:
        guard.close()
