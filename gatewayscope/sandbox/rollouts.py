"""Drive rLLM-style rollouts through an rLLM gateway with real stragglers (the straggler race, docs/concepts.md).

A rollout behaves like rLLM's: its session id is ``f"{uuid4()}:{rollout_idx}"`` (several rollouts of one
task share the uuid), it makes ``calls_per_rollout`` chat calls through
``/sessions/{uid}/v1/chat/completions`` (a growing multi-turn conversation), and it ends with
``POST /admin/flush`` then ``DELETE /sessions/{uid}``.

A *straggler* rollout has one more call, with a large prompt, still in flight when it flushes and deletes:
the driver sends that call tagged with its uid, with a delay of ``D`` seconds (the stub worker sleeps ``D``
seconds) and a hold (it then also waits for a release; the stub protocol,
:mod:`gatewayscope.sandbox.stub_protocol`), waits until the worker reports the call in flight (asked on each
worker listed by the gateway's ``GET /admin/workers``), then flushes and deletes, and only then releases the
call. The call
returns after the delete, however loaded the gateway is; the gateway persists its trace fire-and-forget,
and the store re-creates the session with exactly one trace: a permanent orphan. (When the workers are not
stub workers, only the delay orders the call after the delete.) The driver waits (bounded) until each
straggler's trace is visible (``GET /sessions/{uid}`` shows one trace) before it returns.

Before it flushes and deletes, a rollout waits until its own calls' traces are visible (as rLLM's
draining ``flush()`` does; 0.1.0's ``POST /admin/flush`` does not wait), so the stragglers' late calls are
the only leak; ``drain_before_delete=False`` drops that wait.

*Live* sessions are rollouts still in progress: they make their calls and are not deleted (the first one
has exactly one trace, like an orphan, but is not one).

:func:`run_rollouts` (sync) and :func:`run_rollouts_async` return a :class:`RolloutRun`;
:func:`retry_rollout` replays rLLM's retry, which deletes a session and reuses its uid; :func:`trainer_steps`
replays the steps of a trainer that samples the same tasks again (the same uids every step, each step ending
with a batch delete), optionally with a straggler of one step landing during the next.
``python -m gatewayscope.sandbox.rollouts --gateway URL --rollouts 30 --stragglers 10`` prints a JSON
summary.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import random
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from gatewayscope.sandbox.stub_protocol import AsyncStubClient, stub_headers

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "gatewayscope-stub"
#: characters of the large "tool output" a straggler's call carries (about 8,000 stub tokens)
DEFAULT_LARGE_PROMPT_CHARS = 32_000
#: seconds an idle connection to the gateway is kept for reuse: below uvicorn's 5 s keep-alive timeout
KEEPALIVE_EXPIRY = 2.0

_WORDS = (
    "repository", "function", "error", "traceback", "assert", "module", "import", "config", "value",
    "returns", "list", "dict", "string", "test", "failed", "passed", "line", "file", "path", "patch",
    "diff", "commit", "branch", "build", "install", "version", "request", "response", "token", "cache",
)
_SYSTEM_PROMPT = (
    "You are a careful software engineering agent. Think step by step, call one tool per turn, read "
    "every tool result before you act, and finish with a short summary of the change you made."
)

T = TypeVar("T")


# ----------------------------------------------------------------------------------------------
# Plans (pure)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutPlan:
    """What one rollout (or live session) will do. Built by :func:`plan_rollouts`, pure data."""

    uid: str
    task_id: str
    rollout_idx: int
    task_prompt: str
    observations: tuple[str, ...]  # one user turn per normal call
    straggler: bool = False
    large_observation: str = ""  # the straggler call's extra user turn
    live: bool = False

    @property
    def calls(self) -> int:
        """Normal calls (the straggler's extra call not included)."""
        return len(self.observations)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _large_text(rng: random.Random, chars: int) -> str:
    if chars <= 0:
        return ""
    lines: list[str] = []
    size = 0
    n = 0
    while size < chars:
        line = f"{n:05d}: {_words(rng, 12)}"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "Tool output (cat of the whole log):\n" + "\n".join(lines)[:chars]


def new_task_id() -> str:
    """A task uuid, as rLLM makes one per task."""
    return str(uuid.uuid4())


def plan_rollouts(*, n_rollouts: int, n_stragglers: int = 0, calls_per_rollout: int = 3, n_live: int = 0,
                  group_size: int = 5, seed: int = 0, cluster_stragglers: bool = True,
                  large_prompt_chars: int = DEFAULT_LARGE_PROMPT_CHARS,
                  live_calls: Sequence[int] | None = None,
                  task_id_factory: Callable[[], str] = new_task_id) -> list[RolloutPlan]:
    """The rollouts (then the live sessions) of one run.

    Rollout ``i`` belongs to task ``i // group_size`` and has ``rollout_idx = i % group_size``; its uid is
    ``f"{task_id}:{rollout_idx}"``. With ``cluster_stragglers`` the stragglers fill whole "hard" tasks
    (picked at random), so several members of one task straggle together as in the seed; without it they
    are scattered. Live session ``j`` makes ``live_calls[j]`` calls (default ``1 + j % calls_per_rollout``,
    so the first has exactly one trace). Prompts are drawn from ``seed``; uids are fresh uuids unless
    ``task_id_factory`` says otherwise.
    """
    if n_rollouts < 0 or n_live < 0 or calls_per_rollout < 0:
        raise ValueError("n_rollouts, n_live and calls_per_rollout must not be negative")
    if not 0 <= n_stragglers <= n_rollouts:
        raise ValueError(f"n_stragglers must be between 0 and n_rollouts ({n_rollouts}), not {n_stragglers}")
    if group_size < 1:
        raise ValueError("group_size must be at least 1")
    if live_calls is not None and len(live_calls) != n_live:
        raise ValueError("live_calls needs one call count per live session")
    rng = random.Random(seed)

    n_tasks = math.ceil(n_rollouts / group_size)
    tasks = [list(range(t * group_size, min(n_rollouts, (t + 1) * group_size))) for t in range(n_tasks)]
    stragglers: set[int] = set()
    if cluster_stragglers:
        for t in rng.sample(range(n_tasks), n_tasks):
            need = n_stragglers - len(stragglers)
            if need <= 0:
                break
            members = tasks[t]
            stragglers.update(members if len(members) <= need else rng.sample(members, need))
    else:
        stragglers.update(rng.sample(range(n_rollouts), n_stragglers))

    plans: list[RolloutPlan] = []

    def add_group(indices: Sequence[int], *, live: bool, calls_of: Callable[[int], int]) -> None:
        task_id = task_id_factory()
        task_prompt = f"Task {task_id[:8]}: fix the failing test. " + _words(rng, 40)
        for local, i in enumerate(indices):
            straggler = not live and i in stragglers
            plans.append(RolloutPlan(
                uid=f"{task_id}:{local}", task_id=task_id, rollout_idx=local, task_prompt=task_prompt,
                observations=tuple(f"Observation {k}: {_words(rng, 16)}" for k in range(calls_of(i))),
                straggler=straggler,
                large_observation=_large_text(rng, large_prompt_chars) if straggler else "",
                live=live,
            ))

    for members in tasks:
        add_group(members, live=False, calls_of=lambda _i: calls_per_rollout)
    counts = list(live_calls) if live_calls is not None else [
        1 + j % max(1, calls_per_rollout) for j in range(n_live)]
    for start in range(0, n_live, group_size):
        add_group(range(start, min(n_live, start + group_size)), live=True, calls_of=lambda j: counts[j])
    return plans


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


@dataclass
class RolloutRun:
    """What a run did, and what it leaves behind in the gateway's trace store.

    ``straggler_uids`` are the expected orphans (deleted, then re-created with one trace);
    ``deleted_uids`` are all uids the run deleted (stragglers included); ``live_uids`` maps each live
    session to the number of traces it should have.
    """

    gateway_url: str
    params: dict[str, Any]
    task_ids: list[str] = field(default_factory=list)
    uids_by_task: dict[str, list[str]] = field(default_factory=dict)
    task_of: dict[str, str] = field(default_factory=dict)
    straggler_uids: list[str] = field(default_factory=list)
    deleted_uids: list[str] = field(default_factory=list)
    live_uids: dict[str, int] = field(default_factory=dict)
    #: what each ``DELETE /sessions/{uid}`` answered (``{"deleted": n}``)
    deleted_counts: dict[str, int] = field(default_factory=dict)
    #: epoch seconds when each delete had been answered
    deleted_at: dict[str, float] = field(default_factory=dict)
    #: epoch seconds when each delete was sent (at or before the gateway's delete: the fence it set)
    delete_sent_at: dict[str, float] = field(default_factory=dict)
    #: ``usage.prompt_tokens`` of each straggler's late call
    straggler_prompt_tokens: dict[str, int] = field(default_factory=dict)
    #: stragglers whose late call was already answered when the delete returned (no race happened)
    race_lost_uids: list[str] = field(default_factory=list)
    #: stragglers whose late trace did not show up within the settle timeout (expected behind a tombstone
    #: guard, which drops the late write; not counted in ``errors``)
    unsettled_uids: list[str] = field(default_factory=list)
    #: whether each straggler's call was seen in flight at a worker before the delete (False: timed guess)
    in_flight_confirmed: dict[str, bool] = field(default_factory=dict)
    #: per straggler, epoch seconds of each step: sent, in_flight (or in_flight_unconfirmed), deleted,
    #: released (stub workers), answered, settled
    straggler_timeline: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    calls: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0

    @property
    def deletes(self) -> dict[str, float]:
        """The run's deletes as evidence that its sessions were deleted before (``deleted_ids=``): each uid with
        the moment its delete was sent."""
        return dict(self.delete_sent_at)

    @property
    def expected_orphans(self) -> set[str]:
        """The uids that should now be one-trace sessions although they were deleted."""
        return set(self.straggler_uids)

    @property
    def gone_uids(self) -> list[str]:
        """Deleted uids that should stay gone (every deleted uid but the stragglers)."""
        stragglers = set(self.straggler_uids)
        return [u for u in self.deleted_uids if u not in stragglers]

    @property
    def ok(self) -> bool:
        """No error, every straggler raced its delete and its trace is visible."""
        return not (self.errors or self.race_lost_uids or self.unsettled_uids)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (the dataclass fields plus ``gone_uids`` and ``ok``)."""
        data = asdict(self)
        data["gone_uids"] = self.gone_uids
        data["ok"] = self.ok
        return data


@dataclass
class RetryResult:
    """What :func:`retry_rollout` saw."""

    uid: str
    #: traces the first attempt's ``DELETE`` removed (``None`` if the retry did not delete first)
    deleted_before: int | None
    #: whether the retry re-created the session with ``POST /sessions``
    explicit_create: bool
    calls: int
    #: traces the gateway shows for the uid after the retry's calls
    trace_count: int
    #: whether the retry flushed and deleted its session at the end
    finished: bool
    errors: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------


def _sid(uid: str) -> str:
    return quote(uid, safe="")


def _chat_body(model: str, messages: list[dict[str, Any]], *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 32, "temperature": 1.0}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


async def _chat(client: httpx.AsyncClient, uid: str, model: str, messages: list[dict[str, Any]],
                headers: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One non-streaming call through the gateway; returns (assistant message, usage)."""
    resp = await client.post(f"/sessions/{_sid(uid)}/v1/chat/completions", json=_chat_body(model, messages),
                             headers=headers)
    resp.raise_for_status()
    data = resp.json()
    choices = data.get("choices") or [{}]
    message = choices[0].get("message") or {"role": "assistant", "content": ""}
    return {"role": "assistant", "content": message.get("content") or ""}, data.get("usage") or {}


async def _read_stream(resp: httpx.Response) -> dict[str, Any]:
    """Read an SSE chat stream to its end; returns the usage chunk's usage (or {})."""
    usage: dict[str, Any] = {}
    async for line in resp.aiter_lines():
        if not line.startswith("data: ") or line[6:].strip() == "[DONE]":
            continue
        try:
            chunk = json.loads(line[6:])
        except json.JSONDecodeError:
            continue
        if isinstance(chunk, dict) and chunk.get("usage"):
            usage = chunk["usage"]
    return usage


async def _session_trace_count(client: httpx.AsyncClient, uid: str) -> int | None:
    resp = await client.get(f"/sessions/{_sid(uid)}")
    if resp.status_code == 404:
        return None
    resp.raise_for_status()
    return int(resp.json().get("trace_count", 0))


async def _finish(client: httpx.AsyncClient, uid: str) -> int:
    """rLLM's end of a rollout: flush, then delete the session. Returns the delete's count."""
    (await client.post("/admin/flush")).raise_for_status()
    resp = await client.delete(f"/sessions/{_sid(uid)}")
    resp.raise_for_status()
    return int(resp.json().get("deleted", 0))


class _StubControl:
    """Talks to the stub workers behind a gateway: is a tagged call in flight? release it.

    Found through the gateway's ``GET /admin/workers``; empty (and every method a no-op or a short sleep)
    when the workers are not stub workers.
    """

    def __init__(self, workers: list[AsyncStubClient]) -> None:
        self.workers = workers

    @property
    def available(self) -> bool:
        """Whether the workers are stub workers (calls can be held and released)."""
        return bool(self.workers)

    @classmethod
    async def discover(cls, client: httpx.AsyncClient) -> _StubControl:
        """Find the workers that answer the stub's in-flight route."""
        workers: list[AsyncStubClient] = []
        try:
            resp = await client.get("/admin/workers")
            listed = resp.json() if resp.status_code == 200 else []
            for w in listed if isinstance(listed, list) else []:
                worker = AsyncStubClient(client, str(w["url"]), w.get("api_path"))
                if await worker.is_stub(timeout=2.0):
                    workers.append(worker)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
            logger.info("the workers are not stub workers (%s); stragglers use a timed wait", err)
            return cls([])
        return cls(workers)

    async def wait_in_flight(self, tag: str, timeout: float) -> bool:
        """Wait until some worker has a call tagged ``tag`` in flight; False if none seen (or no stub).

        Each worker is asked once with a long poll (``wait``), so waiting costs no polling load.
        """
        if not self.workers:
            await asyncio.sleep(min(0.25, timeout))
            return False

        async def ask(worker: AsyncStubClient) -> bool:
            try:
                return (await worker.inflight(tag, wait=timeout)).inflight > 0
            except (httpx.HTTPError, ValueError):
                return False

        pending = {asyncio.ensure_future(ask(worker)) for worker in self.workers}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task.result() for task in done):
                    return True
            return False
        finally:
            for task in pending:
                task.cancel()

    async def release(self, tag: str) -> None:
        """Let the calls tagged ``tag`` answer, on every stub worker."""
        for worker in self.workers:
            await worker.release(tag, timeout=10.0)


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


