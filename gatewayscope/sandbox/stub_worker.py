"""A small OpenAI-compatible inference worker that stands in for vLLM behind the rLLM gateway.

It answers like vLLM 0.11+ does when asked for token ids, so the gateway records complete traces:

* ``GET /health`` -> ``{"status": "ok"}`` (the gateway's health loop calls ``{worker}/health``);
* ``GET /v1/models``;
* ``POST /v1/chat/completions``, plain and streaming (SSE), with ``prompt_token_ids`` at the root (in the
  first chunk when streaming), per-choice ``token_ids`` (per chunk when streaming), ``logprobs.content``
  when ``logprobs`` is asked for, and ``usage`` (in streaming only with ``stream_options.include_usage``,
  as vLLM does);
* ``GET /v1/stub/inflight[?tag=T[&wait=S]]``: how many chat calls are in flight right now (in all, or
  carrying the tag ``T``), so a driver can *know* a call reached the worker before it races a delete
  against it. With ``wait`` the answer is held (up to ``S`` seconds) until such a call is in flight.
* ``POST /v1/stub/release?tag=T``: lets the held calls tagged ``T`` answer (see "hold" below).

Everything is deterministic: prompt token ids come from the message text (about one token per four
characters, plus a few per message), so a large prompt really is large; the completion is derived from
the prompt ids. Nothing is random except the response ``id``.

Test knobs, all optional, read from the request (the gateway forwards both body and non hop-by-hop headers):

* delay: header ``x-stub-delay`` or body field ``stub_delay_seconds`` (seconds, capped at
  :data:`MAX_DELAY_SECONDS`). Plain calls sleep before answering; streams send their headers at once and
  sleep before the first chunk.
* tag: header ``x-stub-tag`` or body field ``stub_tag``, counted by ``/v1/stub/inflight``.
* hold: header ``x-stub-hold: 1`` or body field ``stub_hold: true`` (needs a tag): after its delay the call
  also waits until ``POST /v1/stub/release?tag=T`` (or :data:`MAX_HOLD_SECONDS`). A driver that holds a
  call, deletes its session and only then releases it gets a call that lands after the delete, however
  slow the gateway is under load.

These names live in :mod:`gatewayscope.sandbox.stub_protocol`, with the clients that drive the two stub routes.

Run it with ``python -m gatewayscope.sandbox.stub_worker --port P [--host 127.0.0.1]``. It needs
starlette and uvicorn, which come with the ``gateway`` extra (they are dependencies of
``rllm-model-gateway``); the pure token functions of this module import without them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
import uuid
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gatewayscope.sandbox.stub_protocol import (
    DELAY_FIELD,
    DELAY_HEADER,
    HOLD_FIELD,
    HOLD_HEADER,
    INFLIGHT_ROUTE,
    RELEASE_ROUTE,
    TAG_FIELD,
    TAG_HEADER,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

DEFAULT_MODEL = "gatewayscope-stub"
#: characters of message text per prompt token
CHARS_PER_TOKEN = 4
#: tokens added per message (role markers) and once per prompt (the assistant header)
TOKENS_PER_MESSAGE = 4
TOKENS_PER_PROMPT = 3
VOCAB_SIZE = 50_000
#: token ids below this are reserved for the role markers
FIRST_TEXT_TOKEN = 100
_TEXT_VOCAB = VOCAB_SIZE - FIRST_TEXT_TOKEN
#: a request can never make the stub sleep longer than this
MAX_DELAY_SECONDS = 600.0
#: the longest long poll of :data:`INFLIGHT_ROUTE` (``?tag=T&wait=S``)
MAX_INFLIGHT_WAIT_SECONDS = 30.0
#: a held call answers after this long even if nobody releases it
MAX_HOLD_SECONDS = 120.0
#: the longest completion the stub "generates" on its own (capped by max_tokens)
MAX_NATURAL_COMPLETION = 16
MIN_NATURAL_COMPLETION = 8

_ROLE_TOKENS = {"system": 1, "user": 2, "assistant": 3, "tool": 4, "developer": 5, "function": 6}
_WORDS = (
    "the", "agent", "reads", "a", "file", "and", "then", "calls", "tool", "with", "result", "so",
    "answer", "is", "done", "step", "next", "plan", "check", "value", "output", "input", "test", "ok",
)


# ----------------------------------------------------------------------------------------------
# Deterministic "tokenizer" and "model" (pure functions, no web dependencies)
# ----------------------------------------------------------------------------------------------


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one chat message: string content, text parts, and tool calls as JSON."""
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    tool_calls = message.get("tool_calls")
    if tool_calls:
        parts.append(json.dumps(tool_calls, sort_keys=True))
    return "".join(parts)


