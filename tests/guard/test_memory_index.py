"""The guarded launcher's orphan index (``GuardedTraceStore(index=True)``, ``POST /guard/index``), in process.

The inner store is rLLM's own ``MemoryTraceStore`` inside rLLM's own app (httpx's ASGI transport); the truth every
answer is compared with is the same app's ``GET /sessions``, filtered by the full read's candidate rule.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest

pytest.importorskip("rllm_model_gateway")

from rllm_model_gateway.models import GatewayConfig
from rllm_model_gateway.store.memory_store import MemoryTraceStore

from gatewayscope.config import Policy, Target
from gatewayscope.errors import BadResponseError
from gatewayscope.guard import gateway as guarded_gateway
from gatewayscope.guard.memory import GuardedTraceStore
from gatewayscope.sources.rllm_http import RllmClient, read_launcher_index, read_trace_store_http

#: session ids a client may send: quotes, markup, escapes, a slash, non-ASCII
ODD_IDS = ["quote'\";--", "<script>x</script>:1", "%2F..%00", "a/b:2", "émoji 🧵:0", "tab\tnew\nline:3"]


def trace(trace_id: str, session_id: str) -> dict[str, Any]:
    return {"trace_id": trace_id, "session_id": session_id, "model": "m", "messages": []}


def app_client(**kwargs: Any) -> tuple[Any, httpx.AsyncClient]:
    app = guarded_gateway.build_app(GatewayConfig(store_worker="memory"), **kwargs)
    return app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test")


async def truth(client: httpx.AsyncClient, idle_before: float | None, also: list[str]) -> dict[str, Any]:
    """What the full read takes from ``GET /sessions``: totals and the candidates' (id, count, created_at)."""
    listing = (await client.get("/sessions")).json()
    tombstoned = set((await client.post("/guard/tombstones/check",
                                        json={"session_ids": [s["session_id"] for s in listing]})).json()["tombstoned"])
    rows = sorted((s["session_id"], s["trace_count"], s["created_at"]) for s in listing
                  if s["session_id"] in tombstoned or s["session_id"] in also or (s["trace_count"] == 1 and (
                      idle_before is None or s["created_at"] is None or s["created_at"] <= idle_before)))
    return {"sessions": len(listing), "traces": sum(s["trace_count"] for s in listing), "rows": rows,
            "tombstoned": sorted(sid for sid, _, _ in rows if sid in tombstoned)}


async def indexed(client: httpx.AsyncClient, idle_before: float | None, also: list[str],
                  limit: int = 4) -> dict[str, Any]:
    rows: list[tuple[str, int, float]] = []
    tombstoned: list[str] = []
    after = None
    first: dict[str, Any] = {}
    for _ in range(1000):
        page = (await client.post("/guard/index", json={"idle_before": idle_before, "after": after, "limit": limit,
                                                        "session_ids": also})).json()
        first = first or page
        rows += [(c["session_id"], c["trace_count"], c["created_at"]) for c in page["candidates"]]
        tombstoned += page["tombstoned"]
        after = page["next"]
        if after is None:
            break
    return {"sessions": first["sessions"], "traces": first["traces"], "rows": rows, "tombstoned": sorted(tombstoned)}