async def _wait_persisted(client: httpx.AsyncClient, uid: str, n: int, timeout: float, run: RolloutRun) -> None:
    """Wait until the gateway shows at least ``n`` traces for ``uid`` (its calls' fire-and-forget writes)."""
    deadline = time.monotonic() + timeout
    while True:
        count = await _session_trace_count(client, uid) or 0
        if count >= n:
            return
        if time.monotonic() >= deadline:
            run.errors.append(f"{uid}: only {count} of {n} traces persisted after {timeout:.0f} s")
            return
        await asyncio.sleep(0.02)


async def _run_one(client: httpx.AsyncClient, plan: RolloutPlan, run: RolloutRun, stub: _StubControl, *,
                   model: str, straggler_delay: float, straggler_stream: bool, settle_timeout: float,
                   drain: bool) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _SYSTEM_PROMPT},
        {"role": "user", "content": plan.task_prompt},
    ]
    try:
        for k, observation in enumerate(plan.observations):
            if k:
                messages.append({"role": "user", "content": observation})
            reply, _ = await _chat(client, plan.uid, model, list(messages))
            run.calls += 1
            messages.append(reply)
        if plan.calls and (drain or plan.live):
            await _wait_persisted(client, plan.uid, plan.calls, settle_timeout, run)
        if plan.live:
            return
        if plan.straggler:
            await _straggle(client, plan, run, stub, messages, model=model, delay=straggler_delay,
                            stream=straggler_stream, settle_timeout=settle_timeout)
    except httpx.HTTPError as err:
        run.errors.append(f"{plan.uid}: {type(err).__name__}: {err}")
    finally:
        if not plan.live and plan.uid not in run.deleted_at:  # every rollout deletes its session
            try:
                run.delete_sent_at[plan.uid] = time.time()
                run.deleted_counts[plan.uid] = await _finish(client, plan.uid)
                run.deleted_at[plan.uid] = time.time()
                run.deleted_uids.append(plan.uid)
            except httpx.HTTPError as err:
                run.errors.append(f"{plan.uid}: delete failed: {type(err).__name__}: {err}")


