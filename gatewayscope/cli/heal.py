"""``gatewayscope heal``: the unattended, bounded reconcile loop, and its operator commands (docs/heal.md).

``heal --config FILE`` runs passes until SIGINT/SIGTERM (``--once``: one pass now, no first-pass delay);
``heal status`` shows what the journal says; ``heal pause`` / ``heal resume`` flip the kill switch (the pause
file) for every heal on that state folder; ``heal reset`` closes an open breaker.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from types import FrameType
from typing import Any

from gatewayscope._text import terminal_safe
from gatewayscope.cli.common import DEFAULT_CONFIG_ENV


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "heal",
        help="repair the targets unattended, in bounded passes (dry-run unless the [heal] table enforces)",
        description=(
            "Run heal's reconcile loop: every [heal] interval_seconds it reads every target, derives the findings, "
            "plans only the action kinds the [heal.actions] table enables and applies them with every safeguard "
            "of 'apply' (re-read at the write, compare-and-delete, journal, pacing), within its caps, outside "
            "its blocks (pause file, breaker, windows, blocker alerts, gateway health). The default mode is "
            "dry-run: every pass records what it would do and writes nothing. Subcommands: status, pause, "
            "resume, reset."
        ),
        epilog="Example: gatewayscope heal --config gatewayscope.toml --once",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _config_argument(parser, default=None)
    parser.add_argument("--once", action="store_true",
                        help="run one pass now (no first-pass delay), print it and exit (0 when the pass ran and "
                             "wrote or would write without errors, 1 otherwise)")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="how --once and 'heal status' print (default text)")
    parser.set_defaults(func=run_heal, heal_command=None)
    commands = parser.add_subparsers(dest="heal_command", metavar="SUBCOMMAND")
    status = commands.add_parser("status", help="what heal's journal says: last pass, breaker, pause, caps",
                                 description="Show heal's state from its journal (no heal needs to run): the last "
                                             "pass, the breaker and its error budget, the pause file, the window, "
                                             "the writes of the last hour and the outcomes of the last 24 h.")
    _config_argument(status)
    status.add_argument("--format", choices=("text", "json"), default=argparse.SUPPRESS,
                        help="text (default) or json")
    status.set_defaults(func=run_status)
    for name, text in (("pause", "the kill switch: create the pause file; no write starts until 'heal resume'"),
                       ("resume", "remove the pause file"),
                       ("reset", "close an open breaker (the error budget counts again from now)")):
        sub = commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        _config_argument(sub)
        sub.set_defaults(func=run_operator, operator=name)


def _config_argument(parser: argparse.ArgumentParser, default: Any = argparse.SUPPRESS) -> None:
    parser.add_argument("--config", metavar="FILE", default=default,
                        help=f"TOML file with [[targets]] and a [heal] table (default: ${DEFAULT_CONFIG_ENV} if set)")


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    import os

    from gatewayscope.config import load_config
    from gatewayscope.errors import ConfigError
    from gatewayscope.heal.settings import parse_heal_settings

    path = getattr(args, "config", None) or os.environ.get(DEFAULT_CONFIG_ENV) or None
    if not path:
        raise ConfigError(f"heal needs --config FILE (or ${DEFAULT_CONFIG_ENV}): a config with [[targets]] and a "
                          "[heal] table.")
    config = load_config(path)
    settings = parse_heal_settings(config.heal, config.source or path,
                                   policy_idle_seconds=config.policy.orphan_idle_seconds)
    return config, settings


def pass_line(report: Any) -> str:
    """One line for a pass: its result, blocks, and counts."""
    enforced: dict[str, int] = {}
    for result in [*report.resumed, *report.enforced]:
        enforced[result.outcome] = enforced.get(result.outcome, 0) + 1
    would = sum(1 for r in report.would if r.outcome == "would-write")
    parts = [f"heal pass {report.result}"]
    if report.blocked:
        parts.append("blocked by " + "; ".join(f"{k}: {v}" for k, v in sorted(report.blocked.items())))
    parts.append("enforced: " + (", ".join(f"{n} {o}" for o, n in sorted(enforced.items())) or "nothing"))
    parts.append(f"dry-run would write {would}")
    if report.deferred:
        parts.append(f"{len(report.deferred)} deferred by the caps")
    for name, why in sorted(report.skipped_targets.items()):
        parts.append(f"{name} skipped ({why})")
    if report.error:
        parts.append(f"error: {report.error}")
    return terminal_safe("; ".join(parts))


def print_pass(report: Any) -> None:
    """Write a pass's line to stderr (the loop's progress)."""
    sys.stderr.write(pass_line(report) + "\n")
    sys.stderr.flush()


def run_heal(args: argparse.Namespace) -> int:
    from gatewayscope.heal.loop import HealLoop

    if args.heal_command is not None:  # pragma: no cover - argparse dispatches subcommands
        return int(args.func(args))
    config, settings = _load(args)
    loop = HealLoop(config, settings)
    if args.once:
        loop.prepare()
        with loop.lock:
            report = loop.run_pass()
        if args.format == "json":
            sys.stdout.write(json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str) + "\n")
        else:
            sys.stdout.write(pass_line(report) + "\n")
        bad = report.result == "error" or any(r.outcome in ("refused", "unconfirmed") for r in report.enforced)
        return 1 if bad else 0
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    enforced = ", ".join(settings.enforced_kinds()) or "none (dry-run)"
    sys.stderr.write(terminal_safe(
        f"gatewayscope heal: {len(config.targets)} target(s), a pass every {settings.interval_seconds:g} s, "
        f"enforcing {enforced}; journal {settings.journal}, pause file {settings.pause_file}. Ctrl-C stops it.")
        + "\n")
    sys.stderr.flush()
    try:
        loop.run(stop, on_pass=print_pass)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    sys.stderr.write("gatewayscope heal stopped.\n")
    return 0


def run_status(args: argparse.Namespace) -> int:
    from gatewayscope.heal.status import heal_status, status_lines

    _, settings = _load(args)
    status = heal_status(settings)
    if getattr(args, "format", "text") == "json":
        sys.stdout.write(json.dumps(status, indent=2, sort_keys=True, default=str) + "\n")
    else:
        sys.stdout.write("\n".join(terminal_safe(line) for line in status_lines(status)) + "\n")
    return 0


def run_operator(args: argparse.Namespace) -> int:
    import getpass

    from gatewayscope.heal.loop import HealLoop

    config, settings = _load(args)
    loop = HealLoop(config, settings)
    loop.prepare()
    who = f"'gatewayscope heal {args.operator}' by {getpass.getuser()}"
    if args.operator == "pause":
        loop.pause(who)
        sys.stdout.write(terminal_safe(f"Paused: {settings.pause_file} exists; no heal write starts until "
                                       "'gatewayscope heal resume'.") + "\n")
    elif args.operator == "resume":
        loop.resume(who)
        sys.stdout.write("Resumed.\n")
    else:
        loop.reset_breaker(who)
        sys.stdout.write("Breaker reset: the error budget counts again from now.\n")
    return 0
