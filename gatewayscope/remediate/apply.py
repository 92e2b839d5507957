"""Apply a plan, exactly as planned, with the safety protocol of DESIGN.md (seed 002, all of it).

The only code in gatewayscope that writes to a gateway. For every action it:

1. runs only with explicit confirmation (``ApplyOptions.write``; deletes also need ``allow_delete``);
   otherwise it is a dry run that reads but never writes;
2. re-reads the subject right before writing: gone -> ``gone`` (a Bifrost PUT is an upsert and would
   recreate it), already at the target -> ``already-done``, changed in anything but what the action
   changes -> ``stale``;
3. builds the write from that fresh read, never sending a secret a listing masked, never ``keys``;
4. gives a pool write 30 s;
5. after a 5xx waits 250, 750 and 2,000 ms in turn, re-reads each time (gone or already resized settles
   it) and only then sends again with the config read then; still failing -> ``unconfirmed``;
6. after no answer (timeout, connection reset after sending) reads back and never sends again;
7. on a 400 refusal reports ``refused``, naming the remedy for a record with a base URL;
8. never runs two actions on one subject (the plan guarantees it; checked again here);
9. bounded concurrency, a rate limit, a max-errors stop, progress, one closing tally line;
10. journals every attempt and outcome; an applied plan is not applied again; an interrupted apply
    resumes from its journal.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from gatewayscope.analysis.posture import SAFE_POSTURE
from gatewayscope.config import Config, Target
from gatewayscope.errors import (
    GatewayscopeError,
    GatewayTimeoutError,
    HTTPStatusError,
    NotFoundError,
    PlanError,
    SourceError,
    StoreError,
    UnreachableError,
)
from gatewayscope.remediate.journal import FINAL_OUTCOMES, Journal, apply_lock
from gatewayscope.remediate.plan import (
    ACTION_KINDS,
    DELETE_DUTY,
    Action,
    Plan,
    posture_fingerprint,
)
from gatewayscope.remediate.sqlite_delete import TRANSACTION_SESSIONS, SessionDeleter, SessionState
from gatewayscope.render import human_seconds

OUTCOMES = FINAL_OUTCOMES
SUCCESS_OUTCOMES = frozenset({"done", "already-done"})
#: waits after a 5xx before each re-read (seed 002)
RETRY_SCHEDULE = (0.25, 0.75, 2.0)
#: DNS 5 s + upstream model listing 15 s + margin (seed 002)
POOL_WRITE_TIMEOUT = 30.0
#: fields a pool write sends back from the fresh read; the rest PUT keeps when absent (contract 2.5, 8)
POOL_WRITE_FIELDS = ("network_config", "custom_provider_config", "send_back_raw_request", "send_back_raw_response")


@dataclass
class ApplyOptions:
    #: really write (False: a dry run that reads but never writes)
    write: bool = False
    allow_delete: bool = False
    concurrency: int = 4
    #: writes per second over the whole apply (None = no limit; session deletes then keep to DELETE_DUTY)
    rate: float | None = None
    #: stop starting new actions after this many refused/unconfirmed ones (None = never)
    max_errors: int | None = None
    pool_write_timeout: float = POOL_WRITE_TIMEOUT
    retry_schedule: Sequence[float] = RETRY_SCHEDULE
    sleep: Callable[[float], None] = time.sleep


@dataclass
class ActionResult:
    action_id: str
    kind: str
    target: str
    subject: str
    outcome: str  # one of OUTCOMES, or for a dry run: "would-write" plus OUTCOMES; or "skipped"
    detail: str = ""
    sends: int = 0


@dataclass
class ApplyReport:
    plan_id: str
    dry_run: bool
    results: list[ActionResult] = field(default_factory=list)
    #: outcomes settled by an earlier run of the same plan (from the journal)
    previous: list[ActionResult] = field(default_factory=list)
    already_applied: bool = False
    stopped_early: str | None = None

    def tally(self) -> dict[str, int]:
        counts = {outcome: 0 for outcome in OUTCOMES}
        for result in [*self.previous, *self.results]:
            if result.outcome in counts:
                counts[result.outcome] += 1
        return counts

    def tally_line(self) -> str:
        """``<n> done, <n> refused, <n> unconfirmed, <n> gone, <n> stale, <n> already-done``, zeros included."""
        return ", ".join(f"{n} {outcome}" for outcome, n in self.tally().items())

    @property
    def skipped(self) -> list[ActionResult]:
        return [r for r in self.results if r.outcome == "skipped"]

    @property
    def exit_code(self) -> int:
        """0 when every action is done or already done (a dry run: when anything could be checked), else 1."""
        if self.dry_run:
            checked = [r for r in self.results if r.outcome != "unconfirmed"]
            return 1 if self.results and not checked else 0
        everything = [*self.previous, *self.results]
        return 0 if all(r.outcome in SUCCESS_OUTCOMES for r in everything) else 1


class _RateLimiter:
    """At most ``rate`` permits per second across threads (evenly spaced)."""

    def __init__(self, rate: float | None, sleep: Callable[[float], None]) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.sleep = sleep
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self.sleep(start - now)


class _DeletePacer:
    """The session deletes of one target: one at a time, then a pause that keeps them to ``duty`` of the
    gateway's time (``duty=None``: one at a time, no pause; --rate paces them instead).

    Without --rate, apply uses ``DELETE_DUTY`` (3/4): each delete (or batch) is followed by a pause of a third
    of its own duration. The gateway keeps a quarter of its time for its traffic and none of its calls waits
    behind more than one delete, whatever a delete costs: the 0.1.0 memory store scans every session on each
    delete, on the event loop that serves the rollouts, so the cost grows with the store (a fixed rate is
    too slow for a small store and saturates the loop of a big one).
    """

    def __init__(self, duty: float | None, sleep: Callable[[float], None]) -> None:
        self.pause_factor = (1.0 - duty) / duty if duty else 0.0
        self.sleep = sleep
        self._ready_at = 0.0
        self._lock = threading.Lock()

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._lock:
            wait = self._ready_at - time.monotonic()
            if wait > 0:
                self.sleep(wait)
            started = time.monotonic()
            try:
                yield
            finally:
                ended = time.monotonic()
                self._ready_at = ended + (ended - started) * self.pause_factor


class _Context:
    """What the executors share: the journal, the options, the clients, the rate limiter."""

    def __init__(self, plan: Plan, config: Config, options: ApplyOptions, journal: Journal | None,
                 transports: dict[str, Any], deleted_ids: frozenset[str] = frozenset()) -> None:
        self.deleted_ids = deleted_ids
        self.plan = plan
        self.config = config
        self.options = options
        self.journal = journal
        self.transports = transports
        self.limiter = _RateLimiter(options.rate, options.sleep)
        # session deletes: --rate when given; otherwise each target's pacer keeps them to DELETE_DUTY
        self.delete_limiter = self.limiter if options.rate else _RateLimiter(None, options.sleep)
        self._pacers: dict[str, _DeletePacer] = {}
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.stack = ExitStack()
        #: targets whose guarded launcher has no compare-and-delete route (an older gatewayscope)
        self.no_conditional_delete: set[str] = set()
        self._weight_versions: dict[str, int | None] = {}
        self._deleted: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._capabilities = {entry.get("name"): dict(entry.get("capabilities") or {}) for entry in plan.targets}

    def capability(self, target: str, name: str) -> bool:
        """Whether the plan found ``target`` to have ``name`` (``guard``, ``batch_delete``, ``weight_version``)."""
        return bool(self._capabilities.get(target, {}).get(name))

    def idle_threshold(self) -> float:
        """The idle threshold a suspected orphan must be past: the config's, or the plan's when longer."""
        planned = self.plan.policy.get("orphan_idle_seconds")
        threshold = float(self.config.policy.orphan_idle_seconds)
        if isinstance(planned, (int, float)) and not isinstance(planned, bool):
            threshold = max(threshold, float(planned))
        return threshold

    def current_weight_version(self, target: str) -> int | None:
        """The gateway's current weight version (asked once per apply), or None where it has none."""
        with self._lock:
            if target in self._weight_versions:
                return self._weight_versions[target]
        version: int | None = None
        if self.capability(target, "weight_version") and not self.target(target).path:
            try:
                body = self.rllm(target).request("GET", "/admin/weight_version")
            except GatewayscopeError as err:
                raise _Settled("unconfirmed", f"nothing sent: the gateway's weight version could not be read "
                                              f"({err})") from None
            value = body.get("weight_version") if isinstance(body, dict) else None
            version = value if isinstance(value, int) and not isinstance(value, bool) else None
        with self._lock:
            self._weight_versions[target] = version
        return version

    def deleted_before(self, action: Action, journal_path: str) -> bool:
        """Whether the caller vouched for this session's earlier delete, or the journal at ``journal_path``
        records a done delete of it on this target."""
        if action.subject in self.deleted_ids:
            return True
        key = (journal_path, action.target)
        with self._lock:
            known = self._deleted.get(key)
        if known is None:
            try:
                events = Journal(journal_path).read() if journal_path else []
            except GatewayscopeError:
                events = []
            known = {(str(e.get("target")), str(e.get("subject"))) for e in events
                     if e.get("event") == "outcome" and e.get("kind") == "session_delete"
                     and e.get("outcome") == "done"}
            with self._lock:
                self._deleted[key] = known
        return (action.target, action.subject) in known

    def pace(self, action: Action) -> None:
        """Wait for the rate limiter that paces ``action``'s kind."""
        (self.delete_limiter if action.kind == "session_delete" else self.limiter).wait()

    def journal_attempts(self, attempts: Sequence[tuple[Action, int, str]]) -> None:
        """Record write attempts (action, send number, what) before they are made, with one fsync."""
        if self.journal is not None and attempts:
            self.journal.append_many([("attempt", {
                "plan_id": self.plan.id, "action_id": a.id, "kind": a.kind, "target": a.target,
                "subject": a.subject, "send": send, "what": what}) for a, send, what in attempts])

    def target(self, name: str) -> Target:
        try:
            return self.config.target(name)
        except GatewayscopeError:
            raise PlanError(f"The plan acts on target {name!r}, which the config does not name; apply it with "
                            "the config it was planned with.") from None

    def bifrost(self, name: str) -> Any:
        from gatewayscope.sources.bifrost import client_for

        with self._lock:
            if name not in self._clients:
                self._clients[name] = self.stack.enter_context(
                    client_for(self.target(name), transport=self.transports.get(name)))
            return self._clients[name]

    def rllm(self, name: str) -> Any:
        from gatewayscope.sources.rllm_http import RllmClient

        target = self.target(name)
        with self._lock:
            if name not in self._clients:
                assert target.url
                self._clients[name] = self.stack.enter_context(RllmClient(
                    target.url, timeout=target.timeout_seconds, transport=self.transports.get(name),
                    max_connections=max(4, self.options.concurrency), max_body_bytes=target.max_body_bytes))
            return self._clients[name]

    def delete_turn(self, target: str) -> AbstractContextManager[None]:
        """Hold while a session delete (or a batch of them) runs on ``target``: see :class:`_DeletePacer`."""
        with self._lock:
            pacer = self._pacers.get(target)
            if pacer is None:
                pacer = self._pacers[target] = _DeletePacer(None if self.options.rate else DELETE_DUTY,
                                                            self.options.sleep)
        return pacer.turn()

    def attempt(self, action: Action, send: int, what: str) -> None:
        self.pace(action)
        self.journal_attempts([(action, send, what)])