async def _straggle(client: httpx.AsyncClient, plan: RolloutPlan, run: RolloutRun, stub: _StubControl,
                    messages: list[dict[str, Any]], *, model: str, delay: float, stream: bool,
                    settle_timeout: float) -> None:
    """The late call: send it, make sure it is in flight, flush + delete, then let it land and settle.

    On stub workers the call is also held after its delay until the delete has been answered, so it lands
    after the delete however slow a loaded gateway is; elsewhere only the delay orders them.
    """
    late = [*messages, {"role": "user", "content": plan.large_observation}]
    headers = stub_headers(delay=delay, tag=plan.uid, hold=stub.available)

    timeline = run.straggler_timeline.setdefault(plan.uid, {})

    async def finish_under_it(in_flight: bool) -> None:
        run.in_flight_confirmed[plan.uid] = in_flight
        timeline["in_flight" if in_flight else "in_flight_unconfirmed"] = time.time()
        run.delete_sent_at[plan.uid] = time.time()
        run.deleted_counts[plan.uid] = await _finish(client, plan.uid)
        run.deleted_at[plan.uid] = timeline["deleted"] = time.time()
        run.deleted_uids.append(plan.uid)

    async def release() -> None:
        await stub.release(plan.uid)
        timeline["released"] = time.time()

    async def release_on_failure() -> None:
        if "released" not in timeline:  # never leave a held call behind
            with contextlib.suppress(httpx.HTTPError):
                await release()

    timeline["sent"] = time.time()
    if stream:
        body = _chat_body(model, late, stream=True)
        try:
            async with client.stream("POST", f"/sessions/{_sid(plan.uid)}/v1/chat/completions", json=body,
                                     headers=headers) as resp:
                resp.raise_for_status()
                # The gateway answered with headers: it holds an open stream to the worker, and it persists
                # the trace only when that stream ends (after the worker's delay and the release).
                await finish_under_it(True)
                await release()
                usage = await _read_stream(resp)
        finally:
            await release_on_failure()
    else:
        task = asyncio.create_task(_chat(client, plan.uid, model, late, headers=headers))
        try:
            # held calls cannot answer before their release: waiting long for the confirmation is safe
            wait = max(10.0, delay) if stub.available else max(0.05, delay * 0.8)
            await finish_under_it(await stub.wait_in_flight(plan.uid, timeout=wait))
            if task.done():
                run.race_lost_uids.append(plan.uid)
            await release()
        finally:
            await release_on_failure()
            _, usage = await task
    timeline["answered"] = time.time()
    run.calls += 1
    run.straggler_prompt_tokens[plan.uid] = int(usage.get("prompt_tokens", 0))

    deadline = time.monotonic() + settle_timeout
    while True:
        count = await _session_trace_count(client, plan.uid)
        if count == 1:
            timeline["settled"] = time.time()
            return
        if time.monotonic() >= deadline:
            run.unsettled_uids.append(plan.uid)  # not an error: a tombstone guard drops the late write
            return
        await asyncio.sleep(0.02)


