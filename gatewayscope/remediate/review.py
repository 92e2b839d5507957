"""Review a plan: the same jinja2 templates for the CLI (``show``) and the notebooks."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gatewayscope.errors import PlanError
from gatewayscope.remediate.plan import Action, Plan, plan_summary
from gatewayscope.render import render

#: the template of each of the CLI's ``show --format`` choices (``PLAN_FORMATS``; tests/remediate/test_review.py
#: keeps the two in step)
FORMATS = {"text": "plan.txt.j2", "md": "plan.md.j2", "html": "plan.html.j2"}


def before_after(action: Action | dict[str, Any]) -> str:
    """One line for what an action changes.

    >>> before_after({"kind": "pool_shrink", "before": {"concurrency": 1000, "buffer_size": 5000},
    ...               "after": {"concurrency": 64, "buffer_size": 1024}})
    'workers 1000 -> 64, queue 5000 -> 1024'
    """
    data = action.to_dict() if isinstance(action, Action) else action
    kind, before, after = data["kind"], data["before"], data["after"]
    if kind == "pool_shrink":
        return (f"workers {before['concurrency']} -> {after['concurrency']}, "
                f"queue {before['buffer_size']} -> {after['buffer_size']}")
    if kind == "record_delete":
        return f"delete the record ({before.get('concurrency')} workers, base URL {before.get('base_url') or 'none'})"
    if kind == "posture_fix":
        return ", ".join(f"{k}: {str(before.get(k)).lower()} -> {str(v).lower()}" for k, v in after.items())
    if kind == "session_delete":
        return f"delete the session ({before.get('trace_count')} trace(s))"
    if kind == "tombstone_backfill":
        return f"tombstone {len(after.get('session_ids', []))} session id(s)"
    return f"{before} -> {after}"


def render_plan(plan: Plan, fmt: str = "text") -> str:
    """The plan as text, Markdown or HTML."""
    if fmt not in FORMATS:
        raise PlanError(f"Unknown format {fmt!r}; choose text, md or html.")
    created = dt.datetime.fromtimestamp(plan.created_at, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    data = plan.to_dict()
    return render(FORMATS[fmt], plan=data, summary=plan_summary(plan), created=created,
                  before_after=before_after)

