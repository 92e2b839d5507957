"""The safeguards of a heal pass, each a small function over the journal, the settings and the clock.

* :class:`HealLock`: one heal per journal; a second refuses to start and names the holder;
* :func:`breaker_state`: the error budget (refused, unconfirmed or stale outcomes in a window) and the
  breaker it opens, held until an operator resets it (a ``heal-breaker-reset`` row);
* :func:`writes_in_last_hour` and :func:`select_under_caps`: the per-pass, per-target and rolling per-hour caps;
* :func:`pause_reason`: the kill switch (a pause file);
* :func:`firing_blockers` and :func:`target_health`: named Prometheus alerts firing, a gateway's own health.

Everything here reads; nothing writes to a gateway.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatewayscope._files import read_text
from gatewayscope._text import terminal_safe
from gatewayscope.config import Target
from gatewayscope.errors import GatewayscopeError, PlanError
from gatewayscope.heal.settings import DELETE_KINDS, Blockers, BreakerSettings, Limits
from gatewayscope.remediate.plan import Action

#: outcomes the error budget counts
ERROR_OUTCOMES = ("refused", "unconfirmed", "stale")
HOUR_SECONDS = 3600.0


class HealLockedError(PlanError):
    """Another heal holds the journal."""

    kind = "locked"


def lock_holder(lock_path: Path) -> str | None:
    """Who holds (or last held) the heal lock, as a phrase, or None when the file names nobody."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        info = json.loads(read_text(lock_path, limit=64 * 1024))  # a pid, a host and a time
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["since"])))
        return f"process {int(info['pid'])} on host {terminal_safe(str(info['host']))} (since {since})"
    return None


