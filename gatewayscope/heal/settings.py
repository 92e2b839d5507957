"""The ``[heal]`` table of the config file, validated line by line (one line per problem, like the others).

::

    [heal]
    mode = "dry-run"                      # the master switch: "dry-run" (default) or "enforce"
    interval_seconds = 300                # one pass every interval
    first_pass_max_delay_seconds = 120    # the first pass starts after a random delay up to this
    state_dir = "/var/lib/gatewayscope/heal"   # journal, pause file, saved plans (default ~/.local/state/...)
    # journal = "/var/lib/gatewayscope/heal/heal.journal.jsonl"
    # pause_file = "/var/lib/gatewayscope/heal/PAUSE"
    deleted_from = ["/srv/cleanup.journal.jsonl"]   # more journals whose deletes prove an orphan

    [heal.actions]                        # per action kind: "off", "dry-run" (default) or "enforce"
    session_delete = "enforce"            # confirmed orphans (tombstones are recorded first, same mode)
    pool_shrink = "dry-run"
    posture_fix = "dry-run"
    record_delete = "off"                 # default off: it needs to be asked for

    [heal.suspected]                      # deleting unproven orphans: off unless switched on here
    delete = false
    idle_seconds = 7200                   # no lower than 3600 (the trainer's heartbeat budget) ...
    allow_below_heartbeat = false         # ... unless this says so in so many words

    [heal.limits]
    max_actions_per_pass = 200
    max_deletes_per_pass = 100
    max_actions_per_target = 100          # per pass
    max_deletes_per_target = 50           # per pass
    max_actions_per_hour = 1000           # rolling, over every pass in the last hour (from the journal)
    concurrency = 2
    delete_share = 0.05                   # session deletes take at most this share of a gateway's time
    # rate = 5.0                          # writes per second instead of the share

    [heal.breaker]
    max_errors = 10                       # refused, unconfirmed or stale outcomes in the window open it
    window_seconds = 3600

    [heal.windows]                        # no windows: any time
    timezone = "Europe/Berlin"
    allowed = [{ days = ["mon", "tue", "wed", "thu", "fri"], start = "09:00", end = "17:00" }]

    [heal.blockers]
    prometheus_url = "http://prometheus:9090"
    alerts = ["GatewayscopeBifrostBootMemoryOverLimit", "KubeNodeNotReady"]
    gateway_health = true                 # no writes to a target whose own health check fails
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import datetime, time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gatewayscope.errors import ConfigError
from gatewayscope.remediate.kinds import ACTION_KINDS, DESTRUCTIVE_KINDS

MODES = ("dry-run", "enforce")
KIND_MODES = ("off", "dry-run", "enforce")
#: the kinds a ``[heal.actions]`` table sets; ``tombstone_backfill`` follows ``session_delete`` (tombstones are
#: recorded first on a guarded store, so a delete never goes without them)
SETTABLE_KINDS = tuple(kind for kind in ACTION_KINDS if kind != "tombstone_backfill")
#: the trainer's heartbeat budget: a live session's first call may legitimately run this long
HEARTBEAT_SECONDS = 3600.0
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

DEFAULT_INTERVAL_SECONDS = 300.0
DEFAULT_FIRST_PASS_MAX_DELAY_SECONDS = 120.0
DEFAULT_KIND_MODES: dict[str, str] = {kind: ("off" if kind == "record_delete" else "dry-run")
                                      for kind in SETTABLE_KINDS}


def default_state_dir() -> str:
    """Where heal keeps its journal, pause file and plans when the config names no ``state_dir``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return str(Path(base) / "gatewayscope" / "heal")


