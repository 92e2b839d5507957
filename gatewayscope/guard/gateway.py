"""The guarded rLLM gateway: the real ``rllm-model-gateway`` app with the tombstone guard inside.

A drop-in for the ``rllm-model-gateway`` command. It takes the same flags (``--host``, ``--port``,
``--config``, ``--worker`` (repeatable), ``--db-path``, ``--store``, ``--log-level``) with the same
defaults, reads them with rLLM's own config loader (so ``RLLM_GATEWAY_*`` env vars and the YAML file
behave identically), builds the store rLLM would build, wraps it in a
:class:`~gatewayscope.guard.memory.GuardedTraceStore` (``--max-tombstones N``, default 1,000,000,
``0`` disables the guard), and serves rLLM's own app with uvicorn exactly as rLLM's ``main`` does.

What it adds to the gateway:

* every proxied request is stamped with the moment it reached the gateway (an outermost ASGI middleware), and
  the stamp follows it into the fire-and-forget persist task, so the guard tells a straggler (its request came
  before its session's latest delete: dropped) from a new use of the id (after it: kept) exactly;
* ``GET /guard/status``, ``POST /guard/tombstones`` (backfill), ``POST /guard/tombstones/check``,
  ``DELETE /guard/tombstones/{session_id}``;
* with ``--store memory``, ``POST /guard/index``: the orphan index the guard keeps in process (the store's
  totals and, a page at a time, the sessions a scan reads, with what it uses of their traces on request), so
  a scan neither lists every session nor reads its candidates' traces whole;
* ``GET /metrics`` with the guard's figures (``gatewayscope_guard_*``), from a private registry.

With ``--store sqlite`` the guard works the same way, but its tombstones live in this process's memory
and are gone after a restart. For a guard kept inside the database file (which also protects an
unmodified gateway), install the triggers with ``gatewayscope guard install``.

Run it as ``gatewayscope gateway ...`` or ``python -m gatewayscope.guard.gateway ...``. Nothing here
imports the rLLM gateway (or FastAPI) until an app is built, so the CLI works without it.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import errno
import inspect
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gatewayscope._argtypes import checked_number
from gatewayscope._files import MAX_CONFIG_BYTES, UnreadableFileError, check_regular
from gatewayscope.errors import ConfigError, GatewayscopeError
from gatewayscope.guard.memory import (
    DEFAULT_MAX_TOMBSTONES,
    DEFAULT_TOP_DROPPERS,
    REQUEST_ARRIVAL,
    GuardedTraceStore,
)
from gatewayscope.sources.rllm_trace import trace_summary

if TYPE_CHECKING:  # pragma: no cover - typing only
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)

INSTALL_HINT = "install it with: pip install 'gatewayscope[gateway]'"

#: metric name -> HELP; the names are a public contract (dashboards and alerts use them)
METRIC_HELP = {
    "gatewayscope_guard_tombstones": (
        "Deleted session ids the guard remembers right now, each with the moment of its latest delete; a trace "
        "write for one of them whose request reached the gateway before that moment is dropped instead of "
        "re-creating the session as an orphan."
    ),
    "gatewayscope_guard_tombstone_capacity": (
        "Most tombstones the guard keeps (--max-tombstones); beyond it the oldest is evicted. "
        "0 means the guard is disabled and deleted sessions can be resurrected."
    ),
    "gatewayscope_guard_dropped_writes": (
        "Trace writes dropped since the gateway started because their request reached the gateway before "
        "their session's latest delete (stragglers that would have left a one-trace orphan session)."
    ),
    "gatewayscope_guard_kept_after_fence_writes": (
        "Trace writes kept since the gateway started for a deleted session id because their request reached "
        "the gateway after its latest delete: new uses of the id (rLLM reuses ids across steps and retries)."
    ),
    "gatewayscope_guard_tombstones_evicted": (
        "Tombstones evicted (oldest first) since the gateway started to stay within the capacity; "
        "a late write for an evicted id re-creates its session."
    ),
}


# ------------------------------------------------------------------------------------------------
# Flags and config (no rLLM import needed to declare the flags)
# ------------------------------------------------------------------------------------------------


def _non_negative_int(text: str) -> int:
    return checked_number(text, int, lambda value: value >= 0, "expected a whole number >= 0, not {text!r}",
                          "expected a whole number >= 0 (0 disables the guard), not {value}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``rllm-model-gateway``'s flags (same names, same defaults) plus ``--max-tombstones``."""
    parser.add_argument("--host", type=str, default=None,
                        help="address to listen on (rLLM's default: 0.0.0.0; env RLLM_GATEWAY_HOST)")
    parser.add_argument("--port", type=int, default=None,
                        help="port to listen on (rLLM's default: 9090; env RLLM_GATEWAY_PORT)")
    parser.add_argument("--config", type=str, default=None, help="Path to YAML config (rLLM's GatewayConfig)")
    parser.add_argument("--worker", type=str, action="append",
                        help="Worker URL (can be repeated)")
    parser.add_argument("--db-path", type=str, default=None,
                        help="SQLite file for --store sqlite (rLLM's default: ~/.rllm/gateway_traces.db)")
    parser.add_argument("--store", type=str, default=None, choices=["sqlite", "memory"],
                        help="trace store (rLLM 0.1.0's default: sqlite; env RLLM_GATEWAY_STORE)")
    parser.add_argument("--log-level", type=str, default=None, help="log level (default: INFO)")
    parser.add_argument(
        "--max-tombstones", type=_non_negative_int, default=DEFAULT_MAX_TOMBSTONES, metavar="N",
        help=(f"most deleted session ids the guard remembers, oldest evicted first "
              f"(default: {DEFAULT_MAX_TOMBSTONES:,}); 0 disables the guard (rLLM's own behaviour)"),
    )
    parser.add_argument(
        "--discovery-dir", metavar="DIR", default=None,
        help="announce this gateway in DIR while it serves (a Prometheus file_sd JSON file), so an exporter "
             "with discovery_dir = DIR finds it")