async def run_rollouts_async(gateway_url: str, *, n_rollouts: int = 30, n_stragglers: int = 10,
                             straggler_delay: float = 1.5, calls_per_rollout: int = 3, n_live: int = 3,
                             concurrency: int = 16, seed: int = 0, group_size: int = 5,
                             cluster_stragglers: bool = True,
                             large_prompt_chars: int = DEFAULT_LARGE_PROMPT_CHARS,
                             live_calls: Sequence[int] | None = None, straggler_stream: bool = False,
                             model: str = DEFAULT_MODEL, settle_timeout: float = 15.0,
                             drain_before_delete: bool = True, client: httpx.AsyncClient | None = None,
                             transport: httpx.AsyncBaseTransport | None = None) -> RolloutRun:
    """Run rollouts (some of them stragglers) and live sessions against ``gateway_url``.

    See the module docstring for what a rollout, a straggler and a live session do. At most
    ``concurrency`` rollouts run at once. Pass ``client`` (its base URL must be the gateway) or
    ``transport`` to control the HTTP layer. Returns once every straggler's late trace and every live
    session's traces are visible (or ``settle_timeout`` passed: see :attr:`RolloutRun.unsettled_uids` and
    :attr:`RolloutRun.errors`).

    ``drain_before_delete`` (the default) makes each rollout wait until its own calls' traces are visible
    before it flushes and deletes, which is what rLLM's client-side ``flush()`` achieves (it drains the
    persist tasks that already exist). 0.1.0's ``POST /admin/flush`` does not wait for them, so without
    draining a loaded gateway can also resurrect ordinary rollouts (multi-trace orphans); only the
    stragglers' late calls are then not the only leak.
    """
    if straggler_delay <= 0 and n_stragglers:
        raise ValueError("straggler_delay must be positive")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    plans = plan_rollouts(n_rollouts=n_rollouts, n_stragglers=n_stragglers,
                          calls_per_rollout=calls_per_rollout, n_live=n_live, group_size=group_size,
                          seed=seed, cluster_stragglers=cluster_stragglers,
                          large_prompt_chars=large_prompt_chars, live_calls=live_calls)
    params = {
        "n_rollouts": n_rollouts, "n_stragglers": n_stragglers, "straggler_delay": straggler_delay,
        "calls_per_rollout": calls_per_rollout, "n_live": n_live, "concurrency": concurrency, "seed": seed,
        "group_size": group_size, "cluster_stragglers": cluster_stragglers,
        "large_prompt_chars": large_prompt_chars, "straggler_stream": straggler_stream, "model": model,
        "drain_before_delete": drain_before_delete,
    }
    run = RolloutRun(gateway_url=gateway_url.rstrip("/"), params=params)
    for plan in plans:
        if plan.task_id not in run.uids_by_task:
            run.task_ids.append(plan.task_id)
            run.uids_by_task[plan.task_id] = []
        run.uids_by_task[plan.task_id].append(plan.uid)
        run.task_of[plan.uid] = plan.task_id
        if plan.straggler:
            run.straggler_uids.append(plan.uid)
        if plan.live:
            run.live_uids[plan.uid] = plan.calls

    owns_client = client is None
    if client is None:
        # idle connections expire well before the gateway's (uvicorn's) 5 s keep-alive timeout closes them:
        # at equal timeouts a busy machine sends a request on a connection the server is closing, and the call
        # fails with "Server disconnected without sending a response"
        client = httpx.AsyncClient(
            base_url=run.gateway_url, transport=transport,
            timeout=httpx.Timeout(30.0 + straggler_delay),
            limits=httpx.Limits(max_connections=2 * concurrency + 8,
                                max_keepalive_connections=2 * concurrency, keepalive_expiry=KEEPALIVE_EXPIRY),
        )
    run.started_at = time.time()
    try:
        # Open the store with one read first: 0.1.0's SQLite store opens its connection lazily and
        # unguarded, and concurrent first writes would open several that lock each other out.
        (await client.get("/sessions", params={"limit": 1})).raise_for_status()
        stub = await _StubControl.discover(client) if n_stragglers else _StubControl([])
        gate = asyncio.Semaphore(concurrency)

        async def guarded(plan: RolloutPlan) -> None:
            async with gate:
                await _run_one(client, plan, run, stub, model=model, straggler_delay=straggler_delay,
                               straggler_stream=straggler_stream, settle_timeout=settle_timeout,
                               drain=drain_before_delete)

        await asyncio.gather(*(guarded(p) for p in plans))
    finally:
        if owns_client:
            await client.aclose()
    run.finished_at = time.time()
    # Keep the plan order in the lists (the coroutines finish in any order).
    order = {p.uid: i for i, p in enumerate(plans)}
    run.deleted_uids.sort(key=order.__getitem__)
    run.race_lost_uids.sort(key=order.__getitem__)
    run.unsettled_uids.sort(key=order.__getitem__)
    for uid in run.race_lost_uids:
        logger.warning("straggler %s did not leave an orphan as planned", uid)
    for uid in run.unsettled_uids:  # what a tombstone guard does to every straggler: not worth a warning
        logger.info("straggler %s: its late trace did not show (a tombstone guard drops it)", uid)
    return run


