"""ipywidgets views bound to the controllers. No I/O here: every button calls one controller method.

* :class:`SnapshotView` (a :class:`ScanController`): the target picker (a config file, or rLLM and
  Bifrost addresses), a Scan button, the snapshot as tabs (summary, the leak, the pools, boot survival,
  the posture) rendered through the same jinja2 templates as the CLI, charts (parked workers and boot
  memory against the limit by kind, orphan ages, weight-version lag), and an export for bug reports.
* :class:`PlanReview` (a :class:`PlanController`): build options, kind and target filters, one checkbox
  per action, the before/after diff, the plan as ``gatewayscope show`` renders it, a Dry run button, and
  an Apply button that needs the typed confirmation (and, for deletes, their own), a live progress bar fed
  by apply's ``on_result``, the tally line, and the journal as a table.

Both display like a widget (``display(view)`` or a view as the last expression of a cell) and keep the
last error in ``last_error``; :meth:`check` raises it, so an unattended run fails where a person would
have seen the red message.
"""

from __future__ import annotations

import html
from typing import Any

from gatewayscope.errors import GatewayscopeError
from gatewayscope.notebook.controllers import (
    MIN_CONFIRMATION_CHARS,
    SECTIONS,
    PlanController,
    Progress,
    ScanController,
)
from gatewayscope.remediate.plan import ACTION_KINDS
from gatewayscope.remediate.review import before_after
from gatewayscope.render import terminal_safe

#: what to install for the views: ipywidgets is not a dependency of the core package
INSTALL_HINT = "pip install 'gatewayscope[notebook]'"

try:
    import ipywidgets as widgets
except ImportError as err:  # the views are the notebook extra; the controllers work without it
    raise ImportError(f"The notebook views (SnapshotView, PlanReview) need ipywidgets, which is not installed: "
                      f"{INSTALL_HINT}. The controllers (ScanController, PlanController) work without it.",
                      name="ipywidgets") from err

#: action checkboxes shown at once (the filters narrow the rest; Select shown acts on all of them)
MAX_CHECKBOXES = 100
_SECTION_TITLES = {"targets": "Targets", "leak": "The leak", "pools": "The pools", "boot": "Boot survival",
                   "posture": "The posture"}


def _message(text: str, *, error: bool = False) -> str:
    """``text`` (which may quote ids or a gateway's error) as an HTML line: escaped, control chars visible."""
    colour = "#a00" if error else "#333"
    return f'<div style="color:{colour};font-family:sans-serif;font-size:13px">{_text(text)}</div>'


def _text(text: str) -> str:
    """Any text for hand-built HTML: markup escaped, control and bidi characters shown as escapes."""
    return html.escape(terminal_safe(text))


class _View:
    """What both views share: a root widget, an error slot, and widget-like display."""

    root: widgets.Widget

    def __init__(self) -> None:
        self.last_error: Exception | None = None
        self.status = widgets.HTML(value="")

    def _fail(self, err: Exception) -> None:
        self.last_error = err
        self.status.value = _message(str(err), error=True)

    def _ok(self, text: str) -> None:
        self.last_error = None
        self.status.value = _message(text)

    def check(self) -> None:
        """Raise the last error a button met (unattended notebooks call this after clicking)."""
        if self.last_error is not None:
            raise self.last_error

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.root._repr_mimebundle_(**kwargs)


