"""The REST source against a scripted transport: what it reads, and what it says when a gateway misbehaves."""

from __future__ import annotations

import json

import httpx
import pytest

from gatewayscope.config import Policy, Target
from gatewayscope.errors import (
    BadResponseError,
    GatewayTimeoutError,
    HTTPStatusError,
    SourceError,
    UnaddressableSessionError,
    UnreachableError,
)
from gatewayscope.sources.rllm_http import KnownTraces, RllmClient, read_trace_store_http, session_path

NOW = 100_000.0
TARGET = Target(name="gw", kind="rllm", url="http://gw.test:9090", concurrency=2)


def gateway(sessions: list[dict], traces: dict[str, list[dict]], *, paths: dict | None = None,
            weight: int | None = None, tombstoned: set[str] | None = None, calls: list[str] | None = None):
    def handler(request: httpx.Request) -> httpx.Response:
        if calls is not None:
            calls.append(f"{request.method} {request.url.path}")
        path = request.url.path
        if path == "/openapi.json":
            return httpx.Response(200, json={"paths": paths or {"/sessions": {}}})
        if path == "/sessions":
            return httpx.Response(200, json=sessions)
        if path == "/admin/weight_version" and weight is not None:
            return httpx.Response(200, json={"weight_version": weight})
        if path == "/traces/query":
            ids = json.loads(request.content)["session_ids"]
            return httpx.Response(200, json=[t for sid in ids for t in traces.get(sid, [])])
        if path == "/guard/status" and tombstoned is not None:
            return httpx.Response(200, json={"enabled": True, "tombstones": len(tombstoned), "capacity": 10,
                                             "dropped_writes": 4, "evicted": 0, "top_droppers": []})
        if path == "/guard/tombstones/check" and tombstoned is not None:
            ids = json.loads(request.content)["session_ids"]
            return httpx.Response(200, json={"tombstoned": [s for s in ids if s in tombstoned]})
        return httpx.Response(404, json={"detail": "Not Found"})
    return httpx.MockTransport(handler)


def trace(sid: str, ts: float, weight: int | None = None) -> dict:
    return {"trace_id": f"t-{sid}", "session_id": sid, "timestamp": ts, "weight_version": weight, "model": "m",
            "messages": [{"role": "user", "content": "hello"}], "prompt_token_ids": [1, 2, 3],
            "token_counts": {"prompt": 3}}


def test_reads_only_candidate_traces() -> None:
    sessions = [
        {"session_id": "old:0", "trace_count": 1, "created_at": NOW - 9000, "metadata": {}},
        {"session_id": "new:0", "trace_count": 1, "created_at": NOW - 10, "metadata": {}},
        {"session_id": "many:0", "trace_count": 4, "created_at": NOW - 9000, "metadata": {}},
    ]
    calls: list[str] = []
    transport = gateway(sessions, {"old:0": [trace("old:0", NOW - 8000, 3)]}, weight=7, calls=calls,
                        paths={"/sessions": {}, "/admin/weight_version": {}, "/sessions/batch_delete": {}})
    data = read_trace_store_http(TARGET, Policy(orphan_idle_seconds=7200), now=NOW, transport=transport)
    assert data.sessions.height == 3
    assert data.candidate_traces["session_id"].to_list() == ["old:0"]
    assert data.candidate_traces.row(0, named=True)["weight_version"] == 3
    assert data.candidate_traces.row(0, named=True)["prompt_tokens"] == 3
    assert data.current_weight_version == 7
    assert data.capabilities == {"weight_version": True, "batch_delete": True, "guard": False, "openapi": True}
    assert calls.count("POST /traces/query") == 1


def test_guarded_gateway_reports_tombstones() -> None:
    sessions = [{"session_id": f"s{i}:0", "trace_count": 1, "created_at": NOW - 5, "metadata": {}} for i in range(3)]
    transport = gateway(sessions, {"s1:0": [trace("s1:0", NOW - 5)]}, tombstoned={"s1:0", "gone:0"},
                        paths={"/sessions": {}, "/guard/status": {}})
    data = read_trace_store_http(TARGET, Policy(), now=NOW, transport=transport)
    assert data.tombstoned_ids == ["s1:0"]
    assert data.guard is not None and data.guard.tombstones == 2 and data.guard.dropped_writes == 4
    assert data.candidate_traces["session_id"].to_list() == ["s1:0"]


