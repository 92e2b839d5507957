"""``gatewayscope guard``: install, inspect and manage the tombstone guard.

A thin shell over :mod:`gatewayscope.guard.sqlite` (the triggers installed into the gateway's SQLite file)
and :mod:`gatewayscope.guard.backfill` (tombstone backfill and lift, on a SQLite file or a guarded
gateway's URL). Every error is one of gatewayscope's typed errors; ``gatewayscope`` prints its sentence.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
import time
from typing import Any

from gatewayscope._argtypes import checked_number
from gatewayscope._text import terminal_safe
from gatewayscope.config import check_url, is_remote_address
from gatewayscope.errors import ConfigError
from gatewayscope.guard import sqlite as sqlite_guard
from gatewayscope.guard.common import DEFAULT_TIMEOUT as REMOTE_TIMEOUT

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_RETRY_HINT = (
    "Writes are dropped only when their request reached the gateway before the session's latest delete; a new "
    "use of a deleted id (rLLM's next step, a retry) is kept. To lift a tombstone by hand: gatewayscope guard "
    "lift {target} SESSION_ID"
)


def _non_negative_int(text: str) -> int:
    return checked_number(text, lambda digits: int(digits.replace("_", "").replace(",", "")),
                          lambda value: value >= 0, "{text!r} is not a whole number",
                          "{text!r} is negative; give 0 (unlimited) or more")


def _path_or_url(text: str) -> str:
    """An argparse type: a store's path as given, or a gateway URL Python can split (else a sentence)."""
    if is_remote_address(text):
        try:
            check_url(text, "URL")
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix("command line: URL: ")) from None
    return text


def _positive_float(text: str) -> float:
    return checked_number(text, float, lambda value: math.isfinite(value) and value > 0,
                          "{text!r} is not a number of seconds",
                          "{text!r} must be a finite number of seconds, more than 0")


#: what a target of status, lift and backfill is
_TARGET_HELP = "the gateway's SQLite file, or the URL of a 'gatewayscope gateway'"


def _add_target(parser: argparse.ArgumentParser, text: str = _TARGET_HELP) -> None:
    """The ``PATH|URL`` argument of the actions that take a SQLite file or a guarded gateway's URL."""
    parser.add_argument("target", metavar="PATH|URL", type=_path_or_url, help=text)


def _add_timeout(parser: argparse.ArgumentParser) -> None:
    """The ``--timeout`` of the actions that take a SQLite file or a guarded gateway's URL."""
    parser.add_argument("--timeout", type=_positive_float, default=REMOTE_TIMEOUT,
                        metavar="SECONDS", help="busy timeout (SQLite) or request timeout (URL); default 10")


def _add_busy_timeout(parser: argparse.ArgumentParser) -> None:
    """The ``--busy-timeout`` of the actions that write the guard into a SQLite file."""
    parser.add_argument("--busy-timeout", type=_positive_float, default=sqlite_guard.DEFAULT_BUSY_TIMEOUT,
                        metavar="SECONDS", help="wait this long for the gateway's write lock (default 10)")


