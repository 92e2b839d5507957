"""Read an rLLM gateway's trace store over its REST API.

One session listing, then trace reads only for the candidates (one-trace sessions idle long
enough to matter, and sessions that carry a tombstone), batched through ``POST /traces/query``
with bounded concurrency. A guarded launcher with its orphan index serves the candidates, and what
the scan uses of their traces, on ``POST /guard/index`` instead. Features added upstream after
0.1.0 (weight versions, batch delete) and gatewayscope's guard routes are detected from the
gateway's OpenAPI document, never from its version string.
"""

from __future__ import annotations

import io
import random
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import polars as pl

from gatewayscope.config import DEFAULT_MAX_BODY_BYTES, Policy, Target
from gatewayscope.errors import (
    BadResponseError,
    GatewayscopeError,
    HTTPStatusError,
    NotFoundError,
    UnaddressableSessionError,
)
from gatewayscope.orphan_rule import UNKNOWN_FENCE, Tombstone, candidate_expr
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    SESSIONS_SCHEMA,
    GuardStats,
    TraceStoreData,
    frame_from_rows,
)
from gatewayscope.sources._batches import batches
from gatewayscope.sources._gcpause import gc_paused
from gatewayscope.sources._http import HttpClient, path_segment
from gatewayscope.sources.rllm_trace import as_float, as_int, summary_row, trace_row

#: a session id holding a ``/`` that no gateway holds: asks whether the gateway routes such ids
PATH_ROUTE_PROBE = "gatewayscope-probe/path-route"
#: session ids per ``POST /traces/query`` (and per guard check)
QUERY_BATCH = 200
CHECK_BATCH = 5000