def build_parser(prog: str = "python -m gatewayscope.guard.gateway") -> argparse.ArgumentParser:
    """The launcher's parser (the same flags as ``gatewayscope gateway``)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=("rllm-model-gateway with gatewayscope's tombstone guard: "
                     "same flags, plus --max-tombstones."),
    )
    add_arguments(parser)
    return parser


def require_gateway() -> None:
    """Raise a :class:`GatewayscopeError` with the install command when the rLLM gateway is missing."""
    try:
        import rllm_model_gateway.server  # noqa: F401
    except ImportError as err:
        raise GatewayscopeError(
            f"The guarded gateway needs the rLLM model gateway, which cannot be imported ({err}); "
            f"{INSTALL_HINT}"
        ) from None


#: the first bytes of every SQLite database file
_SQLITE_HEADER = b"SQLite format 3\x00"


def _check_startup_file(flag: str, path: str) -> None:
    """Raise OSError (its ``strerror`` the reason) for a ``--config`` or ``--db-path`` file the gateway cannot use:
    not a regular file, a config over MAX_CONFIG_BYTES, a store path that is a folder or a file that is not SQLite
    (a missing store is fine: the gateway creates it)."""
    check_regular(path)
    if flag == "--config":
        if os.path.isfile(path) and os.path.getsize(path) > MAX_CONFIG_BYTES:
            raise UnreadableFileError(errno.EFBIG, f"it is larger than {MAX_CONFIG_BYTES // 2**20} MiB")
        return
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "it is a folder; give the path of the SQLite store's file")
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as handle:
            if handle.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                raise UnreadableFileError(errno.EINVAL, "it is not a SQLite database; give the gateway's store, "
                                                        "or a new path for a new one")


def load_config(args: argparse.Namespace) -> Any:
    """rLLM's ``GatewayConfig`` from the flags, env vars and YAML, read by rLLM's own ``_load_config``."""
    require_gateway()
    from rllm_model_gateway.server import _load_config

    # a FIFO or a device would block the gateway's open of them, or read without end, and the gateway opens its
    # store only at the first request: what would fail then is refused before it serves
    for flag, path in (("--config", args.config), ("--db-path", getattr(args, "db_path", None))):
        if path:
            try:
                _check_startup_file(flag, os.path.expanduser(path))
            except OSError as err:
                raise ConfigError(f"{flag} {path}: {err.strerror or err}.") from None
    try:
        config = _load_config(args)
    except OSError as err:
        raise ConfigError(f"Cannot read the gateway config file {args.config!r}: {err}") from None
    except Exception as err:  # pydantic ValidationError, yaml errors, a non-numeric RLLM_GATEWAY_PORT
        raise ConfigError(f"The gateway configuration is not valid: {err}") from None
    port = getattr(config, "port", 0)
    if isinstance(port, int) and not 0 <= port <= 65535:
        raise ConfigError(f"The gateway configuration is not valid: port {port} is not from 0 to 65535.")
    return config


# ------------------------------------------------------------------------------------------------
# The app
# ------------------------------------------------------------------------------------------------


def _check_store_protocol(store: Any) -> None:
    """The guard wraps rLLM 0.1.0's ``store_trace(trace_id, session_id, data)``; refuse anything else."""
    try:
        supported = "session_id" in inspect.signature(store.store_trace).parameters
    except (AttributeError, TypeError, ValueError):
        supported = False
    if not supported:
        raise GatewayscopeError(
            f"This rllm-model-gateway's trace store ({type(store).__name__}) does not have the 0.1.0 "
            "TraceStore API (store_trace(trace_id, session_id, data)) that the in-process guard wraps. "
            "Use the 0.1.0 release, or the SQLite trigger guard (gatewayscope guard install)."
        )


