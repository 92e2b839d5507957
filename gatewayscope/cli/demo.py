"""``gatewayscope demo``: the embedded sandbox, end to end, in one command."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from gatewayscope.config import load_config
from gatewayscope.render import render
from gatewayscope.scan import scan_report, take_snapshot


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="start a sandbox (real rLLM gateways with real stragglers, a Bifrost emulator) and scan it",
        description=(
            "Start a stub inference worker, two real rllm-model-gateway processes (memory and SQLite store) "
            "and the Bifrost emulator on free loopback ports; drive rollouts whose late calls land after "
            "their session was deleted, so real orphans appear; then scan everything and print what was "
            "found. Keeps running (so you can point other commands at it) until Ctrl-C, which stops "
            "everything it started; --once stops right after the scan."
        ),
    )
    parser.add_argument("--once", action="store_true", help="stop everything after printing the scan")
    parser.add_argument("--workdir", metavar="DIR",
                        help="where the SQLite store and the sandbox config go (default: a temporary folder, "
                             "removed at the end)")
    parser.add_argument("--rollouts", type=int, default=30, metavar="N", help="rollouts per gateway (default 30)")
    parser.add_argument("--stragglers", type=int, default=10, metavar="N",
                        help="rollouts with a call still in flight at delete time (default 10)")
    parser.add_argument("--no-bifrost", action="store_true", help="do not start the Bifrost emulator")
    parser.set_defaults(func=run_demo)


def _say(message: str) -> None:
    sys.stderr.write(f"demo: {message}\n")
    sys.stderr.flush()


def run_demo(args: argparse.Namespace) -> int:
    from gatewayscope.sandbox.demo import Sandbox

    if args.stragglers > args.rollouts or args.rollouts < 1 or args.stragglers < 0:
        sys.stderr.write("gatewayscope: --stragglers must be between 0 and --rollouts (>= 1)\n")
        return 2
    sandbox = Sandbox(args.workdir, rollouts=args.rollouts, stragglers=args.stragglers,
                      with_bifrost=not args.no_bifrost, say=_say)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        run = sandbox.start()
        _say("waiting for the orphans to go idle past the sandbox's threshold")
        sandbox.wait_until_idle()
        config = load_config(run.config_path)
        snapshot = take_snapshot(config)
        report = scan_report(snapshot, config)
        sys.stdout.write(render("scan.txt.j2", report=report, show_orphans=5))
        expected = sum(len(v) for v in run.expected_orphans.values())
        sys.stdout.write(
            f"\nThe rollouts left {expected} stragglers behind as orphans "
            f"({', '.join(f'{k}: {len(v)}' for k, v in run.expected_orphans.items())}).\n"
            f"Sandbox config: {run.config_path}\n"
            f"Try: gatewayscope scan --config {run.config_path} --format json\n"
        )
        if args.once:
            return 0
        sys.stdout.write("The sandbox keeps running; press Ctrl-C to stop everything it started.\n")
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        _say("stopping the sandbox")
        sandbox.stop()
        signal.signal(signal.SIGTERM, previous)