@dataclass(frozen=True)
class Limits:
    """The caps of every pass (see docs/heal.md, "Bounded")."""

    max_actions_per_pass: int = 200
    max_deletes_per_pass: int = 100
    max_actions_per_target: int = 100
    max_deletes_per_target: int = 50
    max_actions_per_hour: int = 1000
    concurrency: int = 2
    rate: float | None = None
    #: the share of a gateway's time heal's session deletes may take (without ``rate``): each delete is followed
    #: by a pause so that deletes stay within it. Lower than apply's 3/4: a chat call that waits behind a delete
    #: is slower, and at 5% about one call in twenty meets one, so the gateway's p95 barely moves
    delete_share: float = 0.05


@dataclass(frozen=True)
class BreakerSettings:
    max_errors: int = 10
    window_seconds: float = 3600.0


@dataclass(frozen=True)
class Window:
    """Days and a time of day (local to the windows' time zone) when writes may run; ``end`` before ``start``
    spans midnight (the day is the day it starts)."""

    days: tuple[str, ...]
    start: time
    end: time | None  # None: midnight at the end of the day

    def contains(self, local: datetime) -> bool:
        """Whether the local time ``local`` falls in this window.

        >>> w = Window(days=("mon",), start=time(22, 0), end=time(2, 0))
        >>> w.contains(datetime(2026, 11, 30, 23, 0)), w.contains(datetime(2026, 12, 1, 1, 0))
        (True, True)
        >>> w.contains(datetime(2026, 12, 1, 3, 0)), w.contains(datetime(2026, 11, 30, 21, 0))
        (False, False)
        """
        now = local.time()
        day = DAYS[local.weekday()]
        previous = DAYS[(local.weekday() - 1) % 7]
        if self.end is None or self.end > self.start:
            return day in self.days and now >= self.start and (self.end is None or now < self.end)
        # spans midnight: the evening of a listed day, or the morning after one
        return (day in self.days and now >= self.start) or (previous in self.days and now < self.end)


@dataclass(frozen=True)
class Windows:
    timezone: str = "UTC"
    allowed: tuple[Window, ...] = ()

    def open_at(self, epoch: float) -> bool:
        """Whether writes may run at ``epoch`` (always, when no window is configured)."""
        if not self.allowed:
            return True
        local = datetime.fromtimestamp(epoch, ZoneInfo(self.timezone)).replace(tzinfo=None)
        return any(window.contains(local) for window in self.allowed)


@dataclass(frozen=True)
class Blockers:
    prometheus_url: str | None = None
    alerts: tuple[str, ...] = ()
    gateway_health: bool = True
    timeout_seconds: float = 5.0


@dataclass(frozen=True)
class HealSettings:
    """What the ``[heal]`` table says, defaults filled in."""

    mode: str = "dry-run"
    kinds: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_KIND_MODES))
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    first_pass_max_delay_seconds: float = DEFAULT_FIRST_PASS_MAX_DELAY_SECONDS
    state_dir: str = field(default_factory=default_state_dir)
    journal_path: str | None = None
    pause_path: str | None = None
    deleted_from: tuple[str, ...] = ()
    delete_suspected: bool = False
    suspected_idle_seconds: float | None = None
    allow_below_heartbeat: bool = False
    limits: Limits = field(default_factory=Limits)
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    windows: Windows = field(default_factory=Windows)
    blockers: Blockers = field(default_factory=Blockers)

    @property
    def journal(self) -> Path:
        return Path(self.journal_path) if self.journal_path else Path(self.state_dir) / "heal.journal.jsonl"

    @property
    def pause_file(self) -> Path:
        return Path(self.pause_path) if self.pause_path else Path(self.state_dir) / "PAUSE"

    def kind_mode(self, kind: str) -> str:
        """How a pass treats ``kind``: "off" (not planned), "dry-run" or "enforce" (the master ``mode`` first)."""
        own = self.kinds.get("session_delete" if kind == "tombstone_backfill" else kind, "off")
        if own == "off":
            return "off"
        return "enforce" if self.mode == "enforce" and own == "enforce" else "dry-run"

    def planned_kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind in ACTION_KINDS if self.kind_mode(kind) != "off")

    def enforced_kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind in ACTION_KINDS if self.kind_mode(kind) == "enforce")


