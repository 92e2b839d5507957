"""The ``[heal]`` table: defaults that write nothing, one line per problem, and the safeguards' pure rules (caps,
breaker, windows, pause) on hand-made inputs."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gatewayscope.config import parse_config
from gatewayscope.errors import ConfigError
from gatewayscope.heal.safeguards import breaker_state, pause_reason, select_under_caps, writes_in_last_hour
from gatewayscope.heal.settings import BreakerSettings, Limits, parse_heal_settings
from gatewayscope.remediate.plan import Action


def problems(raw: dict, **kwargs: float) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_heal_settings(raw, "g.toml", **kwargs)
    return list(info.value.problems)


def test_the_defaults_plan_in_dry_run_and_enforce_nothing() -> None:
    settings = parse_heal_settings({})
    assert settings.mode == "dry-run"
    assert settings.enforced_kinds() == ()
    assert "record_delete" not in settings.planned_kinds()
    assert set(settings.planned_kinds()) == {"tombstone_backfill", "session_delete", "posture_fix", "pool_shrink"}
    assert not settings.delete_suspected
    assert settings.limits == Limits()
    assert settings.first_pass_max_delay_seconds > 0


def test_enforce_is_explicit_per_kind_and_the_mode_is_the_master_switch() -> None:
    kinds = {"session_delete": "enforce", "pool_shrink": "enforce", "posture_fix": "dry-run"}
    dry = parse_heal_settings({"actions": kinds})
    assert dry.enforced_kinds() == ()  # mode is still dry-run: nothing writes
    live = parse_heal_settings({"mode": "enforce", "actions": kinds})
    # tombstones follow the session deletes: a delete never goes without them on a guarded store
    assert live.enforced_kinds() == ("tombstone_backfill", "session_delete", "pool_shrink")
    assert live.kind_mode("posture_fix") == "dry-run"
    assert parse_heal_settings({"mode": "enforce"}).enforced_kinds() == ()


def test_suspected_deletes_need_their_switch_and_the_heartbeat_budget() -> None:
    assert not parse_heal_settings({"suspected": {"idle_seconds": 60}}).delete_suspected  # no switch, no deletes
    lines = problems({"suspected": {"delete": True}}, policy_idle_seconds=1800)
    assert lines == ["g.toml: heal.suspected.delete: 1800 s ([policy] orphan_idle_seconds; set [heal.suspected] "
                     "idle_seconds) is below the trainer's heartbeat budget of 3600 s, so a live session's first "
                     "call could be taken for an orphan; raise it, or set allow_below_heartbeat = true to mean it"]
    assert parse_heal_settings({"suspected": {"delete": True}}).delete_suspected  # the 7200 s default is above
    ok = parse_heal_settings({"suspected": {"delete": True, "idle_seconds": 60, "allow_below_heartbeat": True}})
    assert ok.delete_suspected and ok.suspected_idle_seconds == 60


def test_every_problem_is_one_line() -> None:
    lines = problems({"mode": "on", "speed": 1, "actions": {"session_delete": "yes", "tombstone_backfill": "enforce"},
                      "limits": {"max_deletes_per_pass": -1, "rate": 0}, "breaker": {"max_errors": 0},
                      "windows": {"timezone": "Mars/Olympus", "allowed": [{"days": ["moon"]},
                                                                           {"start": "25:00", "end": "9"}]},
                      "blockers": {"alerts": ["A"], "prometheus_url": "ftp://x"}})
    assert lines == [
        "g.toml: heal.speed: unknown key; expected one of mode, actions, interval_seconds, "
        "first_pass_max_delay_seconds, state_dir, journal, pause_file, deleted_from, suspected, limits, breaker, "
        "windows, blockers",
        "g.toml: heal.mode: expected \"dry-run\" or \"enforce\", got 'on'",
        "g.toml: heal.actions.tombstone_backfill: unknown key; expected one of session_delete, posture_fix, "
        "pool_shrink, record_delete",
        "g.toml: heal.actions.session_delete: expected \"off\", \"dry-run\" or \"enforce\", got 'yes'",
        "g.toml: heal.limits.max_deletes_per_pass: expected a whole number >= 0, got -1",
        "g.toml: heal.limits.rate: expected a positive number of writes per second, got 0",
        "g.toml: heal.breaker.max_errors: expected a whole number >= 1, got 0",
        "g.toml: heal.windows.timezone: unknown time zone 'Mars/Olympus'; expected an IANA name like "
        "\"Europe/Berlin\"",
        "g.toml: heal.windows.allowed[0].days: expected a list of mon, tue, wed, thu, fri, sat, sun, got ['moon']",
        "g.toml: heal.windows.allowed[1].start: expected a time of day \"HH:MM\", got '25:00'",
        "g.toml: heal.windows.allowed[1].end: expected a time of day \"HH:MM\" (or \"24:00\"), got '9'",
        "g.toml: heal.blockers.prometheus_url: 'ftp://x' is not the address of a Prometheus: give its base URL, "
        "such as http://prometheus:9090 (http or https, no query).",
    ]


def test_the_config_file_carries_the_heal_table() -> None:
    config = parse_config({"targets": [], "heal": {"mode": "enforce"}}, "g.toml")
    assert config.heal == {"mode": "enforce"}
    with pytest.raises(ConfigError, match=r"heal: expected a table"):
        parse_config({"heal": 3}, "g.toml")


def test_windows_are_local_days_and_hours_in_their_time_zone() -> None:
    settings = parse_heal_settings({"windows": {"timezone": "Europe/Berlin", "allowed": [
        {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "09:00", "end": "17:00"},
        {"days": ["sat"], "start": "22:00", "end": "02:00"}]}})
    berlin = ZoneInfo("Europe/Berlin")

    def at(*parts: int) -> float:
        return datetime(*parts, tzinfo=berlin).timestamp()

    windows = settings.windows
    assert windows.open_at(at(2026, 12, 2, 9, 0))  # a Wednesday, 09:00 in Berlin
    assert not windows.open_at(at(2026, 12, 2, 8, 59))
    assert not windows.open_at(at(2026, 12, 2, 17, 0))
    # 16:30 UTC is 17:30 in Berlin in winter: closed, though 16:30 is inside 09-17 in UTC
    assert not windows.open_at(datetime(2026, 12, 2, 16, 30, tzinfo=ZoneInfo("UTC")).timestamp())
    assert windows.open_at(at(2026, 12, 5, 23, 0)) and windows.open_at(at(2026, 12, 6, 1, 59))  # Sat night
    assert not windows.open_at(at(2026, 12, 6, 2, 0)) and not windows.open_at(at(2026, 12, 6, 23, 0))
    assert parse_heal_settings({}).windows.open_at(at(2026, 12, 6, 3, 0))  # no windows: always


def action(kind: str, target: str, n: int) -> Action:
    return Action(id=f"a{n:05d}", kind=kind, target=target, subject=f"s{n}", before={}, after={}, reason="",
                  fingerprint="")


def test_the_caps_keep_plan_order_and_defer_the_rest() -> None:
    actions = ([action("tombstone_backfill", "rl", 0)] + [action("session_delete", "rl", i) for i in range(1, 9)]
               + [action("pool_shrink", "bf", i) for i in range(9, 15)] + [action("session_delete", "rl2", 15)])
    limits = Limits(max_actions_per_pass=10, max_deletes_per_pass=5, max_actions_per_target=4,
                    max_deletes_per_target=3)
    kept, deferred = select_under_caps(actions, limits, hour_left=100)
    assert [a.subject for a in kept] == ["s0", "s1", "s2", "s3", "s9", "s10", "s11", "s12", "s15"]
    assert len(kept) + len(deferred) == len(actions)
    assert sum(1 for a in kept if a.kind == "session_delete") <= 5
    assert max(sum(1 for a in kept if a.target == t) for t in ("rl", "bf", "rl2")) <= 4
    # the hour's cap is one more bound on the pass
    kept, _ = select_under_caps(actions, limits, hour_left=2)
    assert [a.subject for a in kept] == ["s0", "s1"]
    kept, deferred = select_under_caps(actions, limits, hour_left=0)
    assert kept == [] and len(deferred) == len(actions)
    # a backfill whose deletes were all deferred goes with them
    kept, deferred = select_under_caps(actions[:3], Limits(max_deletes_per_target=0), hour_left=100)
    assert kept == [] and [a.kind for a in deferred] == ["session_delete", "session_delete", "tombstone_backfill"]


def test_the_hour_counts_each_written_action_once() -> None:
    events = [{"ts": 100.0, "event": "attempt", "plan_id": "p", "action_id": "a1"},
              {"ts": 101.0, "event": "attempt", "plan_id": "p", "action_id": "a1"},
              {"ts": 102.0, "event": "attempt", "plan_id": "q", "action_id": "a1"},
              {"ts": 103.0, "event": "outcome", "plan_id": "q", "action_id": "a1"}]
    assert writes_in_last_hour(events, now=200.0) == 2
    assert writes_in_last_hour(events, now=101.5 + 3600) == 1  # only q's attempt is in the hour


def test_the_breaker_opens_on_its_budget_and_holds_until_reset() -> None:
    settings = BreakerSettings(max_errors=3, window_seconds=100)
    errors = [{"ts": float(t), "event": "outcome", "outcome": o}
              for t, o in ((10, "refused"), (20, "done"), (30, "unconfirmed"), (40, "stale"), (45, "gone"))]
    state = breaker_state(errors, settings, now=50.0)
    assert (state.open, state.errors, state.left) == (False, 3, 0)
    assert breaker_state(errors, settings, now=135.0).errors == 1  # the window slides: only the stale at 40
    opened = [*errors, {"ts": 50.0, "event": "heal-breaker-open", "reason": "3 errors"}]
    assert breaker_state(opened, settings, now=10_000.0).open  # held long after the window: only a reset closes it
    reset = [*opened, {"ts": 60.0, "event": "heal-breaker-reset"}]
    state = breaker_state(reset, settings, now=61.0)
    assert (state.open, state.errors) == (False, 0)  # errors before the reset no longer count


def test_the_pause_file_is_the_kill_switch(tmp_path: Path) -> None:
    pause = tmp_path / "PAUSE"
    assert pause_reason(pause) is None
    pause.write_text("")
    assert pause_reason(pause) is not None and str(pause) in str(pause_reason(pause))


def test_deletes_keep_to_a_small_share_of_the_gateways_time() -> None:
    from gatewayscope.config import Config, Policy
    from gatewayscope.heal.loop import HealLoop

    assert parse_heal_settings({}).limits.delete_share == 0.05
    assert problems({"limits": {"delete_share": 0.9}}) == [
        "g.toml: heal.limits.delete_share: expected a share of the gateway's time above 0 and at most 0.75, got 0.9"]
    settings = parse_heal_settings({"limits": {"delete_share": 0.2}, "state_dir": "/nonexistent/heal"})
    options = HealLoop(Config(targets=[], policy=Policy()), settings)._options(write=True)
    assert options.delete_duty == 0.2 and options.allow_delete and options.stop is not None