class SnapshotView(_View):
    """Target picker + snapshot view, bound to a :class:`ScanController`."""

    def __init__(self, controller: ScanController, *, show_orphans: int = 20) -> None:
        super().__init__()
        self.controller = controller
        self.show_orphans = show_orphans
        self.config_path = widgets.Text(value=controller.config_path, description="config",
                                        placeholder="gatewayscope.toml", layout=widgets.Layout(width="60%"))
        self.trace_stores = widgets.Textarea(value="\n".join(controller.trace_stores), description="rLLM",
                                             placeholder="one gateway URL or SQLite path per line",
                                             layout=widgets.Layout(width="60%", height="48px"))
        self.bifrost_urls = widgets.Textarea(value="\n".join(controller.bifrost_urls), description="Bifrost",
                                             placeholder="one management API URL per line",
                                             layout=widgets.Layout(width="60%", height="48px"))
        self.scan_button = widgets.Button(description="Scan", button_style="primary", icon="search")
        self.target = widgets.Dropdown(description="target", options=[("all targets", "")], value="")
        self.sections = {name: widgets.HTML() for name in SECTIONS}
        self.orphans = widgets.HTML()
        self.records = widgets.HTML()
        self.chart_images = {name: widgets.Image(format="png", layout=widgets.Layout(max_width="760px"))
                             for name in ("boot_memory", "orphan_ages", "weight_lag")}
        self.export_dir = widgets.Text(value="gatewayscope-snapshot", description="export to",
                                       layout=widgets.Layout(width="60%"))
        self.export_button = widgets.Button(description="Export snapshot", icon="download")
        self.tabs = widgets.Tab(children=[
            self.sections["targets"],
            widgets.VBox([self.sections["leak"], self.orphans]),
            widgets.VBox([self.sections["pools"], self.records]),
            self.sections["boot"],
            self.sections["posture"],
            widgets.VBox(list(self.chart_images.values())),
        ])
        for index, title in enumerate([*(_SECTION_TITLES[s] for s in SECTIONS), "Charts"]):
            self.tabs.set_title(index, title)
        self.root = widgets.VBox([
            widgets.HTML("<b>Targets</b>: a config file, or addresses (rLLM: URL or SQLite path; Bifrost: URL)"),
            self.config_path, self.trace_stores, self.bifrost_urls,
            widgets.HBox([self.scan_button, self.target]), self.status, self.tabs,
            widgets.HBox([self.export_dir, self.export_button]),
        ])
        self.scan_button.on_click(lambda _b: self.scan())
        self.export_button.on_click(lambda _b: self.export())
        self.target.observe(lambda _c: self.refresh(), names="value")
        controller.subscribe(lambda _c: self.refresh())
        self.refresh()

    def _lines(self, widget: widgets.Textarea) -> list[str]:
        return [line.strip() for line in str(widget.value).splitlines() if line.strip()]

    def scan(self) -> None:
        """The Scan button: take the targets from the picker (if changed) and read them."""
        try:
            wanted = (self.config_path.value.strip(), self._lines(self.trace_stores), self._lines(self.bifrost_urls))
            current = (self.controller.config_path, self.controller.trace_stores, self.controller.bifrost_urls)
            if wanted != current:
                self.controller.set_targets(wanted[0] or None, trace_stores=wanted[1], bifrost_urls=wanted[2])
            self.status.value = _message("Reading the targets ...")
            snapshot = self.controller.scan()
        except GatewayscopeError as err:
            self._fail(err)
            return
        down = [s.name for s in snapshot.targets if not s.up]
        self._ok(f"Read {len(snapshot.targets)} target(s)" + (f"; down: {', '.join(down)}" if down else "") + ".")

    def export(self) -> None:
        """The Export button: save the snapshot (and its report) for a bug report."""
        try:
            folder = self.controller.export_snapshot(self.export_dir.value.strip() or "gatewayscope-snapshot")
        except (GatewayscopeError, OSError) as err:
            self._fail(err)
            return
        self._ok(f"Snapshot saved to {folder} (load it with 'gatewayscope scan --load-snapshot {folder}').")

    def refresh(self) -> None:
        """Redraw the tabs from the controller's snapshot."""
        names = self.controller.target_names
        options = [("all targets", ""), *((n, n) for n in names)]
        if list(self.target.options) != options:
            keep = self.target.value if self.target.value in names else ""
            self.target.options = options
            self.target.value = keep
        if self.controller.snapshot is None:
            for widget in self.sections.values():
                widget.value = _message("No snapshot yet: press Scan.")
            self.orphans.value = self.records.value = ""
            for image in self.chart_images.values():
                image.value = b""
            return
        target = self.target.value or None
        for name, widget in self.sections.items():
            widget.value = self.controller.html([name], target=target, show_orphans=0 if name == "leak" else 20)
        self.orphans.value = self.controller.orphans_html(max_rows=self.show_orphans)
        self.records.value = self.controller.records_html(max_rows=50)
        for name, image in self.chart_images.items():
            image.value = self.controller.chart(name)