_TOP = ("mode", "actions", "interval_seconds", "first_pass_max_delay_seconds", "state_dir", "journal", "pause_file",
        "deleted_from", "suspected", "limits", "breaker", "windows", "blockers")
_SUSPECTED = ("delete", "idle_seconds", "allow_below_heartbeat")
_LIMITS = ("max_actions_per_pass", "max_deletes_per_pass", "max_actions_per_target", "max_deletes_per_target",
           "max_actions_per_hour", "concurrency", "rate", "delete_share")
_BREAKER = ("max_errors", "window_seconds")
_WINDOWS = ("timezone", "allowed")
_WINDOW = ("days", "start", "end")
_BLOCKERS = ("prometheus_url", "alerts", "gateway_health", "timeout_seconds")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _clock(value: Any, *, end: bool) -> time | str | None:
    """``"HH:MM"`` as a time (``"24:00"`` as None, the end of the day, for an end); a str is the problem."""
    if isinstance(value, str) and len(value) == 5 and value[2] == ":" and value[:2].isdigit() and value[3:].isdigit():
        hours, minutes = int(value[:2]), int(value[3:])
        if end and (hours, minutes) == (24, 0):
            return None
        if hours < 24 and minutes < 60:
            return time(hours, minutes)
    also = ' (or "24:00")' if end else ""
    return f"expected a time of day \"HH:MM\"{also}, got {value!r}"


