"""``gatewayscope plan``, ``show`` and ``apply``: findings into a reviewed plan, applied safely."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatewayscope._text import terminal_safe
from gatewayscope.cli.common import (
    DEFAULT_CONFIG_ENV,
    add_policy_arguments,
    add_target_arguments,
    config_from_args,
    positive_number,
)
from gatewayscope.config import Config, Policy, Target, is_remote_address, load_config
from gatewayscope.errors import ConfigError, PlanError
from gatewayscope.remediate.journal import Journal, deleted_sessions
from gatewayscope.remediate.kinds import ACTION_KINDS, PLAN_FORMATS

if TYPE_CHECKING:  # the heavy modules load only when a command runs
    from gatewayscope.remediate.apply import ActionResult, ApplyReport
    from gatewayscope.remediate.plan import Plan


def register(subparsers: Any) -> None:
    plan = subparsers.add_parser(
        "plan",
        help="build a reviewable remediation plan from a fresh scan",
        description=(
            "Scan the targets and write a JSON plan of the repairs their findings call for: pool_shrink "
            "(Bifrost records over their kind's pool), posture_fix (drifted client config), record_delete "
            "(records that cannot be resized; only with --include-deletes), session_delete (confirmed orphan "
            "sessions; suspected ones only with --include-suspected) and tombstone_backfill (on guarded stores, "
            "before the deletes). Nothing is changed: review the plan with 'gatewayscope show', then "
            "'gatewayscope apply'."
        ),
    )
    add_target_arguments(plan)
    plan.add_argument("--out", required=True, metavar="FILE", help="where to write the plan (JSON)")
    plan.add_argument("--only", nargs="+", choices=ACTION_KINDS, metavar="KIND",
                      help=f"plan only these action kinds ({', '.join(ACTION_KINDS)})")
    plan.add_argument("--include-suspected", action="store_true",
                      help="also delete suspected orphans (one idle trace, nothing proves the delete)")
    plan.add_argument("--include-deletes", action="store_true",
                      help="plan the deletion of Bifrost records that cannot be resized")
    plan.add_argument("--tombstone-ids", metavar="FILE",
                      help="also tombstone these session ids (one per line) on guarded stores")
    plan.add_argument("--deleted-from", action="append", default=[], metavar="JOURNAL",
                      help="an earlier apply's journal (repeatable): a session it deleted whose traces all came "
                           "before that delete is a confirmed orphan; one used again since is not")
    plan.set_defaults(func=run_plan)

    show = subparsers.add_parser("show", help="render a plan for review (text, Markdown or HTML)",
                                 description="Render a plan: summary by kind and target, the memory a shrink "
                                             "frees, every action with its reason, and the warnings.")
    show.add_argument("plan", metavar="PLAN", help="the plan file")
    show.add_argument("--format", choices=PLAN_FORMATS, default="text")
    show.set_defaults(func=run_show)

    apply = subparsers.add_parser(
        "apply",
        help="apply a plan (a dry run unless --yes)",
        description=(
            "Apply exactly the actions of a plan with the safety protocol: every subject is re-read right "
            "before it is written (gone, already done and changed-since-planned subjects are not written), "
            "5xx answers are retried only after a re-read (250, 750, 2000 ms), an unanswered write is read "
            "back and never sent again, and every attempt and outcome goes to an append-only journal. "
            "Without --yes nothing is written (a dry run). Deletes also need --allow-delete. Exit 0 when "
            "every action is done or already done, 1 when any is refused, unconfirmed, gone, stale or "
            "skipped, 2 on usage errors."
        ),
    )
    apply.add_argument("plan", metavar="PLAN", help="the plan file")
    apply.add_argument("--config", metavar="FILE",
                       help=f"the config the plan was made with, for credentials (default ${DEFAULT_CONFIG_ENV}); "
                            "targets given by flags at plan time need none")
    apply.add_argument("--yes", action="store_true", help="really write (default: dry run)")
    apply.add_argument("--allow-delete", action="store_true", help="also run the plan's deletes")
    apply.add_argument("--journal", metavar="FILE", help="the journal (default: PLAN with .journal.jsonl)")
    apply.add_argument("--concurrency", type=int, default=4, metavar="N", help="actions at once (default 4)")
    apply.add_argument("--rate", type=positive_number, metavar="R",
                       help="at most R writes per second (default: no limit; session deletes run one at a "
                            "time per target, taking at most 75%% of the gateway's time)")
    apply.add_argument("--max-errors", type=int, metavar="N",
                       help="stop starting actions after N refused or unconfirmed ones")
    apply.add_argument("--deleted-from", action="append", default=[], metavar="JOURNAL",
                       help="an earlier apply's journal (repeatable): the only evidence apply takes that a session "
                            "was deleted before (give the ones the plan was made with); never read from the plan")
    apply.add_argument("--ignore-signature", action="store_true",
                       help="apply a signed plan where no plan key is set, as an unsigned one")
    policy = apply.add_argument_group("policy (the thresholds apply re-checks each delete against; default: the "
                                      "config's)")
    add_policy_arguments(policy)
    apply.set_defaults(func=run_apply)


def run_plan(args: argparse.Namespace) -> int:
    from gatewayscope.analysis.findings import findings
    from gatewayscope.guard.backfill import read_ids_file
    from gatewayscope.remediate.plan import build_plan
    from gatewayscope.remediate.review import render_plan
    from gatewayscope.scan import take_snapshot

    config = config_from_args(args)
    tombstone_ids = read_ids_file(args.tombstone_ids) if args.tombstone_ids else []
    # target -> {id: when its delete was first sent}: the fence each earlier delete sets
    deleted = deleted_sessions(*(Journal(path) for path in args.deleted_from))
    snapshot = take_snapshot(config, also_sessions=deleted)
    found = findings(snapshot, config, deleted_ids=deleted)
    plan = build_plan(found, only=args.only or (), include_suspected=args.include_suspected,
                      include_deletes=args.include_deletes, tombstone_ids=tombstone_ids)
    try:
        plan.save(args.out)
    except OSError as err:
        raise PlanError(f"Cannot write the plan to {args.out}: {err.strerror or err}.") from None
    sys.stdout.write(render_plan(plan, "text"))
    sys.stdout.write(f"\nPlan written to {args.out}. Review it with 'gatewayscope show {args.out}', try it with "
                     f"'{apply_command(args, config, plan)}' (a dry run), then add --yes"
                     f"{' --allow-delete' if any(a.destructive for a in plan.actions) else ''}.\n")
    return 0 if found.up else 1


def apply_command(args: argparse.Namespace, config: Config, plan: Plan) -> str:
    """The apply command that checks ``plan`` as it was made: its config, the policy flags and the journals
    given to ``plan`` (apply takes its evidence and thresholds from its own command line, never from the plan)."""
    import shlex

    words = ["gatewayscope", "apply", args.out]
    if config.source:
        words += ["--config", config.source]
    if args.orphan_idle_seconds is not None:
        words += ["--orphan-idle-seconds", f"{args.orphan_idle_seconds:g}"]
    if args.max_weight_lag is not None:
        words += ["--max-weight-lag", str(args.max_weight_lag)]
    for path in args.deleted_from:
        words += ["--deleted-from", path]
    return terminal_safe(" ".join(shlex.quote(str(word)) for word in words))


def run_show(args: argparse.Namespace) -> int:
    from gatewayscope.remediate.plan import load_plan
    from gatewayscope.remediate.review import render_plan

    sys.stdout.write(render_plan(load_plan(args.plan), args.format))
    return 0


def config_for_plan(plan: Plan, config_path: str | None) -> Config:
    """The config an apply runs with: the file's targets (credentials), plus the plan's own for the rest."""
    path = config_path or os.environ.get(DEFAULT_CONFIG_ENV) or None
    config = load_config(path) if path else Config(targets=[], policy=Policy())
    known = {t.name for t in config.targets}
    for entry in plan.targets:
        if entry["name"] in known:
            target = config.target(entry["name"])
            if target.address != entry.get("address"):
                raise ConfigError(f"Target {entry['name']!r} is {target.address} in the config but the plan was made "
                                  f"against {entry.get('address')}; apply a plan with the config it was made with.")
            continue
        address = str(entry.get("address", ""))
        if entry.get("kind") == "bifrost" or is_remote_address(address):
            config.targets.append(Target(name=entry["name"], kind=entry["kind"], url=address))
        else:
            config.targets.append(Target(name=entry["name"], kind=entry["kind"], path=address))
    return config


def _print_result(result: ActionResult) -> None:
    # subjects and details come from gateways (session ids, record names, error sentences): escaped
    sys.stdout.write(terminal_safe(f"  {result.action_id} {result.kind} {result.target} {result.subject}: "
                                   f"{result.outcome}{' - ' + result.detail if result.detail else ''}") + "\n")


def run_apply(args: argparse.Namespace) -> int:
    from gatewayscope.remediate.apply import ApplyOptions, apply_plan, stricter_than_planned
    from gatewayscope.remediate.plan import load_plan

    if args.concurrency < 1:
        raise ConfigError("--concurrency: expected a whole number >= 1")
    if args.rate is not None and args.rate <= 0:
        raise ConfigError("--rate: expected a positive number of writes per second")
    if args.max_errors is not None and args.max_errors < 1:
        raise ConfigError("--max-errors: expected a whole number >= 1")
    plan = load_plan(args.plan, ignore_signature=args.ignore_signature)
    config = config_for_plan(plan, args.config)
    if args.orphan_idle_seconds is not None:
        config.policy.orphan_idle_seconds = args.orphan_idle_seconds
    if args.max_weight_lag is not None:
        config.policy.max_weight_lag = args.max_weight_lag
    for sentence in stricter_than_planned(plan, config.policy):  # before anything is read: a dry run says it too
        sys.stderr.write(terminal_safe(sentence) + "\n")
    deleted = deleted_sessions(*(Journal(path) for path in args.deleted_from))
    journal_path = Path(args.journal) if args.journal else Path(args.plan).with_suffix(".journal.jsonl")
    journal = Journal(journal_path)
    options = ApplyOptions(write=args.yes, allow_delete=args.allow_delete, concurrency=args.concurrency,
                           rate=args.rate, max_errors=args.max_errors)
    from tqdm import tqdm

    with tqdm(total=len(plan.actions), desc="apply" if args.yes else "dry run", unit="action",
              file=sys.stderr, disable=None) as bar:
        report = apply_plan(plan, config, options=replace(options), journal=journal,
                            on_result=lambda _r: bar.update(1), deleted_ids=deleted)
    return _print_report(report, plan, args, journal_path)


def _print_report(report: ApplyReport, plan: Plan, args: argparse.Namespace, journal_path: Path) -> int:
    if report.already_applied:
        sys.stdout.write(f"Plan {plan.id} was already applied (journal {journal_path}); nothing to do.\n"
                         f"{report.tally_line()}\n")
        return report.exit_code
    if report.previous:
        sys.stdout.write(f"Resumed: {len(report.previous)} action(s) were settled by an earlier run "
                         f"(journal {journal_path}).\n")
    if report.dry_run:
        counts: dict[str, int] = {}
        for result in report.results:
            counts[result.outcome] = counts.get(result.outcome, 0) + 1
            if result.outcome not in ("would-write", "already-done"):
                _print_result(result)
        deletes = sum(1 for a in plan.actions if a.destructive)
        also = f" (and --allow-delete for the {deletes} deletes)" if deletes else ""
        if not report.results:
            sys.stdout.write("Dry run: the plan has no actions; there is nothing to apply.\n")
            return 0
        sys.stdout.write("Dry run, nothing was sent: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                         + f".\nRun again with --yes to apply{also}.\n")
        if report.exit_code:
            sys.stdout.write("No action could be checked against its gateway (see above); an apply now would "
                             "write nothing.\n")
        return report.exit_code
    for result in report.results:
        if result.outcome not in ("done", "already-done"):
            _print_result(result)
    for target, limit in sorted(report.shrink_concurrency.items()):
        sys.stdout.write(terminal_safe(f"{target}: pool resizes {limit['reason']}.") + "\n")
    if report.skipped:
        sys.stdout.write(f"{len(report.skipped)} action(s) not run (see above); they stay open in the journal.\n")
    if report.stopped_early:
        sys.stdout.write(terminal_safe(f"{report.stopped_early}.") + "\n")
    sys.stdout.write(f"Journal: {journal_path}\n{report.tally_line()}\n")
    return report.exit_code