class ArrivalStamp:
    """Pure ASGI middleware: each HTTP request's handling, and every task it starts, sees when it reached the
    gateway (:data:`~gatewayscope.guard.memory.REQUEST_ARRIVAL`). It reads the clock once per request and
    touches nothing else."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        token = REQUEST_ARRIVAL.set(time.time())
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_ARRIVAL.reset(token)


class GuardCollector:
    """A prometheus-client collector: fresh ``gatewayscope_guard_*`` families from the guard per scrape.

    No label carries a session id (or any label at all): the per-session figures stay on
    ``/guard/status``.
    """

    def __init__(self, guard: GuardedTraceStore) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        """Yield the five families, read from one :meth:`GuardedTraceStore.stats` call."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.guard.stats()
        for name, value in (("gatewayscope_guard_tombstones", stats.tombstones),
                            ("gatewayscope_guard_tombstone_capacity", stats.capacity)):
            yield GaugeMetricFamily(name, METRIC_HELP[name], value=value)
        for name, value in (("gatewayscope_guard_dropped_writes", stats.dropped_writes),
                            ("gatewayscope_guard_kept_after_fence_writes", stats.kept_after_fence),
                            ("gatewayscope_guard_tombstones_evicted", stats.evicted)):
            yield CounterMetricFamily(name, METRIC_HELP[name], value=value)


