"""The write protocol every executor sends through, and what the executors share: the targets' clients, the
thresholds, the pacing of writes and deletes, the journal."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any
from urllib.parse import quote

from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import (
    GatewayscopeError,
    GatewayTimeoutError,
    HTTPStatusError,
    PlanError,
    SourceError,
    UnreachableError,
)
from gatewayscope.orphan_rule import delete_fences, latest_fence
from gatewayscope.remediate.apply.results import OUTCOMES, ActionResult, ApplyOptions, Settled
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import (
    DELETE_DUTY,
    Action,
    Plan,
)

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


class _Latest:
    """The latest read of a subject that a write is built from: ``reread`` reads it again (a re-read that
    settles the action returns its verdict; otherwise the next send is built from the new read)."""

    def __init__(self, read: Callable[[], Any]) -> None:
        self.read = read
        self.value: Any = None

    def reread(self) -> Settled | None:
        latest = self.read()
        if isinstance(latest, Settled):
            return latest
        self.value = latest
        return None
