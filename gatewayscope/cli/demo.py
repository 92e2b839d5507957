"""``gatewayscope demo``: the embedded sandbox, end to end, in one command."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from gatewayscope._text import terminal_safe
from gatewayscope.config import load_config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="start a sandbox (real rLLM gateways with real stragglers, a Bifrost emulator, the exporter) "
             "and scan it",
        description=(
            "Start a stub inference worker, two real rllm-model-gateway processes (memory and SQLite store), "
            "two guarded stores (gatewayscope's guarded gateway with the memory store, and a gateway's SQLite "
            "file whose guard is installed late, after a journaled cleanup) and the Bifrost emulator "
            "on free loopback ports; drive rollouts whose late calls land after their session was deleted, so "
            "real orphans appear where no guard stops them and the guards drop the rest; start the Prometheus "
            "exporter against the sandbox; then scan everything and print what was found, where /metrics is, "
            "the remediation plan the findings call for (written to a file, never applied) and the command that "
            "opens the notebooks. Keeps running (so you can point other commands, Prometheus and the notebooks at it) "
            "until Ctrl-C or SIGTERM, which stop everything it started; --once stops right after printing."
        ),
    )
    parser.add_argument("--once", action="store_true", help="stop everything after printing the scan and the plan")
    parser.add_argument("--workdir", metavar="DIR",
                        help="where the SQLite stores, the sandbox config and the plan go (default: a temporary "
                             "folder, removed at the end)")
    parser.add_argument("--rollouts", type=int, default=30, metavar="N",
                        help="rollouts per gateway (default 30; the guarded SQLite store gets them twice, before and "
                             "after its guard is installed)")
    parser.add_argument("--stragglers", type=int, default=10, metavar="N",
                        help="rollouts with a call still in flight at delete time (default 10)")
    parser.add_argument("--no-bifrost", action="store_true", help="do not start the Bifrost emulator")
    parser.add_argument("--no-exporter", action="store_true", help="do not start the Prometheus exporter")
    parser.set_defaults(func=run_demo)


def _say(message: str) -> None:
    sys.stderr.write(f"demo: {message}\n")
    sys.stderr.flush()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM takes the same way out as Ctrl-C: stop everything the demo started."""
    raise KeyboardInterrupt


def run_demo(args: argparse.Namespace) -> int:
    from gatewayscope.notebook.lab import write_lab_config
    from gatewayscope.render import render
    from gatewayscope.sandbox.demo import GUARDED_SQLITE, Sandbox, demo_plan, notebook_command, plan_preview
    from gatewayscope.scan import scan_report, take_snapshot

    if args.stragglers > args.rollouts or args.rollouts < 1 or args.stragglers < 0:
        sys.stderr.write("gatewayscope: --stragglers must be between 0 and --rollouts (>= 1)\n")
        return 2
    try:
        sandbox = Sandbox(args.workdir, rollouts=args.rollouts, stragglers=args.stragglers,
                          with_bifrost=not args.no_bifrost, with_exporter=not args.no_exporter, say=_say)
    except OSError as err:  # the work folder cannot be made
        sys.stderr.write(terminal_safe(f"gatewayscope demo: cannot make the work folder {args.workdir}: "
                                       f"{err.strerror or err}; give a folder this user may create.") + "\n")
        return 1
    previous = {sig: signal.signal(sig, handler) for sig, handler in
                ((signal.SIGTERM, _interrupt), (signal.SIGINT, signal.default_int_handler))}
    try:
        try:
            run = sandbox.start()
        except RuntimeError as err:  # a part that did not start or rollouts that failed: said in a sentence
            sys.stderr.write(f"gatewayscope demo: the sandbox did not start: {err}\n")
            return 1
        _say("waiting for the orphans to go idle past the sandbox's threshold")
        sandbox.wait_until_idle()
        config = load_config(run.config_path)
        deleted = run.deleted_ids()  # the cleanup's journal: the sessions it deleted that came back are confirmed
        snapshot = take_snapshot(config, also_sessions=deleted)  # a guarded store's index read includes them
        report = scan_report(snapshot, config, deleted_ids=deleted)
        out = sys.stdout
        out.write(render("scan.txt.j2", report=report, show_orphans=5))
        expected = sum(len(v) for v in run.expected_orphans.values())
        out.write(f"\nThe rollouts left {expected} stragglers behind as orphans "
                  f"({', '.join(f'{k}: {len(v)}' for k, v in run.expected_orphans.items())}).\n")
        if run.dropped_stragglers:
            dropped = sum(len(v) for v in run.dropped_stragglers.values())
            out.write(f"The guards dropped the late writes of {dropped} more "
                      f"({', '.join(f'{k}: {len(v)}' for k, v in run.dropped_stragglers.items())}).\n")
        if run.cleanup_journal:
            out.write(f"{GUARDED_SQLITE}: a cleanup deleted its {len(deleted)} orphans before its guard was installed, "
                      "while their rollouts still had a call in flight; those calls brought them back. Its journal "
                      f"({run.cleanup_journal}) proves the deletes, so they are confirmed, and carry no tombstone: "
                      "the plan records theirs first (tombstone_backfill).\n")

        out.write("\nSandbox (loopback):\n")
        for name, url in run.endpoints().items():
            out.write(f"  {name + ':':22s}{url}\n")
        if run.sqlite_path:
            out.write(f"  {'SQLite store:':22s}{run.sqlite_path}\n")
        if run.guarded_sqlite_path:
            out.write(f"  {'guarded SQLite store:':22s}{run.guarded_sqlite_path}\n")
        out.write(f"  {'config:':22s}{run.config_path}\n")
        if run.exporter_url:
            out.write(f"\nPrometheus metrics: {run.exporter_url}/metrics  (one target: "
                      f"{run.exporter_url}/probe?target=bifrost; landing page {run.exporter_url}/)\n")

        # JupyterLab saves the review widgets' state with the notebook only with this setting on
        lab = write_lab_config(run.workdir / "jupyter-config")
        plan_path = run.workdir / "plan.json"
        plan = demo_plan(snapshot, config, out=plan_path, deleted_ids=deleted)
        out.write("\nThe plan these findings call for (written, NOT applied):\n")
        out.write(plan_preview(plan))
        deletes = " --allow-delete" if any(a.destructive for a in plan.actions) else ""
        out.write(
            f"Plan file: {plan_path}\n"
            f"  plan it:  gatewayscope plan --config {run.config_path} --include-suspected --include-deletes "
            f"--deleted-from {run.cleanup_journal} --out {plan_path}\n"
            f"  review:   gatewayscope show {plan_path}\n"
            f"  dry run:  gatewayscope apply {plan_path} --config {run.config_path}\n"
            f"  apply:    gatewayscope apply {plan_path} --config {run.config_path} --yes{deletes}\n"
            f"\nNotebooks (triage, remediate) on this sandbox:\n  {notebook_command(run.config_path, lab_config=lab)}\n"
            f"Scan again: gatewayscope scan --config {run.config_path}\n"
        )
        if args.once and not args.workdir:
            out.write("(--once: the sandbox's temporary folder, its config and plan go when the demo stops; "
                      "--workdir DIR keeps them.)\n")
        if args.once:
            out.flush()
            return 0
        out.write("\nThe sandbox keeps running; press Ctrl-C to stop everything it started.\n")
        out.flush()
        idle = threading.Event()
        while not idle.wait(1.0):  # until Ctrl-C or SIGTERM raises KeyboardInterrupt
            pass
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        # a second Ctrl-C must not cut the shutdown short and leave processes behind
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        _say("stopping the sandbox")
        sandbox.stop()
        _say("stopped everything it started")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
