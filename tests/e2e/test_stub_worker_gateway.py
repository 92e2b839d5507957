"""The stub inference worker, alone and behind the real rLLM gateway: the traces it makes are complete."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from gatewayscope.sandbox.stub_protocol import DELAY_FIELD, StubClient, stub_headers
from gatewayscope.sandbox.stub_worker import complete, prompt_token_count, prompt_token_ids

pytestmark = pytest.mark.e2e

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Summarise the failing test output in one line, please."},
]


def wait_traces(client: httpx.Client, sid: str, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The session's traces once there are ``n`` (the gateway persists them fire-and-forget)."""
    deadline = time.monotonic() + timeout
    while True:
        traces = client.get(f"/sessions/{sid}/traces").json()
        if len(traces) >= n or time.monotonic() >= deadline:
            return traces
        time.sleep(0.02)


def wait_inflight(client: httpx.Client, tag: str, timeout: float = 5.0) -> int:
    """Calls tagged ``tag`` in flight at the worker, long-polled (answered as soon as there is one)."""
    return StubClient(client).inflight(tag, wait=timeout).inflight


def test_stub_worker_direct(stub_worker: str) -> None:
    with httpx.Client(base_url=stub_worker, timeout=10) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["gatewayscope-stub"]

        plain = c.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES}).json()
        assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]  # not asked for
        assert plain["choices"][0]["logprobs"] is None

        body = {"model": "m", "messages": MESSAGES, "logprobs": True, "return_token_ids": True}
        first = c.post("/v1/chat/completions", json=body).json()
        again = c.post("/v1/chat/completions", json=body).json()
        choice = first["choices"][0]
        assert first["prompt_token_ids"] == prompt_token_ids(MESSAGES) == again["prompt_token_ids"]
        assert choice["token_ids"] == again["choices"][0]["token_ids"]  # deterministic
        assert choice["message"]["content"] == plain["choices"][0]["message"]["content"]
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        assert first["usage"] == {"prompt_tokens": len(first["prompt_token_ids"]),
                                  "completion_tokens": len(choice["token_ids"]),
                                  "total_tokens": len(first["prompt_token_ids"]) + len(choice["token_ids"])}

        cut = c.post("/v1/chat/completions", json={**body, "max_tokens": 3}).json()["choices"][0]
        assert cut["finish_reason"] == "length" and cut["token_ids"] == choice["token_ids"][:3]

        for bad in ({"model": "m"}, {"model": "m", "messages": []},
                    {"model": "m", "messages": MESSAGES, "stub_delay_seconds": -1}):
            assert c.post("/v1/chat/completions", json=bad).status_code == 400
        assert c.post("/v1/chat/completions", content=b"{not json").status_code == 400