class _Settled(Exception):
    """Raised inside an executor to end an action with an outcome."""

    def __init__(self, outcome: str, detail: str = "") -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


# -- Bifrost ---------------------------------------------------------------------------------------------

def pool_write_body(record: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The PUT body for a resize, built from a fresh read (contract section 8).

    Sends the record's own network block, custom upstream and raw switches (PUT resets those when
    absent) and the new pool; leaves out what PUT keeps when absent (proxy, openai, prompt cache,
    store_raw_request_response), whose secrets the listing masks; never ``keys``. A record whose network
    block carries a CA certificate cannot be written without sending back a masked secret, so it raises.
    """
    network = record.get("network_config")
    if isinstance(network, dict) and network.get("ca_cert_pem"):
        raise _Settled("refused", "not sent: its network_config carries a CA certificate that the listing masks, "
                                  "and a resize would have to send the mask back; resize it where the certificate "
                                  "is managed, or delete it")
    body: dict[str, Any] = {}
    for key in POOL_WRITE_FIELDS:
        if key in record and record[key] is not None:
            body[key] = record[key]
    body.setdefault("network_config", {})
    body["concurrency_and_buffer_size"] = {"concurrency": int(after["concurrency"]),
                                           "buffer_size": int(after["buffer_size"])}
    return body


def _concurrency(record: dict[str, Any]) -> int:
    block = record.get("concurrency_and_buffer_size") or {}
    value = block.get("concurrency") if isinstance(block, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else 1000


def _refusal(action: Action, err: HTTPStatusError) -> _Settled:
    if action.kind == "pool_shrink":
        if action.details.get("has_base_url"):
            remedy = (f"it keeps its workers; remedy: DELETE /api/providers/{quote(action.subject, safe='')} "
                      "(a provision still in use sets it up again)")
        else:
            remedy = "it keeps its workers"
        return _Settled("refused", f"{err.message} ({err.status}); {remedy}")
    return _Settled("refused", f"{err.message} ({err.status})")


def _send_under_protocol(ctx: _Context, action: Action, result: ActionResult, *, what: str,
                         send: Callable[[], str], reread: Callable[[], object],
                         read_back: Callable[[Exception], None]) -> None:
    """Send one write under rules 5-7; always ends by raising ``_Settled``.

    ``send`` writes (built from the latest read) and returns the detail of a success. After a 5xx,
    wait the next step of the schedule and ``reread`` (which settles gone / done / stale, or refreshes what
    the next send is built from), then send again; with the schedule used up, or after no answer at all,
    ``read_back`` decides (it must raise ``_Settled``) and nothing is sent again. A 4xx is a refusal.
    """
    schedule = list(ctx.options.retry_schedule)
    while True:
        result.sends += 1
        ctx.attempt(action, result.sends, what)
        try:
            detail = send()
        except (GatewayTimeoutError, UnreachableError) as err:
            read_back(err)
            raise _Settled("unconfirmed", str(err)) from None  # read_back always settles; a safety net
        except HTTPStatusError as err:
            if err.status < 500:
                raise _refusal(action, err) from None
            if not schedule:
                read_back(err)
                raise _Settled("unconfirmed", str(err)) from None
            ctx.options.sleep(schedule.pop(0))
            reread()
            continue
        raise _Settled("done", detail)


def _shrink(ctx: _Context, action: Action, result: ActionResult) -> None:
    from gatewayscope.sources.bifrost import POOL_FIELDS, record_fingerprint

    client = ctx.bifrost(action.target)
    target_pool = int(action.after["concurrency"])

    def fresh() -> dict[str, Any]:
        """Re-read; settle gone / already-done / stale; return the record otherwise."""
        try:
            record = client.get_provider(action.subject)
        except NotFoundError:
            raise _Settled("gone", "the record no longer exists; not written (a PUT would recreate it)") from None
        if _concurrency(record) <= target_pool:
            raise _Settled("already-done" if result.sends == 0 else "done",
                           f"holds {_concurrency(record)} workers")
        if record_fingerprint(record, exclude=POOL_FIELDS) != action.fingerprint:
            raise _Settled("stale", "changed since the plan was made; skipped (make a new plan)")
        return record

    record = fresh()
    if not ctx.options.write:
        raise _Settled("would-write", f"{_concurrency(record)} -> {target_pool} workers")

    def send() -> str:
        answer = client.put_provider(action.subject, pool_write_body(record, action.after),
                                     timeout=ctx.options.pool_write_timeout)
        held = _concurrency(answer) if isinstance(answer, dict) else target_pool
        return f"now {held} workers"

    def reread() -> None:
        nonlocal record
        record = fresh()

    _send_under_protocol(ctx, action, result, what=f"PUT pool {target_pool}/{action.after['buffer_size']}",
                         send=send, reread=reread,
                         read_back=lambda err: _read_back_pool(client, action, target_pool, err))


def _read_back_pool(client: Any, action: Action, target_pool: int, err: Exception) -> None:
    """No (good) answer: the write may still be under way there. Read back; never send again."""
    try:
        record = client.get_provider(action.subject)
    except GatewayscopeError as read_err:
        raise _Settled("unconfirmed", f"{err}; read-back failed too: {read_err}") from None
    if _concurrency(record) == target_pool:
        raise _Settled("done", f"no clear answer ({err}), but the record holds the new pool")
    raise _Settled("unconfirmed", f"{err}; the record still holds {_concurrency(record)} workers")


def _record_delete(ctx: _Context, action: Action, result: ActionResult) -> None:
    from gatewayscope.sources.bifrost import POOL_FIELDS, record_fingerprint

    client = ctx.bifrost(action.target)

    def fresh() -> dict[str, Any]:
        try:
            record = client.get_provider(action.subject)
        except NotFoundError:
            raise _Settled("already-done" if result.sends == 0 else "done", "the record is gone") from None
        if result.sends == 0 and record_fingerprint(record, exclude=POOL_FIELDS) != action.fingerprint:
            raise _Settled("stale", "changed since the plan was made; not deleted (make a new plan)")
        return record

    fresh()
    if not ctx.options.write:
        raise _Settled("would-write", "DELETE")

    def send() -> str:
        client.delete_provider(action.subject)
        return "deleted"

    def read_back(err: Exception) -> None:
        fresh()  # gone settles it as done
        raise _Settled("unconfirmed", f"{err}; the record is still there")

    # a DELETE is safe to send again after a re-read: it never recreates anything
    _send_under_protocol(ctx, action, result, what="DELETE record", send=send, reread=fresh, read_back=read_back)


def _posture(ctx: _Context, action: Action, result: ActionResult) -> None:
    from gatewayscope.analysis.posture import posture_drift
    from gatewayscope.sources.bifrost import safe_client_config

    client = ctx.bifrost(action.target)
    settings = list(action.after)

    def fresh() -> dict[str, Any]:
        config = client.get_config()
        client_config = config.get("client_config") if isinstance(config, dict) else None
        if not isinstance(client_config, dict):
            raise _Settled("unconfirmed", "GET /api/config returned no client_config")
        drifted = [s for s in posture_drift(client_config) if s in settings]
        if not drifted:
            raise _Settled("already-done" if result.sends == 0 else "done", "posture holds")
        if result.sends == 0 and posture_fingerprint(safe_client_config(client_config)) != action.fingerprint:
            raise _Settled("stale", "the client config changed since the plan was made; not written")
        return client_config

    client_config = fresh()
    if not ctx.options.write:
        raise _Settled("would-write", ", ".join(f"{s} -> {action.after[s]}" for s in settings))

    def send() -> str:
        # read-modify-write of the WHOLE client config: PUT copies most fields unconditionally
        client.put_config({"client_config": {**client_config, **{s: SAFE_POSTURE[s] for s in settings}}})
        return ", ".join(f"{s} = {SAFE_POSTURE[s]}" for s in settings)

    def reread() -> None:
        nonlocal client_config
        client_config = fresh()

    def read_back(err: Exception) -> None:
        fresh()
        raise _Settled("unconfirmed", f"{err}; the posture still drifts")

    _send_under_protocol(ctx, action, result, what="PUT client_config", send=send, reread=reread,
                         read_back=read_back)


# -- rLLM ------------------------------------------------------------------------------------------------

def _backfill(ctx: _Context, action: Action, result: ActionResult) -> None:
    from gatewayscope.guard.backfill import backfill_tombstones

    target = ctx.target(action.target)
    ids = list(action.after.get("session_ids") or [])
    if not ctx.options.write:
        raise _Settled("would-write", f"{len(ids)} tombstone(s)")
    result.sends += 1
    ctx.attempt(action, result.sends, f"tombstones for {len(ids)} id(s)")
    try:
        outcome = backfill_tombstones(target.address, ids, timeout=target.timeout_seconds)
    except (GatewayTimeoutError, UnreachableError) as err:
        raise _Settled("unconfirmed", str(err)) from None
    except SourceError as err:
        raise _Settled("refused", str(err)) from None
    raise _Settled("done" if outcome.new else "already-done", outcome.message)


# -- rLLM sessions: every delete re-establishes its orphan rule from the live store, right before it

def _recheck(ctx: _Context, action: Action, state: SessionState) -> _Settled | None:
    """None while the live session is still the orphan ``action`` was planned for; otherwise the outcome.

    Whatever the plan file says, a session is deleted only when the live store shows it is the session
    planned against (same trace count, same trace ids where the plan read them, no newer trace) AND it
    is an orphan by one of the rules: it carries a tombstone; its earlier delete is recorded in the
    journal the plan names; or it has exactly one trace, idle past the idle threshold (the config's, or
    the plan's when that is longer) and not at a weight version within the allowed lag of the gateway's
    current one.
    """
    if not state.trace_ids:
        return _Settled("already-done", "the session is gone")
    count = len(state.trace_ids)
    planned = action.before.get("trace_count")
    if count != planned:
        return _Settled("stale", f"the session now has {count} trace(s), not the {planned} it was planned with: "
                                 "it may be live; not deleted")
    planned_ids = action.details.get("trace_ids")
    if planned_ids is not None and sorted(planned_ids) != list(state.trace_ids):
        return _Settled("stale", "its traces are not the ones it was planned with: it may be live; not deleted")
    planned_last = action.details.get("last_trace_at")
    if planned_last is not None and state.last_trace_at is not None and state.last_trace_at > planned_last + 1e-3:
        return _Settled("stale", "it has a newer trace than when it was planned: it may be live; not deleted")
    if state.tombstoned:
        return None
    evidence = action.details.get("deleted_before")
    journal = str(evidence.get("journal", "")) if isinstance(evidence, dict) else ""
    if ctx.deleted_before(action, journal):
        return None
    why = "no tombstone and no recorded earlier delete"
    if count != 1:
        return _Settled("stale", f"not an orphan by the live store: {count} traces, {why}; not deleted")
    if state.last_trace_at is None:
        return _Settled("stale", f"not an orphan by the live store: its trace has no time, {why}; not deleted")
    idle = time.time() - state.last_trace_at
    threshold = ctx.idle_threshold()
    if idle <= threshold:
        return _Settled("stale", f"not an orphan by the live store: its trace is {human_seconds(idle)} old, not past "
                                 f"the {human_seconds(threshold)} idle threshold, {why}: it may be live; not deleted")
    current = ctx.current_weight_version(action.target)
    lag = ctx.config.policy.max_weight_lag
    if current is not None and state.weight_version is not None and current - state.weight_version <= lag:
        return _Settled("stale", f"its trace is at weight version {state.weight_version}, within {lag} of the "
                                 f"gateway's current {current}: it may be live; not deleted")
    return None


def _after_send(verdict: _Settled, sends: int) -> _Settled:
    """A session found gone after one of our sends was deleted by it (or meanwhile): ``done``."""
    if verdict.outcome == "already-done" and sends > 1:
        return _Settled("done", verdict.detail)
    return verdict


def _session_state_http(ctx: _Context, action: Action) -> SessionState:
    """The session as the gateway holds it now: its traces and, on a guarded launcher, its tombstone."""
    from gatewayscope.sources.rllm_http import session_path

    client = ctx.rllm(action.target)
    try:
        body = client.request("GET", f"{session_path(action.subject)}/traces")
    except NotFoundError:
        body = []
    if not isinstance(body, list):
        raise _Settled("unconfirmed", "the session's traces could not be read (not a list)")
    ids: list[str] = []
    times: list[float] = []
    versions: list[int] = []
    for trace in body:
        if not isinstance(trace, dict):
            continue
        ids.append(str(trace.get("trace_id")))
        stamp = trace.get("timestamp")
        if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
            times.append(float(stamp))
        metadata = trace.get("metadata")
        version = trace.get("weight_version", metadata.get("weight_version") if isinstance(metadata, dict) else None)
        if isinstance(version, int) and not isinstance(version, bool):
            versions.append(version)
    tombstoned: bool | None = None
    if ctx.capability(action.target, "guard"):
        check = client.request("POST", "/guard/tombstones/check", json_body={"session_ids": [action.subject]})
        listed = check.get("tombstoned") if isinstance(check, dict) else None
        if not isinstance(listed, list):
            raise _Settled("unconfirmed", "POST /guard/tombstones/check did not return {\"tombstoned\": [...]}")
        tombstoned = action.subject in listed
    return SessionState(trace_ids=tuple(sorted(ids)), last_trace_at=max(times) if times else None,
                        weight_version=max(versions) if versions else None, tombstoned=tombstoned)


#: the guarded launcher's compare-and-delete: deletes only while the session's traces and tombstone are as given
CONDITIONAL_DELETE_PATH = "/guard/sessions/delete-if"


def _delete_http(ctx: _Context, action: Action, state: SessionState) -> int:
    """Delete one session through the gateway: the guarded launcher's compare-and-delete where it has one
    (nothing can land between the check and the delete), else ``DELETE /sessions/{id}`` right after the read."""
    from gatewayscope.sources.rllm_http import session_path

    client = ctx.rllm(action.target)
    if ctx.capability(action.target, "guard") and action.target not in ctx.no_conditional_delete:
        try:
            body = client.request("POST", CONDITIONAL_DELETE_PATH, json_body={
                "session_id": action.subject, "trace_ids": list(state.trace_ids),
                "tombstoned": bool(state.tombstoned)})
        except HTTPStatusError as err:
            if err.status == 409:
                raise _Settled("stale", f"it changed while it was being deleted ({err.message}); not deleted") from None
            if err.status not in (404, 405):
                raise
            ctx.no_conditional_delete.add(action.target)  # an older launcher: the plain delete
        else:
            return int(body.get("deleted", 0)) if isinstance(body, dict) else 0
    body = client.request("DELETE", session_path(action.subject))
    return int(body.get("deleted", 0)) if isinstance(body, dict) else 0


def _session_delete(ctx: _Context, action: Action, result: ActionResult) -> None:
    """One session delete through the gateway's REST API (a SQLite file goes through _session_deletes_sqlite)."""
    verdict = _recheck(ctx, action, _session_state_http(ctx, action))
    if verdict is not None:
        raise verdict
    if not ctx.options.write:
        raise _Settled("would-write", "DELETE session")

    def send() -> str:
        with ctx.delete_turn(action.target):
            # after the pacer's wait: the check and the delete are as close together as the API allows
            state = _session_state_http(ctx, action)
            verdict = _recheck(ctx, action, state)
            if verdict is not None:
                raise _after_send(verdict, result.sends)
            deleted = _delete_http(ctx, action, state)
        return f"deleted ({deleted} trace(s))"

    def reread() -> None:
        if not _session_state_http(ctx, action).trace_ids:
            raise _Settled("done", "the session is gone")

    def read_back(err: Exception) -> None:
        reread()
        raise _Settled("unconfirmed", f"{err}; the session is still there")

    _send_under_protocol(ctx, action, result, what="DELETE session", send=send, reread=reread, read_back=read_back)


#: session ids per POST /sessions/batch_delete (gateways that have it)
DELETE_BATCH = 50


def _session_delete_batch(ctx: _Context, actions: list[Action]) -> list[ActionResult]:
    """Session deletes through ``POST /sessions/batch_delete``, under the same protocol as one delete.

    Each session is re-read and re-checked inside the pacer's turn, right before the batch is sent;
    those no longer orphans settle alone. After a 5xx the batch waits the schedule and goes round again
    (re-read, re-check, send the rest); after no answer each is read back and nothing is sent again.
    """
    results = {a.id: ActionResult(a.id, a.kind, a.target, a.subject, outcome="unconfirmed") for a in actions}

    def settle(action: Action, settled: _Settled, *, sent: bool = False) -> None:
        """``sent``: the read came after this round's send (a session gone now was deleted by it)."""
        settled = _after_send(settled, results[action.id].sends + (1 if sent else 0))
        results[action.id].outcome, results[action.id].detail = settled.outcome, settled.detail

    def still_orphans(batch: list[Action], err: Exception | None) -> list[tuple[Action, SessionState]]:
        """Re-read and re-check each session; ``err``: the send this read follows failed with it."""
        remaining = []
        for action in batch:
            try:
                state = _session_state_http(ctx, action)
                verdict = _recheck(ctx, action, state)
            except _Settled as settled:
                verdict = settled
            except GatewayscopeError as read_err:
                verdict = _Settled("unconfirmed", f"{err or 'read'}; read-back failed: {read_err}")
            if verdict is None:
                remaining.append((action, state))
            else:
                settle(action, verdict, sent=err is not None)
        return remaining

    live = [a for a, _ in still_orphans(actions, None)]
    if not ctx.options.write:
        for action in live:
            settle(action, _Settled("would-write", "DELETE session (batch)"))
        return [results[a.id] for a in actions]
    client = ctx.rllm(actions[0].target)
    schedule = list(ctx.options.retry_schedule)
    while live:
        for action in live:
            results[action.id].sends += 1
            ctx.pace(action)
        ctx.journal_attempts([(a, results[a.id].sends, "POST /sessions/batch_delete") for a in live])
        try:
            with ctx.delete_turn(actions[0].target):
                live = [a for a, _ in still_orphans(live, None)]
                if not live:
                    break
                body = client.request("POST", "/sessions/batch_delete",
                                      json_body={"session_ids": [a.subject for a in live]})
        except (GatewayTimeoutError, UnreachableError) as err:
            for action, _ in still_orphans(live, err):
                settle(action, _Settled("unconfirmed", f"{err}; the session is still there"))
            break
        except HTTPStatusError as err:
            if err.status < 500:
                for action in live:
                    settle(action, _Settled("refused", f"{err.message} ({err.status})"))
                break
            if not schedule:
                for action, _ in still_orphans(live, err):
                    settle(action, _Settled("unconfirmed", str(err)))
                break
            ctx.options.sleep(schedule.pop(0))
            continue
        deleted = body.get("deleted") if isinstance(body, dict) else None
        for action in live:
            settle(action, _Settled("done", f"deleted in a batch of {len(live)} ({deleted} trace(s) in all)"))
        break
    return [results[a.id] for a in actions]


def _session_deletes_sqlite(ctx: _Context, actions: list[Action], *, on_settled: Callable[[ActionResult], None],
                            stop_reason: Callable[[], str | None]) -> list[ActionResult]:
    """The session deletes of one SQLite store, one target's worth, in short exclusive transactions.

    Each session is re-read and re-checked inside the transaction that deletes it (see
    :mod:`gatewayscope.remediate.sqlite_delete` for how the lock is taken without costing the gateway a
    write). ``on_settled`` gets each result as it settles (journal, progress); when the lock stays out of
    reach, the rest end ``unconfirmed`` and nothing more is tried on this store.
    """
    target = ctx.target(actions[0].target)
    assert target.path
    results: list[ActionResult] = []

    def settle(action: Action, outcome: str, detail: str, sends: int) -> None:
        result = ActionResult(action.id, action.kind, action.target, action.subject, outcome, detail, sends)
        results.append(result)
        on_settled(result)

    def decide(action: Action, state: SessionState) -> _Settled | None:
        return _recheck(ctx, action, state)

    try:
        deleter = SessionDeleter(target.path, busy_timeout=target.timeout_seconds, readonly=not ctx.options.write)
        deleter.__enter__()
    except StoreError as err:
        for action in actions:
            settle(action, "unconfirmed", f"nothing sent: {err}", 0)
        return results
    try:
        if not ctx.options.write:
            for action in actions:
                try:
                    verdict = decide(action, deleter.read_state(action.subject))
                except sqlite3.Error as err:
                    verdict = _Settled("unconfirmed", f"nothing sent: {target.path}: {err}")
                verdict = verdict or _Settled("would-write", "DELETE session")
                settle(action, verdict.outcome, verdict.detail, 0)
            return results
        pending = list(actions)
        sends: dict[str, int] = {}
        while pending:  # each pass settles at least one action
            reason = stop_reason()
            if reason:
                for action in pending:
                    settle(action, "skipped", reason, sends.get(action.id, 0))
                break
            chunk = pending[:TRANSACTION_SESSIONS]
            for action in chunk:
                sends[action.id] = sends.get(action.id, 0) + 1
                ctx.pace(action)
            ctx.journal_attempts([(a, sends[a.id], "DELETE session (SQLite)") for a in chunk])
            try:
                with ctx.delete_turn(target.name):
                    decisions = deleter.transaction(chunk, lambda a: a.subject, decide)
            except TimeoutError:
                for action in pending:
                    settle(action, "unconfirmed", f"nothing sent: the gateway kept {target.path} locked for "
                                                  f"{target.timeout_seconds:g} s; deletes on it stopped so that its "
                                                  "writes go first (apply again later; the journal resumes)",
                           sends.get(action.id, 0))
                break
            except StoreError as err:
                for action in pending:
                    settle(action, "unconfirmed", str(err), sends.get(action.id, 0))
                break
            for decision in decisions:
                action = decision.item
                if decision.deleted is not None:
                    settle(action, "done", f"deleted ({decision.deleted} trace(s))", sends[action.id])
                else:
                    verdict = _after_send(decision.verdict, sends[action.id])  # type: ignore[arg-type]
                    settle(action, verdict.outcome, verdict.detail, sends[action.id])
            pending = pending[len(decisions):]
            ctx.options.sleep(deleter.pause)  # the gateway's waiting writer goes next
    finally:
        deleter.__exit__(None, None, None)
    return results


_EXECUTORS: dict[str, Callable[[_Context, Action, ActionResult], None]] = {
    "pool_shrink": _shrink,
    "record_delete": _record_delete,
    "posture_fix": _posture,
    "tombstone_backfill": _backfill,
    "session_delete": _session_delete,
}


# -- the driver ------------------------------------------------------------------------------------------

def _run_action(ctx: _Context, action: Action) -> ActionResult:
    result = ActionResult(action.id, action.kind, action.target, action.subject, outcome="unconfirmed")
    try:
        _EXECUTORS[action.kind](ctx, action, result)
        result.detail = "executor ended without an outcome"
    except _Settled as settled:
        result.outcome, result.detail = settled.outcome, settled.detail
    except PlanError:
        raise
    except GatewayscopeError as err:
        # a read before any write failed: nothing of ours is under way
        result.outcome = "unconfirmed"
        result.detail = f"{'after sending: ' if result.sends else 'nothing sent: '}{err}"
    _journal_outcome(ctx, action, result)
    return result


def _journal_outcome(ctx: _Context, action: Action, result: ActionResult) -> None:
    if ctx.journal is not None and ctx.options.write and result.outcome in OUTCOMES:
        ctx.journal.append("outcome", plan_id=ctx.plan.id, action_id=action.id, kind=action.kind,
                           target=action.target, subject=action.subject, outcome=result.outcome,
                           detail=result.detail, sends=result.sends)


def apply_plan(
    plan: Plan,
    config: Config,
    *,
    options: ApplyOptions | None = None,
    journal: Journal | None = None,
    transports: dict[str, Any] | None = None,
    on_result: Callable[[ActionResult], None] | None = None,
    deleted_ids: Collection[str] = (),
) -> ApplyReport:
    """Apply ``plan`` (a dry run unless ``options.write``). ``on_result`` is called after each action (progress).

    ``deleted_ids``: session ids the caller knows were deleted before (as ``build_plan`` took them); with
    the journals a plan names, they are the only "deleted before" evidence apply accepts, never the plan's
    word alone.
    """
    options = options or ApplyOptions()
    if options.write and journal is None:
        raise PlanError("A real apply needs a journal (every attempt and outcome is recorded).")
    if options.concurrency < 1:
        raise PlanError("--concurrency must be at least 1.")
    report = ApplyReport(plan_id=plan.id, dry_run=not options.write)
    subjects = [(a.target, a.subject) for a in plan.actions]
    if len(set(subjects)) != len(subjects):
        raise PlanError("The plan has two actions on one subject; it is not a plan gatewayscope made.")
    unknown = {a.kind for a in plan.actions} - set(ACTION_KINDS)
    if unknown:
        raise PlanError(f"The plan has action kinds this gatewayscope does not know: {', '.join(sorted(unknown))}.")
    for action in plan.actions:
        config_target = next((t for t in config.targets if t.name == action.target), None)
        if config_target is None:
            raise PlanError(f"The plan acts on target {action.target!r}, which the config does not name; apply it "
                            "with the config it was planned with (--config).")

    # the lock comes before the journal is read: two applies must not both find an action unsettled
    with apply_lock(journal, plan.id) if journal is not None and options.write else nullcontext():
        return _apply_locked(plan, config, options, journal, transports or {}, on_result, report,
                             frozenset(deleted_ids))


def _apply_locked(plan: Plan, config: Config, options: ApplyOptions, journal: Journal | None,
                  transports: dict[str, Any], on_result: Callable[[ActionResult], None] | None,
                  report: ApplyReport, deleted_ids: frozenset[str]) -> ApplyReport:
    settled = journal.outcomes(plan.id) if journal is not None else {}
    pending: list[Action] = []
    for action in plan.actions:
        if action.id in settled:
            record = settled[action.id]
            report.previous.append(ActionResult(action.id, action.kind, action.target, action.subject,
                                                outcome=str(record["outcome"]), detail=str(record.get("detail", "")),
                                                sends=int(record.get("sends", 0))))
        else:
            pending.append(action)
    if plan.actions and not pending:
        report.already_applied = True
        return report

    ctx = _Context(plan, config, options, journal, transports, deleted_ids)
    if journal is not None and options.write:
        journal.append("apply-start", plan_id=plan.id, actions=len(pending), resumed=len(report.previous),
                       allow_delete=options.allow_delete)
    errors = 0
    # tombstone first, then delete: a target whose backfill failed gets no deletes
    unguarded_deletes = {r.target for r in report.previous
                         if r.kind == "tombstone_backfill" and r.outcome not in SUCCESS_OUTCOMES}
    stop = threading.Event()
    lock = threading.Lock()

    def blocked(action: Action) -> ActionResult | None:
        """The reason an action is not run now, as a ``skipped`` result, or None."""
        if stop.is_set():
            return ActionResult(action.id, action.kind, action.target, action.subject, "skipped",
                                report.stopped_early or "stopped")
        if action.kind == "session_delete" and action.target in unguarded_deletes:
            return ActionResult(action.id, action.kind, action.target, action.subject, "skipped",
                                "its target's tombstones were not recorded first; not deleted")
        if action.destructive and options.write and not options.allow_delete:
            return ActionResult(action.id, action.kind, action.target, action.subject, "skipped",
                                "a delete: needs --allow-delete")
        return None

    def count(result: ActionResult) -> ActionResult:
        nonlocal errors
        with lock:
            if result.outcome in ("refused", "unconfirmed"):
                errors += 1
                if options.max_errors is not None and errors >= options.max_errors and not stop.is_set():
                    report.stopped_early = f"stopped after {errors} error(s) (--max-errors {options.max_errors})"
                    stop.set()
        if on_result:
            on_result(result)
        return result

    def stop_reason() -> str | None:
        return (report.stopped_early or "stopped") if stop.is_set() else None

    def work(item: Action | list[Action]) -> list[ActionResult]:
        if isinstance(item, Action):
            return [count(blocked(item) or _run_action(ctx, item))]
        skipped = {a.id: blocked(a) for a in item}
        runnable = [a for a in item if skipped[a.id] is None]
        by_id = {a.id: a for a in runnable}
        if runnable and ctx.target(runnable[0].target).path:
            def on_settled(result: ActionResult) -> None:
                _journal_outcome(ctx, by_id[result.action_id], result)
                count(result)

            ran = {r.action_id: r for r in _session_deletes_sqlite(ctx, runnable, on_settled=on_settled,
                                                                    stop_reason=stop_reason)}
            return [count(skipped[a.id]) if skipped[a.id] else ran[a.id] for a in item]  # type: ignore[arg-type]
        ran = {r.action_id: r for r in (_session_delete_batch(ctx, runnable) if runnable else [])}
        for action in runnable:
            _journal_outcome(ctx, action, ran[action.id])
        return [count(skipped[a.id] or ran[a.id]) for a in item]

    def work_items(phase: list[Action]) -> list[Action | list[Action]]:
        """One item per action, except session deletes on a SQLite store (all of one store's in one item: they
        run one transaction at a time) and on a gateway with batch delete (chunks of DELETE_BATCH)."""
        items: list[Action | list[Action]] = []
        stores: dict[str, list[Action]] = {}
        batched: dict[str, list[Action]] = {}
        for action in phase:
            if action.kind == "session_delete" and ctx.target(action.target).path:
                stores.setdefault(action.target, []).append(action)
            elif action.kind == "session_delete" and ctx.capability(action.target, "batch_delete"):
                batched.setdefault(action.target, []).append(action)
            else:
                items.append(action)
        items += list(stores.values())
        for group in batched.values():
            items += [group[i:i + DELETE_BATCH] for i in range(0, len(group), DELETE_BATCH)]
        return items

    try:
        with ctx.stack:
            # phases in plan order: tombstones land before any delete starts
            for kind in ACTION_KINDS:
                phase = [a for a in pending if a.kind == kind]
                if not phase:
                    continue
                with ThreadPoolExecutor(max_workers=options.concurrency,
                                        thread_name_prefix="gatewayscope-apply") as pool:
                    results = [r for part in pool.map(work, work_items(phase)) for r in part]
                report.results.extend(results)
                if kind == "tombstone_backfill":
                    unguarded_deletes.update(r.target for r in results if r.outcome not in SUCCESS_OUTCOMES
                                             and r.outcome != "would-write")
    finally:
        if journal is not None and options.write:
            journal.append("apply-end", plan_id=plan.id, tally=report.tally(),
                           skipped=len(report.skipped), stopped_early=report.stopped_early)
    order = {a.id: i for i, a in enumerate(plan.actions)}
    report.results.sort(key=lambda r: order[r.action_id])
    return report