def register(subparsers: Any) -> None:
    """Add ``guard`` and its actions."""
    parser = subparsers.add_parser(
        "guard",
        help="the tombstone guard: stop straggling trace writes from resurrecting deleted sessions",
        description=textwrap.fill(
            "The tombstone guard stops the rLLM gateway from resurrecting a deleted session when a "
            "straggling trace write lands after its delete. For '--store sqlite', 'guard install' puts "
            "a tombstone table and triggers into the gateway's own database file, so the unmodified "
            "rllm-model-gateway drops those writes (and counts them). For '--store memory', run the "
            "gateway with 'gatewayscope gateway' instead; 'guard backfill', 'guard lift' and 'guard status' "
            "also accept its URL.", width=78,
        ),
        epilog=(
            "Examples:\n"
            "  gatewayscope guard install ~/.rllm/gateway_traces.db\n"
            "  gatewayscope guard status ~/.rllm/gateway_traces.db\n"
            "  gatewayscope guard backfill ~/.rllm/gateway_traces.db --ids-file orphans.txt\n"
            "  gatewayscope guard lift http://127.0.0.1:9090 3f2c...:0"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=lambda args: _no_action(parser))
    actions = parser.add_subparsers(dest="guard_action", metavar="ACTION", parser_class=type(parser))

    install = actions.add_parser(
        "install",
        help="install the guard into the gateway's SQLite file (idempotent; safe while the gateway runs)",
        description=(
            "Install the tombstone guard into an rLLM gateway's SQLite trace store: a deleted session "
            "gets a tombstone, and a later trace write for it is dropped and counted instead of "
            "resurrecting it. Idempotent: a second install changes nothing and says so; it also repairs "
            "missing or altered triggers. Safe while the gateway runs and writes (one short write "
            "transaction). Refuses a file that is not a trace store."
        ),
    )
    install.add_argument("path", metavar="PATH", help="the gateway's SQLite file (rllm-model-gateway --db-path)")
    install.add_argument("--capacity", type=_non_negative_int, metavar="N",
                         help="keep at most N tombstones, evicting the oldest first (default 1,000,000 on "
                              "a first install, else unchanged; 0 = unlimited)")
    _add_busy_timeout(install)
    install.add_argument("--full-check", action="store_true",
                         help="check the whole file before writing, however long that holds up the gateway's "
                              "writes (a store in DELETE journal mode too large to check within "
                              f"{sqlite_guard.CHECK_HOLD_SECONDS:g} s otherwise gets its schema and the guard's "
                              "tables checked); for a stopped gateway")
    install.set_defaults(func=run_install)

    status = actions.add_parser(
        "status",
        help="show tombstones, dropped writes, the worst droppers and whether the triggers are intact",
        description=(
            "Show the guard's state: tombstones against the capacity, dropped writes, evictions, the "
            "sessions with the most dropped writes, and whether every trigger is present as installed. "
            "Read-only. Exit 0 when the guard is installed and intact, 1 otherwise."
        ),
    )
    _add_target(status)
    status.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default) for people, json for programs")
    status.add_argument("--top", type=_non_negative_int, default=sqlite_guard.DEFAULT_TOP, metavar="N",
                        help="list the N sessions with the most dropped writes (default 10; SQLite only)")
    _add_timeout(status)
    status.set_defaults(func=run_status)

    uninstall = actions.add_parser(
        "uninstall",
        help="remove the guard's triggers and tables; the gateway's own tables and rows stay as they are",
        description=(
            "Remove the tombstone guard from the gateway's SQLite file: its triggers, indexes and tables "
            "(the tombstones are discarded). The gateway's tables, indexes and rows are left exactly as "
            "they are; stragglers resurrect deleted sessions again afterwards."
        ),
    )
    uninstall.add_argument("path", metavar="PATH", help="the gateway's SQLite file")
    _add_busy_timeout(uninstall)
    uninstall.set_defaults(func=run_uninstall)

    lift = actions.add_parser(
        "lift",
        help="lift one session's tombstone: even its stragglers land again",
        description=(
            "Lift the tombstone of one session, forgetting its fence: even a straggler from before its latest "
            "delete lands again. Not needed for a new use of a deleted id (rLLM's next step, a retry): its "
            "writes came after the delete and are kept anyway."
        ),
    )
    _add_target(lift)
    lift.add_argument("session_id", metavar="SESSION_ID", help="the session whose tombstone to lift")
    _add_timeout(lift)
    lift.set_defaults(func=run_lift)

    backfill = actions.add_parser(
        "backfill",
        help="record tombstones for session ids known to be deleted (deletes nothing)",
        description=(
            "Record tombstones for session ids known to be deleted, or about to be: orphans you are "
            "deleting now, ids from a file. Deletes nothing and is idempotent; reports how many were "
            "new. Tombstone first, then delete, so a straggler landing in between is dropped."
        ),
    )
    _add_target(backfill, "the gateway's SQLite file (guard installed), or the URL of a 'gatewayscope gateway'")
    source = backfill.add_mutually_exclusive_group(required=True)
    source.add_argument("--ids-file", metavar="FILE",
                        help="one session id per line; blank lines and # comments skipped; - for stdin")
    source.add_argument("session_ids", nargs="*", default=[], metavar="SESSION_ID",
                        help="session ids given on the command line")
    _add_timeout(backfill)
    backfill.set_defaults(func=run_backfill)

    runner = actions.add_parser(
        "run",
        help="run a program (an rLLM trainer) so that every rLLM gateway it starts gets the guard",
        description=(
            "Run COMMAND so that every rLLM model gateway app built in it or in the Python processes it starts "
            "gets the tombstone guard: the gateway rLLM's GatewayManager starts as a subprocess (python -m "
            "rllm_model_gateway) and the one it serves on a thread of the trainer alike. Nothing in COMMAND "
            "changes; a gateway the guard does not know runs unguarded and says so once in its log. With "
            "--discovery-dir each guarded gateway announces itself there while it serves (Prometheus file_sd "
            "JSON), for the exporter's discovery_dir and for Prometheus. Exit status: COMMAND's."
        ),
        epilog=("Example:\n  gatewayscope guard run --discovery-dir /run/gatewayscope -- "
                "python -m rllm.trainer.verl.train_agent_ppo ..."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    runner.add_argument("--max-tombstones", type=_non_negative_int, default=None, metavar="N",
                     help="most deleted session ids each gateway's guard remembers (default 1,000,000; 0 disables "
                          "the guard)")
    runner.add_argument("--discovery-dir", metavar="DIR",
                     help="where each guarded gateway announces itself while it serves")
    runner.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                     help="the program to run, after --")
    runner.set_defaults(func=run_command)


def guard_run_environment(environ: dict[str, str], *, max_tombstones: int | None,
                          discovery_dir: str | None) -> dict[str, str]:
    """The environment ``guard run`` gives its command: the attach hook's directory first on ``PYTHONPATH`` and
    the guard's options (see :mod:`gatewayscope.guard.attach`)."""
    from pathlib import Path

    from gatewayscope.guard import attach

    hook = str(Path(attach.__file__).resolve().parent / "_autoattach")
    env = dict(environ)
    rest = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != hook]
    env["PYTHONPATH"] = os.pathsep.join([hook, *rest])
    env[attach.ENABLE_ENV] = "1"
    if max_tombstones is not None:
        env[attach.MAX_TOMBSTONES_ENV] = str(max_tombstones)
    if discovery_dir:
        env[attach.DISCOVERY_DIR_ENV] = os.path.abspath(os.path.expanduser(discovery_dir))
    return env


