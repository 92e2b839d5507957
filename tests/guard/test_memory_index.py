"""The guarded launcher's orphan index (``GuardedTraceStore(index=True)``, ``POST /guard/index``), in process.

The inner store is rLLM's own ``MemoryTraceStore`` inside rLLM's own app (httpx's ASGI transport); the truth every
answer is compared with is the same app's ``GET /sessions``, filtered by the full read's candidate rule, and for the
trace summaries its ``POST /traces/query`` of each candidate through ``trace_row`` (the rows a full read makes).
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
from gatewayscope.sources.rllm_trace import summary_row, trace_row

#: session ids a client may send: quotes, markup, escapes, a slash, non-ASCII
ODD_IDS = ["quote'\";--", "<script>x</script>:1", "%2F..%00", "a/b:2", "émoji 🧵:0", "tab\tnew\nline:3"]


def trace(trace_id: str, session_id: str, rng: random.Random | None = None) -> dict[str, Any]:
    """A trace record; with ``rng``, one of the shapes whose fields :func:`trace_row` reads differently (weight
    version at the root or in the metadata, prompt token ids or only a count, messages or none, odd models)."""
    record: dict[str, Any] = {"trace_id": trace_id, "session_id": session_id, "model": "m", "messages": []}
    if rng is None:
        return record
    record["timestamp"] = rng.choice([1_700_000_000.25 + rng.random(), 5, None, "soon"])
    record["model"] = rng.choice(["m", "<b>model</b>", "", None, 7])
    record["messages"] = rng.choice([[], None, [{"role": "user", "content": "héllo \u2028 " * rng.randint(0, 3)}],
                                     {"odd": [1.5, True, None]}])
    shape = rng.randrange(4)
    if shape == 0:
        record["weight_version"] = rng.choice([3, None, "4", True])
    elif shape == 1:
        record["metadata"] = {"weight_version": rng.choice([2, 2.5, None])}
    record["prompt_token_ids"] = rng.choice([[1, 2, 3], [], None, "x"])
    record["token_counts"] = rng.choice([{"prompt": 9}, {"prompt": True}, {}, None])
    return record


def app_client(**kwargs: Any) -> tuple[Any, httpx.AsyncClient]:
    app = guarded_gateway.build_app(GatewayConfig(store_worker="memory"), **kwargs)
    return app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test")


async def truth(client: httpx.AsyncClient, idle_before: float | None, also: list[str]) -> dict[str, Any]:
    """What the full read takes from ``GET /sessions``: totals and the candidates' (id, count, created_at)."""
    listing = (await client.get("/sessions")).json()
    checked = (await client.post("/guard/tombstones/check",
                                 json={"session_ids": [s["session_id"] for s in listing]})).json()
    tombstoned = set(checked["tombstoned"])
    confirmable = tombstoned - set(checked["reused"])  # used again since their fence: no orphan proof
    rows = sorted((s["session_id"], s["trace_count"], s["created_at"]) for s in listing
                  if s["session_id"] in confirmable or s["session_id"] in also or (s["trace_count"] == 1 and (
                      idle_before is None or s["created_at"] is None or s["created_at"] <= idle_before)))
    return {"sessions": len(listing), "traces": sum(s["trace_count"] for s in listing), "rows": rows,
            "tombstoned": sorted(sid for sid, _, _ in rows if sid in tombstoned)}


async def indexed(client: httpx.AsyncClient, idle_before: float | None, also: list[str],
                  limit: int = 4, summaries: bool = False) -> dict[str, Any]:
    rows: list[tuple[str, int, float]] = []
    tombstoned: list[str] = []
    summarized: dict[str, list[tuple[Any, ...]]] = {}
    after = None
    first: dict[str, Any] = {}
    for _ in range(1000):
        page = (await client.post("/guard/index", json={"idle_before": idle_before, "after": after, "limit": limit,
                                                        "session_ids": also, "summaries": summaries})).json()
        first = first or page
        rows += [(c["session_id"], c["trace_count"], c["created_at"]) for c in page["candidates"]]
        summarized.update({c["session_id"]: [summary_row(c["session_id"], s) for s in c["summaries"]]
                           for c in page["candidates"] if "summaries" in c})
        tombstoned += page["tombstoned"]
        after = page["next"]
        if after is None:
            break
    answer = {"sessions": first["sessions"], "traces": first["traces"], "rows": rows, "tombstoned": sorted(tombstoned)}
    if summaries:
        answer["summaries"] = summarized
    return answer