def parse_heal_settings(raw: dict[str, Any] | None, origin: str = "<config>",
                        *, policy_idle_seconds: float = 7200.0) -> HealSettings:
    """Validate the raw ``[heal]`` table; ConfigError with one line per problem.

    ``policy_idle_seconds`` is the ``[policy]`` idle threshold, which suspected deletes use unless
    ``[heal.suspected] idle_seconds`` sets their own.

    >>> parse_heal_settings({}).mode, parse_heal_settings({}).enforced_kinds()
    ('dry-run', ())
    >>> try:
    ...     parse_heal_settings({"mode": "on", "suspected": {"delete": True, "idle_seconds": 600}}, "g.toml")
    ... except ConfigError as err:
    ...     print(err)  # doctest: +NORMALIZE_WHITESPACE
    g.toml: heal.mode: expected "dry-run" or "enforce", got 'on'
    g.toml: heal.suspected.idle_seconds: 600 s is below the trainer's heartbeat budget of 3600 s, so a live \
session's first call could be taken for an orphan; raise it, or set allow_below_heartbeat = true to mean it
    """
    raw = raw or {}
    problems: list[str] = []

    def add(key: str, message: str) -> None:
        problems.append(f"{origin}: heal.{key}: {message}")

    def table(key: str, keys: tuple[str, ...]) -> dict[str, Any]:
        value = raw.get(key, {})
        if not isinstance(value, dict):
            add(key, f"expected a table ([heal.{key}])")
            return {}
        for extra in sorted(set(value) - set(keys)):
            add(f"{key}.{extra}", f"unknown key; expected one of {', '.join(keys)}")
        return value

    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: heal: expected a table ([heal])")
    for extra in sorted(set(raw) - set(_TOP)):
        add(extra, f"unknown key; expected one of {', '.join(_TOP)}")
    values: dict[str, Any] = {}

    mode = raw.get("mode", "dry-run")
    if mode not in MODES:
        add("mode", f"expected \"dry-run\" or \"enforce\", got {mode!r}")
    else:
        values["mode"] = mode

    kinds = dict(DEFAULT_KIND_MODES)
    actions = table("actions", SETTABLE_KINDS)
    for kind in SETTABLE_KINDS:
        if kind in actions:
            if actions[kind] not in KIND_MODES:
                add(f"actions.{kind}", f"expected \"off\", \"dry-run\" or \"enforce\", got {actions[kind]!r}")
            else:
                kinds[kind] = actions[kind]
    values["kinds"] = kinds

    for key, strict in (("interval_seconds", True), ("first_pass_max_delay_seconds", False)):
        if key in raw:
            value = raw[key]
            if not _number(value) or value < 0 or (strict and value <= 0):
                add(key, f"expected {'a positive number of seconds' if strict else 'a number of seconds >= 0'}, "
                         f"got {value!r}")
            else:
                values[key] = float(value)

    for key, attribute in (("state_dir", "state_dir"), ("journal", "journal_path"), ("pause_file", "pause_path")):
        if key in raw:
            value = raw[key]
            if not isinstance(value, str) or not value:
                add(key, f"expected a path, got {value!r}")
            else:
                values[attribute] = os.path.expanduser(value)
    if "deleted_from" in raw:
        value = raw["deleted_from"]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            add("deleted_from", f"expected a list of journal paths, got {value!r}")
        else:
            values["deleted_from"] = tuple(os.path.expanduser(v) for v in value)

    suspected = table("suspected", _SUSPECTED)
    for key in ("delete", "allow_below_heartbeat"):
        if key in suspected and not isinstance(suspected[key], bool):
            add(f"suspected.{key}", f"expected true or false, got {suspected[key]!r}")
    delete = suspected.get("delete") is True
    allow = suspected.get("allow_below_heartbeat") is True
    values["delete_suspected"], values["allow_below_heartbeat"] = delete, allow
    idle = policy_idle_seconds
    if "idle_seconds" in suspected:
        value = suspected["idle_seconds"]
        if not _number(value) or value <= 0:
            add("suspected.idle_seconds", f"expected a positive number of seconds, got {value!r}")
        else:
            idle = float(value)
            values["suspected_idle_seconds"] = idle
    if delete and idle < HEARTBEAT_SECONDS and not allow:
        where = "suspected.idle_seconds" if "idle_seconds" in suspected else "suspected.delete"
        how = ("" if "idle_seconds" in suspected
               else " ([policy] orphan_idle_seconds; set [heal.suspected] idle_seconds)")
        add(where, f"{idle:g} s{how} is below the trainer's heartbeat budget of {HEARTBEAT_SECONDS:g} s, so a live "
                   "session's first call could be taken for an orphan; raise it, or set allow_below_heartbeat = "
                   "true to mean it")

    limits_raw = table("limits", _LIMITS)
    limits: dict[str, Any] = {}
    for key in _LIMITS[:-2]:
        if key in limits_raw:
            minimum = 1 if key == "concurrency" else 0
            if not _whole(limits_raw[key], minimum):
                add(f"limits.{key}", f"expected a whole number >= {minimum}, got {limits_raw[key]!r}")
            else:
                limits[key] = limits_raw[key]
    if "rate" in limits_raw:
        if not _number(limits_raw["rate"]) or limits_raw["rate"] <= 0:
            add("limits.rate", f"expected a positive number of writes per second, got {limits_raw['rate']!r}")
        else:
            limits["rate"] = float(limits_raw["rate"])
    if "delete_share" in limits_raw:
        share = limits_raw["delete_share"]
        if not _number(share) or not 0 < share <= 0.75:
            add("limits.delete_share",
                f"expected a share of the gateway's time above 0 and at most 0.75, got {share!r}")
        else:
            limits["delete_share"] = float(share)
    values["limits"] = Limits(**limits)

    breaker_raw = table("breaker", _BREAKER)
    breaker: dict[str, Any] = {}
    if "max_errors" in breaker_raw:
        if not _whole(breaker_raw["max_errors"], 1):
            add("breaker.max_errors", f"expected a whole number >= 1, got {breaker_raw['max_errors']!r}")
        else:
            breaker["max_errors"] = breaker_raw["max_errors"]
    if "window_seconds" in breaker_raw:
        if not _number(breaker_raw["window_seconds"]) or breaker_raw["window_seconds"] <= 0:
            add("breaker.window_seconds",
                f"expected a positive number of seconds, got {breaker_raw['window_seconds']!r}")
        else:
            breaker["window_seconds"] = float(breaker_raw["window_seconds"])
    values["breaker"] = BreakerSettings(**breaker)

    values["windows"] = _parse_windows(table("windows", _WINDOWS), add)
    values["blockers"] = _parse_blockers(table("blockers", _BLOCKERS), add)

    if problems:
        raise ConfigError(problems)
    return HealSettings(**values)