def running_heal(lock_path: Path) -> str | None:
    """Who holds the heal lock now, or None when no process holds it (a crashed heal's file may still name it:
    the kernel released its lock, and that is what counts)."""
    try:
        handle = open(lock_path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock_holder(lock_path) or "another process"
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


class HealLock:
    """The only heal of one journal while it is held (``flock``: the kernel drops it when the process dies, so a
    crash never leaves it behind). ``<journal>.heal.lock`` names the holder: pid, host, since."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.path = journal.with_name(journal.name + ".heal.lock")
        self._handle: Any = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the life of the heal
        except OSError as err:
            raise PlanError(f"Cannot create the heal lock {self.path}: {err.strerror or err}.") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            holder = lock_holder(self.path) or "another process"
            raise HealLockedError(
                f"Another heal holds the journal {self.journal}: {holder}. This one "
                "did not start (nothing was read or written). Run one heal per journal (on Kubernetes: one "
                "replica, strategy Recreate).") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is None:
            return
        with contextlib.suppress(OSError):
            self._handle.seek(0)
            self._handle.truncate()
        fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None

    def __enter__(self) -> HealLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the error budget and its breaker ----------------------------------------------------------------------------

@dataclass(frozen=True)
class BreakerState:
    """Whether the breaker holds writes, and the budget it keeps."""

    open: bool
    errors: int
    max_errors: int
    opened_at: float | None = None
    reason: str = ""

    @property
    def left(self) -> int:
        """Errors the budget allows before it opens."""
        return max(0, self.max_errors - self.errors)


def _stamp(event: dict[str, Any]) -> float | None:
    value = event.get("ts")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def breaker_state(events: Sequence[dict[str, Any]], settings: BreakerSettings, now: float) -> BreakerState:
    """The breaker as the journal ``events`` leave it at ``now``.

    Open from a ``heal-breaker-open`` row until a later ``heal-breaker-reset`` row (an operator's). The budget
    counts the outcome rows in :data:`ERROR_OUTCOMES` of the last ``window_seconds``, after the latest reset.

    >>> events = [{"ts": 10.0, "event": "outcome", "outcome": "refused"},
    ...           {"ts": 20.0, "event": "heal-breaker-open", "reason": "r"}]
    >>> breaker_state(events, BreakerSettings(max_errors=1), 30.0).open
    True
    >>> breaker_state(events + [{"ts": 25.0, "event": "heal-breaker-reset"}], BreakerSettings(max_errors=1), 30.0)
    BreakerState(open=False, errors=0, max_errors=1, opened_at=None, reason='')
    """
    reset_at = -1.0
    opened: dict[str, Any] | None = None
    for event in events:
        stamp = _stamp(event)
        if stamp is None:
            continue
        if event.get("event") == "heal-breaker-reset":
            reset_at, opened = max(reset_at, stamp), None
        elif event.get("event") == "heal-breaker-open" and stamp > reset_at:
            opened = event
    since = max(reset_at, now - settings.window_seconds)
    errors = sum(1 for e in events if e.get("event") == "outcome" and e.get("outcome") in ERROR_OUTCOMES
                 and (_stamp(e) or -1.0) > since)
    if opened is not None:
        return BreakerState(True, errors, settings.max_errors, _stamp(opened), str(opened.get("reason", "")))
    return BreakerState(False, errors, settings.max_errors)


# -- caps -----------------------------------------------------------------------------------------------------

def writes_in_last_hour(events: Iterable[dict[str, Any]], now: float) -> int:
    """Actions with a write attempt in the hour before ``now`` (each action once, however many sends)."""
    seen: set[tuple[str, str]] = set()
    for event in events:
        if event.get("event") == "attempt" and (_stamp(event) or -1.0) >= now - HOUR_SECONDS:
            seen.add((str(event.get("plan_id")), str(event.get("action_id"))))
    return len(seen)


def select_under_caps(actions: Sequence[Action], limits: Limits, *,
                      hour_left: int) -> tuple[list[Action], list[Action]]:
    """(kept, deferred): the actions of a pass, in plan order, kept while every cap has room.

    A tombstone backfill counts as one action; it is kept only with a delete of its target kept after it (it
    exists for them). The deferred actions are planned again by a later pass from a fresh read.
    """
    kept: list[Action] = []
    deferred: list[Action] = []
    actions_per_target: dict[str, int] = {}
    deletes_per_target: dict[str, int] = {}
    deletes = 0
    budget = min(limits.max_actions_per_pass, max(0, hour_left))
    for action in actions:
        delete = action.kind in DELETE_KINDS
        room = (len(kept) < budget
                and actions_per_target.get(action.target, 0) < limits.max_actions_per_target
                and (not delete or (deletes < limits.max_deletes_per_pass
                                    and deletes_per_target.get(action.target, 0) < limits.max_deletes_per_target)))
        if not room:
            deferred.append(action)
            continue
        kept.append(action)
        actions_per_target[action.target] = actions_per_target.get(action.target, 0) + 1
        if delete:
            deletes += 1
            deletes_per_target[action.target] = deletes_per_target.get(action.target, 0) + 1
    with_deletes = {a.target for a in kept if a.kind == "session_delete"}
    for action in [a for a in kept if a.kind == "tombstone_backfill" and a.target not in with_deletes]:
        kept.remove(action)
        deferred.append(action)
    return kept, deferred


# -- the operator ---------------------------------------------------------------------------------------------

def pause_reason(pause_file: Path) -> str | None:
    """A sentence while the pause file exists (the kill switch), else None."""
    try:
        if pause_file.exists():
            return f"paused: the pause file {pause_file} exists (remove it, or POST /-/heal/resume, to resume)"
    except OSError as err:  # unreadable: treated as paused, never as "go"
        return f"paused: the pause file {pause_file} cannot be checked ({err.strerror or err})"
    return None


def firing_blockers(blockers: Blockers, *, transport: Any = None) -> str | None:
    """A sentence while a named alert fires, or Prometheus cannot say (no answer holds writes too); else None."""
    if not blockers.alerts or not blockers.prometheus_url:
        return None
    from gatewayscope.sources.prometheus import PrometheusClient

    try:
        with PrometheusClient(blockers.prometheus_url, timeout=blockers.timeout_seconds, transport=transport) as client:
            firing = client.firing_alerts()
    except GatewayscopeError as err:
        return f"blocked: the blocker alerts cannot be read, so writes hold ({err})"
    named = sorted(firing & set(blockers.alerts))
    if named:
        return f"blocked: alert(s) firing: {', '.join(named)}"
    return None


def target_health(target: Target, *, timeout: float, transport: Any = None) -> str | None:
    """A sentence when ``target``'s own health check fails (``GET /health``), else None. A SQLite file has no
    health endpoint: its reads and writes are its check."""
    if not target.is_remote or not target.url:
        return None
    from gatewayscope.sources._http import HttpClient

    try:
        with HttpClient(target.url, timeout=min(timeout, target.timeout_seconds), transport=transport,
                        max_connections=1, max_body_bytes=64 * 1024) as client:
            response = client.send("GET", "/health")
            parsed, body = client.parse_json(response)
    except GatewayscopeError as err:
        return f"{target.name}: its health check failed ({err})"
    if target.kind == "rllm" and not (parsed and isinstance(body, dict) and body.get("status") in ("ok", "healthy")):
        return f"{target.name}: its health check did not say ok"
    return None


@contextlib.contextmanager
def held(lock: HealLock | None) -> Iterator[None]:
    """Hold ``lock`` (when given) for the block."""
    if lock is None:
        yield
        return
    with lock:
        yield
