"""The notebook as a record, and a review that says what is true now: driven without a kernel, on the Bifrost
emulator (a real HTTP server in this process), with IPython's own display machinery where output is written.

* Every dry run and apply rewrites one static HTML output (same display id) under the review: plan id, the
  actions run, the tally line, the journal; hostile names are escaped in it.
* Every button clears the status line first: a refused confirmation's red sentence is gone while Apply runs;
  a new plan resets the progress and the tally of the previous one; a failed scan shows its error in the tabs.
* An empty config box falls back to ``$GATEWAYSCOPE_CONFIG``.
* The action list is paged: the review shows at most a page of checkboxes, whatever the plan's size.
* Messages name the notebook's widgets and parameters, never CLI flags; an empty plan says there is nothing
  to do; files go to the run directory; JupyterLab reads the widget-state default the notebooks ship.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.config import Config
from gatewayscope.errors import ConfigError
from gatewayscope.notebook import (
    ConfirmationError,
    PlanController,
    PlanReview,
    Progress,
    RunRecord,
    ScanController,
    SnapshotView,
    run_directory,
    write_lab_config,
)
from gatewayscope.remediate.apply import ActionResult, ApplyOptions
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_realistic, seed_small
from tests.helpers import auth_config, auth_config_file, emulator_with_auth

ADMIN, PASSWORD, PASSWORD_ENV = "admin", "Notebook-Record-Pw-3!", "GS_TEST_NOTEBOOK_RECORD_PW"
HTML_MIME, WIDGET_MIME = "text/html", "application/vnd.jupyter.widget-view+json"
#: a CLI flag as the command line's messages name them ("--config", "--include-suspected")
CLI_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[BifrostEmulator]:
    yield from emulator_with_auth(monkeypatch, ADMIN, PASSWORD, PASSWORD_ENV)


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real IPython shell (no history file), so ``display`` publishes as it does in a kernel."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config as TraitletsConfig

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    config = TraitletsConfig()
    config.HistoryManager.enabled = False
    instance = InteractiveShell.instance(config=config)
    try:
        yield instance
    finally:
        InteractiveShell.clear_instance()


def bifrost_config(emu: BifrostEmulator) -> Config:
    return auth_config(emu, ADMIN, PASSWORD_ENV)


def config_file(emu: BifrostEmulator, path: Path, name: str) -> Path:
    return auth_config_file(emu, path, name, ADMIN, PASSWORD_ENV)


def no_wait() -> ApplyOptions:
    return ApplyOptions(sleep=lambda _s: None)


def records(outputs: list[Any], display_id: str) -> list[Any]:
    """The outputs published under ``display_id`` (the record), in order."""
    return [o for o in outputs if o.transient.get("display_id") == display_id]


def texts(view: Any) -> list[str]:
    """Every message a view shows: its status, and (a plan review) the summary, plan view and tally."""
    names = ("status", "selection_summary", "plan_view", "tally")
    return [getattr(view, n).value for n in names if hasattr(view, n)]


# -- the record ----------------------------------------------------------------------------------------------


def test_every_dry_run_and_apply_rewrites_one_static_record(emu: BifrostEmulator, shell: Any,
                                                           tmp_path: Path) -> None:
    from IPython.utils.capture import capture_output

    seed_small(emu)
    journal = tmp_path / "run" / "remediate.journal.jsonl"
    plan = PlanController(ScanController(config=bifrost_config(emu)), journal_path=journal, include_deletes=True,
                          apply_options=no_wait())
    full = plan.build()
    review = PlanReview(plan)
    with capture_output() as shown:
        review.show()
        assert WIDGET_MIME in shown.outputs[0].data  # the widget first, then its record
        first = records(shown.outputs, review.record_display_id)
        assert [o.update for o in first] == [False] and "Nothing run yet" in first[0].data[HTML_MIME]

        review.dry_run_button.click()
        review.check()
        review.confirmation.value = "0000000000"  # refused: nothing ran, the record stays as it was
        review.apply_button.click()
        assert isinstance(review.last_error, ConfirmationError)
        after_refusal = len(records(shown.outputs, review.record_display_id))

        review.confirmation.value = full.id[:8]
        review.delete_confirmation.value = plan.required_delete_confirmation()
        review.apply_button.click()
        review.check()
    published = records(shown.outputs, review.record_display_id)
    assert after_refusal == 2
    assert [o.update for o in published] == [False, True, True]  # rewritten in place, never appended
    assert all(set(o.data) == {HTML_MIME, "text/plain"} for o in published)  # static HTML: no widget, no script
    dry, applied = (o.data[HTML_MIME] for o in published[1:])
    assert f"Dry run</b> of plan <code>{full.id}</code>" in dry
    assert f"Dry run, nothing was sent: {len(full.actions)} would-write." in dry
    assert applied.count("<li>") == 2 and dry.split("</li>")[0] in applied  # the dry run stays in the record
    tally = plan.tally_line()
    assert tally == f"{len(full.actions)} done, 0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"
    assert f"<code>{tally}</code>" in applied and f"Journal: <code>{journal}</code>" in applied
    assert f"plan-{full.id}.json" in applied
    assert all(f"<td>{a.id}</td>" in applied and f"<code>{a.subject}</code>" in applied for a in full.actions)
    assert "<script" not in applied
    assert plan.record_html() == applied


def test_the_record_escapes_what_a_gateway_named() -> None:
    hostile = "<img src=x onerror=alert(1)>\x1b[31m\u202e"
    run = RunRecord(dry_run=False, plan_id="p<b>", parent_plan_id="q&", at="now",
                    results=[ActionResult(action_id="a00001", kind="record_delete", target=hostile, subject=hostile,
                                          outcome="done")],
                    resumed=0, tally_line="1 done", journal=f"/runs/{hostile}/journal.jsonl")
    page = run.html()
    assert "<img" not in page and "\x1b" not in page and "\u202e" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "p&lt;b&gt;" in page and "q&amp;" in page


# -- stale messages ------------------------------------------------------------------------------------------


def test_every_action_clears_the_last_message_and_a_new_plan_resets_the_progress(emu: BifrostEmulator,
                                                                                   tmp_path: Path) -> None:
    seed_small(emu)
    plan = PlanController(ScanController(config=bifrost_config(emu)), journal_path=tmp_path / "j.jsonl",
                          apply_options=no_wait())
    review = PlanReview(plan)
    review.build_button.click()
    review.check()
    first = plan.require_plan()
    assert f"Plan {first.id} has {len(first.actions)} action(s)" in review.status.value
    review.dry_run_button.click()
    assert review.progress_label.value == f"dry run: {len(first.actions)} of {len(first.actions)} actions" \
        f"; last: {plan.progress.last.action_id} would-write"  # type: ignore[union-attr]

    # a new plan: the previous plan's dry run is no longer shown anywhere
    review.include_deletes.value = True
    review.build_button.click()
    review.check()
    second = plan.require_plan()
    assert second.id != first.id
    assert (review.progress_label.value, review.progress.value, review.tally.value) == ("", 0, "")
    assert "Dry run" not in review.status.value and second.id in review.status.value

    # a refused confirmation is red; the next Apply replaces it before anything is sent
    review.confirmation.value = "nonsense"
    review.apply_button.click()
    assert "#a00" in review.status.value and "nothing was written" in review.status.value
    seen: list[str] = []

    def watch(progress: Progress) -> None:
        seen.append(review.status.value)

    plan.on_progress(watch)
    review.confirmation.value = second.id[:8]
    review.delete_confirmation.value = plan.required_delete_confirmation()
    review.apply_button.click()
    review.check()
    assert seen and all("#a00" not in s and "nothing was written" not in s for s in seen)
    assert all(f"Applying plan {second.id}" in s for s in seen)
    assert f"Applied plan {second.id}: {plan.tally_line()}" in review.status.value

    # load plan: a wrong path is a red sentence, the right one replaces it
    review.plan_file.value = str(tmp_path / "missing.json")
    review.load_button.click()
    assert isinstance(review.last_error, Exception) and "#a00" in review.status.value
    assert "Build plan" in review.status.value and not CLI_FLAG.search(review.status.value)
    saved = PlanController(ScanController(config=bifrost_config(emu)))
    saved.build(only=("posture_fix",))
    review.plan_file.value = str(saved.save_selected(tmp_path / "plan.json"))
    review.load_button.click()
    review.check()
    assert "#a00" not in review.status.value and plan.require_plan().id in review.status.value
    assert review.progress_label.value == "" and review.tally.value == ""


def test_a_failed_scan_shows_its_error_in_the_tabs(emu: BifrostEmulator, tmp_path: Path) -> None:
    seed_small(emu)
    view = SnapshotView(ScanController(config=bifrost_config(emu)))
    assert all("press Scan" in w.value for w in view.sections.values())
    view.config_path.value = str(tmp_path / "<b>gone</b>.toml")
    view.scan_button.click()
    assert isinstance(view.last_error, ConfigError)
    for widget in view.sections.values():
        assert "The scan failed" in widget.value and "press Scan" not in widget.value
        assert "&lt;b&gt;gone&lt;/b&gt;.toml" in widget.value and "<b>gone" not in widget.value
        assert "config box" in widget.value and not CLI_FLAG.search(widget.value)

    # a good scan clears it; a failure after it says so above the previous snapshot
    view.config_path.value = str(config_file(emu, tmp_path / "ok.toml", "edge"))
    view.scan_button.click()
    view.check()
    assert not any("The scan failed" in w.value for w in view.sections.values())
    view.config_path.value = str(tmp_path / "other-missing.toml")
    view.scan_button.click()
    assert "The scan failed" in view.sections["pools"].value and "edge: the pools" in view.sections["pools"].value


# -- $GATEWAYSCOPE_CONFIG ------------------------------------------------------------------------------------


def test_an_empty_config_box_falls_back_to_the_environment(emu: BifrostEmulator, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seed_small(emu)
    given = config_file(emu, tmp_path / "given.toml", "given")
    from_env = config_file(emu, tmp_path / "env.toml", "from-env")
    monkeypatch.setenv("GATEWAYSCOPE_CONFIG", str(from_env))

    assert ScanController().target_names == ["from-env"]  # no config_path: the variable's file
    view = SnapshotView(ScanController(str(given)))
    assert str(from_env) in view.config_path.placeholder
    view.scan_button.click()
    view.check()
    assert view.controller.target_names == ["given"]
    view.config_path.value = ""  # cleared: the variable, not the last file, and not "no targets"
    view.scan_button.click()
    view.check()
    assert view.controller.target_names == ["from-env"]
    assert f"from {from_env} ($GATEWAYSCOPE_CONFIG)" in view.status.value

    monkeypatch.delenv("GATEWAYSCOPE_CONFIG")
    view.config_path.value = str(given)
    view.scan_button.click()
    view.config_path.value = ""
    view.scan_button.click()
    assert isinstance(view.last_error, ConfigError) and "No targets" in view.sections["leak"].value


# -- layout --------------------------------------------------------------------------------------------------


def test_a_hundred_actions_show_a_page_of_checkboxes_under_the_controls(emu: BifrostEmulator) -> None:
    import ipywidgets

    seed_realistic(emu)
    plan = PlanController(ScanController(config=bifrost_config(emu)), include_deletes=True)
    review = PlanReview(plan)
    review.build_button.click()
    review.check()
    actions = plan.actions
    assert len(actions) >= 100

    def shown() -> list[ipywidgets.Checkbox]:
        return [w for w in review.checkbox_box.children if isinstance(w, ipywidgets.Checkbox)]

    assert len(shown()) <= plan.page_size == 20
    assert [b.description.split()[0] for b in shown()] == [a.id for a in actions[:20]]
    assert f"of {len(actions)} shown, page 1 of {plan.page_count}" in review.page_label.value
    assert review.previous_button.disabled and not review.next_button.disabled
    # the controls come before the list
    order = list(review.root.children)
    assert order.index(review.tabs) > max(i for i, w in enumerate(order)
                                          if isinstance(w, ipywidgets.HBox) and review.apply_button in w.children)

    visited: set[str] = set()
    for _ in range(plan.page_count):  # every page, each within the page size
        boxes = shown()
        assert 0 < len(boxes) <= plan.page_size
        visited.update(b.description.split()[0] for b in boxes)
        review.next_button.click()
    assert visited == {a.id for a in actions} and review.next_button.disabled
    assert len(review.checkboxes) == len(actions)  # made once each, as their page was shown

    # a checkbox on a later page selects that action; a filter goes back to its first page
    review.checkboxes[actions[-1].id].value = False
    assert not plan.is_selected(actions[-1].id)
    review.kind_filter.value = ("record_delete",)
    deletes = [a for a in actions if a.kind == "record_delete"]
    assert plan.page == 0 and [b.description.split()[0] for b in shown()] == [a.id for a in deletes[:20]]
    review.deselect_shown.click()  # every delete the filter shows, on every page
    assert not any(plan.is_selected(a.id) for a in deletes)
    review.select_shown.click()
    assert all(plan.is_selected(a.id) for a in deletes)


# -- wording and the empty plan ------------------------------------------------------------------------------


def test_messages_name_widgets_not_flags_and_an_empty_plan_has_nothing_to_do(emu: BifrostEmulator,
                                                                              tmp_path: Path) -> None:
    seed_realistic(emu, orgs=4)
    plan = PlanController(ScanController(config=bifrost_config(emu)), journal_path=tmp_path / "j.jsonl",
                          apply_options=no_wait())
    review = PlanReview(plan)
    review.build_button.click()  # unreachable records are left out: the plan says how to include them
    review.check()
    assert "the 'include record deletes' box (include_deletes)" in html.unescape(review.plan_view.value)
    review.include_deletes.value = True
    review.build_button.click()
    assert "delete confirmation (the deletes box, confirm_deletes)" in review.plan_view.value
    for value in texts(review):
        assert not CLI_FLAG.search(value), value

    # apply everything, then plan again: nothing to do, said plainly, and no confirmation asked
    review.confirmation.value = plan.required_confirmation()
    review.delete_confirmation.value = plan.required_delete_confirmation()
    review.apply_button.click()
    review.check()
    review.include_deletes.value = False
    review.build_button.click()
    review.check()
    empty = plan.require_plan()
    assert empty.actions == []
    assert f"Plan {empty.id} has no action: nothing to do." in review.status.value
    assert "nothing to do" in review.selection_summary.value and "To apply, type" not in review.selection_summary.value
    review.dry_run_button.click()
    assert "nothing to dry-run" in review.status.value and ": ." not in review.status.value
    plan.dry_run()
    assert plan.tally_line() == "Dry run: no action selected, nothing to do."
    review.apply_button.click()
    assert "nothing to apply" in review.status.value
    for value in texts(review):
        assert not CLI_FLAG.search(value), value


# -- where files go, and JupyterLab ---------------------------------------------------------------------------


def test_the_run_directory_is_a_fresh_folder_per_run_unless_named(tmp_path: Path) -> None:
    import datetime as dt

    when = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert run_directory(now=when) == Path("gatewayscope-runs") / "20260304T030607Z"  # UTC, whatever the zone
    assert run_directory("  ", now=when) == run_directory(now=when)
    assert run_directory(tmp_path / "mine") == tmp_path / "mine"
    assert run_directory().parent == Path("gatewayscope-runs") and not Path(run_directory()).is_absolute()
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert "gatewayscope-runs/" in ignored  # ignored at any depth: notebooks/ included


def test_jupyterlab_saves_widget_state_with_the_shipped_default(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jupyterlab_server", reason="JupyterLab comes with the notebook extra")
    from jupyterlab_server.settings_utils import _get_overrides

    folder = tmp_path / "jupyter-config"
    (folder / "labconfig").mkdir(parents=True)
    (folder / "labconfig" / "default_setting_overrides.json").write_text(
        json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
                    "@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": False}}))
    assert write_lab_config(folder) == folder
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(folder))
    overrides, error = _get_overrides(str(tmp_path / "no-app-settings"))
    assert error == ""
    assert overrides["@jupyter-widgets/jupyterlab-manager:plugin"] == {"saveState": True}
    assert overrides["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}  # kept