async def retry_rollout_async(gateway_url: str, uid: str, *, calls: int = 2, delete_first: bool = True,
                              explicit_create: bool = True, metadata: dict[str, Any] | None = None,
                              finish: bool = False, model: str = DEFAULT_MODEL, settle_timeout: float = 3.0,
                              client: httpx.AsyncClient | None = None,
                              transport: httpx.AsyncBaseTransport | None = None) -> RetryResult:
    """rLLM's rollout retry (``process_task_with_retry``): the failed attempt's session is deleted and the
    retry reuses the same uid.

    With ``delete_first`` the function deletes ``uid`` itself (as the failed attempt's ``finally`` does);
    with ``explicit_create`` it then re-creates the session with ``POST /sessions {"session_id": uid}``
    (a deliberate re-creation, which must lift a tombstone); then it makes ``calls`` calls and reports how
    many traces the gateway shows for ``uid``. With ``finish`` it flushes and deletes at the end, as a
    successful retry does.

    The gateway persists traces fire-and-forget, so the count is read once ``calls`` more traces show, or
    after ``settle_timeout`` seconds: a gateway that drops the writes (a tombstone guard) costs the whole
    wait, so pass a short ``settle_timeout`` when fewer traces are expected.
    """
    owns_client = client is None
    if client is None:
        client = httpx.AsyncClient(base_url=gateway_url.rstrip("/"), transport=transport, timeout=30.0,
                                   limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY))
    result = RetryResult(uid=uid, deleted_before=None, explicit_create=explicit_create, calls=0,
                         trace_count=0, finished=False)
    try:
        if delete_first:
            resp = await client.delete(f"/sessions/{_sid(uid)}")
            resp.raise_for_status()
            result.deleted_before = int(resp.json().get("deleted", 0))
        if explicit_create:
            body: dict[str, Any] = {"session_id": uid}
            if metadata:
                body["metadata"] = metadata
            (await client.post("/sessions", json=body)).raise_for_status()
        target = (await _session_trace_count(client, uid) or 0) + calls
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _SYSTEM_PROMPT},
            {"role": "user", "content": f"Retry of {uid}: fix the failing test."},
        ]
        for k in range(calls):
            if k:
                messages.append({"role": "user", "content": f"Observation {k}: the retry goes on."})
            reply, _ = await _chat(client, uid, model, list(messages))
            result.calls += 1
            messages.append(reply)
        deadline = time.monotonic() + settle_timeout
        while True:
            result.trace_count = await _session_trace_count(client, uid) or 0
            if result.trace_count >= target or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        if finish:
            await _finish(client, uid)
            result.finished = True
    except httpx.HTTPError as err:
        result.errors.append(f"{type(err).__name__}: {err}")
    finally:
        if owns_client:
            await client.aclose()
    return result