class RllmClient(HttpClient):
    """A thin client for the gateway's REST API; every error becomes a gatewayscope error.

    ``max_connections`` bounds the pool (reads of candidate traces run that many at once)."""

    server = "The rLLM gateway"
    timeout_sentence = ("{who} did not answer {where} in time; raise timeout_seconds if it is busy, or check that "
                        "it is healthy.")
    unreachable_sentence = ("Cannot reach the rLLM gateway at {base_url} ({error_type}: {error}); check the URL and "
                            "that the gateway is running.")

    def __init__(self, base_url: str, *, timeout: float = 10.0, transport: httpx.BaseTransport | None = None,
                 max_connections: int = 16, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        super().__init__(base_url, timeout=timeout, transport=transport, max_connections=max_connections,
                         max_body_bytes=max_body_bytes)
        self._path_routes: bool | None = None
        self._path_routes_lock = threading.Lock()

    def request(self, method: str, path: str, *, json_body: Any = None, timeout: float | None = None,
                raw: bool = False) -> Any:
        """Send one request and return its parsed JSON, or raise a typed error with a sentence.

        ``timeout`` (default the client's) bounds the whole exchange, the answer's body included, and the
        answer is read up to the client's ``max_body_bytes`` (see :func:`~gatewayscope.sources._http.exchange`).
        With ``raw`` the answer itself is returned (its status checked, its body not parsed yet: see
        :meth:`json_of`)."""
        response = self.send(method, path, json_body=json_body, timeout=timeout)
        return response if raw else self.json_of(response)

    @staticmethod
    def json_of(response: httpx.Response) -> Any:
        """An answer's parsed JSON, or BadResponseError saying it is not JSON."""
        parsed, value = HttpClient.parse_json(response)
        if parsed:
            return value
        snippet = response.text[:80].replace("\n", " ")
        raise BadResponseError(
            f"{response.request.method} {response.request.url} answered {response.status_code} with "
            f"something that is not JSON ({snippet!r}...); is this an rLLM gateway?"
        )

    def routes_path_ids(self) -> bool:
        """Whether the gateway routes ``/sessions/{session_id:path}`` (upstream main does, 0.1.0 does not), so
        that a session id holding a ``/`` reaches its session.

        Its OpenAPI document says ``/sessions/{session_id}`` either way, so the gateway is asked once (and the
        answer kept): ``GET /sessions/{id}/traces`` for an id holding a ``/`` that no session has answers a list
        where the route takes such ids, and 404 (no route) where it does not.
        """
        with self._path_routes_lock:
            if self._path_routes is None:
                try:
                    body = self.request("GET", f"{session_path(PATH_ROUTE_PROBE, path_routes=True)}/traces")
                except (HTTPStatusError, BadResponseError):
                    body = None
                self._path_routes = isinstance(body, list)
            return self._path_routes

    def session_path(self, session_id: str) -> str:
        """:func:`session_path` on this gateway: an id holding a ``/`` is written out where the gateway routes
        such ids (:meth:`routes_path_ids`), and refused with :class:`UnaddressableSessionError` where it does
        not."""
        if "/" not in session_id:
            return session_path(session_id)
        return session_path(session_id, path_routes=self.routes_path_ids())

    def openapi_paths(self) -> set[str]:
        """The routes the gateway declares (FastAPI's /openapi.json); empty if it does not say."""
        try:
            document = self.request("GET", "/openapi.json")
        except (HTTPStatusError, BadResponseError):
            return set()
        paths = document.get("paths") if isinstance(document, dict) else None
        return set(paths) if isinstance(paths, dict) else set()


def parse_session_listing(body: Any, where: str) -> list[tuple[str, int, float | None, float | None]]:
    """Validate ``GET /sessions``: rows of (session_id, trace_count, created_at, last_trace_at=None)."""
    if not isinstance(body, list):
        raise BadResponseError(f"{where} should be a JSON list of sessions, got {type(body).__name__}.")
    rows: list[tuple[str, int, float | None, float | None]] = []
    for item in body:
        if not isinstance(item, dict) or not isinstance(item.get("session_id"), str):
            raise BadResponseError(f"{where} holds an entry without a session_id: {str(item)[:80]}")
        count = as_int(item.get("trace_count"))
        if count is None:
            raise BadResponseError(f"{where}: session {item['session_id']!r} has no whole-number trace_count.")
        rows.append((item["session_id"], count, as_float(item.get("created_at")), None))
    return rows


#: the columns of a ``GET /sessions`` answer the fast path accepts, and the types they must have
_LISTING_TYPES = {"session_id": (pl.String,), "trace_count": (pl.Int64,),
                  "created_at": (pl.Float64, pl.Int64, pl.Null)}


def session_frame(response: httpx.Response, where: str) -> pl.DataFrame:
    """``GET /sessions`` as a SESSIONS_SCHEMA frame.

    polars reads the answer's JSON itself (no Python object per session, unlike ``json.loads`` and a loop
    over the rows); it is used only when every entry has a string ``session_id``, a whole-number
    ``trace_count`` and a numeric or null ``created_at``. Anything else goes through
    :func:`parse_session_listing`, which accepts what it accepts and says what is wrong.
    """
    try:
        frame: pl.DataFrame | None = pl.read_json(io.BytesIO(response.content), infer_schema_length=None)
    except Exception:  # not JSON, not a list of objects, mixed types: the slow path says what is wrong
        frame = None
    if frame is not None and frame.height and all(
            frame.schema.get(column, pl.Null) in types or (column == "created_at" and column not in frame.schema)
            for column, types in _LISTING_TYPES.items()) \
            and not frame["session_id"].null_count() and not frame["trace_count"].null_count():
        created = (pl.col("created_at").cast(pl.Float64) if "created_at" in frame.schema
                   else pl.lit(None, dtype=pl.Float64))
        return frame.select(pl.col("session_id"), pl.col("trace_count"), created.alias("created_at"),
                            pl.lit(None, dtype=pl.Float64).alias("last_trace_at"))
    rows = parse_session_listing(RllmClient.json_of(response), where)
    return frame_from_rows(rows, SESSIONS_SCHEMA)


def read_guard_status(client: RllmClient) -> GuardStats | None:
    """The guarded launcher's figures, or None when the gateway has no guard routes."""
    try:
        body = client.request("GET", "/guard/status")
    except NotFoundError:
        return None
    if not isinstance(body, dict):
        raise BadResponseError("GET /guard/status did not return an object.")

    def count(key: str) -> int:
        value = body.get(key, 0)
        number = as_int(value)
        if number is None or number < 0:
            raise BadResponseError(f"GET /guard/status: {key} is not a whole number >= 0 ({str(value)[:40]!r}).")
        return number

    return GuardStats(
        tombstones=count("tombstones"),
        capacity=count("capacity"),
        dropped_writes=count("dropped_writes"),
        kept_after_fence=count("kept_after_fence"),
        evicted=count("evicted"),
        enabled=bool(body.get("enabled", True)),
        top_droppers=[d for d in body.get("top_droppers", []) if isinstance(d, dict)],
        index=body["index"] if isinstance(body.get("index"), str) else None,
    )


@dataclass
class LauncherIndex:
    """What a guarded launcher's ``POST /guard/index`` gave: the candidate sessions (SESSIONS_SCHEMA, as
    ``GET /sessions`` lists them), those of them that carry a tombstone, the store's totals, and per candidate
    whose traces it summarized, those traces' CANDIDATE_TRACES_SCHEMA rows (a launcher that does not summarize,
    an older one, leaves ``summaries`` without the candidate: its traces are read through ``POST
    /traces/query``)."""

    sessions: pl.DataFrame
    tombstoned: dict[str, Tombstone]
    session_total: int
    trace_total: int
    summaries: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)


