"""The parts of the public API that are not the core's own functions as they are.

:func:`apply_plan` takes keyword options where the core takes an
:class:`~gatewayscope.remediate.apply.ApplyOptions` and a :class:`~gatewayscope.remediate.journal.Journal`.
Exit codes stay with the command line: the library returns reports and raises
:class:`~gatewayscope.errors.GatewayscopeError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gatewayscope.config import Config
    from gatewayscope.remediate.apply import ActionResult, ApplyReport
    from gatewayscope.remediate.journal import Journal
    from gatewayscope.remediate.plan import Plan


def apply_plan(
    plan: Plan,
    config: Config,
    *,
    write: bool = False,
    allow_delete: bool = False,
    journal: str | os.PathLike[str] | Journal | None = None,
    concurrency: int = 4,
    rate: float | None = None,
    max_errors: int | None = None,
    deleted_ids: Mapping[str, Any] | None = None,
    on_result: Callable[[ActionResult], None] | None = None,
) -> ApplyReport:
    """Apply exactly the actions of ``plan`` to the targets of ``config``, with every safeguard of
    ``gatewayscope apply``; ``write=False`` (the default) is a dry run that re-reads every subject and
    writes nothing.

    Every subject is re-read right before it is written; one that is gone, already done or changed since
    it was planned is not written. ``allow_delete`` lets the plan's deletes run (without it they are
    skipped and stay open in the journal). A real apply needs ``journal`` (a path or a
    :class:`~gatewayscope.remediate.journal.Journal`): every attempt and outcome is recorded there, an
    interrupted apply resumes from it, and an applied plan is not applied again. ``concurrency`` actions
    run at once; ``rate`` caps the writes per second; ``max_errors`` stops starting actions after that many
    refused or unconfirmed ones. ``deleted_ids`` are the sessions known to have been deleted before, each with
    the moment of that delete (``{id: epoch seconds}`` or ``{target: {id: epoch seconds}}``, as
    :func:`gatewayscope.remediate.journal.deleted_sessions` reads apply journals): apply takes "deleted before"
    evidence only from them (and from a plan it can trust: made in this process, or signed and checked), and
    it proves an orphan only for traces dispatched before that delete. ``on_result`` is called with each
    action's result as it settles.

    Returns the :class:`~gatewayscope.remediate.apply.ApplyReport`; raises
    :class:`~gatewayscope.errors.PlanError` for a plan that cannot be applied as asked.

    >>> from gatewayscope import Config, Plan, Policy
    >>> plan = Plan(created_at=0.0, targets=[], actions=[], policy={})
    >>> report = apply_plan(plan, Config(targets=[], policy=Policy()))
    >>> report.dry_run, report.results
    (True, [])
    """
    from gatewayscope.remediate.apply import ApplyOptions
    from gatewayscope.remediate.apply import apply_plan as apply_core
    from gatewayscope.remediate.journal import Journal

    if journal is not None and not isinstance(journal, Journal):
        journal = Journal(Path(journal))
    options = ApplyOptions(write=write, allow_delete=allow_delete, concurrency=concurrency, rate=rate,
                           max_errors=max_errors)
    return apply_core(plan, config, options=options, journal=journal, on_result=on_result, deleted_ids=deleted_ids)