def run_command(args: argparse.Namespace) -> int:
    """``guard run -- COMMAND``: exec COMMAND with the attach hook (this process becomes COMMAND)."""
    import shutil

    from gatewayscope.errors import ConfigError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("guard run: give the program to run after --, e.g. gatewayscope guard run -- python "
                          "train.py")
    program = shutil.which(command[0])
    if program is None:
        raise ConfigError(terminal_safe(f"guard run: {command[0]!r} is not a program on PATH (or not executable)."))
    env = guard_run_environment(dict(os.environ), max_tombstones=args.max_tombstones,
                                discovery_dir=args.discovery_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(program, command, env)
    return EXIT_FAILED  # not reached: exec replaces this process


def _no_action(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


# -- actions ---------------------------------------------------------------------------------------


def run_install(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    # the orphan index's fill, a page of sessions at a time; the bar shows only on a terminal (disable=None)
    with tqdm(total=0, desc="orphan index", unit="row", unit_scale=True, file=sys.stderr, disable=None,
              leave=False) as bar:
        def progress(done: int, estimate: int) -> None:
            bar.total = estimate
            bar.update(done - bar.n)

        result = sqlite_guard.install(args.path, capacity=args.capacity, busy_timeout=args.busy_timeout,
                                      progress=progress, full_check=args.full_check)
    print(result.message)
    return EXIT_OK


def run_uninstall(args: argparse.Namespace) -> int:
    result = sqlite_guard.uninstall(args.path, busy_timeout=args.busy_timeout)
    print(result.message)
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    from gatewayscope.guard import backfill as guard_backfill  # HTTP: loaded only when used

    if is_remote_address(args.target):
        body = guard_backfill.remote_status(args.target, timeout=args.timeout)
        if args.format == "json":
            print(json.dumps(body, indent=2, sort_keys=True))
        else:
            print(format_remote_status(args.target, body))
        return EXIT_OK if body.get("enabled") else EXIT_FAILED
    status = sqlite_guard.status(args.target, top=args.top, busy_timeout=args.timeout)
    if args.format == "json":
        print(json.dumps(status.to_dict(), indent=2, sort_keys=True))
    else:
        print(format_status(status))
    return EXIT_OK if status.installed and status.triggers_intact else EXIT_FAILED


def run_lift(args: argparse.Namespace) -> int:
    from gatewayscope.guard import backfill as guard_backfill  # HTTP: loaded only when used

    lifted = guard_backfill.lift(args.target, args.session_id, timeout=args.timeout)
    if lifted:
        print(terminal_safe(f"Lifted the tombstone of {args.session_id} in {args.target}: its trace writes land "
                            "again."))
    else:
        print(terminal_safe(f"{args.session_id} has no tombstone in {args.target}; nothing changed."))
    return EXIT_OK


def run_backfill(args: argparse.Namespace) -> int:
    from gatewayscope.guard import backfill as guard_backfill  # HTTP: loaded only when used

    if args.ids_file == "-":
        ids = guard_backfill.read_ids_stream(sys.stdin.buffer)
    elif args.ids_file:
        ids = guard_backfill.read_ids_file(args.ids_file)
    else:
        ids = list(args.session_ids)
    if not ids:
        print(f"No session ids to backfill{' in ' + args.ids_file if args.ids_file else ''}; nothing changed.")
        return EXIT_OK
    result = guard_backfill.backfill_tombstones(args.target, ids, timeout=args.timeout)
    print(terminal_safe(f"Backfilled {args.target}: {result.message}"))
    return EXIT_OK


# -- text views ------------------------------------------------------------------------------------


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))


def _capacity(capacity: int) -> str:
    return "unlimited" if capacity == 0 else f"{capacity:,}"


#: the orphan index's states in ``guard status``
_INDEX_STATES = {
    "ready": "ready (scans read only the candidate sessions)",
    "building": ("building: its fill did not complete, so scans read every session; complete it with: "
                 "gatewayscope guard install {target}"),
    "damaged": "damaged: scans read every session; rebuild it with: gatewayscope guard install {target}",
    "absent": ("absent (a guard installed by an older gatewayscope): scans read every session; add it with: "
               "gatewayscope guard install {target}"),
}


def format_status(status: sqlite_guard.GuardStatus) -> str:
    """The text view of ``guard status`` for a SQLite file."""
    lines: list[str] = []
    if not status.installed:
        lines.append(f"The tombstone guard is not installed in {status.path}: a straggling trace write after a "
                     "delete resurrects the session.")
        lines.append(f"Install it with: gatewayscope guard install {status.path}")
        return "\n".join(lines)
    state = "triggers intact" if status.triggers_intact else "triggers NOT intact"
    lines.append(f"Tombstone guard in {status.path}: installed {_when(status.installed_at)}, {state}")
    lines.append(f"  tombstones      {status.tombstones:,} / {_capacity(status.capacity)}"
                 f"{' (FIFO: the oldest are evicted first)' if status.capacity else ''}")
    sessions = "session" if status.sessions_with_drops == 1 else "sessions"
    lines.append(f"  dropped writes  {status.dropped_writes:,} (from {status.sessions_with_drops:,} {sessions}; "
                 "stragglers: sent before their session's latest delete)")
    lines.append(f"  kept after a fence  {status.kept_after_fence:,} (new uses of deleted ids: sent after the delete)")
    lines.append(f"  evicted         {status.evicted:,}")
    lines.append(f"  journal mode    {status.journal_mode}")
    lines.append(f"  orphan index    {_INDEX_STATES.get(status.index, status.index).format(target=status.path)}")
    if not status.triggers_intact:
        problems = []
        if status.missing:
            problems.append(f"missing: {', '.join(status.missing)}")
        if status.altered:
            problems.append(f"altered: {', '.join(status.altered)}")
        lines.append(f"  PROBLEM: {'; '.join(problems)}. Stragglers may resurrect sessions (or the gateway's "
                     f"writes may fail). Repair with: gatewayscope guard install {status.path}")
    if status.top_droppers:
        ids = [terminal_safe(d.session_id) for d in status.top_droppers]  # chosen by the gateway's callers
        width = max(len("SESSION"), *(len(sid) for sid in ids))
        lines.append("")
        lines.append(f"Sessions with dropped writes (top {len(status.top_droppers)} of "
                     f"{status.sessions_with_drops:,}):")
        lines.append(f"  {'SESSION'.ljust(width)}  {'DROPPED':>7}  {'DELETED':<20}  LAST DROPPED")
        for sid, d in zip(ids, status.top_droppers, strict=True):
            lines.append(f"  {sid.ljust(width)}  {d.dropped:>7,}  {_when(d.deleted_at):<20}  "
                         f"{_when(d.last_dropped_at)}")
        lines.append(_RETRY_HINT.format(target=status.path))
    return "\n".join(lines)


def _count(value: Any) -> int:
    """A count from a gateway's answer, 0 when it is not a whole number (the answer is not trusted)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def format_remote_status(url: str, body: dict[str, Any]) -> str:
    """The text view of ``guard status`` for a guarded gateway's ``GET /guard/status``."""
    capacity = _count(body.get("capacity"))
    lines = [f"Tombstone guard of {url}: {'enabled' if body.get('enabled') else 'DISABLED (--max-tombstones 0)'}",
             f"  tombstones      {_count(body.get('tombstones')):,} / "
             f"{_capacity(capacity) if capacity else 'disabled'}",
             f"  dropped writes  {_count(body.get('dropped_writes')):,} (stragglers)",
             f"  kept after a fence  {_count(body.get('kept_after_fence')):,} (new uses of deleted ids)",
             f"  evicted         {_count(body.get('evicted')):,}"]
    droppers = [d for d in body.get("top_droppers") or [] if isinstance(d, dict)]
    if droppers:
        ids = [terminal_safe(str(d.get("session_id", ""))) for d in droppers]
        width = max(len("SESSION"), *(len(sid) for sid in ids))
        lines.append("")
        lines.append("Sessions with dropped writes:")
        lines.append(f"  {'SESSION'.ljust(width)}  {'DROPPED':>7}")
        for sid, d in zip(ids, droppers, strict=True):
            lines.append(f"  {sid.ljust(width)}  {_count(d.get('dropped')):>7,}")
        lines.append("A listed session that should be live can be lifted with: "
                     f"gatewayscope guard lift {url} SESSION_ID (an explicit POST /sessions also lifts it)")
    return "\n".join(lines)