class PlanReview(_View):
    """Plan review with per-action selection, diff, dry run and a confirmed apply, bound to a PlanController."""

    def __init__(self, controller: PlanController, *, max_checkboxes: int = MAX_CHECKBOXES) -> None:
        super().__init__()
        self.controller = controller
        self.max_checkboxes = max_checkboxes
        self.include_suspected = widgets.Checkbox(value=controller.include_suspected,
                                                  description="include suspected orphans", indent=False)
        self.include_deletes = widgets.Checkbox(value=controller.include_deletes,
                                                description="include record deletes", indent=False)
        self.build_button = widgets.Button(description="Build plan", icon="list", button_style="info")
        self.kind_filter = widgets.SelectMultiple(description="kinds", options=[], rows=5)
        self.target_filter = widgets.SelectMultiple(description="targets", options=[], rows=5)
        self.select_shown = widgets.Button(description="Select shown", icon="check-square")
        self.deselect_shown = widgets.Button(description="Deselect shown", icon="square")
        self.checkbox_box = widgets.VBox()
        self.checkboxes: dict[str, widgets.Checkbox] = {}
        self.selection_summary = widgets.HTML()
        self.diff = widgets.HTML()
        self.plan_view = widgets.HTML()
        self.dry_run_button = widgets.Button(description="Dry run", icon="eye", button_style="info")
        self.confirmation = widgets.Text(description="confirm", placeholder="first 8+ characters of the plan id")
        self.delete_confirmation = widgets.Text(description="deletes", placeholder="number of deletes, or empty")
        self.apply_button = widgets.Button(description="Apply", icon="play", button_style="danger")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="progress", bar_style="")
        self.progress_label = widgets.Label(value="")
        self.tally = widgets.HTML()
        self.outcome = widgets.HTML()
        self.journal = widgets.HTML()
        self.tabs = widgets.Tab(children=[
            widgets.VBox([widgets.HBox([self.kind_filter, self.target_filter]),
                          widgets.HBox([self.select_shown, self.deselect_shown]),
                          self.selection_summary, self.checkbox_box]),
            self.diff, self.plan_view, self.outcome, self.journal,
        ])
        for index, title in enumerate(("Actions", "Diff", "Plan", "Outcome", "Journal")):
            self.tabs.set_title(index, title)
        self.root = widgets.VBox([
            widgets.HBox([self.include_suspected, self.include_deletes, self.build_button]),
            self.tabs,
            widgets.HBox([self.dry_run_button]),
            widgets.HBox([self.confirmation, self.delete_confirmation, self.apply_button]),
            widgets.HBox([self.progress, self.progress_label]),
            self.tally, self.status,
        ])
        self.build_button.on_click(lambda _b: self.build())
        self.select_shown.on_click(lambda _b: self._guard(controller.select_visible))
        self.deselect_shown.on_click(lambda _b: self._guard(controller.deselect_visible))
        self.kind_filter.observe(self._on_filter, names="value")
        self.target_filter.observe(self._on_filter, names="value")
        self.dry_run_button.on_click(lambda _b: self.dry_run())
        self.apply_button.on_click(lambda _b: self.apply())
        controller.subscribe(lambda _c: self.refresh())
        controller.on_progress(self._on_progress)
        self._refreshing = False
        self.refresh()

    def _guard(self, call: Any) -> None:
        try:
            call()
        except GatewayscopeError as err:
            self._fail(err)

    # -- buttons -----------------------------------------------------------------------------------

    def build(self) -> None:
        """The Build button: a fresh plan from the scan controller's snapshot with the chosen options."""
        try:
            plan = self.controller.build(include_suspected=self.include_suspected.value,
                                         include_deletes=self.include_deletes.value)
        except GatewayscopeError as err:
            self._fail(err)
            return
        self._ok(f"Plan {plan.id} has {len(plan.actions)} action(s); all are selected.")

    def dry_run(self) -> None:
        """The Dry run button: re-read every selected subject, write nothing."""
        try:
            self.controller.dry_run()
        except GatewayscopeError as err:
            self._fail(err)
            return
        self._ok("Dry run done: nothing was sent. " + self.controller.tally_line())

    def apply(self) -> None:
        """The Apply button: checks the typed confirmations, then applies the selected actions."""
        try:
            report = self.controller.apply(self.confirmation.value, self.delete_confirmation.value or None)
        except GatewayscopeError as err:
            self._fail(err)
            return
        if report.already_applied:
            self._ok("This plan was already applied (see the journal); nothing was sent.")
        else:
            self._ok(f"Applied plan {report.plan_id}. Scan again to verify.")

    def _on_filter(self, _change: Any) -> None:
        if self._refreshing:
            return
        self._guard(lambda: self.controller.set_filter(kinds=self.kind_filter.value, targets=self.target_filter.value))

    def _on_checkbox(self, action_id: str, change: Any) -> None:
        if self._refreshing:
            return
        self._guard(lambda: self.controller.set_selected(action_id, bool(change["new"])))

    def _on_progress(self, progress: Progress) -> None:
        self.progress.max = max(1, progress.total)
        self.progress.value = min(progress.settled, self.progress.max)
        self.progress.bar_style = "" if progress.running else "success"
        what = "dry run" if progress.dry_run else "apply"
        last = f"; last: {progress.last.action_id} {progress.last.outcome}" if progress.last else ""
        self.progress_label.value = f"{what}: {progress.settled} of {progress.total} actions{last}"

    # -- drawing -----------------------------------------------------------------------------------

    def _checkbox(self, action_id: str) -> widgets.Checkbox:
        box = self.checkboxes.get(action_id)
        if box is None:
            action = next(a for a in self.controller.actions if a.id == action_id)
            # a plain-text description (description_allow_html stays off): only the control chars to escape
            label = terminal_safe(f"{action.id} {action.kind} {action.target} {action.subject}: "
                                  f"{before_after(action)}")
            box = widgets.Checkbox(value=True, description=label, indent=False,
                                   layout=widgets.Layout(width="auto"),
                                   style={"description_width": "initial"})
            box.observe(lambda change, i=action_id: self._on_checkbox(i, change), names="value")
            self.checkboxes[action_id] = box
        return box

    def refresh(self) -> None:
        """Redraw from the controller: filters, checkboxes, diff, plan, confirmation hints, outcome, journal."""
        controller = self.controller
        self._refreshing = True
        try:
            if controller.plan is None:
                self.checkboxes = {}
                self.checkbox_box.children = ()
                self.selection_summary.value = _message("No plan yet: press Build plan.")
                self.diff.value = self.plan_view.value = ""
                self.outcome.value = controller.outcome_html()
                self.journal.value = controller.journal_html()
                return
            if set(self.checkboxes) - {a.id for a in controller.actions}:
                self.checkboxes = {}
            kinds = [k for k in ACTION_KINDS if k in controller.kinds()]
            if list(self.kind_filter.options) != kinds:
                self.kind_filter.options = kinds
            if list(self.target_filter.options) != controller.targets():
                self.target_filter.options = controller.targets()
            self.kind_filter.value = tuple(k for k in kinds if k in controller.kind_filter)
            self.target_filter.value = tuple(t for t in controller.targets() if t in controller.target_filter)
            visible = controller.visible_actions()
            boxes = [self._checkbox(a.id) for a in visible[:self.max_checkboxes]]
            for action in visible[:self.max_checkboxes]:
                self.checkboxes[action.id].value = controller.is_selected(action.id)
            more = len(visible) - len(boxes)
            tail = [widgets.HTML(_message(f"... and {more} more shown by the filters (Select shown and Deselect "
                                          "shown act on them too); narrow the filters to see them."))] if more else []
            self.checkbox_box.children = (*boxes, *tail)
            selected = controller.selected_plan()
            deletes = controller.deletes_selected()
            hint = (f"To apply, type <code>{_text(selected.id[:MIN_CONFIRMATION_CHARS])}</code> (at least "
                    f"{MIN_CONFIRMATION_CHARS} characters of the plan id) in <i>confirm</i>")
            if deletes:
                hint += (f"; to run its {deletes} delete(s), type <code>{deletes}</code> in <i>deletes</i> "
                         "(empty: the deletes are skipped)")
            self.selection_summary.value = (
                f'<div style="font-family:sans-serif;font-size:13px">{len(selected.actions)} of '
                f"{len(controller.actions)} actions selected ({len(visible)} shown); plan id of the selection "
                f"<code>{_text(selected.id)}</code>. {hint}.</div>")
            self.diff.value = controller.diff_html()
            self.plan_view.value = controller.plan_html()
            self.outcome.value = controller.outcome_html()
            self.journal.value = controller.journal_html()
            tally = _text(controller.tally_line())
            self.tally.value = (f'<div style="font-family:monospace;font-size:14px">{tally}</div>'
                                if controller.last_report is not None else "")
        finally:
            self._refreshing = False
