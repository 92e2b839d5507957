"""Notebooks and widgets: controllers that hold state and call the core, and ipywidgets views bound to them.

>>> from gatewayscope.notebook import PlanController, ScanController  # doctest: +SKIP
>>> scan = ScanController("gatewayscope.toml"); scan.scan()            # doctest: +SKIP
"""

from gatewayscope.notebook.controllers import (
    ConfirmationError,
    PlanController,
    Progress,
    ScanController,
    diff_rows,
    render_table,
)
from gatewayscope.notebook.widgets import PlanReview, SnapshotView

__all__ = [
    "ConfirmationError",
    "PlanController",
    "PlanReview",
    "Progress",
    "ScanController",
    "SnapshotView",
    "diff_rows",
    "render_table",
]