def test_the_index_answers_what_the_listing_gives_through_random_traffic() -> None:
    app, client = app_client()
    guard: GuardedTraceStore = app.state.guard
    assert isinstance(guard.inner, MemoryTraceStore) and guard.index is not None
    rng = random.Random(11)
    ids = [f"s:{i}" for i in range(30)] + ODD_IDS

    async def scenario() -> None:
        async with client:
            for step in range(400):
                sid = rng.choice(ids)
                roll = rng.random()
                if roll < 0.55:
                    await guard.store_trace(f"t{step}", sid, trace(f"t{step}", sid))
                elif roll < 0.62:  # the same trace id written again: counted once, as the store counts it
                    await guard.store_trace(f"t{step - 1}", sid, trace(f"t{step - 1}", sid))
                elif roll < 0.72:
                    await guard.delete_session(sid)
                elif roll < 0.8:
                    await client.post("/sessions", json={"session_id": sid})  # a retry: lifts the tombstone
                elif roll < 0.85:
                    guard.add_tombstones([sid])
                elif roll < 0.9:
                    app.state.sessions.ensure_session(sid)
                if step % 50 == 49:
                    listing = (await client.get("/sessions")).json()
                    created = sorted(s["created_at"] for s in listing)
                    for idle_before in (None, created[len(created) // 2] if created else 0.0, 0.0):
                        also = rng.sample(ids, 3)
                        assert await indexed(client, idle_before, also) == await truth(client, idle_before, also)

    asyncio.run(scenario())


def test_a_page_is_bounded_and_the_pages_do_not_overlap() -> None:
    app, client = app_client()
    guard: GuardedTraceStore = app.state.guard

    async def scenario() -> None:
        async with client:
            for i in range(25):
                await guard.store_trace(f"t{i}", f"one:{i:02d}", trace(f"t{i}", f"one:{i:02d}"))
            page = (await client.post("/guard/index", json={"limit": 10})).json()
            assert [c["session_id"] for c in page["candidates"]] == [f"one:{i:02d}" for i in range(10)]
            assert page["next"] == "one:09" and (page["sessions"], page["traces"]) == (25, 25)
            last = (await client.post("/guard/index", json={"limit": 10, "after": "one:19"})).json()
            assert len(last["candidates"]) == 5 and last["next"] is None
            default = (await client.post("/guard/index", content=b"")).json()
            assert len(default["candidates"]) == 25

    asyncio.run(scenario())


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "must be JSON"),
    (b'["a"]', "JSON object"),
    (b'{"idle_before": "yesterday"}', "idle_before"),
    (b'{"idle_before": true}', "idle_before"),
    (b'{"idle_before": NaN}', "idle_before"),
    (b'{"after": 3}', "after"),
    (b'{"limit": 0}', "limit"),
    (b'{"limit": 10001}', "limit"),
    (b'{"limit": 2.5}', "limit"),
    (b'{"session_ids": "a"}', "session_ids"),
    (b'{"session_ids": [1]}', "session_ids"),
])
def test_a_wrong_index_request_is_refused_with_400(body: bytes, message: str) -> None:
    _, client = app_client()

    async def scenario() -> None:
        async with client:
            response = await client.post("/guard/index", content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400
            assert message in response.json()["error"]

    asyncio.run(scenario())


def test_no_index_without_an_empty_memory_store_or_with_the_guard_off() -> None:
    for kwargs, state in (({"store": MemoryTraceStore()}, "absent"), ({"max_tombstones": 0}, "absent"),
                          ({}, "ready")):
        _, client = app_client(**kwargs)

        async def scenario(client: httpx.AsyncClient) -> tuple[int, str]:
            async with client:
                status = (await client.get("/guard/status")).json()
                return (await client.post("/guard/index", json={})).status_code, status["index"]

        code, index = asyncio.run(scenario(client))
        assert index == state
        assert (code == 200) == (state == "ready")


# ------------------------------------------------------------------------------------------------
# The HTTP source against answers of POST /guard/index it must not trust
# ------------------------------------------------------------------------------------------------

STATUS = {"enabled": True, "tombstones": 0, "capacity": 10, "dropped_writes": 0, "evicted": 0, "top_droppers": [],
          "index": "ready"}


def launcher(index_answers: Any) -> httpx.MockTransport:
    """A launcher whose ``/guard/status`` says the index is ready and whose ``/guard/index`` answers
    ``index_answers(body)``; every other route is unknown."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/guard/status":
            return httpx.Response(200, json=STATUS)
        if request.url.path == "/guard/index":
            return httpx.Response(200, content=index_answers(json.loads(request.content)))
        return httpx.Response(404, json={"error": "not found"})
    return httpx.MockTransport(handler)


@pytest.mark.parametrize("body", [
    b"[]", b'{"candidates": "x", "tombstoned": []}', b'{"candidates": [], "tombstoned": [], "sessions": "1"}',
    b'{"candidates": [{"session_id": 3, "trace_count": 1}], "tombstoned": [], "sessions": 1, "traces": 1}',
    b'{"candidates": [{"session_id": "a", "trace_count": true}], "tombstoned": [], "sessions": 1, "traces": 1}',
    b"<html>",
])
def test_a_malformed_index_answer_is_a_bad_response(body: bytes) -> None:
    target = Target(name="gw", kind="rllm", url="http://gw.test:9090")
    with pytest.raises(BadResponseError):
        read_trace_store_http(target, Policy(), now=1e9, transport=launcher(lambda _: body))


def test_an_index_whose_pages_do_not_advance_is_read_once() -> None:
    asked: list[Any] = []

    def answer(body: dict[str, Any]) -> bytes:
        asked.append(body.get("after"))
        return json.dumps({"sessions": 2, "traces": 5, "tombstoned": [], "next": "a:0",
                           "candidates": [{"session_id": "a:0", "trace_count": 1, "created_at": 1.0}]}).encode()

    with RllmClient("http://gw.test:9090", transport=launcher(answer)) as client:
        read = read_launcher_index(client, idle_before=0.0, also=[])
    assert asked == [None, "a:0"]  # the second page named the same "next": the read stopped there
    assert read.sessions["session_id"].to_list() == ["a:0"]  # and kept no session twice
    assert (read.session_total, read.trace_total) == (2, 5)
