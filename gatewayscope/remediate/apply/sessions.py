"""The rLLM executors: ``tombstone_backfill``, and the session deletes, each re-establishing its orphan rule from
the live store right before it deletes (through the gateway, in batches where it has them, or in the SQLite
file)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from gatewayscope.errors import (
    BadResponseError,
    GatewayscopeError,
    GatewayTimeoutError,
    HTTPStatusError,
    NotFoundError,
    SourceError,
    StoreError,
    UnreachableError,
)
from gatewayscope.orphan_rule import Tombstone, dispatched_at_of, judge
from gatewayscope.remediate.apply.protocol import _Context, _refusal, _single, _write
from gatewayscope.remediate.apply.results import CONDITIONAL_DELETE_PATH, ActionResult, Settled
from gatewayscope.remediate.plan import (
    Action,
)
from gatewayscope.remediate.sqlite_delete import TRANSACTION_SESSIONS, SessionDeleter, SessionState
from gatewayscope.render import human_seconds

# -- rLLM: tombstones ---------------------------------------------------------------------------------------

def tombstone_backfill(ctx: _Context, action: Action, result: ActionResult) -> Settled:
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


def session_delete(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    """One session delete through the gateway's REST API (a SQLite file goes through session_deletes_sqlite)."""
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


def session_delete_batch(ctx: _Context, actions: list[Action]) -> list[ActionResult]:
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


def session_deletes_sqlite(ctx: _Context, actions: list[Action], *, on_settled: Callable[[ActionResult], None],
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