def text_token_ids(text: str) -> list[int]:
    """Token ids of ``text``: one per :data:`CHARS_PER_TOKEN` characters, derived with CRC-32."""
    return [
        FIRST_TEXT_TOKEN + zlib.crc32(text[i:i + CHARS_PER_TOKEN].encode("utf-8")) % _TEXT_VOCAB
        for i in range(0, len(text), CHARS_PER_TOKEN)
    ]


def prompt_token_ids(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Prompt token ids of a chat, as the stub reports them in ``prompt_token_ids``.

    Each message contributes ``TOKENS_PER_MESSAGE`` marker tokens plus ``ceil(len(text) / 4)`` text tokens,
    and the prompt ends with ``TOKENS_PER_PROMPT`` tokens, so the size is proportional to the text.

    >>> len(prompt_token_ids([{"role": "user", "content": "x" * 400}]))
    107
    """
    ids: list[int] = []
    for message in messages:
        role = _ROLE_TOKENS.get(str(message.get("role", "")), 7)
        ids += [0, role]
        ids += text_token_ids(message_text(message))
        ids += [0, 8]
    ids += [0, _ROLE_TOKENS["assistant"], 9]
    return ids


def prompt_token_count(messages: Sequence[Mapping[str, Any]]) -> int:
    """``len(prompt_token_ids(messages))`` without building the list."""
    return TOKENS_PER_PROMPT + sum(
        TOKENS_PER_MESSAGE + math.ceil(len(message_text(m)) / CHARS_PER_TOKEN) for m in messages
    )


@dataclass(frozen=True)
class Completion:
    """What the stub "generates" for one prompt."""

    token_ids: list[int]
    words: list[str]
    logprobs: list[float]
    finish_reason: str

    @property
    def text(self) -> str:
        """The completion text (each token is one word preceded by a space, the first one without)."""
        return "".join(self.words).lstrip()


def complete(prompt_ids: Sequence[int], max_tokens: int | None = None) -> Completion:
    """The deterministic completion of ``prompt_ids``.

    Its natural length is 8 to 16 tokens (from the prompt); ``max_tokens`` below that cuts it short with
    ``finish_reason="length"``.
    """
    seed = zlib.crc32(",".join(map(str, prompt_ids)).encode("ascii"))
    rng = random.Random(seed)
    natural = MIN_NATURAL_COMPLETION + seed % (MAX_NATURAL_COMPLETION - MIN_NATURAL_COMPLETION + 1)
    n = natural
    finish = "stop"
    if max_tokens is not None and max_tokens < natural:
        n = max(0, max_tokens)
        finish = "length"
    ids = [rng.randrange(FIRST_TEXT_TOKEN, VOCAB_SIZE) for _ in range(n)]
    words = [f" {_WORDS[t % len(_WORDS)]}" for t in ids]
    logprobs = [-round(0.01 + (t % 997) / 1000.0, 3) for t in ids]
    return Completion(token_ids=ids, words=words, logprobs=logprobs, finish_reason=finish)


# ----------------------------------------------------------------------------------------------
# The web app
# ----------------------------------------------------------------------------------------------


@dataclass
class StubState:
    """Counters the stub keeps (per process)."""

    requests_total: int = 0
    streams_total: int = 0
    inflight: Counter[str] = field(default_factory=Counter)
    inflight_total: int = 0
    #: calls waiting for a release, per tag
    held: Counter[str] = field(default_factory=Counter)
    #: per tag: set once the tag is released (kept until its last call in flight ends)
    releases: dict[str, asyncio.Event] = field(default_factory=dict)
    released_total: int = 0

    def release_event(self, tag: str) -> asyncio.Event:
        """The release event of ``tag`` (created on first use)."""
        event = self.releases.get(tag)
        if event is None:
            event = self.releases[tag] = asyncio.Event()
        return event

    def start(self, tag: str) -> None:
        """A chat call tagged ``tag`` (``""``: untagged) is in flight."""
        self.requests_total += 1
        self.inflight_total += 1
        self.inflight[tag] += 1

    def end(self, tag: str) -> None:
        """The call has answered (or given up); a tag's release is forgotten with its last call."""
        self.inflight_total -= 1
        self.inflight[tag] -= 1
        if self.inflight[tag] <= 0:
            del self.inflight[tag]
            self.releases.pop(tag, None)

    async def hold(self, tag: str) -> None:
        """Wait until ``tag`` is released, at most :data:`MAX_HOLD_SECONDS`."""
        self.held[tag] += 1
        try:
            await asyncio.wait_for(self.release_event(tag).wait(), MAX_HOLD_SECONDS)
        except asyncio.TimeoutError:
            pass
        finally:
            self.held[tag] -= 1
            if self.held[tag] <= 0:
                del self.held[tag]


class _BadRequest(Exception):
    pass


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in {"1", "true", "yes"})


