"""Notebooks and widgets: controllers that hold state over the public API, and ipywidgets views bound to them.

The controllers need nothing beyond ``pip install gatewayscope``; the views (:class:`SnapshotView`,
:class:`PlanReview`) need the ``notebook`` extra (``pip install 'gatewayscope[notebook]'``) and are
imported only when used, so importing this package never imports ipywidgets.

>>> from gatewayscope.notebook import PlanController, ScanController  # doctest: +SKIP
>>> scan = ScanController("gatewayscope.toml"); scan.scan()            # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gatewayscope.notebook.controllers import (
    ConfirmationError,
    PlanController,
    Progress,
    RunRecord,
    ScanController,
    diff_rows,
    render_table,
    run_directory,
)
from gatewayscope.notebook.lab import write_lab_config
from gatewayscope.notebook.wording import notebook_words

if TYPE_CHECKING:
    from gatewayscope.notebook.widgets import PlanReview, SnapshotView

__all__ = [
    "ConfirmationError",
    "PlanController",
    "PlanReview",
    "Progress",
    "RunRecord",
    "ScanController",
    "SnapshotView",
    "diff_rows",
    "notebook_words",
    "render_table",
    "run_directory",
    "write_lab_config",
]

#: the names that need ipywidgets, loaded on first use
_VIEWS = ("PlanReview", "SnapshotView")


def __getattr__(name: str) -> Any:
    if name in _VIEWS:
        from gatewayscope.notebook import widgets

        value = getattr(widgets, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