@dataclass
class LateLanding:
    """What :func:`land_late_calls` did: the sessions its late calls brought back (one trace each)."""

    uids: list[str]
    #: the uids whose session shows exactly the late call's one trace afterwards
    landed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def land_late_calls_async(gateway_url: str, uids: Sequence[str], during: Callable[[], object], *,
                                model: str = DEFAULT_MODEL, in_flight_timeout: float = 30.0,
                                settle_timeout: float = 15.0) -> LateLanding:
    """One more late call for each of ``uids``, held at the stub worker while ``during()`` runs, then let land.

    What a rollout with a second call still in flight leaves when a cleanup deletes its orphan session
    meanwhile: the call answers after the delete and its trace re-creates the session, with that one trace.
    Each call is sent and seen in flight at a stub worker before ``during()`` (a synchronous function, run in
    a thread) starts, and released only after it returned, so every trace lands after it. ``during``'s
    exception is raised once the calls are released. Needs stub workers behind the gateway (ValueError
    otherwise): only they hold a call until it is released.
    """
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY)
    result = LateLanding(uids=list(uids))
    async with httpx.AsyncClient(base_url=gateway_url.rstrip("/"), timeout=httpx.Timeout(30.0 + in_flight_timeout),
                                 limits=limits) as client:
        stub = await _StubControl.discover(client)
        if not stub.available:
            raise ValueError("late calls held across a cleanup need stub workers behind the gateway")

        def tag(uid: str) -> str:
            return f"late:{uid}"

        message = [{"role": "system", "content": _SYSTEM_PROMPT}]
        calls = {uid: asyncio.create_task(_chat(client, uid, model, [*message, {
            "role": "user", "content": f"Observation of {uid}: the last tool call returns."}],
            headers=stub_headers(tag=tag(uid), hold=True))) for uid in result.uids}
        try:
            for uid in result.uids:
                if not await stub.wait_in_flight(tag(uid), timeout=in_flight_timeout):
                    raise RuntimeError(f"{uid}: the late call was not in flight at the worker after "
                                       f"{in_flight_timeout:.0f} s")
            await asyncio.to_thread(during)
        finally:
            for uid in result.uids:  # never leave a held call behind
                with contextlib.suppress(httpx.HTTPError):
                    await stub.release(tag(uid))
            answers = await asyncio.gather(*calls.values(), return_exceptions=True)
        failed: set[str] = set()
        for uid, answer in zip(calls, answers, strict=True):
            if isinstance(answer, BaseException):
                failed.add(uid)
                result.errors.append(f"{uid}: {type(answer).__name__}: {answer}")
        pending = [uid for uid in result.uids if uid not in failed]
        deadline = time.monotonic() + settle_timeout
        while pending:  # bounded by settle_timeout
            pending = [uid for uid in pending if await _session_trace_count(client, uid) != 1]
            if not pending or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        result.landed = [uid for uid in result.uids if uid not in failed and uid not in pending]
    return result