def _delay_of(headers: Mapping[str, str], body: Mapping[str, Any]) -> float:
    raw: Any = headers.get(DELAY_HEADER)
    if raw is None:
        raw = body.get(DELAY_FIELD)
    if raw is None:
        return 0.0
    try:
        delay = float(raw)
    except (TypeError, ValueError) as err:
        raise _BadRequest(f"stub delay must be a number of seconds, not {raw!r}") from err
    if not math.isfinite(delay) or delay < 0:
        raise _BadRequest(f"stub delay must be a non-negative number of seconds, not {raw!r}")
    return min(delay, MAX_DELAY_SECONDS)


def _max_tokens_of(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _BadRequest(f"{key} must be a non-negative integer")
            return value
    return None


def _wants_token_ids(body: Mapping[str, Any]) -> bool:
    extra = body.get("extra_body")
    return _truthy(body.get("return_token_ids")) or (
        isinstance(extra, Mapping) and _truthy(extra.get("return_token_ids"))
    )


def _logprob_entry(word: str, logprob: float) -> dict[str, Any]:
    return {"token": word, "logprob": logprob, "bytes": list(word.encode("utf-8")), "top_logprobs": []}


@dataclass(frozen=True)
class _Chat:
    """One chat call as the stub reads it, and its answer (plain or as stream chunks)."""

    tag: str
    delay: float
    hold: bool
    stream: bool
    want_ids: bool
    want_logprobs: bool
    include_usage: bool
    model: str
    prompt_ids: list[int]
    completion: Completion
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def read(cls, raw: bytes, headers: Mapping[str, str], model: str) -> _Chat:
        """The call from its body and headers (``model``: when the body names none); _BadRequest if bad."""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest("the request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise _BadRequest("messages must be a non-empty list of objects")
        delay = _delay_of(headers, body)
        max_tokens = _max_tokens_of(body)
        tag = str(headers.get(TAG_HEADER) or body.get(TAG_FIELD) or "")
        hold = _truthy(headers.get(HOLD_HEADER)) or _truthy(body.get(HOLD_FIELD))
        if hold and not tag:
            raise _BadRequest(f"a held call needs a tag ({TAG_HEADER}) to be released by")
        prompt_ids = prompt_token_ids(messages)
        return cls(
            tag=tag, delay=delay, hold=hold, stream=bool(body.get("stream")), want_ids=_wants_token_ids(body),
            want_logprobs=_truthy(body.get("logprobs")),
            include_usage=isinstance(body.get("stream_options"), dict) and bool(
                body["stream_options"].get("include_usage")),
            model=str(body.get("model") or model), prompt_ids=prompt_ids,
            completion=complete(prompt_ids, max_tokens),
        )

    @property
    def usage(self) -> dict[str, int]:
        """The call's ``usage``."""
        prompt, completion = len(self.prompt_ids), len(self.completion.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def reply(self) -> dict[str, Any]:
        """The answer of a plain (not streamed) call."""
        completion = self.completion
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": completion.text, "tool_calls": []},
            "logprobs": ({"content": [_logprob_entry(w, lp) for w, lp in
                                      zip(completion.words, completion.logprobs, strict=True)]}
                         if self.want_logprobs else None),
            "finish_reason": completion.finish_reason,
            "stop_reason": None,
        }
        if self.want_ids:
            choice["token_ids"] = completion.token_ids
        payload: dict[str, Any] = {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [choice], "usage": self.usage, "prompt_logprobs": None, "kv_transfer_params": None,
        }
        if self.want_ids:
            payload["prompt_token_ids"] = self.prompt_ids
        return payload

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        data = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}
        return f"data: {json.dumps(data)}\n\n"

    def chunks(self) -> Iterator[str]:
        """The server-sent events of a streamed call, ``[DONE]`` last."""
        completion = self.completion
        first_extra: dict[str, Any] = {"prompt_token_ids": self.prompt_ids} if self.want_ids else {}
        yield self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}], **first_extra)
        last = len(completion.token_ids) - 1
        for i, (tid, word, lp) in enumerate(
                zip(completion.token_ids, completion.words, completion.logprobs, strict=True)):
            text = word.lstrip() if i == 0 else word
            piece: dict[str, Any] = {
                "index": 0, "delta": {"content": text},
                "logprobs": {"content": [_logprob_entry(text, lp)]} if self.want_logprobs else None,
                "finish_reason": completion.finish_reason if i == last else None,
            }
            if self.want_ids:
                piece["token_ids"] = [tid]
            yield self._chunk([piece])
        if last < 0:  # an empty completion still says why it stopped
            yield self._chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": completion.finish_reason}])
        if self.include_usage:
            yield self._chunk([], usage=self.usage)
        yield "data: [DONE]\n\n"


