"""gatewayscope: observability and remediation for the rLLM trace store and Bifrost provider records.

The library in six lines (``gatewayscope scan``, ``plan`` and ``apply`` do the same on the command line)::

    import gatewayscope as gs

    config = gs.load_config("gatewayscope.toml")        # or gs.Config(targets=[gs.Target(...)], policy=gs.Policy())
    snapshot = gs.take_snapshot(config)                  # read every target
    found = gs.findings(snapshot, config)                # found.orphans: one row per orphan session
    plan = gs.build_plan(found, include_suspected=True)  # pure data, reviewable, content-hashed
    report = gs.apply_plan(plan, config, write=True, allow_delete=True, journal="apply.jsonl")

Every name is loaded on first use, so ``import gatewayscope`` imports none of polars, jinja2 or the
notebook stack. Errors are :class:`GatewayscopeError` and its subclasses, each a sentence for the user.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [  # noqa: RUF022 (grouped by role, each group sorted)
    "__version__",
    # configuration
    "Config",
    "Policy",
    "Target",
    "load_config",
    # reading
    "Snapshot",
    "take_snapshot",
    # findings
    "Findings",
    "TargetFindings",
    "findings",
    # remediation
    "Action",
    "ApplyReport",
    "Plan",
    "apply_plan",
    "build_plan",
    "load_plan",
    "Journal",
    "deleted_sessions",
    # errors
    "AuthError",
    "BadResponseError",
    "BodyTooLargeError",
    "ConfigError",
    "GatewayTimeoutError",
    "GatewayscopeError",
    "HTTPStatusError",
    "NotFoundError",
    "PlanError",
    "RedirectError",
    "SourceError",
    "StoreError",
    "UnaddressableSessionError",
    "UnreachableError",
]

#: where each public name is defined
_SOURCES: dict[str, str] = {
    "Config": "gatewayscope.config",
    "Policy": "gatewayscope.config",
    "Target": "gatewayscope.config",
    "load_config": "gatewayscope.config",
    "Snapshot": "gatewayscope.snapshot",
    "take_snapshot": "gatewayscope.scan",
    "Findings": "gatewayscope.analysis.findings",
    "TargetFindings": "gatewayscope.analysis.findings",
    "findings": "gatewayscope.analysis.findings",
    "Action": "gatewayscope.remediate.plan",
    "Plan": "gatewayscope.remediate.plan",
    "build_plan": "gatewayscope.remediate.plan",
    "load_plan": "gatewayscope.remediate.plan",
    "ApplyReport": "gatewayscope.remediate.apply",
    "apply_plan": "gatewayscope.api",
    "Journal": "gatewayscope.remediate.journal",
    "deleted_sessions": "gatewayscope.remediate.journal",
    **{name: "gatewayscope.errors" for name in __all__[__all__.index("AuthError"):]},
}

if TYPE_CHECKING:
    from gatewayscope.analysis.findings import Findings, TargetFindings, findings
    from gatewayscope.api import apply_plan
    from gatewayscope.config import Config, Policy, Target, load_config
    from gatewayscope.errors import (
        AuthError,
        BadResponseError,
        BodyTooLargeError,
        ConfigError,
        GatewayscopeError,
        GatewayTimeoutError,
        HTTPStatusError,
        NotFoundError,
        PlanError,
        RedirectError,
        SourceError,
        StoreError,
        UnaddressableSessionError,
        UnreachableError,
    )
    from gatewayscope.remediate.apply import ApplyReport
    from gatewayscope.remediate.journal import Journal, deleted_sessions
    from gatewayscope.remediate.plan import Action, Plan, build_plan, load_plan
    from gatewayscope.scan import take_snapshot
    from gatewayscope.snapshot import Snapshot


def __getattr__(name: str) -> Any:
    """Load a public name on first use, and present it as ``gatewayscope.<name>``."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    value.__module__ = __name__
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