def test_known_traces_are_not_asked_for_again_while_their_sessions_stay_the_same() -> None:
    def listing(**created: float) -> list[dict]:
        return [{"session_id": sid.replace("_", ":"), "trace_count": 1, "created_at": at, "metadata": {}}
                for sid, at in created.items()]

    traces = {"a:0": [trace("a:0", NOW - 8000)], "b:0": [trace("b:0", NOW - 8000)],
              "c:0": [trace("c:0", NOW - 8000), trace("c:0", NOW - 10)]}
    policy = Policy(orphan_idle_seconds=7200)
    clock = [0.0]
    known = KnownTraces(max_age_seconds=100.0, clock=lambda: clock[0], jitter=lambda: 1.0)

    def read(sessions: list[dict]) -> tuple[list[tuple], list[str]]:
        calls: list[str] = []
        data = read_trace_store_http(TARGET, policy, now=NOW, known=known,
                                     transport=gateway(sessions, traces, calls=calls))
        return sorted(data.candidate_traces.rows()), calls

    # c:0 is listed with one trace, but a second one landed before its traces were read: not kept
    first, calls = read(listing(a_0=NOW - 9000, b_0=NOW - 9000, c_0=NOW - 9000))
    assert calls.count("POST /traces/query") == 1 and len(known) == 2
    again, calls = read(listing(a_0=NOW - 9000, b_0=NOW - 9000, c_0=NOW - 9000))
    assert again == first, "kept rows must give the same read"
    assert calls.count("POST /traces/query") == 1  # for c:0 only
    # b:0 was deleted and written again (a new created_at) with a new trace; a:0 is gone from the listing
    traces["b:0"] = [{**trace("b:0", NOW - 7300), "trace_id": "t-b:0-again"}]
    changed, _ = read(listing(b_0=NOW - 7400))
    assert [(row[0], row[1]) for row in changed] == [("b:0", "t-b:0-again")]
    assert len(known) == 1, "a session that is no longer a candidate is forgotten"
    # a delete that bypassed the gateway left created_at as it was: the row is trusted max_age_seconds only
    traces["b:0"] = [{**trace("b:0", NOW - 7250), "trace_id": "t-b:0-third"}]
    clock[0] = 99.0
    stale, calls = read(listing(b_0=NOW - 7400))
    assert [row[1] for row in stale] == ["t-b:0-again"] and "POST /traces/query" not in calls
    clock[0] = 100.0
    fresh, calls = read(listing(b_0=NOW - 7400))
    assert [row[1] for row in fresh] == ["t-b:0-third"] and calls.count("POST /traces/query") == 1


@pytest.mark.parametrize(
    ("body", "match"),
    [(b"<html>oops</html>", "not JSON"), (b'{"sessions": []}', "should be a JSON list"),
     (b'[{"id": 1}]', "without a session_id"), (b'[{"session_id": "a", "trace_count": "x"}]', "trace_count")],
)
def test_garbage_listing_is_a_bad_response(body: bytes, match: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":
            return httpx.Response(404)
        return httpx.Response(200, content=body)
    with pytest.raises(BadResponseError, match=match):
        read_trace_store_http(TARGET, Policy(), now=NOW, transport=httpx.MockTransport(handler))


def test_transport_failures_are_typed_sentences() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    def error(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": "overloaded"})

    with pytest.raises(UnreachableError, match="Cannot reach the rLLM gateway at http://gw.test:9090"):
        read_trace_store_http(TARGET, Policy(), now=NOW, transport=httpx.MockTransport(refuse))
    with pytest.raises(GatewayTimeoutError, match="did not answer"):
        read_trace_store_http(TARGET, Policy(), now=NOW, transport=httpx.MockTransport(slow))
    with pytest.raises(HTTPStatusError, match="HTTP 503 .*overloaded"):
        read_trace_store_http(TARGET, Policy(), now=NOW, transport=httpx.MockTransport(error))


def test_session_path_escapes_odd_ids() -> None:
    assert session_path("b c:1?#%") == "/sessions/b%20c%3A1%3F%23%25"
    assert session_path("...") == "/sessions/..."


def test_a_session_id_holding_a_slash_is_refused_with_the_remedy() -> None:
    # the gateway decodes %2F before it routes: /sessions/a%2Fb/traces reaches no route, or another session's
    with pytest.raises(UnaddressableSessionError, match="holds a '/'.*SQLite store directly") as caught:
        session_path("../admin")
    assert isinstance(caught.value, SourceError) and caught.value.kind == "unaddressable"
    with pytest.raises(UnaddressableSessionError):
        session_path("x/traces")


@pytest.mark.parametrize(("session_id", "raw"), [(".", b"/sessions/%2E/traces"), ("..", b"/sessions/%2E%2E/traces")])
def test_dot_session_ids_reach_their_session(session_id: str, raw: bytes) -> None:
    """httpx collapses a bare ``.`` or ``..`` segment (``/sessions/./traces`` becomes ``/sessions/traces``)."""
    seen: list[tuple[str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.raw_path))
        return httpx.Response(200, json=[] if request.method == "GET" else {"deleted": 1})

    with RllmClient("http://gw.test:9090", transport=httpx.MockTransport(handler)) as client:
        client.request("GET", f"{session_path(session_id)}/traces")
        client.request("DELETE", session_path(session_id))
    assert seen == [("GET", raw), ("DELETE", raw.removesuffix(b"/traces"))]


def test_without_openapi_the_optional_routes_are_probed_directly() -> None:
    sessions = [{"session_id": "a:0", "trace_count": 2, "created_at": NOW, "metadata": {}}]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sessions":
            return httpx.Response(200, json=sessions)
        if request.url.path == "/admin/weight_version":
            return httpx.Response(200, json={"weight_version": 12})
        return httpx.Response(404, json={"detail": "Not Found"})

    data = read_trace_store_http(TARGET, Policy(), now=NOW, transport=httpx.MockTransport(handler))
    assert data.current_weight_version == 12
    assert data.capabilities["weight_version"] is True and data.capabilities["openapi"] is False
    assert data.guard is None
