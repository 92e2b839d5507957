"""Apply a plan, exactly as planned, under the safety protocol (docs/remediation.md).

The only code in gatewayscope that writes to a gateway. Read it top to bottom:

* **Outcomes** are values (:class:`Settled`): every executor returns one, none raises one.
* **The write protocol** (:func:`_write`) is the one way a write is sent, for a single subject and for a
  batch of session deletes alike: it journals the attempt, sends, and decides what an answer means.
  After a 5xx it waits 250, 750 and 2,000 ms in turn, re-reads (gone or already fixed settles it), and
  only then sends again, built from that read; a write with no answer is read back and never sent
  again; a 4xx is a refusal.
* **The executors** (one per action kind) re-read their subject right before writing: gone -> ``gone`` (a
  Bifrost PUT is an upsert and would recreate it), already at the target -> ``already-done``, changed in
  anything but what the action changes -> ``stale``. Writes are built from the fresh read, never with a
  secret a listing masked, never with ``keys``. A session delete re-establishes its orphan rule from the
  live store right before it deletes (:func:`_recheck`).
* **The driver** (:func:`apply_plan`) runs four steps a reader can follow: validate the plan against the
  config, take the apply lock and resume from the journal, then run the phases in plan order (tombstones
  before deletes) with bounded concurrency (a Bifrost target's pool resizes within its memory headroom,
  :func:`_shrink_limits`), a rate limit and deletes paced per target, while the error
  budget (``max_errors``) can stop new actions; every attempt and outcome is journaled, and the report
  ends with one tally line.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from gatewayscope.analysis.posture import SAFE_POSTURE
from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import (
    BadResponseError,
    GatewayscopeError,
    GatewayTimeoutError,
    HTTPStatusError,
    NotFoundError,
    PlanError,
    SourceError,
    StoreError,
    UnreachableError,
)
from gatewayscope.orphan_rule import Tombstone, delete_fences, dispatched_at_of, judge, latest_fence
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

#: how an action ends (the tally counts these)
Outcome = Literal["done", "refused", "unconfirmed", "gone", "stale", "already-done"]
#: plus what a dry run reports, and an action that was not run
Status = Literal["done", "refused", "unconfirmed", "gone", "stale", "already-done", "would-write", "skipped"]

OUTCOMES: tuple[Outcome, ...] = FINAL_OUTCOMES  # type: ignore[assignment]
SUCCESS_OUTCOMES = frozenset({"done", "already-done"})
#: waits after a 5xx before each re-read
RETRY_SCHEDULE = (0.25, 0.75, 2.0)
#: DNS 5 s + upstream model listing 15 s + margin: how long a Bifrost pool write may take there
POOL_WRITE_TIMEOUT = 30.0
#: fields a pool write sends back from the fresh read; the rest PUT keeps when absent
POOL_WRITE_FIELDS = ("network_config", "custom_provider_config", "send_back_raw_request", "send_back_raw_response")
#: session ids per POST /sessions/batch_delete (gateways that have it)
DELETE_BATCH = 50
#: the guarded launcher's compare-and-delete: deletes only while the session's traces and tombstone are as given
CONDITIONAL_DELETE_PATH = "/guard/sessions/delete-if"


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
    #: without ``rate``: the share of a gateway's time its session deletes may take (default DELETE_DUTY)
    delete_duty: float | None = None
    #: asked before each action (and each SQLite transaction) starts: a sentence stops every action not yet
    #: started (skipped, open in the journal), None lets it run. Heal's kill switch, windows and blockers
    stop: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class Settled:
    """How an action ended, and why."""

    outcome: Status
    detail: str = ""


@dataclass
class ActionResult:
    action_id: str
    kind: str
    target: str
    subject: str
    outcome: str  # a Status: one of OUTCOMES, "would-write" in a dry run, or "skipped"
    detail: str = ""
    sends: int = 0


@dataclass
class ApplyReport:
    """What an apply did: ``str(report)`` is the tally line (a dry run's says what its checks found),
    ``report.counts`` the tally."""

    plan_id: str
    dry_run: bool
    results: list[ActionResult] = field(default_factory=list)
    #: outcomes settled by an earlier run of the same plan (from the journal)
    previous: list[ActionResult] = field(default_factory=list)
    already_applied: bool = False
    stopped_early: str | None = None
    #: per Bifrost target: how many pool resizes ran at once, and why (the memory-headroom rule)
    shrink_concurrency: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tally(self) -> dict[str, int]:
        counts: dict[str, int] = {outcome: 0 for outcome in OUTCOMES}
        for result in [*self.previous, *self.results]:
            if result.outcome in counts:
                counts[result.outcome] += 1
        return counts

    @property
    def counts(self) -> dict[str, int]:
        """Actions per outcome, zeros included: ``{"done": 10, "refused": 0, ...}``."""
        return self.tally()

    def tally_line(self) -> str:
        """``<n> done, <n> refused, <n> unconfirmed, <n> gone, <n> stale, <n> already-done``, zeros included."""
        return ", ".join(f"{n} {outcome}" for outcome, n in self.tally().items())

    def __str__(self) -> str:
        if not self.dry_run:
            return self.tally_line()
        # a dry run sends nothing: its line counts what each check found, never "0 done"
        found: dict[str, int] = {}
        for result in self.results:
            found[result.outcome] = found.get(result.outcome, 0) + 1
        counted = ", ".join(f"{n} {outcome}" for outcome, n in sorted(found.items(), key=lambda item: -item[1]))
        return f"dry run, nothing was sent: {counted or 'no action'}"

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


# -- the thresholds a delete is checked against -------------------------------------------------------------

_THRESHOLDS = (("orphan_idle_seconds", "--orphan-idle-seconds", "idle threshold"),
               ("max_weight_lag", "--max-weight-lag", "allowed weight-version lag"))


def _planned(plan: Plan, key: str) -> float | None:
    value = plan.policy.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def checked_policy(plan: Plan, policy: Policy) -> tuple[float, int]:
    """(idle threshold, allowed weight lag) apply re-checks a suspected orphan against: ``policy``'s (the config's,
    with apply's flags), or the plan's where that is stricter. Only a trusted plan (made in this process, or signed
    and checked) may loosen them to the plan's own: an unsigned plan file can be edited."""
    idle, lag = float(policy.orphan_idle_seconds), int(policy.max_weight_lag)
    planned_idle, planned_lag = _planned(plan, "orphan_idle_seconds"), _planned(plan, "max_weight_lag")
    if plan.trusted:
        return (planned_idle if planned_idle is not None else idle,
                int(planned_lag) if planned_lag is not None else lag)
    return (max(idle, planned_idle) if planned_idle is not None else idle,
            max(lag, int(planned_lag)) if planned_lag is not None else lag)


def stricter_than_planned(plan: Plan, policy: Policy) -> list[str]:
    """One sentence per threshold that apply will check more strictly than the plan was made with, naming the
    flag that gives apply the plan's threshold; empty when apply checks what the plan was made with."""
    if not any(a.kind == "session_delete" and a.details.get("confidence") == "suspected" for a in plan.actions):
        return []
    idle, lag = checked_policy(plan, policy)
    sentences = []
    for (key, flag, what), checked in zip(_THRESHOLDS, (idle, float(lag)), strict=True):
        planned = _planned(plan, key)
        if planned is not None and planned < checked:
            sentences.append(f"The plan's suspected orphans were found with {flag} {planned:g}, but apply checks "
                             f"each delete against a {what} of {checked:g} (the config's or the default), so they "
                             f"will end stale: pass {flag} {planned:g} to apply to check them as planned.")
    return sentences


# -- pacing ----------------------------------------------------------------------------------------------

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


# -- what the executors share ------------------------------------------------------------------------------

class _Context:
    """The plan, the config, the options, the journal, the clients, the limiters and the pacers."""

    def __init__(self, plan: Plan, config: Config, options: ApplyOptions, journal: Journal | None,
                 transports: dict[str, Any], deleted_ids: Mapping[str, Any] | None = None) -> None:
        self.plan = plan
        self.config = config
        self.options = options
        self.journal = journal
        self.transports = transports
        #: the "deleted before" evidence apply accepts: what the caller names now, per target (never a path or a
        #: claim the plan file carries, unless the plan is one this process made or whose signature it checked)
        self._deleted = {name: delete_fences(deleted_ids, name) for name in {t.name for t in config.targets}}
        self.limiter = _RateLimiter(options.rate, options.sleep)
        # session deletes: --rate when given; otherwise each target's pacer keeps them to DELETE_DUTY
        self.delete_limiter = self.limiter if options.rate else _RateLimiter(None, options.sleep)
        self.stack = ExitStack()
        #: targets whose guarded launcher has no compare-and-delete route (an older gatewayscope)
        self.no_conditional_delete: set[str] = set()
        self._pacers: dict[str, _DeletePacer] = {}
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._weight_versions: dict[str, int | None] = {}
        self._capabilities = {entry.get("name"): dict(entry.get("capabilities") or {}) for entry in plan.targets}
        #: per Bifrost target: the pool resizes that may run at once (see _shrink_limits)
        self.shrink_slots: dict[str, threading.Semaphore] = {}

    def target(self, name: str) -> Target:
        try:
            return self.config.target(name)
        except GatewayscopeError:
            raise PlanError(f"The plan acts on target {name!r}, which the config does not name; apply it with "
                            "the config it was planned with.") from None

    def capability(self, target: str, name: str) -> bool:
        """Whether the plan found ``target`` to have ``name`` (``guard``, ``batch_delete``, ``weight_version``)."""
        return bool(self._capabilities.get(target, {}).get(name))

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

    # -- the orphan rule's inputs

    def idle_threshold(self) -> float:
        """The idle threshold a suspected orphan must be past (see :func:`checked_policy`)."""
        return checked_policy(self.plan, self.config.policy)[0]

    def max_weight_lag(self) -> int:
        """The weight-version lag a suspected orphan must exceed (see :func:`checked_policy`)."""
        return checked_policy(self.plan, self.config.policy)[1]

    def current_weight_version(self, target: str) -> int | None:
        """The gateway's current weight version (asked once per apply), or None where it has none."""
        with self._lock:
            if target in self._weight_versions:
                return self._weight_versions[target]
        version: int | None = None
        if self.capability(target, "weight_version") and self.target(target).is_remote:
            try:
                body = self.rllm(target).request("GET", "/admin/weight_version")
            except GatewayscopeError as err:
                raise SourceError(f"the gateway's weight version could not be read ({err})") from None
            value = body.get("weight_version") if isinstance(body, dict) else None
            version = value if isinstance(value, int) and not isinstance(value, bool) else None
        with self._lock:
            self._weight_versions[target] = version
        return version

    def deleted_fence(self, action: Action) -> float | None:
        """The moment of the latest recorded earlier delete of this session on its target, or None: from the
        evidence the caller gave apply, and from the plan's own record of it only when the plan is trusted (made
        in this process, or signed and its signature checked): an unsigned plan file can be edited."""
        fences = [self._deleted.get(action.target, {}).get(action.subject)]
        evidence = action.details.get("deleted_before")
        if self.plan.trusted and isinstance(evidence, dict):
            moment = evidence.get("deleted_at")
            if isinstance(moment, (int, float)) and not isinstance(moment, bool) and moment == moment:
                fences.append(float(moment))
        return latest_fence(*fences)

    # -- pacing and the journal

    def pace(self, action: Action) -> None:
        """Wait for the rate limiter that paces ``action``'s kind."""
        (self.delete_limiter if action.kind == "session_delete" else self.limiter).wait()

    def delete_turn(self, target: str) -> AbstractContextManager[None]:
        """Hold while a session delete (or a batch of them) runs on ``target``: see :class:`_DeletePacer`."""
        with self._lock:
            pacer = self._pacers.get(target)
            if pacer is None:
                duty = self.options.delete_duty or DELETE_DUTY
                pacer = self._pacers[target] = _DeletePacer(None if self.options.rate else duty,
                                                            self.options.sleep)
        return pacer.turn()

    def journal_attempts(self, attempts: Sequence[tuple[Action, int, str]]) -> None:
        """Record write attempts (action, send number, what) before they are made, with one fsync."""
        if self.journal is not None and attempts:
            self.journal.append_many([("attempt", {
                "plan_id": self.plan.id, "action_id": a.id, "kind": a.kind, "target": a.target,
                "subject": a.subject, "send": send, "what": what}) for a, send, what in attempts])

    def journal_outcome(self, action: Action, result: ActionResult) -> None:
        if self.journal is not None and self.options.write and result.outcome in OUTCOMES:
            self.journal.append("outcome", plan_id=self.plan.id, action_id=action.id, kind=action.kind,
                                target=action.target, subject=action.subject, outcome=result.outcome,
                                detail=result.detail, sends=result.sends)


# -- the write protocol ----------------------------------------------------------------------------------------

def _write(ctx: _Context, *, begin: Callable[[], None], send: Callable[[], Settled | str],
           reread: Callable[[], Settled | None], read_back: Callable[[Exception], Settled],
           refuse: Callable[[HTTPStatusError], Settled]) -> Settled:
    """Send one write (for one subject, or one batch) and decide what its answer means.

    ``begin`` counts and journals the attempt; ``send`` writes (built from the latest read) and returns the
    detail of a success, or settles on its own (a check right before it found nothing to write). After a
    5xx: wait the next step of the schedule, ``reread`` (which settles gone / done / stale, or refreshes
    what the next send is built from), send again. With the schedule used up, or after no answer at all,
    ``read_back`` decides and nothing is sent again. A 4xx is ``refuse``'s.
    """
    schedule = list(ctx.options.retry_schedule)
    while True:  # bounded: one pass per step of the schedule
        begin()
        try:
            answer = send()
        except (GatewayTimeoutError, UnreachableError) as err:
            return read_back(err)
        except HTTPStatusError as err:
            if err.status < 500:
                return refuse(err)
            if not schedule:
                return read_back(err)
            ctx.options.sleep(schedule.pop(0))
            settled = reread()
            if settled is not None:
                return settled
            continue
        return answer if isinstance(answer, Settled) else Settled("done", answer)


def _single(ctx: _Context, action: Action, result: ActionResult, what: str) -> Callable[[], None]:
    """The ``begin`` of a write to one subject."""
    def begin() -> None:
        result.sends += 1
        ctx.pace(action)
        ctx.journal_attempts([(action, result.sends, what)])
    return begin


def _refusal(action: Action) -> Callable[[HTTPStatusError], Settled]:
    def refuse(err: HTTPStatusError) -> Settled:
        if action.kind == "pool_shrink":
            if action.details.get("has_base_url"):
                remedy = (f"it keeps its workers; remedy: DELETE /api/providers/{quote(action.subject, safe='')} "
                          "(a provision still in use sets it up again)")
            else:
                remedy = "it keeps its workers"
            return Settled("refused", f"{err.message} ({err.status}); {remedy}")
        return Settled("refused", f"{err.message} ({err.status})")
    return refuse


# -- Bifrost ------------------------------------------------------------------------------------------------

def pool_write_body(record: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | Settled:
    """The PUT body for a resize, built from a fresh read.

    Sends the record's own network block, custom upstream and raw switches (PUT resets those when
    absent) and the new pool; leaves out what PUT keeps when absent (proxy, openai, prompt cache,
    store_raw_request_response), whose secrets the listing masks; never ``keys``. A record whose network
    block carries a CA certificate cannot be written without sending back a masked secret: ``refused``.
    """
    network = record.get("network_config")
    if isinstance(network, dict) and network.get("ca_cert_pem"):
        return Settled("refused", "not sent: its network_config carries a CA certificate that the listing masks, "
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


def _shrink(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    from gatewayscope.sources.bifrost import POOL_FIELDS, record_fingerprint

    client = ctx.bifrost(action.target)
    target_pool = int(action.after["concurrency"])

    def fresh() -> dict[str, Any] | Settled:
        try:
            record = client.get_provider(action.subject)
        except NotFoundError:
            return Settled("gone", "the record no longer exists; not written (a PUT would recreate it)")
        if _concurrency(record) <= target_pool:
            return Settled("already-done" if result.sends == 0 else "done", f"holds {_concurrency(record)} workers")
        if record_fingerprint(record, exclude=POOL_FIELDS) != action.fingerprint:
            return Settled("stale", "changed since the plan was made; skipped (make a new plan)")
        return record

    first = fresh()
    if isinstance(first, Settled):
        return first
    record: dict[str, Any] = first
    if not ctx.options.write:
        return Settled("would-write", f"{_concurrency(record)} -> {target_pool} workers")

    def send() -> Settled | str:
        body = pool_write_body(record, action.after)
        if isinstance(body, Settled):
            return body
        answer = client.put_provider(action.subject, body, timeout=ctx.options.pool_write_timeout)
        return f"now {_concurrency(answer) if isinstance(answer, dict) else target_pool} workers"

    def reread() -> Settled | None:
        nonlocal record
        latest = fresh()
        if isinstance(latest, Settled):
            return latest
        record = latest
        return None

    def read_back(err: Exception) -> Settled:
        """No (good) answer: the write may still be under way there. Read back; never send again."""
        try:
            latest = client.get_provider(action.subject)
        except GatewayscopeError as read_err:
            return Settled("unconfirmed", f"{err}; read-back failed too: {read_err}")
        if _concurrency(latest) == target_pool:
            return Settled("done", f"no clear answer ({err}), but the record holds the new pool")
        return Settled("unconfirmed", f"{err}; the record still holds {_concurrency(latest)} workers")

    what = f"PUT pool {target_pool}/{action.after['buffer_size']}"
    return _write(ctx, begin=_single(ctx, action, result, what), send=send, reread=reread, read_back=read_back,
                  refuse=_refusal(action))


def _record_delete(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    from gatewayscope.sources.bifrost import POOL_FIELDS, record_fingerprint

    client = ctx.bifrost(action.target)

    def fresh() -> Settled | None:
        try:
            record = client.get_provider(action.subject)
        except NotFoundError:
            return Settled("already-done" if result.sends == 0 else "done", "the record is gone")
        if result.sends == 0 and record_fingerprint(record, exclude=POOL_FIELDS) != action.fingerprint:
            return Settled("stale", "changed since the plan was made; not deleted (make a new plan)")
        return None

    settled = fresh()
    if settled is not None:
        return settled
    if not ctx.options.write:
        return Settled("would-write", "DELETE")

    def send() -> str:
        client.delete_provider(action.subject)
        return "deleted"

    def read_back(err: Exception) -> Settled:
        return fresh() or Settled("unconfirmed", f"{err}; the record is still there")

    # a DELETE is safe to send again after a re-read: it never recreates anything
    return _write(ctx, begin=_single(ctx, action, result, "DELETE record"), send=send, reread=fresh,
                  read_back=read_back, refuse=_refusal(action))


def _posture(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    from gatewayscope.analysis.posture import posture_drift
    from gatewayscope.sources.bifrost import safe_client_config

    client = ctx.bifrost(action.target)
    settings = list(action.after)

    def fresh() -> dict[str, Any] | Settled:
        config = client.get_config()
        client_config = config.get("client_config") if isinstance(config, dict) else None
        if not isinstance(client_config, dict):
            return Settled("unconfirmed", "GET /api/config returned no client_config")
        if not [s for s in posture_drift(client_config) if s in settings]:
            return Settled("already-done" if result.sends == 0 else "done", "posture holds")
        if result.sends == 0 and posture_fingerprint(safe_client_config(client_config)) != action.fingerprint:
            return Settled("stale", "the client config changed since the plan was made; not written")
        return client_config

    first = fresh()
    if isinstance(first, Settled):
        return first
    client_config: dict[str, Any] = first
    if not ctx.options.write:
        return Settled("would-write", ", ".join(f"{s} -> {action.after[s]}" for s in settings))

    def send() -> str:
        # read-modify-write of the WHOLE client config: PUT copies most fields unconditionally
        client.put_config({"client_config": {**client_config, **{s: SAFE_POSTURE[s] for s in settings}}})
        return ", ".join(f"{s} = {SAFE_POSTURE[s]}" for s in settings)

    def reread() -> Settled | None:
        nonlocal client_config
        latest = fresh()
        if isinstance(latest, Settled):
            return latest
        client_config = latest
        return None

    def read_back(err: Exception) -> Settled:
        return reread() or Settled("unconfirmed", f"{err}; the posture still drifts")

    return _write(ctx, begin=_single(ctx, action, result, "PUT client_config"), send=send, reread=reread,
                  read_back=read_back, refuse=_refusal(action))


# -- rLLM: tombstones ---------------------------------------------------------------------------------------

def _backfill(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    from gatewayscope.guard.backfill import backfill_tombstones

    target = ctx.target(action.target)
    ids = list(action.after.get("session_ids") or [])
    if not ctx.options.write:
        return Settled("would-write", f"{len(ids)} tombstone(s)")
    _single(ctx, action, result, f"tombstones for {len(ids)} id(s)")()
    try:
        outcome = backfill_tombstones(target.address, ids, timeout=target.timeout_seconds)
    except (GatewayTimeoutError, UnreachableError) as err:
        return Settled("unconfirmed", str(err))
    except SourceError as err:
        return Settled("refused", str(err))
    return Settled("done" if outcome.new else "already-done", outcome.message)


# -- rLLM: session deletes, each re-establishing its orphan rule from the live store right before it -----------

def _recheck(ctx: _Context, action: Action, state: SessionState) -> Settled | None:
    """None while the live session is still the orphan ``action`` was planned for; otherwise the outcome.

    Whatever the plan file says, a session is deleted only when the live store shows it is the session
    planned against (same trace count, same trace ids where the plan read them, no newer trace) AND it
    is an orphan by the rule (:func:`gatewayscope.orphan_rule.judge`) on what the live store holds: every trace
    dispatched before its tombstone's fence (unless the guard saw it written again since) or before a recorded
    earlier delete (:meth:`_Context.deleted_fence`); or exactly one trace, idle past the idle threshold (the
    config's, or the plan's when that is longer) and not at a weight version within the allowed lag of the
    gateway's current one.
    """
    if not state.trace_ids:
        return Settled("already-done", "the session is gone")
    count = len(state.trace_ids)
    planned = action.before.get("trace_count")
    if count != planned:
        return Settled("stale", f"the session now has {count} trace(s), not the {planned} it was planned with: "
                                "it may be live; not deleted")
    planned_ids = action.details.get("trace_ids")
    if planned_ids is not None and sorted(planned_ids) != list(state.trace_ids):
        return Settled("stale", "its traces are not the ones it was planned with: it may be live; not deleted")
    planned_last = action.details.get("last_trace_at")
    if planned_last is not None and state.last_trace_at is not None and state.last_trace_at > planned_last + 1e-3:
        return Settled("stale", "it has a newer trace than when it was planned: it may be live; not deleted")
    verdict = judge(trace_count=count, last_trace_at=state.last_trace_at, latest_dispatch=state.latest_dispatch,
                    weight_version=state.weight_version, tombstone_fence=state.fence, reused=state.reused,
                    deleted_fence=ctx.deleted_fence(action), now=time.time(), idle_seconds=ctx.idle_threshold(),
                    max_weight_lag=ctx.max_weight_lag(),
                    # asked of the gateway only for a session the weight version can decide
                    current_weight_version=ctx.current_weight_version(action.target) if count == 1 else None,
                    seconds_text=human_seconds)
    if verdict.confidence is not None:
        return None
    why = "no tombstone and no recorded earlier delete it came before"
    return Settled("stale", f"not an orphan by the live store: {verdict.reason}, {why}: it may be live; not deleted")


def _after_send(settled: Settled, sends: int) -> Settled:
    """A session found gone after one of our sends was deleted by it (or meanwhile): ``done``."""
    if settled.outcome == "already-done" and sends > 1:
        return Settled("done", settled.detail)
    return settled


def _session_state_http(ctx: _Context, action: Action) -> SessionState:
    """The session as the gateway holds it now: its traces and, on a guarded launcher, its tombstone."""
    from gatewayscope.sources.rllm_http import read_tombstones

    client = ctx.rllm(action.target)
    try:
        body = client.request("GET", f"{client.session_path(action.subject)}/traces")
    except NotFoundError:
        body = []
    if not isinstance(body, list):
        raise BadResponseError("the session's traces could not be read (GET .../traces did not return a list)")
    ids: list[str] = []
    times: list[float] = []
    versions: list[int] = []
    dispatched: list[float | None] = []
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
        dispatched.append(dispatched_at_of(trace))
    tombstone: Tombstone | None = None
    guarded = ctx.capability(action.target, "guard")
    if guarded:
        tombstone = read_tombstones(client, [action.subject]).get(action.subject)
    known = [when for when in dispatched if when is not None]
    return SessionState(trace_ids=tuple(sorted(ids)), last_trace_at=max(times) if times else None,
                        weight_version=max(versions) if versions else None,
                        tombstoned=(tombstone is not None) if guarded else None,
                        latest_dispatch=max(known) if known and len(known) == len(dispatched) else None,
                        fence=tombstone.fence if tombstone is not None else None,
                        reused=tombstone.reused if tombstone is not None else False)


def _delete_http(ctx: _Context, action: Action, state: SessionState) -> Settled | str:
    """Delete one session through the gateway: the guarded launcher's compare-and-delete where it has one
    (nothing can land between the check and the delete), else ``DELETE /sessions/{id}`` right after the read."""
    client = ctx.rllm(action.target)
    if ctx.capability(action.target, "guard") and action.target not in ctx.no_conditional_delete:
        try:
            body = client.request("POST", CONDITIONAL_DELETE_PATH, json_body={
                "session_id": action.subject, "trace_ids": list(state.trace_ids),
                "tombstoned": bool(state.tombstoned)})
        except HTTPStatusError as err:
            if err.status == 409:
                return Settled("stale", f"it changed while it was being deleted ({err.message}); not deleted")
            if err.status not in (404, 405):
                raise
            ctx.no_conditional_delete.add(action.target)  # an older launcher: the plain delete
        else:
            return f"deleted ({int(body.get('deleted', 0)) if isinstance(body, dict) else 0} trace(s))"
    body = client.request("DELETE", client.session_path(action.subject))
    return f"deleted ({int(body.get('deleted', 0)) if isinstance(body, dict) else 0} trace(s))"


def _session_delete(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    """One session delete through the gateway's REST API (a SQLite file goes through _session_deletes_sqlite)."""
    settled = _recheck(ctx, action, _session_state_http(ctx, action))
    if settled is not None:
        return settled
    if not ctx.options.write:
        return Settled("would-write", "DELETE session")

    def send() -> Settled | str:
        with ctx.delete_turn(action.target):
            # after the pacer's wait: the check and the delete are as close together as the API allows
            state = _session_state_http(ctx, action)
            settled = _recheck(ctx, action, state)
            if settled is not None:
                return _after_send(settled, result.sends)
            return _delete_http(ctx, action, state)

    def reread() -> Settled | None:
        return None if _session_state_http(ctx, action).trace_ids else Settled("done", "the session is gone")

    def read_back(err: Exception) -> Settled:
        return reread() or Settled("unconfirmed", f"{err}; the session is still there")

    return _write(ctx, begin=_single(ctx, action, result, "DELETE session"), send=send, reread=reread,
                  read_back=read_back, refuse=_refusal(action))


def _session_delete_batch(ctx: _Context, actions: list[Action]) -> list[ActionResult]:
    """Session deletes through ``POST /sessions/batch_delete``, under the same write protocol as one delete.

    The batch is one write: each session is re-read and re-checked inside the pacer's turn, right before
    the batch is sent, and those no longer orphans settle alone; after a 5xx the protocol waits, re-reads
    (sessions gone by then were deleted) and sends the rest again; after no answer each session is read
    back and nothing is sent again.
    """
    results = {a.id: ActionResult(a.id, a.kind, a.target, a.subject, outcome="unconfirmed") for a in actions}

    def settle(action: Action, settled: Settled, *, sent: bool = False) -> None:
        """``sent``: the read came after this round's send (a session gone now was deleted by it)."""
        settled = _after_send(settled, results[action.id].sends + (1 if sent else 0))
        results[action.id].outcome, results[action.id].detail = settled.outcome, settled.detail

    def still_orphans(batch: list[Action], *, sent: bool, err: Exception | None = None) -> list[Action]:
        remaining = []
        for action in batch:
            try:
                settled = _recheck(ctx, action, _session_state_http(ctx, action))
            except GatewayscopeError as read_err:
                settled = Settled("unconfirmed", f"{err or 'read'}; read-back failed: {read_err}")
            if settled is None:
                remaining.append(action)
            else:
                settle(action, settled, sent=sent)
        return remaining

    live = still_orphans(actions, sent=False)
    if not ctx.options.write:
        for action in live:
            settle(action, Settled("would-write", "DELETE session (batch)"))
        return [results[a.id] for a in actions]
    if not live:
        return [results[a.id] for a in actions]
    client = ctx.rllm(actions[0].target)
    nothing_left = Settled("done", "")  # every session settled on its own; nothing to send

    def begin() -> None:
        for action in live:
            results[action.id].sends += 1
            ctx.pace(action)
        ctx.journal_attempts([(a, results[a.id].sends, "POST /sessions/batch_delete") for a in live])

    def send() -> Settled | str:
        nonlocal live
        with ctx.delete_turn(actions[0].target):
            live = still_orphans(live, sent=False)
            if not live:
                return nothing_left
            body = client.request("POST", "/sessions/batch_delete",
                                  json_body={"session_ids": [a.subject for a in live]})
        deleted = body.get("deleted") if isinstance(body, dict) else None
        return f"deleted in a batch of {len(live)} ({deleted} trace(s) in all)"

    def reread() -> Settled | None:
        nonlocal live
        live = still_orphans(live, sent=True)
        return None if live else nothing_left

    def read_back(err: Exception) -> Settled:
        nonlocal live
        live = still_orphans(live, sent=True, err=err)
        return Settled("unconfirmed", f"{err}; the session is still there")

    def refuse(err: HTTPStatusError) -> Settled:
        return Settled("refused", f"{err.message} ({err.status})")

    settled = _write(ctx, begin=begin, send=send, reread=reread, read_back=read_back, refuse=refuse)
    for action in live:
        results[action.id].outcome, results[action.id].detail = settled.outcome, settled.detail
    return [results[a.id] for a in actions]


def _session_deletes_sqlite(ctx: _Context, actions: list[Action], *, on_settled: Callable[[ActionResult], None],
                            stop_reason: Callable[[], str | None]) -> list[ActionResult]:
    """The session deletes of one SQLite store, in short exclusive transactions.

    Each session is re-read and re-checked inside the transaction that deletes it (see
    :mod:`gatewayscope.remediate.sqlite_delete` for how the lock is taken without costing the gateway a
    write). ``on_settled`` gets each result as it settles (journal, progress); when the lock stays out of
    reach, the rest end ``unconfirmed`` and nothing more is tried on this store.
    """
    target = ctx.target(actions[0].target)
    assert target.path
    results: list[ActionResult] = []
    sends: dict[str, int] = {}

    def settle(action: Action, settled: Settled) -> None:
        result = ActionResult(action.id, action.kind, action.target, action.subject, settled.outcome,
                              settled.detail, sends.get(action.id, 0))
        results.append(result)
        on_settled(result)

    def decide(action: Action, state: SessionState) -> Settled | None:
        return _recheck(ctx, action, state)

    try:
        deleter = SessionDeleter(target.path, busy_timeout=target.timeout_seconds, readonly=not ctx.options.write)
        deleter.__enter__()
    except StoreError as err:
        for action in actions:
            settle(action, Settled("unconfirmed", f"nothing sent: {err}"))
        return results
    try:
        if not ctx.options.write:
            for action in actions:
                try:
                    settled = decide(action, deleter.read_state(action.subject))
                except sqlite3.Error as err:
                    settled = Settled("unconfirmed", f"nothing sent: {target.path}: {err}")
                settle(action, settled or Settled("would-write", "DELETE session"))
            return results
        pending = list(actions)
        while pending:  # bounded: each pass settles at least one action
            reason = stop_reason()
            if reason:
                for action in pending:
                    settle(action, Settled("skipped", reason))
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
                    settle(action, Settled("unconfirmed", (
                        f"nothing sent: the gateway kept {target.path} locked for {target.timeout_seconds:g} s; "
                        "deletes on it stopped so that its writes go first (apply again later; the journal "
                        "resumes)")))
                break
            except StoreError as err:
                for action in pending:
                    settle(action, Settled("unconfirmed", str(err)))
                break
            for decision in decisions:
                if decision.deleted is not None:
                    settle(decision.item, Settled("done", f"deleted ({decision.deleted} trace(s))"))
                else:
                    settle(decision.item, _after_send(decision.verdict, sends[decision.item.id]))  # type: ignore[arg-type]
            pending = pending[len(decisions):]
            ctx.options.sleep(deleter.pause)  # the gateway's waiting writer goes next
    finally:
        deleter.__exit__(None, None, None)
    return results


_EXECUTORS: dict[str, Callable[[_Context, Action, ActionResult], Settled]] = {
    "pool_shrink": _shrink,
    "record_delete": _record_delete,
    "posture_fix": _posture,
    "tombstone_backfill": _backfill,
    "session_delete": _session_delete,
}


def _run_action(ctx: _Context, action: Action) -> ActionResult:
    result = ActionResult(action.id, action.kind, action.target, action.subject, outcome="unconfirmed")
    try:
        settled = _EXECUTORS[action.kind](ctx, action, result)
        result.outcome, result.detail = settled.outcome, settled.detail
    except PlanError:
        raise
    except GatewayscopeError as err:
        # a read failed: before any send nothing of ours is under way; after one, nothing is sent again
        result.outcome = "unconfirmed"
        result.detail = f"{'after sending: ' if result.sends else 'nothing sent: '}{err}"
    ctx.journal_outcome(action, result)
    return result


# -- the driver ------------------------------------------------------------------------------------------------

def _validate(plan: Plan, config: Config, options: ApplyOptions, journal: Journal | None) -> None:
    """Step 1: the plan can be applied as asked with this config (PlanError otherwise; nothing is read)."""
    if options.write and journal is None:
        raise PlanError("A real apply needs a journal (every attempt and outcome is recorded).")
    if options.concurrency < 1:
        raise PlanError("--concurrency must be at least 1.")
    subjects = [(a.target, a.subject) for a in plan.actions]
    if len(set(subjects)) != len(subjects):
        raise PlanError("The plan has two actions on one subject; it is not a plan gatewayscope made.")
    unknown = {a.kind for a in plan.actions} - set(ACTION_KINDS)
    if unknown:
        raise PlanError(f"The plan has action kinds this gatewayscope does not know: {', '.join(sorted(unknown))}.")
    named = {t.name for t in config.targets}
    for action in plan.actions:
        if action.target not in named:
            raise PlanError(f"The plan acts on target {action.target!r}, which the config does not name; apply it "
                            "with the config it was planned with (--config).")


def _resume(plan: Plan, journal: Journal | None, report: ApplyReport) -> list[Action]:
    """Step 2: the actions an earlier run of this plan settled go to ``report.previous``; the rest are returned."""
    settled = journal.outcomes(plan.id) if journal is not None else {}
    pending: list[Action] = []
    for action in plan.actions:
        record = settled.get(action.id)
        if record is None:
            pending.append(action)
            continue
        report.previous.append(ActionResult(action.id, action.kind, action.target, action.subject,
                                            outcome=str(record["outcome"]), detail=str(record.get("detail", "")),
                                            sends=int(record.get("sends", 0))))
    return pending


class _ErrorBudget:
    """Counts refused and unconfirmed actions; at ``max_errors`` no new action starts."""

    def __init__(self, max_errors: int | None, on_result: Callable[[ActionResult], None] | None) -> None:
        self.max_errors = max_errors
        self.on_result = on_result
        self.errors = 0
        self.stopped: str | None = None
        self._lock = threading.Lock()

    def count(self, result: ActionResult) -> ActionResult:
        with self._lock:
            if result.outcome in ("refused", "unconfirmed"):
                self.errors += 1
                if self.max_errors is not None and self.errors >= self.max_errors and self.stopped is None:
                    self.stopped = f"stopped after {self.errors} error(s) (--max-errors {self.max_errors})"
        if self.on_result:
            self.on_result(result)
        return result


class _Gate:
    """Why an action is not run now: the error budget ran out, its store's tombstones were not recorded
    first (tombstone first, then delete), or it is a delete without ``allow_delete``."""

    def __init__(self, options: ApplyOptions, budget: _ErrorBudget, previous: list[ActionResult]) -> None:
        self.options = options
        self.budget = budget
        self.unguarded = {r.target for r in previous
                          if r.kind == "tombstone_backfill" and r.outcome not in SUCCESS_OUTCOMES}

    def stop_reason(self) -> str | None:
        if self.budget.stopped:
            return self.budget.stopped
        return self.options.stop() if self.options.stop is not None else None

    def blocked(self, action: Action) -> ActionResult | None:
        def skipped(reason: str) -> ActionResult:
            return ActionResult(action.id, action.kind, action.target, action.subject, "skipped", reason)

        reason = self.stop_reason()
        if reason:
            return skipped(reason)
        if action.kind == "session_delete" and action.target in self.unguarded:
            return skipped("its target's tombstones were not recorded first; not deleted")
        if action.destructive and self.options.write and not self.options.allow_delete:
            return skipped("a delete: needs --allow-delete")
        return None

    def after_phase(self, kind: str, results: list[ActionResult]) -> None:
        if kind == "tombstone_backfill":
            self.unguarded.update(r.target for r in results
                                  if r.outcome not in SUCCESS_OUTCOMES and r.outcome != "would-write")


def _work_items(ctx: _Context, phase: list[Action]) -> list[Action | list[Action]]:
    """One item per action, except session deletes on a SQLite store (all of one store's in one item: they
    run one transaction at a time) and on an unguarded gateway with batch delete (chunks of DELETE_BATCH)."""
    items: list[Action | list[Action]] = []
    stores: dict[str, list[Action]] = {}
    batched: dict[str, list[Action]] = {}
    for action in phase:
        if action.kind == "session_delete" and not ctx.target(action.target).is_remote:
            stores.setdefault(action.target, []).append(action)
        elif (action.kind == "session_delete" and ctx.capability(action.target, "batch_delete")
              # a guarded launcher's compare-and-delete (one session per request) beats a batch: nothing can land
              # between its check and its delete, so a session that turns live is never deleted
              and not ctx.capability(action.target, "guard")):
            batched.setdefault(action.target, []).append(action)
        else:
            items.append(action)
    items += list(stores.values())
    for group in batched.values():
        items += [group[i:i + DELETE_BATCH] for i in range(0, len(group), DELETE_BATCH)]
    return items


def _run_item(ctx: _Context, gate: _Gate, item: Action | list[Action]) -> list[ActionResult]:
    budget = gate.budget
    if isinstance(item, Action):
        slot = ctx.shrink_slots.get(item.target) if item.kind == "pool_shrink" else None
        with slot if slot is not None else nullcontext():
            return [budget.count(gate.blocked(item) or _run_action(ctx, item))]
    skipped = {a.id: gate.blocked(a) for a in item}
    runnable = [a for a in item if skipped[a.id] is None]
    by_id = {a.id: a for a in runnable}
    if runnable and not ctx.target(runnable[0].target).is_remote:
        def on_settled(result: ActionResult) -> None:
            ctx.journal_outcome(by_id[result.action_id], result)
            budget.count(result)

        ran = {r.action_id: r for r in _session_deletes_sqlite(ctx, runnable, on_settled=on_settled,
                                                                stop_reason=gate.stop_reason)}
    else:
        ran = {r.action_id: r for r in (_session_delete_batch(ctx, runnable) if runnable else [])}
        for action in runnable:
            ctx.journal_outcome(action, ran[action.id])
            budget.count(ran[action.id])
    return [budget.count(blocked) if (blocked := skipped[a.id]) else ran[a.id] for a in item]


def _shrink_limits(ctx: _Context, phase: list[Action], report: ApplyReport) -> None:
    """The memory-headroom rule of the pool resizes: per Bifrost target, at most as many at once as the gateway's
    memory has room for while each resize briefly runs the record's old and new pools together
    (:func:`gatewayscope.analysis.memory.shrink_concurrency`), from its runtime metrics read now; one at a time
    when they cannot be read or trusted. Each limit is journaled and kept in ``report.shrink_concurrency``."""
    from gatewayscope.analysis.memory import measured_figures, shrink_concurrency
    from gatewayscope.sources.bifrost.metrics import read_runtime_metrics

    for name in sorted({a.target for a in phase}):
        target = ctx.target(name)
        actions = [a for a in phase if a.target == name]
        if len(actions) == 1 or ctx.options.concurrency == 1:  # one at a time anyway: nothing to measure
            ctx.shrink_slots[name] = threading.Semaphore(1)
            report.shrink_concurrency[name] = {"concurrency": 1, "reason": "one record at a time: "
                                               + ("one resize" if len(actions) == 1 else "--concurrency 1")}
            continue
        measured = None
        try:
            auth = target.auth.resolve() if target.auth is not None else None
            runtime, _ = read_runtime_metrics(target, transport=ctx.transports.get(name), auth=auth)
            if runtime is not None:  # the records say which workers the gateway parks now
                listing = ctx.bifrost(name).list_providers()
                workers = sum(_concurrency(r) for r in listing if r.get("provider_status") != "error")
                measured = measured_figures(runtime, workers)
        except GatewayscopeError:
            measured = None
        limit = shrink_concurrency([int(a.after["concurrency"]) for a in actions], requested=ctx.options.concurrency,
                                   memory_limit_bytes=target.memory_limit_bytes, measured=measured)
        ctx.shrink_slots[name] = threading.Semaphore(limit.concurrency)
        report.shrink_concurrency[name] = {"concurrency": limit.concurrency, "reason": limit.reason}
        if ctx.journal is not None:
            ctx.journal.append("shrink-concurrency", plan_id=ctx.plan.id, target=name,
                               concurrency=limit.concurrency, reason=limit.reason)


def _run_phases(ctx: _Context, pending: list[Action], gate: _Gate, report: ApplyReport) -> None:
    """Step 3: the phases in plan order (tombstones land before any delete starts), each with bounded
    concurrency."""
    for kind in ACTION_KINDS:
        phase = [a for a in pending if a.kind == kind]
        if not phase:
            continue
        if kind == "pool_shrink" and ctx.options.write:
            _shrink_limits(ctx, phase, report)
        with ThreadPoolExecutor(max_workers=ctx.options.concurrency, thread_name_prefix="gatewayscope-apply") as pool:
            results = [r for part in pool.map(lambda item: _run_item(ctx, gate, item), _work_items(ctx, phase))
                       for r in part]
        report.results.extend(results)
        gate.after_phase(kind, results)


def apply_plan(
    plan: Plan,
    config: Config,
    *,
    options: ApplyOptions | None = None,
    journal: Journal | None = None,
    transports: dict[str, Any] | None = None,
    on_result: Callable[[ActionResult], None] | None = None,
    deleted_ids: Mapping[str, Any] | None = None,
) -> ApplyReport:
    """Apply ``plan`` (a dry run unless ``options.write``). ``on_result`` is called after each action (progress).

    ``deleted_ids``: the sessions the caller knows were deleted before, each with the moment of that delete
    (``{id: epoch seconds}`` or ``{target: {id: epoch seconds}}``, as
    :func:`~gatewayscope.remediate.journal.deleted_sessions` reads them from apply journals). With the plan's
    own record of it when the plan is trusted (made in this process, or signed and checked), they are the only
    "deleted before" evidence apply accepts, and they prove an orphan only for traces dispatched before that
    delete.
    """
    options = options or ApplyOptions()
    _validate(plan, config, options, journal)
    # the lock comes before the journal is read: two applies must not both find an action unsettled
    with apply_lock(journal, plan.id) if journal is not None and options.write else nullcontext():
        report = ApplyReport(plan_id=plan.id, dry_run=not options.write)
        pending = _resume(plan, journal, report)
        if plan.actions and not pending:
            report.already_applied = True
            return report
        ctx = _Context(plan, config, options, journal, transports or {}, deleted_ids)
        budget = _ErrorBudget(options.max_errors, on_result)
        if journal is not None and options.write:
            journal.append("apply-start", plan_id=plan.id, actions=len(pending), resumed=len(report.previous),
                           allow_delete=options.allow_delete)
        try:
            with ctx.stack:
                _run_phases(ctx, pending, _Gate(options, budget, report.previous), report)
        finally:
            report.stopped_early = budget.stopped
            if journal is not None and options.write:
                journal.append("apply-end", plan_id=plan.id, tally=report.tally(),
                               skipped=len(report.skipped), stopped_early=report.stopped_early)
        order = {a.id: i for i, a in enumerate(plan.actions)}
        report.results.sort(key=lambda r: order[r.action_id])
        return report