# ----------------------------------------------------------------------------------------------
# Sync entry points
# ----------------------------------------------------------------------------------------------


def _run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion, also from inside a running event loop (a notebook kernel)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def run_rollouts(gateway_url: str, *, n_rollouts: int = 30, n_stragglers: int = 10,
                 straggler_delay: float = 1.5, calls_per_rollout: int = 3, n_live: int = 3,
                 concurrency: int = 16, seed: int = 0, group_size: int = 5, cluster_stragglers: bool = True,
                 large_prompt_chars: int = DEFAULT_LARGE_PROMPT_CHARS,
                 live_calls: Sequence[int] | None = None, straggler_stream: bool = False,
                 model: str = DEFAULT_MODEL, settle_timeout: float = 15.0, drain_before_delete: bool = True,
                 transport: httpx.AsyncBaseTransport | None = None) -> RolloutRun:
    """Synchronous :func:`run_rollouts_async` (safe to call from a notebook)."""
    return _run_sync(lambda: run_rollouts_async(
        gateway_url, n_rollouts=n_rollouts, n_stragglers=n_stragglers, straggler_delay=straggler_delay,
        calls_per_rollout=calls_per_rollout, n_live=n_live, concurrency=concurrency, seed=seed,
        group_size=group_size, cluster_stragglers=cluster_stragglers, large_prompt_chars=large_prompt_chars,
        live_calls=live_calls, straggler_stream=straggler_stream, model=model, settle_timeout=settle_timeout,
        drain_before_delete=drain_before_delete, transport=transport))


def land_late_calls(gateway_url: str, uids: Sequence[str], during: Callable[[], object], *,
                    model: str = DEFAULT_MODEL, in_flight_timeout: float = 30.0,
                    settle_timeout: float = 15.0) -> LateLanding:
    """Synchronous :func:`land_late_calls_async`."""
    return _run_sync(lambda: land_late_calls_async(gateway_url, uids, during, model=model,
                                                   in_flight_timeout=in_flight_timeout,
                                                   settle_timeout=settle_timeout))


def retry_rollout(gateway_url: str, uid: str, *, calls: int = 2, delete_first: bool = True,
                  explicit_create: bool = True, metadata: dict[str, Any] | None = None,
                  finish: bool = False, model: str = DEFAULT_MODEL, settle_timeout: float = 3.0,
                  transport: httpx.AsyncBaseTransport | None = None) -> RetryResult:
    """Synchronous :func:`retry_rollout_async`."""
    return _run_sync(lambda: retry_rollout_async(
        gateway_url, uid, calls=calls, delete_first=delete_first, explicit_create=explicit_create,
        metadata=metadata, finish=finish, model=model, settle_timeout=settle_timeout, transport=transport))


@dataclass
class StepsRun:
    """What :func:`trainer_steps` saw: per step, the traces each uid's session held just before the step's
    delete, and for the straggler (when asked for) whether its late trace joined the next step's session."""

    uids: list[str]
    #: per step: uid -> traces its session held right before the step ended with its delete
    kept: list[dict[str, int]] = field(default_factory=list)
    #: the uid whose extra call was still in flight when a step deleted it, landing during the next step
    straggler: str | None = None
    #: traces the straggler's session held in the next step before and after its late call answered
    straggler_session: tuple[int, int] | None = None
    batch_delete: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def straggler_joined(self) -> bool | None:
        """Whether the old step's late trace was mixed into the next step's session (None: no straggler)."""
        if self.straggler_session is None:
            return None
        before, after = self.straggler_session
        return after > before