#: most pages of ``POST /guard/index`` one read asks for (the launcher's pages hold up to 10,000 sessions each)
MAX_INDEX_PAGES = 10_000


def _summaries_of(item: dict[str, Any]) -> list[tuple[Any, ...]] | None:
    """The trace rows a candidate of ``POST /guard/index`` carries, or None when it carries none (an older
    launcher, or one that left them out); BadResponseError when they are malformed."""
    summaries = item.get("summaries")
    if summaries is None:
        return None
    if not isinstance(summaries, list):
        raise BadResponseError(f"POST /guard/index: the summaries of session {item['session_id']!r} are not a list.")
    rows = []
    for summary in summaries:
        row = summary_row(item["session_id"], summary)
        if row is None:
            raise BadResponseError(f"POST /guard/index holds a malformed trace summary of session "
                                   f"{item['session_id']!r}: {str(summary)[:80]}")
        rows.append(row)
    return rows


def read_launcher_index(client: RllmClient, *, idle_before: float, also: list[str],
                        summaries: bool = True) -> LauncherIndex:
    """The candidates and totals from a guarded launcher's orphan index, a page at a time (``after`` the last id
    of the page before, so the pages are in id order and never overlap); the totals are the first page's. With
    ``summaries`` the launcher is asked for its candidates' trace summaries too (one that does not know the
    flag ignores it)."""
    rows: list[tuple[str, int, float | None, None]] = []
    tombstoned: dict[str, Tombstone] = {}
    summarized: dict[str, list[tuple[Any, ...]]] = {}
    totals: tuple[int, int] | None = None
    after: str | None = None
    request: dict[str, Any] = {"idle_before": idle_before, "session_ids": also}
    if summaries:
        request["summaries"] = True
    for _ in range(MAX_INDEX_PAGES):  # bounded; each page starts after the last id of the one before
        body = client.request("POST", "/guard/index", json_body={**request, "after": after})
        if not isinstance(body, dict) or not isinstance(body.get("candidates"), list) \
                or not isinstance(body.get("tombstoned"), list):
            raise BadResponseError("POST /guard/index did not return {\"candidates\": [...], \"tombstoned\": [...], "
                                   "...}.")
        if totals is None:
            sessions, traces = as_int(body.get("sessions")), as_int(body.get("traces"))
            if sessions is None or traces is None:
                raise BadResponseError("POST /guard/index did not return whole-number session and trace totals.")
            totals = (sessions, traces)
        for item in body["candidates"]:
            count = as_int(item.get("trace_count")) if isinstance(item, dict) else None
            if count is None or not isinstance(item.get("session_id"), str):
                raise BadResponseError(f"POST /guard/index holds a malformed candidate: {str(item)[:80]}")
            if after is None or item["session_id"] > after:  # the pages are in id order: none is read twice
                rows.append((item["session_id"], count, as_float(item.get("created_at")), None))
                served = _summaries_of(item)
                if served is not None:
                    summarized[item["session_id"]] = served
        tombstoned.update(tombstones_of(body, "POST /guard/index"))
        following = body.get("next")
        if not isinstance(following, str) or (after is not None and following <= after):
            break
        after = following
    else:
        raise BadResponseError(f"POST /guard/index did not end within {MAX_INDEX_PAGES:,} pages.")
    assert totals is not None
    return LauncherIndex(sessions=frame_from_rows(rows, SESSIONS_SCHEMA), tombstoned=tombstoned,
                         session_total=totals[0], trace_total=totals[1], summaries=summarized)


