"""``gatewayscope scan``: read every target and report what is wrong with it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gatewayscope._text import terminal_safe
from gatewayscope.cli.common import add_target_arguments, config_from_args


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "scan",
        help="read the targets and report orphan sessions, worker pools and posture",
        description=(
            "Read every target (rLLM trace stores over REST or from their SQLite file, Bifrost management "
            "APIs) and report orphan sessions with their confidence, tombstone figures, parked workers, "
            "boot memory against the limit, and posture drift. Exit 0 when every target answered, 1 when "
            "one did not (the others are still reported), 2 on a usage or configuration error."
        ),
        epilog="Example: gatewayscope scan --trace-store http://127.0.0.1:9090 --orphan-idle-seconds 600",
    )
    add_target_arguments(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default) for people, json for programs (shape: docs/cli.md#scan---format-json)")
    parser.add_argument("--show-orphans", type=int, default=10, metavar="N",
                        help="list up to N orphan sessions per target in the text view (default 10, 0 = none)")
    parser.add_argument("--save-snapshot", metavar="DIR",
                        help="also save the raw snapshot to DIR (parquet + manifest) for offline analysis "
                             "or a bug report")
    parser.add_argument("--load-snapshot", metavar="DIR",
                        help="analyse a snapshot saved earlier instead of reading the targets")
    parser.set_defaults(func=run_scan)


def run_scan(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from gatewayscope.scan import take_snapshot
    from gatewayscope.snapshot import Snapshot

    reading = None
    if args.load_snapshot:
        config = config_from_args(args, require_targets=False)
    else:
        config = config_from_args(args)
        # The read starts first and the analysis and rendering modules load while it runs: SQLite and the
        # network wait without the GIL. Plan fingerprints only when the snapshot is kept (it may be planned
        # from later).
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gatewayscope-scan")
        reading = pool.submit(take_snapshot, config, fingerprints=bool(args.save_snapshot))
        pool.shutdown(wait=False)
    from gatewayscope.analysis.findings import findings
    from gatewayscope.scan import scan_report

    snapshot = reading.result() if reading is not None else Snapshot.load(args.load_snapshot)
    if args.save_snapshot:
        snapshot.save(args.save_snapshot)
    found = findings(snapshot, config)
    report = scan_report(found)
    if args.format == "json":
        from gatewayscope.render.jsontext import dumps_indented

        sys.stdout.write(dumps_indented(report) + "\n")  # json.dumps(indent=2, sort_keys=True)'s text, faster
    else:
        from gatewayscope.render import render  # jinja2: only the text view needs it

        sys.stdout.write(render("scan.txt.j2", report=report, show_orphans=max(0, args.show_orphans)))
        if args.save_snapshot:
            sys.stdout.write(f"Snapshot saved to {terminal_safe(args.save_snapshot)}\n")
    return 0 if found.up else 1
