"""ipywidgets views bound to the controllers. No I/O here: every button calls one controller method.

* :class:`SnapshotView` (a :class:`ScanController`): the target picker (a config file, or rLLM and
  Bifrost addresses), a Scan button, the snapshot as tabs (summary, the leak, the pools, boot survival,
  the posture) rendered through the same jinja2 templates as the CLI, charts (parked workers and boot
  memory against the limit by kind, orphan ages, weight-version lag), and an export for bug reports.
* :class:`PlanReview` (a :class:`PlanController`): build options or a plan file, then the controls (Dry
  run, the typed confirmation and, for deletes, their own, Apply, a live progress bar fed by apply's
  ``on_result``, the tally line) above the action list: one checkbox per action, a page at a time, with
  kind and target filters; then the before/after diff, the plan as ``gatewayscope show`` renders it, the
  outcome and the journal. :meth:`PlanReview.show` also writes the record of every dry run and apply as
  a static HTML output under the widget, updated in place, so the saved notebook keeps it offline.

Both display like a widget (``display(view)`` or a view as the last expression of a cell) and keep the
last error in ``last_error``; :meth:`check` raises it, so an unattended run fails where a person would
have seen the red message. Every button first clears the status line, then writes its own outcome; every
message is worded for the notebook (:func:`~gatewayscope.notebook.wording.notebook_words`).
"""

from __future__ import annotations

import html
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gatewayscope.errors import GatewayscopeError
from gatewayscope.notebook.controllers import (
    CONFIG_ENV,
    MIN_CONFIRMATION_CHARS,
    SECTIONS,
    PlanController,
    Progress,
    ScanController,
    run_directory,
)
from gatewayscope.notebook.wording import notebook_words
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

_SECTION_TITLES = {"targets": "Targets", "leak": "The leak", "pools": "The pools", "boot": "Boot survival",
                   "posture": "The posture"}


def _message(text: str, *, error: bool = False) -> str:
    """``text`` (which may quote ids or a gateway's error) as an HTML line: worded for the notebook, escaped,
    control chars visible."""
    colour = "#a00" if error else "#333"
    return f'<div style="color:{colour};font-family:sans-serif;font-size:13px">{_text(notebook_words(text))}</div>'


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

    def _start(self, text: str) -> None:
        """A button was pressed: the previous outcome (a red refusal included) gives way to what runs now."""
        self.last_error = None
        self.status.value = _message(text)

    def check(self) -> None:
        """Raise the last error a button met (unattended notebooks call this after clicking)."""
        if self.last_error is not None:
            raise self.last_error

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.root._repr_mimebundle_(**kwargs)