def tombstones_of(body: dict[str, Any], what: str) -> dict[str, Tombstone]:
    """The tombstones an answer of the guarded launcher names: ``tombstoned`` (ids), with ``fences`` (id -> the
    moment of its latest delete) and ``reused`` (ids written again after it) from a launcher that keeps fences; an
    older one's ban has no time (``orphan_rule.UNKNOWN_FENCE``). BadResponseError for a malformed answer."""
    listed, fences, reused = body.get("tombstoned"), body.get("fences", {}), body.get("reused", [])
    if not isinstance(listed, list) or not isinstance(fences, dict) or not isinstance(reused, list):
        raise BadResponseError(f"{what} did not return {{\"tombstoned\": [...], \"fences\": {{...}}, "
                               "\"reused\": [...]}.")
    again = {str(sid) for sid in reused}
    found: dict[str, Tombstone] = {}
    timed = "fences" in body
    for sid in listed:
        moment = as_float(fences.get(sid)) if timed else UNKNOWN_FENCE
        if moment is None:
            raise BadResponseError(f"{what} gave session {str(sid)[:80]!r} a fence that is not a number.")
        found[str(sid)] = Tombstone(fence=moment, reused=str(sid) in again)
    return found


def read_tombstones(client: RllmClient, session_ids: list[str]) -> dict[str, Tombstone]:
    """The tombstones of ``session_ids`` on a guarded launcher (``POST /guard/tombstones/check``, in batches)."""
    found: dict[str, Tombstone] = {}
    for batch in batches(session_ids, CHECK_BATCH):
        body = client.request("POST", "/guard/tombstones/check", json_body={"session_ids": batch})
        if not isinstance(body, dict):
            raise BadResponseError("POST /guard/tombstones/check did not return {\"tombstoned\": [...]}.")
        found.update(tombstones_of(body, "POST /guard/tombstones/check"))
    return found