def guard_registry(guard: GuardedTraceStore) -> CollectorRegistry:
    """A private registry holding only the guard's collector."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(GuardCollector(guard))
    return registry


def status_payload(guard: GuardedTraceStore) -> dict[str, Any]:
    """The body of ``GET /guard/status``; ``index`` is "ready" when ``POST /guard/index`` answers."""
    stats = guard.stats()
    return {
        "enabled": stats.enabled,
        "tombstones": stats.tombstones,
        "capacity": stats.capacity,
        "dropped_writes": stats.dropped_writes,
        "kept_after_fence": stats.kept_after_fence,
        "evicted": stats.evicted,
        "top_droppers": [{"session_id": str(d["session_id"]), "dropped": int(d["dropped"])}
                         for d in stats.top_droppers],
        "index": stats.index,
    }


#: most candidate sessions one ``POST /guard/index`` answer holds (the default and the cap of ``limit``)
INDEX_PAGE = 10_000
#: most ``session_ids`` one ``POST /guard/index`` request may name
INDEX_MAX_IDS = 100_000
#: most trace summaries one ``POST /guard/index`` answer holds: the page ends before the candidate that would pass
#: it, and a candidate with more traces than this gets none (the scan reads its traces through /traces/query)
INDEX_PAGE_SUMMARIES = 20_000
#: trace summaries made between two turns of the gateway's event loop (about one /traces/query batch of work)
SUMMARY_CHUNK = 200

_INDEX_SHAPE = ('{"idle_before": <epoch seconds> | null, "after": "<session id>" | null, "limit": <1..'
                f'{INDEX_PAGE}>, "session_ids": ["<session id>", ...], "summaries": true | false}}')


def parse_index_request(raw: bytes) -> tuple[float | None, str | None, int, list[str], bool]:
    """``(idle_before, after, limit, session_ids, summaries)`` of a ``POST /guard/index`` body, or ValueError with
    a message for the client. Every key is optional; other keys are ignored (the gateway's middleware adds some).

    >>> parse_index_request(b'{"idle_before": 100.5, "after": "a:0", "limit": 2}')
    (100.5, 'a:0', 2, [], False)
    """
    try:
        body = json.loads(raw) if raw else {}
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"the body must be JSON of the shape {_INDEX_SHAPE}") from None
    if not isinstance(body, dict):
        raise ValueError(f"the body must be a JSON object of the shape {_INDEX_SHAPE}")
    idle_before, after = body.get("idle_before"), body.get("after")
    limit, ids = body.get("limit", INDEX_PAGE), body.get("session_ids", [])
    summaries = body.get("summaries", False)
    if idle_before is not None and (isinstance(idle_before, bool) or not isinstance(idle_before, (int, float))
                                    or idle_before != idle_before):
        raise ValueError("idle_before must be a number (epoch seconds) or null")
    if after is not None and not isinstance(after, str):
        raise ValueError("after must be a session id string or null")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INDEX_PAGE:
        raise ValueError(f"limit must be a whole number from 1 to {INDEX_PAGE}")
    if not isinstance(ids, list) or len(ids) > INDEX_MAX_IDS or not all(isinstance(sid, str) for sid in ids):
        raise ValueError(f"session_ids must be a list of at most {INDEX_MAX_IDS:,} session id strings")
    if not isinstance(summaries, bool):
        raise ValueError("summaries must be true or false")
    return (float(idle_before) if idle_before is not None else None), after, limit, ids, summaries


async def _trace_summaries(guard: GuardedTraceStore, session_id: str) -> list[dict[str, Any]] | None:
    """The summaries of ``session_id``'s traces whose record names it (those a read through ``POST
    /traces/query`` keeps), read from the store as that route reads them; None when one cannot be summarized."""
    found: list[dict[str, Any]] = []
    for position, trace in enumerate(await guard.get_session_traces(session_id)):
        if position and position % SUMMARY_CHUNK == 0:
            await asyncio.sleep(0)  # a session of many traces lets the gateway's calls run too
        if isinstance(trace, dict) and trace.get("session_id") == session_id:
            summary = trace_summary(trace)
            if summary is None:
                return None
            found.append(summary)
    return found


async def index_payload(guard: GuardedTraceStore, sessions: Any, *, idle_before: float | None, after: str | None,
                        limit: int, session_ids: list[str], summaries: bool = False) -> dict[str, Any]:
    """The body of ``POST /guard/index``: the store's totals and one page of the candidate sessions.

    ``{"sessions", "traces", "candidates": [{"session_id", "trace_count", "created_at"}], "tombstoned": [ids of
    the page that carry a tombstone], "next": <the id to pass as after> | null}``: the candidates are the sessions
    ``GET /sessions`` lists with one trace and ``created_at`` at or before ``idle_before`` (or null), the
    tombstoned sessions, and those of ``session_ids``, in id order after ``after``; ``created_at`` is the
    listing's (rLLM's session manager's record, else the first trace's time in the store).

    With ``summaries`` each one-trace or tombstoned candidate also carries ``"summaries"``: per trace of it, what a
    scan derives from the whole record (:func:`~gatewayscope.sources.rllm_trace.trace_summary`). A candidate with
    more traces than :data:`INDEX_PAGE_SUMMARIES`, or one whose record cannot be summarized, carries none (the scan
    reads it whole), and the page ends before the candidate whose summaries would pass that many in the answer. The
    candidates, totals and tombstones are one moment of the index (no await while they are taken); the summaries are
    read after, letting the event loop run between chunks, so a write or delete in between shows in them as it would
    in the trace read that follows a listing.
    """
    index = guard.index
    assert index is not None
    created = getattr(sessions, "_created_at", None)  # rLLM's SessionManager: id -> its creation time
    stamps = getattr(guard.inner, "_timestamps", None)  # rLLM's MemoryTraceStore: trace id -> its write time
    rows = index.candidates(idle_before=idle_before, tombstones=guard.confirmable, also=session_ids,
                            created=created if isinstance(created, dict) else None,
                            stamps=stamps if isinstance(stamps, dict) else None)
    start = 0 if after is None else bisect.bisect_right(rows, after, key=lambda row: row[0])
    page = rows[start:start + limit]
    totals = (len(index.sessions), index.traces)
    tombstoned = set(guard.tombstoned_among(row[0] for row in page))
    candidates: list[dict[str, Any]] = [{"session_id": sid, "trace_count": count, "created_at": when}
                                        for sid, count, when in page]
    if summaries:
        asked = set(session_ids)
        budget, made = INDEX_PAGE_SUMMARIES, 0
        for position, (sid, count, _) in enumerate(page):  # bounded: one page
            # a scan reads the traces of one-trace, tombstoned and asked-for sessions (the fence check needs when
            # each trace was dispatched); the rest are listed for their figures only
            wanted = count == 1 or sid in tombstoned or sid in asked
            served = await _trace_summaries(guard, sid) if wanted and count <= INDEX_PAGE_SUMMARIES else None
            if served is not None and len(served) > INDEX_PAGE_SUMMARIES:
                served = None
            if served is not None:
                if len(served) > budget and position:  # the page ends here; the next one starts with it
                    del candidates[position:], page[position:]
                    break
                candidates[position]["summaries"] = served
                budget -= len(served)
                made += len(served)
            if made >= SUMMARY_CHUNK:
                made = 0
                await asyncio.sleep(0)  # let the gateway's calls run between chunks of summaries
    more = start + len(page) < len(rows)
    listed = [row[0] for row in page if row[0] in tombstoned]
    return {
        "sessions": totals[0],
        "traces": totals[1],
        "candidates": candidates,
        **tombstones_payload(guard, listed),
        "next": page[-1][0] if more and page else None,
    }


def tombstones_payload(guard: GuardedTraceStore, tombstoned: list[str]) -> dict[str, Any]:
    """``{"tombstoned": ids, "fences": {id: the moment of its latest delete}, "reused": [ids written again after
    it]}`` for ids that carry a tombstone (the shape ``POST /guard/tombstones/check`` and ``/guard/index`` share)."""
    return {"tombstoned": tombstoned,
            "fences": {sid: guard.fence_of(sid) for sid in tombstoned},
            "reused": [sid for sid in tombstoned if guard.is_reused(sid)]}


_BODY_SHAPE = '{"session_ids": ["<session id>", ...]}'


def parse_session_ids(raw: bytes) -> list[str]:
    """The ``session_ids`` of a guard request body; ValueError with a message for the client otherwise.

    Other keys are ignored: the gateway's own middleware adds sampling fields (``logprobs``, ...) to
    every JSON object POSTed to it.

    >>> parse_session_ids(b'{"session_ids": ["a:0", "b:1"], "logprobs": true}')
    ['a:0', 'b:1']
    """
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"the body must be JSON of the shape {_BODY_SHAPE}") from None
    if not isinstance(body, dict) or "session_ids" not in body:
        raise ValueError(f"the body must be a JSON object of the shape {_BODY_SHAPE}")
    ids = body["session_ids"]
    if not isinstance(ids, list):
        raise ValueError(f"session_ids must be a list of session id strings, not {type(ids).__name__}")
    for position, sid in enumerate(ids):
        if not isinstance(sid, str) or not sid:
            raise ValueError(f"session_ids[{position}] must be a non-empty string, not {sid!r}")
    return ids


def parse_conditional_delete(raw: bytes) -> tuple[str, list[str], bool]:
    """``(session_id, trace_ids, tombstoned)`` of a ``POST /guard/sessions/delete-if`` body, or ValueError.

    >>> parse_conditional_delete(b'{"session_id": "a:0", "trace_ids": ["t1"], "tombstoned": false}')
    ('a:0', ['t1'], False)
    """
    shape = '{"session_id": "<id>", "trace_ids": ["<trace id>", ...], "tombstoned": true|false}'
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"the body must be JSON of the shape {shape}") from None
    if not isinstance(body, dict):
        raise ValueError(f"the body must be a JSON object of the shape {shape}")
    session_id, trace_ids, tombstoned = body.get("session_id"), body.get("trace_ids"), body.get("tombstoned")
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("session_id must be a non-empty string")
    if not isinstance(trace_ids, list) or not all(isinstance(t, str) for t in trace_ids):
        raise ValueError("trace_ids must be a list of trace id strings")
    if not isinstance(tombstoned, bool):
        raise ValueError("tombstoned must be true or false")
    return session_id, trace_ids, tombstoned


def add_guard_routes(app: Any, guard: GuardedTraceStore) -> None:
    """Add ``/guard/...`` and ``/metrics`` to a (gateway) Starlette/FastAPI app.

    Plain Starlette routes: they take the request and return a response, nothing is injected.
    """
    from prometheus_client.exposition import choose_encoder
    from starlette.responses import JSONResponse
    from starlette.responses import Response as StarletteResponse

    registry = guard_registry(guard)

    def error(status: int, message: str) -> Response:
        return JSONResponse({"error": message}, status_code=status)  # the gateway's error envelope

    async def status(request: Request) -> Response:
        return JSONResponse(status_payload(guard))

    async def add(request: Request) -> Response:
        try:
            ids = parse_session_ids(await request.body())
        except ValueError as err:
            return error(400, str(err))
        if not guard.enabled:
            return error(409, "The tombstone guard is disabled (--max-tombstones 0): no tombstone was "
                              "recorded. Restart the gateway with a capacity to record tombstones.")
        added, already = guard.add_tombstones(ids)
        return JSONResponse({"added": added, "already": already, "tombstones": guard.stats().tombstones})

    async def check(request: Request) -> Response:
        try:
            ids = parse_session_ids(await request.body())
        except ValueError as err:
            return error(400, str(err))
        return JSONResponse(tombstones_payload(guard, guard.tombstoned_among(ids)))

    async def lift(request: Request) -> Response:
        return JSONResponse({"lifted": guard.lift(request.path_params["session_id"])})

    async def delete_if(request: Request) -> Response:
        try:
            session_id, trace_ids, tombstoned = parse_conditional_delete(await request.body())
        except ValueError as err:
            return error(400, str(err))
        if not guard.enabled:
            return error(409, "The tombstone guard is disabled (--max-tombstones 0): no conditional delete.")
        deleted, live, live_tombstoned = await guard.delete_session_if(session_id, trace_ids, tombstoned)
        if deleted is None:
            return JSONResponse({"error": "the session does not match: not deleted", "trace_ids": live,
                                 "tombstoned": live_tombstoned}, status_code=409)
        return JSONResponse({"deleted": deleted, "trace_ids": live, "tombstoned": live_tombstoned})

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return StarletteResponse(encoder(registry), media_type=content_type)

    async def index(request: Request) -> Response:
        try:
            idle_before, after, limit, ids, summaries = parse_index_request(await request.body())
        except ValueError as err:
            return error(400, str(err))
        return JSONResponse(await index_payload(guard, getattr(request.app.state, "sessions", None),
                                                idle_before=idle_before, after=after, limit=limit, session_ids=ids,
                                                summaries=summaries))

    app.add_route("/guard/status", status, methods=["GET"])
    app.add_route("/guard/tombstones", add, methods=["POST"])
    app.add_route("/guard/tombstones/check", check, methods=["POST"])
    app.add_route("/guard/tombstones/{session_id:path}", lift, methods=["DELETE"])
    app.add_route("/guard/sessions/delete-if", delete_if, methods=["POST"])
    app.add_route("/metrics", metrics, methods=["GET"])
    if guard.index is not None:
        app.add_route("/guard/index", index, methods=["POST"])


def build_app(
    config: Any = None,
    *,
    max_tombstones: int = DEFAULT_MAX_TOMBSTONES,
    top_droppers: int = DEFAULT_TOP_DROPPERS,
    store: Any = None,
    discovery_dir: str | None = None,
) -> FastAPI:
    """rLLM's own gateway app (``create_app``) around a guarded store, plus the guard's routes.

    ``config`` is rLLM's ``GatewayConfig`` (its defaults when None); ``store`` the inner store (rLLM's
    ``create_store(config)`` when None). The guard is ``app.state.guard``. With ``discovery_dir`` the gateway
    announces itself there while it serves (:mod:`gatewayscope.guard.discovery`).
    """
    require_gateway()
    import rllm_model_gateway.server as server

    config, guard = guarded_store(config, store, max_tombstones=max_tombstones, top_droppers=top_droppers)
    # rLLM's own create_app, also where gatewayscope.guard.attach replaced it in this process
    create_app = getattr(server.create_app, "__gatewayscope_unguarded__", server.create_app)
    app = create_app(config, store=guard)
    guard_app(app, guard, announce_to=discovery_dir, config=config)
    return app


def guarded_store(config: Any, store: Any = None, *, max_tombstones: int = DEFAULT_MAX_TOMBSTONES,
                  top_droppers: int = DEFAULT_TOP_DROPPERS) -> tuple[Any, GuardedTraceStore]:
    """(config, guard): rLLM's ``GatewayConfig`` (its defaults when None) and the guard around ``store`` (the
    store rLLM's ``create_store(config)`` makes when None). GatewayscopeError for a store without the 0.1.0
    ``TraceStore`` API."""
    require_gateway()
    from rllm_model_gateway.models import GatewayConfig
    from rllm_model_gateway.server import create_store

    if config is None:
        config = GatewayConfig()
    inner = store if store is not None else create_store(config)
    _check_store_protocol(inner)
    # the orphan index is exact only from an empty store's first write: rLLM's memory store, made here
    index = store is None and getattr(config, "store_worker", None) == "memory"
    return config, GuardedTraceStore(inner, max_tombstones=max_tombstones, top_droppers=top_droppers, index=index)


def guard_app(app: Any, guard: GuardedTraceStore, *, announce_to: str | None = None, config: Any = None) -> None:
    """Give a gateway app built around ``guard`` the request stamps and the guard's routes (``app.state.guard``);
    with ``announce_to``, an announcement in that directory while the app serves (its lifespan), for the
    gateway on ``config``'s host and port."""
    app.add_middleware(ArrivalStamp)  # added last: the outermost, so the stamp is taken before anything else runs
    add_guard_routes(app, guard)
    app.state.guard = guard
    if announce_to:
        _announce_while_serving(app, announce_to, config)


