"""What ``gatewayscope heal status`` (and the triage notebook) show: the state heal's journal leaves, read only.

The same figures the ``gatewayscope_heal_*`` metrics give a running heal, from the journal alone, so they can be
read with no heal running (and from another machine that mounts the state folder).
"""

from __future__ import annotations

import time
from typing import Any

from gatewayscope.config import Config
from gatewayscope.heal.safeguards import (
    HOUR_SECONDS,
    breaker_state,
    pause_reason,
    running_heal,
    writes_in_last_hour,
)
from gatewayscope.heal.settings import HealSettings, parse_heal_settings
from gatewayscope.remediate.journal import FINAL_OUTCOMES, Journal


def heal_status(settings: HealSettings, *, now: float | None = None) -> dict[str, Any]:
    """The state of the heal that keeps ``settings``'s journal, as a JSON-able document."""
    now = time.time() if now is None else now
    journal = Journal(settings.journal)
    events = journal.read()
    breaker = breaker_state(events, settings.breaker, now)
    last_pass = next((e for e in reversed(events) if e.get("event") == "heal-pass-end"), None)
    day = now - 24 * HOUR_SECONDS
    outcomes: dict[str, dict[str, int]] = {}
    for event in events:
        if event.get("event") == "outcome" and isinstance(event.get("ts"), (int, float)) and event["ts"] >= day:
            kind = str(event.get("kind"))
            per = outcomes.setdefault(kind, dict.fromkeys(FINAL_OUTCOMES, 0))
            outcome = str(event.get("outcome"))
            if outcome in per:
                per[outcome] += 1
    would: dict[str, int] = {}
    if last_pass is not None:
        start = max((i for i, e in enumerate(events) if e.get("event") == "heal-pass-start"), default=0)
        for event in events[start:]:
            if event.get("event") == "heal-would" and event.get("outcome") == "would-write":
                would[str(event.get("kind"))] = would.get(str(event.get("kind")), 0) + 1
    lock = settings.journal.with_name(settings.journal.name + ".heal.lock")
    return {
        "journal": str(settings.journal),
        "mode": settings.mode,
        "kinds": {kind: settings.kind_mode(kind) for kind in settings.kinds},
        "running": running_heal(lock),
        "paused": pause_reason(settings.pause_file),
        "breaker": {"open": breaker.open, "reason": breaker.reason or None, "opened_at": breaker.opened_at,
                    "errors_in_window": breaker.errors, "max_errors": breaker.max_errors},
        "window_open": settings.windows.open_at(now),
        "last_pass": None if last_pass is None else {
            "at": last_pass.get("ts"), "result": last_pass.get("result"), "blocked": last_pass.get("blocked"),
            "enforced": last_pass.get("enforced"), "would": last_pass.get("would"),
            "deferred": last_pass.get("deferred"), "error": last_pass.get("error"),
            "stopped": last_pass.get("stopped")},
        "writes_last_hour": writes_in_last_hour(events, now),
        "max_actions_per_hour": settings.limits.max_actions_per_hour,
        "outcomes_last_24h": outcomes,
        "would_last_pass": would,
    }


def status_lines(status: dict[str, Any]) -> list[str]:
    """``heal status`` as text, one fact a line."""
    last = status["last_pass"]
    breaker = status["breaker"]
    lines = [
        f"journal: {status['journal']}",
        f"running: {status['running'] or 'no heal holds the journal'}",
        f"mode: {status['mode']}; " + ", ".join(f"{k} {m}" for k, m in sorted(status["kinds"].items())),
        f"paused: {status['paused'] or 'no'}",
        f"breaker: {'OPEN (' + str(breaker['reason']) + ')' if breaker['open'] else 'closed'}; "
        f"{breaker['errors_in_window']} of {breaker['max_errors']} errors in its window",
        f"window: {'open' if status['window_open'] else 'closed'}",
        f"writes in the last hour: {status['writes_last_hour']} of {status['max_actions_per_hour']}",
    ]
    if last is None:
        lines.append("last pass: none yet")
    else:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(last["at"] or 0)))
        blocked = ", ".join(last["blocked"] or []) or "nothing"
        lines.append(f"last pass: {at}, {last['result']}; {last['enforced']} enforced, {last['would']} dry-run, "
                     f"{last['deferred']} deferred by the caps; blocked by {blocked}"
                     + (f"; error: {last['error']}" if last["error"] else "")
                     + (f"; stopped: {last['stopped']}" if last["stopped"] else ""))
    for kind, counts in sorted(status["outcomes_last_24h"].items()):
        lines.append(f"{kind} (last 24 h): " + ", ".join(f"{n} {o}" for o, n in counts.items()))
    if status["would_last_pass"]:
        lines.append("dry-run would do: " + ", ".join(f"{n} {k}" for k, n in sorted(status["would_last_pass"].items())))
    return lines


def config_status_lines(config: Config) -> list[str]:
    """``heal status`` of the heal that ``config``'s ``[heal]`` table describes, as its lines (the triage notebook
    shows these); one line saying so when the config has no ``[heal]`` table."""
    if not config.heal:
        return ["No [heal] table in this config: heal is not set up for these targets (see docs/heal.md)."]
    settings = parse_heal_settings(config.heal, config.source or "<config>",
                                   policy_idle_seconds=config.policy.orphan_idle_seconds)
    return status_lines(heal_status(settings))
