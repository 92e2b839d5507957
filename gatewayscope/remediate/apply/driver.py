"""The driver: validate the plan against the config, take the apply lock and resume from the journal, then run
the phases in plan order under the gate (error budget, delete permission) with bounded concurrency."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

from gatewayscope.config import Config
from gatewayscope.errors import (
    GatewayscopeError,
    PlanError,
)
from gatewayscope.remediate.apply.bifrost import _concurrency, pool_shrink, posture_fix, record_delete
from gatewayscope.remediate.apply.protocol import _Context
from gatewayscope.remediate.apply.results import (
    DELETE_BATCH,
    SUCCESS_OUTCOMES,
    ActionResult,
    ApplyOptions,
    ApplyReport,
    Settled,
)
from gatewayscope.remediate.apply.sessions import (
    session_delete,
    session_delete_batch,
    session_deletes_sqlite,
    tombstone_backfill,
)
from gatewayscope.remediate.journal import Journal, apply_lock
from gatewayscope.remediate.plan import (
    ACTION_KINDS,
    Action,
    Plan,
)

_EXECUTORS: dict[str, Callable[[_Context, Action, ActionResult], Settled]] = {
    "pool_shrink": pool_shrink,
    "record_delete": record_delete,
    "posture_fix": posture_fix,
    "tombstone_backfill": tombstone_backfill,
    "session_delete": session_delete,
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

        ran = {r.action_id: r for r in session_deletes_sqlite(ctx, runnable, on_settled=on_settled,
                                                                stop_reason=gate.stop_reason)}
    else:
        ran = {r.action_id: r for r in (session_delete_batch(ctx, runnable) if runnable else [])}
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
    plan_folder = plan.path.parent if plan.path is not None else None
    with apply_lock(journal, plan.id, plan_folder) if journal is not None and options.write else nullcontext():
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