class KnownTraces:
    """Candidate-trace rows kept from one read of a gateway to the next (the exporter keeps one per target).

    An orphan is re-read at every exporter read until it is deleted, and on 0.1.0 each of its traces
    costs the gateway's event loop time to encode (more with long prompts). A one-trace
    session's trace does not change while the listing shows the session with the same ``created_at``
    and one trace: the gateway stores every call under a new trace id, and a session deleted through
    that gateway comes back with a new ``created_at``. So the next read reuses those rows and asks the
    gateway only for the other candidates. A delete that bypasses the gateway process (gatewayscope's
    SQLite-file delete, another replica on the same file) leaves its ``created_at`` as it was, so a
    session written again after it would look unchanged: no row is trusted longer than
    ``max_age_seconds`` (each row between half and all of it, so the re-reads spread out). Sessions with
    more traces (tombstoned ones) or without a ``created_at`` are always read afresh, and rows of sessions
    that are no longer candidates are dropped at every read, so this holds at most one read's candidates.
    """

    def __init__(self, *, max_age_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 jitter: Callable[[], float] = random.random) -> None:
        self.max_age_seconds = max_age_seconds
        self._clock = clock
        self._jitter = jitter
        self._lock = threading.Lock()
        #: session id -> (its created_at when read, when the row expires, its one trace row)
        self._rows: dict[str, tuple[float, float, tuple[Any, ...]]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    @staticmethod
    def _one_trace_state(candidates: pl.DataFrame) -> dict[str, float]:
        return {sid: created for sid, count, created in candidates.select("session_id", "trace_count", "created_at")
                .iter_rows() if count == 1 and created is not None}

    def split(self, candidates: pl.DataFrame) -> tuple[list[tuple[Any, ...]], list[str]]:
        """The kept rows of ``candidates`` (session frame rows) still in the same state, and the ids to read."""
        state = self._one_trace_state(candidates)
        now = self._clock()
        reuse: list[tuple[Any, ...]] = []
        read: list[str] = []
        with self._lock:
            for sid in candidates["session_id"]:
                kept = self._rows.get(sid)
                if kept is not None and state.get(sid) == kept[0] and now < kept[1]:
                    reuse.append(kept[2])
                else:
                    read.append(sid)
        return reuse, read

    def keep(self, candidates: pl.DataFrame, fetched: list[tuple[Any, ...]]) -> None:
        """Remember the rows just read for one-trace candidates, and forget sessions no longer candidates."""
        state = self._one_trace_state(candidates)
        by_session: dict[str, list[tuple[Any, ...]]] = {}
        for row in fetched:
            by_session.setdefault(row[0], []).append(row)
        now = self._clock()
        with self._lock:
            rows = {sid: kept for sid, kept in self._rows.items() if state.get(sid) == kept[0] and now < kept[1]}
            for sid, found in by_session.items():
                if sid in state and len(found) == 1:  # a second trace since the listing: read it again next time
                    expires = now + self.max_age_seconds * (0.5 + 0.5 * self._jitter())
                    rows[sid] = (state[sid], expires, found[0])
            self._rows = rows


def read_trace_store_http(target: Target, policy: Policy, *, now: float,
                          transport: httpx.BaseTransport | None = None,
                          known: KnownTraces | None = None, full: bool = False,
                          also: Collection[str] = ()) -> TraceStoreData:
    """Read the sessions and the candidate traces of a gateway at ``target.url``.

    With ``known``, candidates whose trace an earlier read already holds are not asked for again (see
    :class:`KnownTraces`); the result is the same. A guarded launcher whose ``/guard/status`` says its orphan
    index is ready is read through ``POST /guard/index`` instead of ``GET /sessions`` (see
    :func:`read_launcher_index`): ``sessions`` then holds the candidates only, with the totals beside them, and
    the findings are those of the full read; ``also`` names more sessions to include when they exist (ids the
    findings will be given as deleted before). The launcher also serves what the scan uses of its candidates'
    traces (:func:`~gatewayscope.sources.rllm_trace.trace_row`'s fields), so their whole records are not read;
    a candidate it did not summarize is read through ``POST /traces/query``. ``full=True`` lists every session
    and reads every candidate's traces whole even then.
    """
    assert target.url, "an HTTP trace-store target needs a url"
    with RllmClient(target.url, timeout=target.timeout_seconds, transport=transport,
                    max_connections=target.concurrency, max_body_bytes=target.max_body_bytes) as client:
        paths = client.openapi_paths()
        capabilities = {
            "weight_version": "/admin/weight_version" in paths,
            "batch_delete": "/sessions/batch_delete" in paths,
            "guard": "/guard/status" in paths,
            "openapi": bool(paths),
        }
        # always asked: the guard's routes need not appear in the OpenAPI document; a 404 means no guard. Asked
        # before the listing, whose errors still come first (a guard's error is raised after it)
        guard_error: GatewayscopeError | None = None
        try:
            guard = read_guard_status(client)
        except GatewayscopeError as err:
            guard, guard_error = None, err
        indexed = (read_launcher_index(client, idle_before=now - policy.orphan_idle_seconds, also=list(also))
                   if guard is not None and guard.index == "ready" and not full else None)
        if indexed is None:
            sessions = session_frame(client.request("GET", "/sessions", raw=True), f"GET {target.url}/sessions")
        else:
            sessions = indexed.sessions

        current_weight: int | None = None
        if capabilities["weight_version"] or not paths:  # no OpenAPI document: ask, a 404 means no feature
            try:
                body = client.request("GET", "/admin/weight_version")
            except NotFoundError:
                body = None
            current_weight = as_int(body.get("weight_version")) if isinstance(body, dict) else None
            capabilities["weight_version"] = current_weight is not None

        if guard_error is not None:
            raise guard_error
        capabilities["guard"] = guard is not None

        tombstoned: dict[str, Tombstone] = {} if indexed is None else indexed.tombstoned
        if guard is not None and guard.tombstones > 0 and indexed is None:
            tombstoned = read_tombstones(client, sessions["session_id"].to_list())

        idle_before = now - policy.orphan_idle_seconds
        # the ids a fence may prove orphans: tombstoned and not used again since, and the ones given as deleted
        proof = pl.Series(sorted({*(sid for sid, stone in tombstoned.items() if not stone.reused), *also}),
                          dtype=pl.String)
        # created_at is at or before the first trace, so a recent one means a recent trace
        candidate_sessions = sessions.filter(candidate_expr(pl.col("trace_count"), pl.col("created_at"), idle_before,
                                                            pl.col("session_id").is_in(proof.implode())))
        reused: list[tuple[Any, ...]] = []
        trace_rows: list[tuple[Any, ...]] = []
        # the candidates the launcher summarized need no trace read; the others (all of them from any other
        # gateway or an older launcher) are read whole through POST /traces/query
        summarized = indexed.summaries if indexed is not None else {}
        to_read = candidate_sessions
        if summarized:
            served = pl.col("session_id").is_in(pl.Series(list(summarized), dtype=pl.String).implode())
            for sid in candidate_sessions.filter(served)["session_id"]:
                trace_rows.extend(summarized[sid])
            to_read = candidate_sessions.filter(~served)
        candidates = to_read["session_id"].to_list()
        if known is not None:
            reused, candidates = known.split(to_read)

        def fetch(batch: list[str]) -> list[tuple[Any, ...]]:
            body = client.request("POST", "/traces/query", json_body={"session_ids": batch})
            if not isinstance(body, list):
                raise BadResponseError("POST /traces/query did not return a list of traces.")
            wanted = set(batch)
            with gc_paused():
                return [trace_row(trace) for trace in body
                        if isinstance(trace, dict) and trace.get("session_id") in wanted]

        with ThreadPoolExecutor(max_workers=target.concurrency) as pool:
            for part in pool.map(fetch, batches(candidates, QUERY_BATCH)):
                trace_rows.extend(part)
        if known is not None:
            known.keep(candidate_sessions, trace_rows)
        trace_rows += reused

    return TraceStoreData(
        sessions=sessions,
        candidate_traces=frame_from_rows(trace_rows, CANDIDATE_TRACES_SCHEMA),
        tombstoned_ids=list(tombstoned),
        fences={sid: stone.fence for sid, stone in tombstoned.items() if stone.fence != UNKNOWN_FENCE},
        reused_ids=[sid for sid, stone in tombstoned.items() if stone.reused],
        current_weight_version=current_weight,
        guard=guard,
        capabilities=capabilities,
        access="rest",
        session_total=indexed.session_total if indexed is not None else None,
        trace_total=indexed.trace_total if indexed is not None else None,
        also_read=frozenset(also),
    )


def session_path(session_id: str, *, path_routes: bool = False) -> str:
    """The path of one session, the id escaped whole so no character of it can change the route.

    Every character but the unreserved ones is percent-escaped, and the dot segments ``.`` and ``..`` are
    written ``%2E`` and ``%2E%2E``: a URL keeps them (a bare ``.`` or ``..`` segment would be collapsed
    into the path around it) and the gateway decodes them back into the id.

    An id holding a ``/`` is written with each ``/`` as ``%2F`` (and each part between them escaped as above)
    for a gateway that routes ``/sessions/{session_id:path}`` (``path_routes``; see
    :meth:`RllmClient.routes_path_ids`): it decodes ``%2F`` before it routes, and the route takes the whole
    rest of the path. Without ``path_routes`` such an id raises :class:`UnaddressableSessionError`: the 0.1.0
    gateway's ``/sessions/{session_id}`` never matches it, and the sentence says to delete it from the SQLite
    store instead.

    >>> session_path("task a:1"), session_path(".."), session_path("%2F")
    ('/sessions/task%20a%3A1', '/sessions/%2E%2E', '/sessions/%252F')
    >>> session_path("harbor/hello-world:0", path_routes=True), session_path("a/../b", path_routes=True)
    ('/sessions/harbor%2Fhello-world%3A0', '/sessions/a%2F%2E%2E%2Fb')
    """
    if "/" in session_id and not path_routes:
        raise UnaddressableSessionError(
            f"Session {session_id!r} holds a '/', which this rLLM gateway's REST API cannot address: the gateway "
            "decodes %2F back to '/' before it routes, and its /sessions/{session_id} route takes one path segment "
            "(upstream main's takes the rest of the path), so no request reaches this session. "
            "Delete it from the gateway's SQLite store directly: give the target's path (its SQLite file) "
            "instead of its url, then scan, plan and apply again.")
    return "/sessions/" + "%2F".join(path_segment(part) for part in session_id.split("/"))
