"""The heal loop: read, find, plan, apply, journal, on a timer, inside every safeguard (docs/heal.md).

One pass, top to bottom (:meth:`HealLoop.run_pass`):

1. **Resume** an enforced plan an earlier pass (or an earlier process) left unfinished: apply's journal settles
   what it did, and each open action is re-read before anything is sent, so nothing is written twice.
2. **Read** every target (the exporter's read when heal runs inside it), with the ids heal's own journal and the
   ``deleted_from`` journals record as deleted, so a session deleted before that came back is a confirmed orphan.
3. **Plan** with :func:`~gatewayscope.remediate.plan.build_plan`, only the kinds the ``[heal]`` table enables; a
   target that is down or answered garbage is not planned (build_plan skips it), one whose health check fails
   loses its actions.
4. **Cap** the plan (per pass, per target, rolling per hour); the rest waits for a later pass's fresh read.
5. **Block**: paused, the breaker open, outside every window, a named alert firing: the pass writes nothing and
   records what it would have done, as in dry-run.
6. **Apply** the enforced kinds with :func:`~gatewayscope.remediate.apply.apply_plan` (re-read at the write,
   compare-and-delete, pacing, journal); the kill switch, the windows and the blockers are asked again before
   each action, the error budget's remainder is apply's ``max_errors``. The dry-run kinds go through a dry
   apply (reads only) and each would-do is a journal row.
7. **Count**: metrics, and the breaker opens when the error budget is spent.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatewayscope.config import Config
from gatewayscope.errors import GatewayscopeError
from gatewayscope.heal.safeguards import (
    BreakerState,
    HealLock,
    breaker_state,
    firing_blockers,
    pause_reason,
    select_under_caps,
    target_health,
    writes_in_last_hour,
)
from gatewayscope.heal.settings import HealSettings
from gatewayscope.remediate.apply import ActionResult, ApplyOptions, apply_plan
from gatewayscope.remediate.journal import Journal, deleted_sessions
from gatewayscope.remediate.plan import Action, Plan, build_plan
from gatewayscope.snapshot import Snapshot

log = logging.getLogger(__name__)

#: why a pass wrote nothing it would otherwise have written (the ``reason`` label of the blocked metrics)
BLOCK_REASONS = ("paused", "breaker", "window", "alert", "gateway-health")
#: how a pass ended (the ``result`` label of gatewayscope_heal_passes_total)
PASS_RESULTS = ("ok", "blocked", "error")
#: how often, at most, a pass asks Prometheus again while it applies (the pause file is checked every action)
ALERT_RECHECK_SECONDS = 5.0
#: saved enforced plans kept in the state folder (the journal keeps every row for good)
KEPT_PLANS = 50

#: ``read(config, deleted_ids)`` -> a Snapshot with every target of ``config``
Reader = Callable[[Config, Mapping[str, Mapping[str, float]]], Snapshot]


@dataclass
class PassReport:
    """What one pass did."""

    started_at: float
    finished_at: float = 0.0
    result: str = "ok"
    #: reason -> sentence, for each reason that held writes this pass
    blocked: dict[str, str] = field(default_factory=dict)
    plan_id: str | None = None
    enforced: list[ActionResult] = field(default_factory=list)
    would: list[ActionResult] = field(default_factory=list)
    deferred: list[Action] = field(default_factory=list)
    resumed: list[ActionResult] = field(default_factory=list)
    skipped_targets: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    stopped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        def rows(results: list[ActionResult]) -> list[dict[str, Any]]:
            return [{"kind": r.kind, "target": r.target, "subject": r.subject, "outcome": r.outcome,
                     "detail": r.detail} for r in results]

        return {"started_at": self.started_at, "finished_at": self.finished_at, "result": self.result,
                "blocked": dict(self.blocked), "plan_id": self.plan_id, "enforced": rows(self.enforced),
                "would": rows(self.would), "resumed": rows(self.resumed),
                "deferred": [{"kind": a.kind, "target": a.target, "subject": a.subject} for a in self.deferred],
                "skipped_targets": dict(self.skipped_targets), "error": self.error, "stopped": self.stopped}


@dataclass
class HealCounters:
    """What the metrics show: counters since the process started, and the last pass's state."""

    actions: dict[tuple[str, str, str], int] = field(default_factory=dict)
    passes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PASS_RESULTS, 0))
    blocked_passes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BLOCK_REASONS, 0))
    blocked: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BLOCK_REASONS, 0))
    would: dict[tuple[str, str], int] = field(default_factory=dict)
    deferred: dict[tuple[str, str], int] = field(default_factory=dict)
    last_pass_at: float | None = None
    last_pass_duration: float | None = None
    breaker: BreakerState | None = None
    paused: bool = False