async def whole_rows(client: httpx.AsyncClient, session_ids: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Each session's trace rows as a read of whole records makes them: ``POST /traces/query`` for the session,
    its records naming it, through :func:`trace_row` (after the JSON they travel as)."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    for sid in session_ids:
        records = (await client.post("/traces/query", json={"session_ids": [sid]})).json()
        found[sid] = [trace_row(record) for record in records if record.get("session_id") == sid]
    return found


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
                    await guard.store_trace(f"t{step}", sid, trace(f"t{step}", sid, rng))
                elif roll < 0.62:  # the same trace id written again: counted once, as the store counts it
                    await guard.store_trace(f"t{step - 1}", sid, trace(f"t{step - 1}", sid, rng))
                elif roll < 0.72:
                    await guard.delete_session(sid)
                elif roll < 0.8:
                    await client.post("/sessions", json={"session_id": sid})  # a retry: changes no fence
                elif roll < 0.85:
                    guard.add_tombstones([sid])
                elif roll < 0.9:
                    app.state.sessions.ensure_session(sid)
                if step % 50 == 49:
                    listing = (await client.get("/sessions")).json()
                    created = sorted(s["created_at"] for s in listing)
                    for idle_before in (None, created[len(created) // 2] if created else 0.0, 0.0):
                        also = rng.sample(ids, 3)
                        expected = await truth(client, idle_before, also)
                        assert await indexed(client, idle_before, also) == expected
                        # with summaries: the same candidates, each one-trace, tombstoned or asked-for one with the
                        # rows a read of its whole records gives
                        served = await indexed(client, idle_before, also, summaries=True)
                        wanted = [sid for sid, count, _ in expected["rows"]
                                  if count == 1 or sid in expected["tombstoned"] or sid in also]
                        assert served.pop("summaries") == await whole_rows(client, wanted)
                        assert served == expected

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


def test_a_record_the_gateways_encoder_refuses_gets_no_summary() -> None:
    """NaN in a caller's messages: the gateway stores it, but its own JSON encoder refuses to send the record
    (``POST /traces/query`` fails), so the launcher serves no summary for it either and a scan reads it as any
    read of whole records does, rather than report what a read of that gateway cannot."""
    app, client = app_client()
    guard: GuardedTraceStore = app.state.guard

    async def scenario() -> None:
        async with client:
            for sid, content in (("nan:0", float("nan")), ("inf:0", float("inf")), ("fine:0", "hello")):
                record = trace(f"{sid}-t", sid)
                record["messages"] = [{"role": "user", "content": content}]
                await guard.store_trace(f"{sid}-t", sid, record)
            page = (await client.post("/guard/index", json={"summaries": True})).json()
            served = {c["session_id"]: c.get("summaries") for c in page["candidates"]}
            assert served["nan:0"] is None and served["inf:0"] is None
            assert served["fine:0"] is not None and served["fine:0"][0]["prompt_chars"] > 0

    asyncio.run(scenario())


def test_the_summaries_of_one_answer_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most INDEX_PAGE_SUMMARIES summaries an answer: the page ends before the candidate that would pass it, a
    candidate with more traces than that gets none, and so does one whose record strict JSON cannot carry."""
    monkeypatch.setattr(guarded_gateway, "INDEX_PAGE_SUMMARIES", 5)
    app, client = app_client()
    guard: GuardedTraceStore = app.state.guard
    counts = {"a:0": 1, "b:0": 3, "c:0": 2, "d:0": 7, "e:0": 1, "f:0": 1}

    async def scenario() -> None:
        async with client:
            for sid, count in counts.items():
                for k in range(count):
                    record = trace(f"{sid}-{k}", sid)
                    record["timestamp"] = float("nan") if sid == "f:0" else 100.0 + k
                    await guard.store_trace(f"{sid}-{k}", sid, record)
            guard.add_tombstones(["b:0", "c:0", "d:0"])  # tombstoned: candidates with all their traces
            pages = []
            after = None
            for _ in range(10):
                page = (await client.post("/guard/index", json={"after": after, "summaries": True})).json()
                pages.append(page)
                after = page["next"]
                if after is None:
                    break
            assert [[c["session_id"] for c in page["candidates"]] for page in pages] == [
                ["a:0", "b:0"], ["c:0", "d:0", "e:0", "f:0"]]
            assert pages[0]["next"] == "b:0" and pages[0]["tombstoned"] == ["b:0"]
            assert pages[1]["tombstoned"] == ["c:0", "d:0"]
            served = {c["session_id"]: c.get("summaries") for page in pages for c in page["candidates"]}
            assert {sid: None if got is None else len(got) for sid, got in served.items()} == {
                "a:0": 1, "b:0": 3, "c:0": 2, "d:0": None, "e:0": 1, "f:0": None}
            assert all(sum(len(c.get("summaries", [])) for c in page["candidates"]) <= 5 for page in pages)
            rows = await whole_rows(client, ["a:0", "b:0", "c:0", "e:0"])
            assert {sid: [summary_row(sid, x) for x in got] for sid, got in served.items() if got} == rows
            # without summaries nothing ends a page early
            plain = (await client.post("/guard/index", json={})).json()
            assert len(plain["candidates"]) == 6 and plain["next"] is None
            assert not any("summaries" in c for c in plain["candidates"])

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
    (b'{"summaries": 1}', "summaries"),
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


GOOD_SUMMARY = {"trace_id": "t1", "timestamp": 5.0, "weight_version": 2, "prompt_tokens": 3, "prompt_chars": 40,
                "model": "m"}


@pytest.mark.parametrize("summaries", [
    "x", {"trace_id": "t1"}, [None], ["t1"], [{k: v for k, v in GOOD_SUMMARY.items() if k != "model"}],
    [{**GOOD_SUMMARY, "trace_id": 7}], [{**GOOD_SUMMARY, "timestamp": "5"}], [{**GOOD_SUMMARY, "prompt_tokens": True}],
    [{**GOOD_SUMMARY, "weight_version": 2.5}], [{**GOOD_SUMMARY, "model": ["<script>"]}],
])
def test_a_malformed_trace_summary_is_a_bad_response_naming_the_session(summaries: Any) -> None:
    sid = "<script>x</script>:1"
    body = json.dumps({"sessions": 1, "traces": 1, "tombstoned": [], "next": None,
                       "candidates": [{"session_id": sid, "trace_count": 1, "created_at": 1.0,
                                       "summaries": summaries}]}).encode()
    target = Target(name="gw", kind="rllm", url="http://gw.test:9090")
    with pytest.raises(BadResponseError, match="summar") as caught:
        read_trace_store_http(target, Policy(), now=1e9, transport=launcher(lambda _: body))
    assert repr(sid) in str(caught.value)


def test_candidates_without_summaries_are_read_whole_and_the_others_not_at_all() -> None:
    """A launcher that summarizes some candidates (or, older, none): the scan asks POST /traces/query for the
    others only, and its rows are the summaries' and the records' alike."""
    asked: list[list[str]] = []
    candidates = [{"session_id": "a:0", "trace_count": 1, "created_at": 1.0, "summaries": [GOOD_SUMMARY]},
                  {"session_id": "b:0", "trace_count": 1, "created_at": 1.0},
                  {"session_id": "c:0", "trace_count": 2, "created_at": 1.0, "summaries": []}]
    record = {"trace_id": "t2", "session_id": "b:0", "timestamp": 6.0, "model": "m", "prompt_token_ids": [1, 2],
              "messages": [{"role": "user", "content": "hi"}], "metadata": {"weight_version": 4}}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/guard/status":
            return httpx.Response(200, json=STATUS)
        if request.url.path == "/guard/index":
            assert json.loads(request.content)["summaries"] is True
            return httpx.Response(200, json={"sessions": 9, "traces": 12, "tombstoned": [], "next": None,
                                             "candidates": candidates})
        if request.url.path == "/traces/query":
            asked.append(json.loads(request.content)["session_ids"])
            return httpx.Response(200, json=[record] if "b:0" in asked[-1] else [])
        return httpx.Response(404, json={"error": "not found"})

    target = Target(name="gw", kind="rllm", url="http://gw.test:9090")
    data = read_trace_store_http(target, Policy(), now=1e9, transport=httpx.MockTransport(handler))
    assert asked == [["b:0"]]
    assert sorted(data.candidate_traces.iter_rows()) == [("a:0", "t1", 5.0, 2, 3, 40, "m", None), trace_row(record)]


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