def _announce_while_serving(app: Any, directory: str, config: Any) -> None:
    from gatewayscope.guard import discovery

    port = getattr(config, "port", None)
    if not isinstance(port, int) or port <= 0:
        logger.warning("gatewayscope guard: the gateway's port is not known before it starts (%r); it is not "
                       "announced in %s", port, directory)
        return
    original = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(served: Any) -> Any:
        path = None
        try:
            path = discovery.announce(directory, host=str(getattr(config, "host", "") or ""), port=port,
                                      store=str(getattr(config, "store_worker", "") or ""),
                                      db_path=getattr(config, "db_path", None))
        except OSError as err:
            logger.warning("gatewayscope guard: cannot announce the gateway in %s (%s)", directory, err)
        try:
            async with original(served) as state:
                yield state
        finally:
            if path is not None:
                discovery.withdraw(path)

    app.router.lifespan_context = lifespan


# ------------------------------------------------------------------------------------------------
# Serving
# ------------------------------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    """Build the guarded gateway from parsed flags and serve it until interrupted (like rLLM's main)."""
    config = load_config(args)
    logging.basicConfig(level=getattr(logging, config.log_level.upper(), logging.INFO))
    app = build_app(config, max_tombstones=args.max_tombstones, discovery_dir=getattr(args, "discovery_dir", None))
    if args.max_tombstones == 0:
        logger.warning("gatewayscope tombstone guard DISABLED (--max-tombstones 0): a trace write after a "
                       "session's delete re-creates the session, as in rllm-model-gateway.")
    else:
        logger.info("gatewayscope tombstone guard on: up to %d tombstones (oldest evicted first); "
                    "state at /guard/status and /metrics", args.max_tombstones)
    if config.store_worker == "sqlite":
        logger.info("--store sqlite: the guard's tombstones live in this process's memory and are lost on "
                    "restart; to keep them in the database file (protecting an unmodified gateway too), "
                    "run 'gatewayscope guard install'.")

    import uvicorn

    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level.lower())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gatewayscope.guard.gateway``: parse, serve; errors as one sentence (exit 2 or 1)."""
    args = build_parser().parse_args(argv)
    try:
        return serve(args)
    except ConfigError as err:
        for problem in err.problems:
            sys.stderr.write(f"gatewayscope gateway: {problem}\n")
        return 2
    except GatewayscopeError as err:
        sys.stderr.write(f"gatewayscope gateway: {err}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