def heal_config(config: Config, settings: HealSettings) -> Config:
    """``config`` with the idle threshold suspected deletes are found and re-checked with."""
    if settings.suspected_idle_seconds is None:
        return config
    policy = dataclasses.replace(config.policy, orphan_idle_seconds=settings.suspected_idle_seconds,
                                 warnings=list(config.policy.warnings))
    return dataclasses.replace(config, policy=policy)


def subplan(plan: Plan, actions: list[Action]) -> Plan:
    """The plan of ``actions`` only (its own id): what one apply of a pass runs."""
    part = Plan(created_at=plan.created_at, targets=plan.targets, actions=list(actions), policy=dict(plan.policy),
                warnings=list(plan.warnings), trusted=plan.trusted)
    part.id = part.compute_id()
    return part


class HealLoop:
    """The reconcile loop over ``config``'s targets under ``settings`` (see the module docstring).

    ``read`` replaces the read (the exporter's, in ``gatewayscope export --heal``); ``transports`` maps target
    names to httpx transports (and ``"prometheus"`` to Prometheus's), as everywhere. ``clock``, ``sleep`` and
    ``rng`` are the seams tests use.
    """

    def __init__(self, config: Config, settings: HealSettings, *, read: Reader | None = None,
                 transports: dict[str, Any] | None = None, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
                 share_reads: bool = False) -> None:
        #: whether an exporter in the same process may serve heal's reads (``export --heal``): only when heal
        #: judges suspected orphans with the exporter's own idle threshold (the read fetches the candidates by it)
        self.shares_reads = share_reads and settings.suspected_idle_seconds in (None, config.policy.orphan_idle_seconds)
        self.config = heal_config(config, settings)
        self.settings = settings
        self.transports = dict(transports or {})
        self.read = read or self._read
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.journal = Journal(settings.journal)
        self.lock = HealLock(settings.journal)
        self.counters = HealCounters()
        self.last_pass: PassReport | None = None
        self._lock = threading.Lock()
        self._alerts_checked: tuple[float, str | None] | None = None
        self._deleted: dict[str, dict[str, float]] | None = None

    # -- the state folder ------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the state folder (and the journal's)."""
        for folder in (Path(self.settings.state_dir), self.settings.journal.parent,
                       self.settings.pause_file.parent):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise GatewayscopeError(f"Cannot create heal's folder {folder}: {err.strerror or err}.") from None

    @property
    def plans_dir(self) -> Path:
        return Path(self.settings.state_dir) / "plans"

    # -- the operator ----------------------------------------------------------------------------------------

    def pause(self, who: str = "operator") -> None:
        """The kill switch: create the pause file (every heal on this state folder stops writing within one
        action) and journal it."""
        path = self.settings.pause_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"paused by {who} at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n")
        self.journal.append("heal-pause", who=who)
        with self._lock:
            self.counters.paused = True

    def resume(self, who: str = "operator") -> None:
        """Remove the pause file and journal it."""
        self.settings.pause_file.unlink(missing_ok=True)
        self.journal.append("heal-resume", who=who)
        with self._lock:
            self.counters.paused = False

    def reset_breaker(self, who: str = "operator") -> None:
        """Close the breaker: the error budget counts again from now."""
        self.journal.append("heal-breaker-reset", who=who)

    # -- reads -----------------------------------------------------------------------------------------------

    def _read(self, config: Config, deleted: Mapping[str, Mapping[str, float]]) -> Snapshot:
        from gatewayscope.scan import take_snapshot

        return take_snapshot(config, transports=self.transports, also_sessions=deleted)

    def deleted_ids(self) -> dict[str, dict[str, float]]:
        """Per target, the sessions heal's journal and the ``deleted_from`` journals record as deleted, each with
        the moment of that delete (the fence: a trace dispatched after it is a new use)."""
        deleted = deleted_sessions(self.journal, *(Journal(path) for path in self.settings.deleted_from))
        with self._lock:
            self._deleted = deleted
        return deleted

    def known_deleted(self, target: str) -> list[str]:
        """The ids of :meth:`deleted_ids` on ``target`` as of the last pass (a shared read includes them)."""
        with self._lock:
            known = self._deleted
        if known is None:
            known = self.deleted_ids()
        return sorted(known.get(target, {}))

    # -- the blockers ----------------------------------------------------------------------------------------

    def _alerts(self, *, fresh: bool) -> str | None:
        now = time.monotonic()
        cached = self._alerts_checked
        if not fresh and cached is not None and now - cached[0] < ALERT_RECHECK_SECONDS:
            return cached[1]
        reason = firing_blockers(self.settings.blockers, transport=self.transports.get("prometheus"))
        self._alerts_checked = (now, reason)
        return reason

    def blocks(self, events: list[dict[str, Any]], now: float) -> dict[str, str]:
        """reason -> sentence for each reason that holds writes now."""
        found: dict[str, str] = {}
        paused = pause_reason(self.settings.pause_file)
        if paused:
            found["paused"] = paused
        breaker = breaker_state(events, self.settings.breaker, now)
        if breaker.open:
            found["breaker"] = (f"the breaker is open ({breaker.reason}); reset it with 'gatewayscope heal reset' "
                                "once the cause is fixed")
        if not self.settings.windows.open_at(now):
            found["window"] = f"outside every allowed window ({self.settings.windows.timezone})"
        alert = self._alerts(fresh=True)
        if alert:
            found["alert"] = alert
        return found

    def _stop_check(self) -> str | None:
        """Asked by apply before each action: the kill switch, the windows and the alerts, now."""
        paused = pause_reason(self.settings.pause_file)
        if paused:
            return paused
        if not self.settings.windows.open_at(self.clock()):
            return "the allowed window closed"
        return self._alerts(fresh=False)

    # -- one pass --------------------------------------------------------------------------------------------

    def run_pass(self) -> PassReport:
        """One pass (see the module docstring). Never raises for a target's failure; a journal that cannot be
        written ends the pass with result ``error``."""
        report = PassReport(started_at=self.clock())
        clock = time.perf_counter()
        try:
            self._pass(report)
        except GatewayscopeError as err:
            report.result, report.error = "error", str(err)
            log.warning("heal pass failed: %s", err)
        report.finished_at = self.clock()
        self._count(report, time.perf_counter() - clock)
        try:
            self.journal.append("heal-pass-end", plan_id=report.plan_id, result=report.result,
                                blocked=sorted(report.blocked), enforced=len(report.enforced),
                                would=len(report.would), deferred=len(report.deferred), error=report.error,
                                stopped=report.stopped)
        except GatewayscopeError as err:
            log.warning("heal could not journal its pass: %s", err)
        self.last_pass = report
        return report

    def _pass(self, report: PassReport) -> None:
        settings = self.settings
        events = self.journal.read()
        now = report.started_at
        report.blocked = self.blocks(events, now)
        self.journal.append("heal-pass-start", blocked=report.blocked, mode=settings.mode,
                            enforced_kinds=list(settings.enforced_kinds()))
        if not report.blocked:
            self._resume(events, report)

        deleted = self.deleted_ids()
        from gatewayscope.analysis.findings import findings

        snapshot = self.read(self.config, deleted)
        try:
            found = findings(snapshot, self.config, deleted_ids=deleted)
        except GatewayscopeError:
            if self.read == self._read:
                raise
            # a shared read made before this pass's journals named a newly deleted id: read it here instead
            snapshot = self._read(self.config, deleted)
            found = findings(snapshot, self.config, deleted_ids=deleted)
        for snap in snapshot.targets:
            if not snap.up:
                report.skipped_targets[snap.name] = f"not read: {snap.error}"
        plan = build_plan(found, only=settings.planned_kinds(), include_suspected=settings.delete_suspected,
                          include_deletes=settings.kind_mode("record_delete") != "off",
                          created_at=now)
        actions = list(plan.actions)
        if settings.blockers.gateway_health and actions:
            for name in sorted({a.target for a in actions}):
                problem = target_health(self.config.target(name), timeout=settings.blockers.timeout_seconds,
                                        transport=self.transports.get(name))
                if problem:
                    report.skipped_targets[name] = problem
                    report.blocked.setdefault("gateway-health", problem)
                    actions = [a for a in actions if a.target != name]
        hour_left = settings.limits.max_actions_per_hour - writes_in_last_hour(events, now)
        kept, report.deferred = select_under_caps(actions, settings.limits, hour_left=hour_left)
        if report.deferred:
            self.journal.append("heal-deferred", actions=len(report.deferred),
                                by_kind={k: sum(1 for a in report.deferred if a.kind == k)
                                         for k in sorted({a.kind for a in report.deferred})})
        held = {r for r in report.blocked if r != "gateway-health"}
        enforced = set(settings.enforced_kinds()) if not held else set()
        to_write = [a for a in kept if a.kind in enforced]
        to_try = [a for a in kept if a.kind not in enforced]
        breaker = breaker_state(events, settings.breaker, now)
        if to_write:
            self._enforce(subplan(plan, to_write), breaker, deleted, report)
        if to_try:
            self._dry_run(subplan(plan, to_try), deleted, report)
        after = breaker_state(self.journal.read(), settings.breaker, self.clock())
        if not after.open and after.errors >= after.max_errors:
            reason = (f"{after.errors} refused, unconfirmed or stale outcome(s) in "
                      f"{settings.breaker.window_seconds:g} s (max_errors {after.max_errors})")
            self.journal.append("heal-breaker-open", reason=reason)
            report.blocked.setdefault("breaker", f"the breaker opened: {reason}")
        if held:
            report.result = "blocked"

    def _options(self, *, write: bool, max_errors: int | None = None) -> ApplyOptions:
        limits = self.settings.limits
        return ApplyOptions(write=write, allow_delete=write, concurrency=limits.concurrency, rate=limits.rate,
                            delete_duty=limits.delete_share, max_errors=max_errors,
                            stop=self._stop_check if write else None, sleep=self.sleep)

    def _enforce(self, plan: Plan, breaker: BreakerState, deleted: Mapping[str, Any], report: PassReport) -> None:
        self.plans_dir.mkdir(parents=True, exist_ok=True)
        path = self.plans_dir / f"{plan.id}.json"
        plan.save(path)
        self._prune_plans()
        report.plan_id = plan.id
        self.journal.append("heal-apply", plan_id=plan.id, plan_file=str(path), actions=len(plan.actions))
        result = apply_plan(plan, self.config, options=self._options(write=True, max_errors=max(1, breaker.left)),
                            journal=self.journal, transports=self.transports, deleted_ids=deleted)
        report.enforced = list(result.results)
        report.stopped = result.stopped_early or next(
            (r.detail for r in result.results if r.outcome == "skipped" and r.detail), None)
        self.journal.append("heal-applied", plan_id=plan.id, tally=result.tally(), skipped=len(result.skipped),
                            stopped=report.stopped)

    def _dry_run(self, plan: Plan, deleted: Mapping[str, Any], report: PassReport) -> None:
        result = apply_plan(plan, self.config, options=self._options(write=False), transports=self.transports,
                            deleted_ids=deleted)
        report.would = list(result.results)
        if report.would:
            self.journal.append_many([("heal-would", {
                "kind": r.kind, "target": r.target, "subject": r.subject, "outcome": r.outcome,
                "detail": r.detail}) for r in report.would])

    def _resume(self, events: list[dict[str, Any]], report: PassReport) -> None:
        """Finish the enforced plans an earlier pass left without ``heal-applied`` (a crash, a kill)."""
        from gatewayscope.remediate.plan import load_plan

        started: dict[str, str] = {}
        for event in events:
            if event.get("event") == "heal-apply" and isinstance(event.get("plan_file"), str):
                started[str(event.get("plan_id"))] = event["plan_file"]
            elif event.get("event") == "heal-applied":
                started.pop(str(event.get("plan_id")), None)
        for plan_id, plan_file in started.items():
            try:
                plan = load_plan(plan_file, ignore_signature=True)
            except GatewayscopeError as err:
                log.warning("heal cannot resume plan %s: %s", plan_id, err)
                self.journal.append("heal-applied", plan_id=plan_id, tally=None, skipped=0,
                                    stopped=f"not resumed: {err}")
                continue
            breaker = breaker_state(events, self.settings.breaker, self.clock())
            result = apply_plan(plan, self.config, options=self._options(write=True, max_errors=max(1, breaker.left)),
                                journal=self.journal, transports=self.transports, deleted_ids=self.deleted_ids())
            report.resumed += result.results
            self.journal.append("heal-applied", plan_id=plan_id, tally=result.tally(), skipped=len(result.skipped),
                                stopped=result.stopped_early, resumed=True)

    def _prune_plans(self) -> None:
        plans = sorted(self.plans_dir.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in plans[:-KEPT_PLANS]:
            old.unlink(missing_ok=True)

    # -- counting --------------------------------------------------------------------------------------------

    def _count(self, report: PassReport, duration: float) -> None:
        try:
            breaker = breaker_state(self.journal.read(), self.settings.breaker, self.clock())
        except GatewayscopeError:
            breaker = None
        with self._lock:
            counters = self.counters
            counters.passes[report.result] = counters.passes.get(report.result, 0) + 1
            for result in [*report.resumed, *report.enforced]:
                key = (result.target, result.kind, result.outcome)
                counters.actions[key] = counters.actions.get(key, 0) + 1
            counters.would = {}
            for result in report.would:
                if result.outcome == "would-write":
                    key2 = (result.target, result.kind)
                    counters.would[key2] = counters.would.get(key2, 0) + 1
            counters.deferred = {}
            for action in report.deferred:
                key2 = (action.target, action.kind)
                counters.deferred[key2] = counters.deferred.get(key2, 0) + 1
            counters.blocked = {reason: (1 if reason in report.blocked else 0) for reason in BLOCK_REASONS}
            for reason in report.blocked:
                if reason in counters.blocked_passes:
                    counters.blocked_passes[reason] += 1
            counters.last_pass_at = report.finished_at
            counters.last_pass_duration = duration
            counters.breaker = breaker
            counters.paused = "paused" in report.blocked or self.settings.pause_file.exists()

    def snapshot_counters(self) -> HealCounters:
        """A copy of the counters (for a scrape)."""
        with self._lock:
            copy = dataclasses.replace(self.counters, actions=dict(self.counters.actions),
                                       passes=dict(self.counters.passes),
                                       blocked_passes=dict(self.counters.blocked_passes),
                                       blocked=dict(self.counters.blocked), would=dict(self.counters.would),
                                       deferred=dict(self.counters.deferred))
        copy.paused = self.settings.pause_file.exists()
        return copy

    # -- the loop --------------------------------------------------------------------------------------------

    def first_delay(self) -> float:
        """The random delay before the first pass (a deploy burst must not meet a pass)."""
        return self.rng.uniform(0.0, self.settings.first_pass_max_delay_seconds)

    def run(self, stop: threading.Event, *, passes: int | None = None,
            on_pass: Callable[[PassReport], None] | None = None) -> int:
        """Hold the heal lock and run passes every ``interval_seconds`` until ``stop`` is set (or ``passes`` ran).
        Returns the number of passes. Raises HealLockedError when another heal holds the journal."""
        self.prepare()
        count = 0
        with self.lock:
            self.journal.append("heal-start", mode=self.settings.mode,
                                enforced_kinds=list(self.settings.enforced_kinds()))
            if stop.wait(self.first_delay()):
                return 0
            while not stop.is_set():
                report = self.run_pass()
                count += 1
                if on_pass is not None:
                    on_pass(report)
                if passes is not None and count >= passes:
                    break
                if stop.wait(self.settings.interval_seconds):
                    break
            self.journal.append("heal-stop", passes=count)
        return count