def test_prompt_size_is_proportional_to_text() -> None:
    small = [{"role": "user", "content": "y" * 400}]
    large = [{"role": "user", "content": "y" * 40_000}]
    assert len(prompt_token_ids(small)) == prompt_token_count(small) == 4 + 100 + 3
    assert len(prompt_token_ids(large)) == prompt_token_count(large) == 4 + 10_000 + 3
    assert complete(prompt_token_ids(small)) == complete(prompt_token_ids(small))


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_plain_and_streaming_calls_through_gateway_make_full_traces(rllm_gateway: Any, store: str) -> None:
    gw = rllm_gateway(store)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        resp = c.post("/sessions/plain-1/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
        assert resp.status_code == 200
        answer = resp.json()
        # The gateway strips vLLM fields and the logprobs it injected before answering the client.
        assert "prompt_token_ids" not in answer and "token_ids" not in answer["choices"][0]
        assert "logprobs" not in answer["choices"][0]

        lines: list[str] = []
        with c.stream("POST", "/sessions/stream-1/v1/chat/completions",
                      json={"model": "m", "messages": MESSAGES, "stream": True,
                            "stream_options": {"include_usage": True}}) as sresp:
            assert sresp.status_code == 200
            assert sresp.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in sresp.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        streamed_text = "".join(
            (ch["choices"][0]["delta"].get("content") or "")
            for ch in (json.loads(line[6:]) for line in lines[:-1]) if ch["choices"])

        [plain] = wait_traces(c, "plain-1", 1)
        [streamed] = wait_traces(c, "stream-1", 1)

    expected_prompt = prompt_token_ids(MESSAGES)
    expected = complete(expected_prompt)
    for trace in (plain, streamed):
        assert trace["prompt_token_ids"] == expected_prompt
        assert trace["completion_token_ids"] == expected.token_ids
        assert trace["logprobs"] == expected.logprobs
        assert trace["response_message"]["content"] == expected.text
        assert trace["finish_reason"] == "stop"
        assert trace["token_counts"] == {"prompt": len(expected_prompt), "completion": len(expected.token_ids)}
    assert streamed_text == expected.text == answer["choices"][0]["message"]["content"]
    assert plain["session_id"] == "plain-1" and streamed["session_id"] == "stream-1"
    assert streamed["raw_response"] is None and plain["raw_response"]["prompt_token_ids"] == expected_prompt


@pytest.mark.parametrize("how", ["header", "body"])
def test_delay_reaches_the_worker_through_the_gateway(rllm_gateway: Any, how: str) -> None:
    gw = rllm_gateway("memory")
    tag = f"delay-{how}"
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES}
    headers = stub_headers(tag=tag, delay=0.8 if how == "header" else None)
    if how == "body":
        body[DELAY_FIELD] = 0.8
    result: dict[str, Any] = {}

    def call() -> None:
        result["response"] = httpx.post(f"{gw.url}/sessions/{tag}/v1/chat/completions", json=body,
                                        headers=headers, timeout=10)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        with httpx.Client(base_url=gw.url, timeout=10) as c:
            # the probe goes through the gateway's bare /v1 proxy to the worker: the call is held there
            assert wait_inflight(c, tag) == 1
            assert c.get(f"/sessions/{tag}/traces").json() == []  # nothing persisted while it is held
    finally:
        thread.join(timeout=10)
    assert result["response"].status_code == 200
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        [trace] = wait_traces(c, tag, 1)
        assert StubClient(c).inflight(tag).inflight == 0
    assert trace["latency_ms"] >= 800  # the gateway measured the worker's sleep (a lower bound, not a timing)


def test_a_held_call_answers_only_after_its_release(rllm_gateway: Any) -> None:
    gw = rllm_gateway("memory")
    tag = "held-1"
    result: dict[str, Any] = {}

    def call() -> None:
        result["response"] = httpx.post(f"{gw.url}/sessions/{tag}/v1/chat/completions",
                                        json={"model": "m", "messages": MESSAGES},
                                        headers=stub_headers(tag=tag, hold=True, delay=0.1),
                                        timeout=30)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        with httpx.Client(base_url=gw.url, timeout=10) as c:
            stub = StubClient(c)
            assert wait_inflight(c, tag) == 1
            deadline = time.monotonic() + 5
            while stub.inflight(tag).held != 1:  # past its delay
                assert time.monotonic() < deadline
                time.sleep(0.01)
            # held: the session has no trace, and deleting it now happens before the call lands
            assert c.get(f"/sessions/{tag}/traces").json() == []
            assert c.delete(f"/sessions/{tag}").json() == {"deleted": 0}
            assert thread.is_alive()
            assert stub.release(tag) == {"tag": tag, "held": 1, "inflight": 1}
    finally:
        thread.join(timeout=30)
    assert result["response"].status_code == 200
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        assert len(wait_traces(c, tag, 1)) == 1  # landed after the delete: the straggler's resurrection
        assert c.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES},
                      headers=stub_headers(hold=True)).status_code == 400  # a hold needs a tag