def _parse_windows(raw: dict[str, Any], add: Any) -> Windows:
    timezone = raw.get("timezone", "UTC")
    if not isinstance(timezone, str) or not timezone:
        add("windows.timezone", f"expected an IANA time zone name like \"Europe/Berlin\", got {timezone!r}")
        timezone = "UTC"
    else:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            add("windows.timezone", f"unknown time zone {timezone!r}; expected an IANA name like \"Europe/Berlin\"")
            timezone = "UTC"
    allowed = raw.get("allowed", [])
    windows: list[Window] = []
    if not isinstance(allowed, list):
        add("windows.allowed", "expected a list of { days = [...], start = \"HH:MM\", end = \"HH:MM\" }")
        allowed = []
    for index, entry in enumerate(allowed):
        where = f"windows.allowed[{index}]"
        if not isinstance(entry, dict):
            add(where, "expected { days = [...], start = \"HH:MM\", end = \"HH:MM\" }")
            continue
        for extra in sorted(set(entry) - set(_WINDOW)):
            add(f"{where}.{extra}", f"unknown key; expected one of {', '.join(_WINDOW)}")
        days = entry.get("days", list(DAYS))
        if not isinstance(days, list) or not days or not all(isinstance(d, str) and d.lower() in DAYS for d in days):
            add(f"{where}.days", f"expected a list of {', '.join(DAYS)}, got {days!r}")
            continue
        start = _clock(entry.get("start", "00:00"), end=False)
        end = _clock(entry.get("end", "24:00"), end=True)
        if isinstance(start, str):
            add(f"{where}.start", start)
        if isinstance(end, str):
            add(f"{where}.end", end)
        if isinstance(start, str) or isinstance(end, str) or start is None:
            continue
        if end == start:
            add(f"{where}.end", "equals start: the window would be empty")
            continue
        windows.append(Window(days=tuple(d.lower() for d in days), start=start, end=end))
    return Windows(timezone=timezone, allowed=tuple(windows))


def _parse_blockers(raw: dict[str, Any], add: Any) -> Blockers:
    values: dict[str, Any] = {}
    if "prometheus_url" in raw:
        from gatewayscope.sources.prometheus import check_prometheus_url

        try:
            values["prometheus_url"] = check_prometheus_url(raw["prometheus_url"])
        except ConfigError as err:
            add("blockers.prometheus_url", str(err))
    if "alerts" in raw:
        alerts = raw["alerts"]
        if not isinstance(alerts, list) or not all(isinstance(a, str) and a for a in alerts):
            add("blockers.alerts", f"expected a list of alert names, got {alerts!r}")
        else:
            values["alerts"] = tuple(alerts)
            if alerts and "prometheus_url" not in raw:
                add("blockers.alerts", "needs prometheus_url: the alerts are read from Prometheus's HTTP API")
    if "gateway_health" in raw:
        if not isinstance(raw["gateway_health"], bool):
            add("blockers.gateway_health", f"expected true or false, got {raw['gateway_health']!r}")
        else:
            values["gateway_health"] = raw["gateway_health"]
    if "timeout_seconds" in raw:
        if not _number(raw["timeout_seconds"]) or raw["timeout_seconds"] <= 0:
            add("blockers.timeout_seconds", f"expected a positive number of seconds, got {raw['timeout_seconds']!r}")
        else:
            values["timeout_seconds"] = float(raw["timeout_seconds"])
    return Blockers(**values)


#: the destructive kinds, counted against the delete caps
DELETE_KINDS = DESTRUCTIVE_KINDS