async def trainer_steps_async(gateway_url: str, uids: Sequence[str], *, steps: int = 2, calls: int = 3,
                              straggler: str | None = None, model: str = DEFAULT_MODEL,
                              settle_timeout: float = 10.0) -> StepsRun:
    """Steps of an rLLM trainer that samples the same tasks again: every step runs ``calls`` calls on each of
    ``uids`` (``{task id}:{rollout index}``, the same ids every step, as rLLM's trainers name rollouts), waits
    until their traces show, notes what each session holds, and ends by deleting every uid (one
    ``POST /sessions/batch_delete`` where the gateway has it, as ``adelete_sessions`` does, else one
    ``DELETE`` each). No ``POST /sessions`` anywhere: the trainers create sessions only with sampling params.

    With ``straggler`` (one of ``uids``, stub workers needed) that uid's step also sends one more call, held at
    the stub worker and seen in flight before the delete; it is released once the next step has made its calls
    on the same uid, so its trace lands while the id is in use again.
    """
    run = StepsRun(uids=list(uids), straggler=straggler)
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY)
    async with httpx.AsyncClient(base_url=gateway_url.rstrip("/"), timeout=60.0, limits=limits) as client:
        paths = (await client.get("/openapi.json")).json().get("paths", {})
        run.batch_delete = "/sessions/batch_delete" in paths
        stub = await _StubControl.discover(client)
        if straggler is not None and not stub.available:
            raise ValueError("a straggler held across a step needs stub workers behind the gateway")
        held: asyncio.Task[Any] | None = None
        tag = f"steps:{straggler}"

        async def use(uid: str, step: int) -> None:
            messages: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM_PROMPT},
                                              {"role": "user", "content": f"Step {step} of {uid}."}]
            for k in range(calls):
                reply, _ = await _chat(client, uid, model, list(messages))
                messages += [reply, {"role": "user", "content": f"Observation {k} of step {step}."}]

        try:
            for step in range(steps):
                await asyncio.gather(*(use(uid, step) for uid in uids))
                for uid in uids:  # bounded: each waits at most settle_timeout
                    deadline = time.monotonic() + settle_timeout
                    while (await _session_trace_count(client, uid) or 0) < calls and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)
                if held is not None:  # the old step's call answers now, while its id is in use again
                    assert straggler is not None
                    before = await _session_trace_count(client, straggler) or 0
                    await stub.release(tag)
                    await held
                    held = None
                    await asyncio.sleep(0.3)  # its fire-and-forget write lands (or is dropped) meanwhile
                    (await client.post("/admin/flush")).raise_for_status()
                    run.straggler_session = (before, await _session_trace_count(client, straggler) or 0)
                run.kept.append({uid: await _session_trace_count(client, uid) or 0 for uid in uids})
                if straggler is not None and step < steps - 1 and run.straggler_session is None:
                    late = [{"role": "user", "content": f"A long tool result of step {step}."}]
                    held = asyncio.create_task(_chat(client, straggler, model, late,
                                                     headers=stub_headers(delay=0.0, tag=tag, hold=True)))
                    if not await stub.wait_in_flight(tag, timeout=10.0):
                        run.errors.append(f"the straggler's call on {straggler} was not seen in flight")
                (await client.post("/admin/flush")).raise_for_status()
                if run.batch_delete:
                    (await client.post("/sessions/batch_delete", json={"session_ids": list(uids)})).raise_for_status()
                else:
                    for uid in uids:
                        (await client.delete(f"/sessions/{_sid(uid)}")).raise_for_status()
        except httpx.HTTPError as err:
            run.errors.append(f"{type(err).__name__}: {err}")
        finally:
            if held is not None:
                with contextlib.suppress(httpx.HTTPError):
                    await stub.release(tag)
                with contextlib.suppress(httpx.HTTPError):
                    await held
    return run


def trainer_steps(gateway_url: str, uids: Sequence[str], *, steps: int = 2, calls: int = 3,
                  straggler: str | None = None, model: str = DEFAULT_MODEL, settle_timeout: float = 10.0) -> StepsRun:
    """Synchronous :func:`trainer_steps_async`."""
    return _run_sync(lambda: trainer_steps_async(gateway_url, uids, steps=steps, calls=calls, straggler=straggler,
                                                 model=model, settle_timeout=settle_timeout))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run rollouts against a gateway and print a JSON summary; exit 1 if the run was not ok."""
    parser = argparse.ArgumentParser(prog="python -m gatewayscope.sandbox.rollouts",
                                     description="Drive rLLM-style rollouts, with stragglers, via a gateway.")
    parser.add_argument("--gateway", required=True, help="gateway base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--rollouts", type=int, default=30)
    parser.add_argument("--stragglers", type=int, default=10)
    parser.add_argument("--delay", type=float, default=1.5, help="seconds a straggler's late call takes")
    parser.add_argument("--calls", type=int, default=3, help="normal calls per rollout")
    parser.add_argument("--live", type=int, default=3, help="sessions left in use (not deleted)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=5, help="rollouts per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scatter", action="store_true", help="scatter stragglers instead of whole tasks")
    parser.add_argument("--large-prompt-chars", type=int, default=DEFAULT_LARGE_PROMPT_CHARS)
    parser.add_argument("--stream", action="store_true", help="stragglers' late call streams (SSE)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--no-drain", action="store_true",
                        help="delete without waiting for the rollout's own traces (0.1.0's flush does not wait)")
    args = parser.parse_args(argv)
    try:
        run = run_rollouts(args.gateway, n_rollouts=args.rollouts, n_stragglers=args.stragglers,
                           straggler_delay=args.delay, calls_per_rollout=args.calls, n_live=args.live,
                           concurrency=args.concurrency, seed=args.seed, group_size=args.group_size,
                           cluster_stragglers=not args.scatter, large_prompt_chars=args.large_prompt_chars,
                           straggler_stream=args.stream, model=args.model,
                           drain_before_delete=not args.no_drain)
    except (ValueError, httpx.HTTPError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(run.to_dict(), indent=2))
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