def _json(payload: Any, status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(payload, status_code=status)


def _error(status: int, message: str) -> Response:
    return _json({"error": {"message": message, "type": "invalid_request_error", "code": status}}, status)


class StubWorker:
    """The stub worker: its :class:`StubState` and one method per route; :meth:`app` serves them."""

    def __init__(self, model: str = DEFAULT_MODEL) -> None:
        self.model = model
        self.state = StubState()

    def app(self) -> Starlette:
        """The routes as an ASGI app (starlette); ``app.state.stub`` holds the :class:`StubState`."""
        from starlette.applications import Starlette
        from starlette.routing import Route

        app = Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route(INFLIGHT_ROUTE, self.inflight, methods=["GET"]),
            Route(RELEASE_ROUTE, self.release, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ])
        app.state.stub = self.state
        return app

    async def health(self, request: Request) -> Response:
        """``GET /health``."""
        return _json({"status": "ok"})

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model it serves."""
        return _json({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "gatewayscope-stub",
             "max_model_len": 131072},
        ]})

    async def inflight(self, request: Request) -> Response:
        """``GET`` :data:`INFLIGHT_ROUTE`: the calls in flight and held (of ``?tag=``, or in all); with
        ``&wait=S``, a long poll answered as soon as a call with the tag is in flight."""
        state = self.state
        tag = request.query_params.get("tag")
        try:
            wait = min(float(request.query_params.get("wait") or 0.0), MAX_INFLIGHT_WAIT_SECONDS)
        except ValueError:
            return _error(400, "wait must be a number of seconds")
        if tag is not None and wait > 0:
            deadline = time.monotonic() + wait
            while not state.inflight[tag] and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        payload: dict[str, Any] = {
            "inflight": state.inflight[tag] if tag is not None else state.inflight_total,
            "held": state.held[tag] if tag is not None else sum(state.held.values()),
            "requests_total": state.requests_total,
            "streams_total": state.streams_total,
        }
        if tag is not None:
            payload["tag"] = tag
        return _json(payload)

    async def release(self, request: Request) -> Response:
        """``POST`` :data:`RELEASE_ROUTE` ``?tag=T``: the calls held under ``T`` answer."""
        state = self.state
        tag = request.query_params.get("tag")
        if not tag:
            return _error(400, "release needs a tag (?tag=T)")
        held = state.held[tag]
        state.release_event(tag).set()
        state.released_total += 1
        return _json({"tag": tag, "held": held, "inflight": state.inflight[tag]})

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``, plain or streamed, after the call's delay and hold."""
        from starlette.responses import StreamingResponse

        try:
            chat = _Chat.read(await request.body(), request.headers, self.model)
        except _BadRequest as err:
            return _error(400, str(err))
        self.state.start(chat.tag)
        if not chat.stream:
            try:
                await self._wait_turn(chat)
            finally:
                self.state.end(chat.tag)
            return _json(chat.reply())
        self.state.streams_total += 1
        return StreamingResponse(self._events(chat), media_type="text/event-stream")

    async def _wait_turn(self, chat: _Chat) -> None:
        if chat.delay:
            await asyncio.sleep(chat.delay)
        if chat.hold:
            await self.state.hold(chat.tag)

    async def _events(self, chat: _Chat) -> AsyncIterator[str]:
        # a stream sends its headers at once; the delay and the hold come before its first chunk
        try:
            await self._wait_turn(chat)
            for event in chat.chunks():
                yield event
        finally:
            self.state.end(chat.tag)


def create_app(model: str = DEFAULT_MODEL) -> Starlette:
    """The stub worker as an ASGI app (starlette). ``app.state.stub`` holds its :class:`StubState`."""
    return StubWorker(model).app()


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: serve the stub worker with uvicorn until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m gatewayscope.sandbox.stub_worker",
                                     description="OpenAI-compatible stub inference worker (vLLM fields).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name served by /v1/models")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import uvicorn

    uvicorn.run(create_app(args.model), host=args.host, port=args.port, log_level=args.log_level,
                access_log=False, timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