class SnapshotView(_View):
    """Target picker + snapshot view, bound to a :class:`ScanController`.

    ``run_dir`` is the run directory the Export button saves under (``<run_dir>/snapshot``; default
    :func:`~gatewayscope.notebook.controllers.run_directory`).
    """

    def __init__(self, controller: ScanController, *, show_orphans: int = 20,
                 run_dir: str | Path | None = None) -> None:
        super().__init__()
        self.controller = controller
        self.show_orphans = show_orphans
        self.run_dir = run_directory(run_dir)
        #: the error of the last Scan that failed (shown in the tabs), empty after a good one
        self.scan_error = ""
        env = controller.env_config_path()
        self.config_path = widgets.Text(value=controller.config_path, description="config",
                                        placeholder=(f"empty: ${CONFIG_ENV} ({env})" if env else "gatewayscope.toml"),
                                        layout=widgets.Layout(width="60%"))
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
        self.export_dir = widgets.Text(value=str(self.run_dir / "snapshot"), description="export to",
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
        """The Scan button: take the targets from the picker (if changed; an empty config box falls back to
        ``$GATEWAYSCOPE_CONFIG``) and read them. A failure shows in the status line and in every tab."""
        self._start("Reading the targets ...")
        self.scan_error = ""
        try:
            wanted = (self.config_path.value.strip(), self._lines(self.trace_stores), self._lines(self.bifrost_urls))
            current = (self.controller.config_path, self.controller.trace_stores, self.controller.bifrost_urls)
            if wanted != current:  # a cleared config box falls back to $GATEWAYSCOPE_CONFIG (set_targets)
                self.controller.set_targets(wanted[0] or None, trace_stores=wanted[1], bifrost_urls=wanted[2])
            snapshot = self.controller.scan()
        except GatewayscopeError as err:
            self.scan_error = str(err)
            self._fail(err)
            self.refresh()
            return
        self.scan_error = ""
        self.refresh()
        down = [s.name for s in snapshot.targets if not s.up]
        source = self.controller.config_in_use
        origin = ""
        if source:
            origin = f" from {source}" + (f" (${CONFIG_ENV})" if not self.controller.config_path else "")
        self._ok(f"Read {len(snapshot.targets)} target(s){origin}" + (f"; down: {', '.join(down)}" if down else "")
                 + ".")

    def export(self) -> None:
        """The Export button: save the snapshot (and its report) for a bug report."""
        self._start("Saving the snapshot ...")
        try:
            folder = self.controller.export_snapshot(self.export_dir.value.strip() or self.run_dir / "snapshot")
        except (GatewayscopeError, OSError) as err:
            self._fail(err)
            return
        self._ok(f"Snapshot saved to {folder} (scan.load_snapshot({str(folder)!r}) analyses it again, offline).")

    def refresh(self) -> None:
        """Redraw the tabs from the controller's snapshot."""
        names = self.controller.target_names
        options = [("all targets", ""), *((n, n) for n in names)]
        if list(self.target.options) != options:
            keep = self.target.value if self.target.value in names else ""
            self.target.options = options
            self.target.value = keep
        failed = _message(f"The scan failed: {self.scan_error}", error=True) if self.scan_error else ""
        if self.controller.snapshot is None:
            for widget in self.sections.values():
                widget.value = failed or _message("No snapshot yet: press Scan.")
            self.orphans.value = self.records.value = ""
            for image in self.chart_images.values():
                image.value = b""
            return
        if failed:  # the targets the picker names were not read: say so above what an earlier scan read
            failed += _message("Below: the previous snapshot.")
        target = self.target.value or None
        for name, widget in self.sections.items():
            widget.value = failed + self.controller.html([name], target=target,
                                                         show_orphans=0 if name == "leak" else 20)
        self.orphans.value = self.controller.orphans_html(max_rows=self.show_orphans)
        self.records.value = self.controller.records_html(max_rows=50)
        for name, image in self.chart_images.items():
            image.value = self.controller.chart(name)


class PlanReview(_View):
    """Plan review with per-action selection, diff, dry run and a confirmed apply, bound to a PlanController.

    The controls (Dry run, the confirmations, Apply, the progress) sit above the action list, which shows
    one page of the controller's ``page_size`` actions at a time, so the review keeps its height whatever
    the number of actions. ``display`` publishes the record (tests pass their own; default: IPython's, when
    a kernel runs).
    """

    def __init__(self, controller: PlanController, *,
                 display: Callable[[str, str, bool], None] | None = None) -> None:
        super().__init__()
        self.controller = controller
        #: the display id of the record output :meth:`show` writes and every run updates
        self.record_display_id = f"gatewayscope-record-{uuid.uuid4().hex}"
        self._display = display or _ipython_display
        self._record_shown = False
        self._record_runs = -1
        self._plan_shown: str | None = None
        self.include_suspected = widgets.Checkbox(value=controller.include_suspected,
                                                  description="include suspected orphans", indent=False)
        self.include_deletes = widgets.Checkbox(value=controller.include_deletes,
                                                description="include record deletes", indent=False)
        self.build_button = widgets.Button(description="Build plan", icon="list", button_style="info")
        self.plan_file = widgets.Text(description="plan file", placeholder="a plan .json to review instead",
                                      layout=widgets.Layout(width="50%"))
        self.load_button = widgets.Button(description="Load plan", icon="folder-open")
        self.kind_filter = widgets.SelectMultiple(description="kinds", options=[], rows=5)
        self.target_filter = widgets.SelectMultiple(description="targets", options=[], rows=5)
        self.select_shown = widgets.Button(description="Select shown", icon="check-square",
                                           tooltip="select every action the filters show, on every page")
        self.deselect_shown = widgets.Button(description="Deselect shown", icon="square",
                                             tooltip="deselect every action the filters show, on every page")
        self.previous_button = widgets.Button(description="Previous", icon="chevron-left")
        self.next_button = widgets.Button(description="Next", icon="chevron-right")
        self.page_label = widgets.Label(value="")
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
                          widgets.HBox([self.previous_button, self.page_label, self.next_button]),
                          self.checkbox_box]),
            self.diff, self.plan_view, self.outcome, self.journal,
        ])
        for index, title in enumerate(("Actions", "Diff", "Plan", "Outcome", "Journal")):
            self.tabs.set_title(index, title)
        self.root = widgets.VBox([
            widgets.HBox([self.include_suspected, self.include_deletes, self.build_button]),
            widgets.HBox([self.plan_file, self.load_button]),
            self.selection_summary,
            widgets.HBox([self.dry_run_button, self.confirmation, self.delete_confirmation, self.apply_button]),
            widgets.HBox([self.progress, self.progress_label]),
            self.status, self.tally,
            self.tabs,
        ])
        self.build_button.on_click(lambda _b: self.build())
        self.load_button.on_click(lambda _b: self.load())
        self.select_shown.on_click(lambda _b: self._guard(controller.select_visible))
        self.deselect_shown.on_click(lambda _b: self._guard(controller.deselect_visible))
        self.previous_button.on_click(lambda _b: self._guard(controller.previous_page))
        self.next_button.on_click(lambda _b: self._guard(controller.next_page))
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

    # -- the record ----------------------------------------------------------------------------------

    def show(self) -> None:
        """Display the review, and under it the record of every dry run and apply (static HTML).

        The record is a plain HTML output with its own display id, rewritten in place after every run (a
        button, or a controller call from a later cell), so the saved notebook and its HTML export show
        what was done, offline, without widget state.
        """
        self._display_widget()
        self._record_shown = True
        self._record_runs = len(self.controller.runs)
        self._display(self.record_display_id, self.controller.record_html(), False)

    def _display_widget(self) -> None:
        try:
            from IPython.display import display
        except ImportError:  # pragma: no cover - IPython comes with ipywidgets
            return
        display(self)

    def _publish_record(self) -> None:
        runs = len(self.controller.runs)
        if self._record_shown and runs != self._record_runs:
            self._record_runs = runs
            self._display(self.record_display_id, self.controller.record_html(), True)

    # -- buttons -----------------------------------------------------------------------------------

    def build(self) -> None:
        """The Build button: a fresh plan from the scan controller's snapshot with the chosen options."""
        self._start("Building the plan ...")
        try:
            plan = self.controller.build(include_suspected=self.include_suspected.value,
                                         include_deletes=self.include_deletes.value)
        except GatewayscopeError as err:
            self._fail(err)
            return
        self._ok(self._plan_sentence(plan.id, len(plan.actions), bool(plan.warnings)))

    def load(self) -> None:
        """The Load plan button: review the plan file named in *plan file* instead."""
        path = self.plan_file.value.strip()
        self._start(f"Loading {path} ..." if path else "")
        if not path:
            self._fail(GatewayscopeError("Type the path of a plan file in the plan file box, then press Load plan."))
            return
        try:
            plan = self.controller.load(path)
        except GatewayscopeError as err:
            self._fail(err)
            return
        self._ok(self._plan_sentence(plan.id, len(plan.actions), bool(plan.warnings)))

    @staticmethod
    def _plan_sentence(plan_id: str, actions: int, warned: bool) -> str:
        if not actions:
            return (f"Plan {plan_id} has no action: nothing to do." +
                    (" The Plan tab says what was left out." if warned else ""))
        return (f"Plan {plan_id} has {actions} action(s); all are selected. Review them, dry run, then type the "
                "confirmation and Apply.")

    def dry_run(self) -> None:
        """The Dry run button: re-read every selected subject, write nothing."""
        self._start("Dry run: re-reading every selected subject ...")
        try:
            if not self.controller.selected_ids:
                self.controller.require_plan()
                self._ok("No action selected: nothing to dry-run.")
                return
            self.controller.dry_run()
        except GatewayscopeError as err:
            self._fail(err)
            return
        self._ok(self.controller.tally_line())

    def apply(self) -> None:
        """The Apply button: checks the typed confirmations, then applies the selected actions."""
        self._start("Checking the confirmation ...")
        try:
            self.controller.check_confirmation(self.confirmation.value, self.delete_confirmation.value or None)
            selected = self.controller.selected_plan()
            self._start(f"Applying plan {selected.id} ({len(selected.actions)} action(s)) ...")
            report = self.controller.apply(self.confirmation.value, self.delete_confirmation.value or None)
        except GatewayscopeError as err:
            self._fail(err)
            return
        if report.already_applied:
            self._ok("This plan was already applied (see the journal); nothing was sent.")
        else:
            self._ok(f"Applied plan {report.plan_id}: {self.controller.tally_line()}. Scan again to verify.")

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
        self.progress_label.value = terminal_safe(f"{what}: {progress.settled} of {progress.total} actions{last}")

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

    def _draw_progress(self) -> None:
        """The progress bar and label from the controller: empty until this plan's first run."""
        progress = self.controller.progress
        if self.controller.last_report is None and not progress.running:
            self.progress.max, self.progress.value, self.progress.bar_style = max(1, progress.total), 0, ""
            self.progress_label.value = ""
        else:
            self._on_progress(progress)

    def refresh(self) -> None:
        """Redraw from the controller: filters, the page of checkboxes, confirmation hints, diff, plan,
        progress, outcome, journal; and the record when a run was added."""
        controller = self.controller
        self._refreshing = True
        try:
            self._publish_record()
            plan = controller.plan
            plan_id = plan.id if plan is not None else None
            if plan_id != self._plan_shown:  # another plan: what was said about the previous one is stale
                self._plan_shown = plan_id
                self.tally.value = ""
                if plan is not None:
                    self._ok(self._plan_sentence(plan.id, len(plan.actions), bool(plan.warnings)))
            self._draw_progress()
            if controller.plan is None:
                self.checkboxes = {}
                self.checkbox_box.children = ()
                self.page_label.value = ""
                self.selection_summary.value = _message("No plan yet: press Build plan (or load a plan file).")
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
            page = controller.page_actions()
            boxes = [self._checkbox(a.id) for a in page]
            for action in page:
                self.checkboxes[action.id].value = controller.is_selected(action.id)
            self.checkbox_box.children = tuple(boxes)
            first = controller.page * controller.page_size
            self.page_label.value = (f"actions {first + 1}-{first + len(page)} of {len(visible)} shown, page "
                                     f"{controller.page + 1} of {controller.page_count}" if visible
                                     else "no action shown by these filters")
            self.previous_button.disabled = controller.page == 0
            self.next_button.disabled = controller.page >= controller.page_count - 1
            self.selection_summary.value = self._summary_html(len(visible))
            self.diff.value = controller.diff_html()
            self.plan_view.value = controller.plan_html()
            self.outcome.value = controller.outcome_html()
            self.journal.value = controller.journal_html()
            tally = _text(controller.tally_line())
            self.tally.value = (f'<div style="font-family:monospace;font-size:14px">{tally}</div>'
                                if controller.last_report is not None else "")
        finally:
            self._refreshing = False

    def _summary_html(self, shown: int) -> str:
        controller = self.controller
        selected = controller.selected_plan()
        style = '<div style="font-family:sans-serif;font-size:13px">'
        if not controller.actions:
            return f"{style}Plan <code>{_text(selected.id)}</code> has no action: nothing to do.</div>"
        counts = (f"{len(selected.actions)} of {len(controller.actions)} actions selected ({shown} shown by the "
                  "filters)")
        if not selected.actions:
            return f"{style}{counts}: nothing to apply; tick the actions to run.</div>"
        deletes = controller.deletes_selected()
        hint = (f"To apply, type <code>{_text(selected.id[:MIN_CONFIRMATION_CHARS])}</code> (at least "
                f"{MIN_CONFIRMATION_CHARS} characters of the plan id) in <i>confirm</i>")
        if deletes:
            hint += (f"; to run its {deletes} delete(s), type <code>{deletes}</code> in <i>deletes</i> "
                     "(empty: the deletes are skipped)")
        return f"{style}{counts}; plan id of the selection <code>{_text(selected.id)}</code>. {hint}.</div>"


def _ipython_display(display_id: str, html_text: str, update: bool) -> None:
    """Write (or rewrite in place) the HTML output ``display_id`` of the running kernel; nothing without one."""
    try:
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import HTML, display
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return
    if not InteractiveShell.initialized():  # a plain Python process (a script, a test): no notebook to write to
        return
    display(HTML(html_text), display_id=display_id, update=update)
