"""The notebook controllers and widgets, driven without a kernel: values are set and buttons clicked on the
ipywidgets objects, and the outcome is read back from the gateways themselves.

* The Bifrost emulator (a real HTTP server in this process) with the realistic and the small seed: the
  snapshot view's frames agree with the emulator's own accounting; a selection of actions is applied under
  its own plan id, only after the typed confirmations, and the emulator's records and request log show
  exactly what was applied; a wrong confirmation writes nothing, not even a journal line.
* The real rLLM gateway (unmodified, memory store) with real stragglers from ``run_rollouts``: the orphans
  are deleted and the live sessions keep every trace.
* gatewayscope's guarded gateway: the plan tombstones a suspected orphan before deleting it, so a late write
  for it is dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import ConfigError, PlanError
from gatewayscope.notebook import (
    ConfirmationError,
    PlanController,
    PlanReview,
    Progress,
    ScanController,
    SnapshotView,
)
from gatewayscope.remediate.apply import ApplyOptions
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import load_plan
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_realistic, seed_small
from gatewayscope.sandbox.rollouts import land_late_calls
from tests.helpers import auth_config, auth_config_file, emulator_with_auth, wait_for
from tests.helpers import gateway_sessions as sessions

ADMIN, PASSWORD, PASSWORD_ENV = "admin", "Notebook-Emulator-Pw-7!", "GS_TEST_NOTEBOOK_EMU_PW"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TAIL = "0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"
SAFE = {"drop_excess_requests": False, "enforce_auth_on_inference": True, "disable_content_logging": True}


@pytest.fixture
def emu(monkeypatch: pytest.MonkeyPatch) -> Iterator[BifrostEmulator]:
    """The emulator with admin auth on (the credentials come from the config's env var, as in production)."""
    yield from emulator_with_auth(monkeypatch, ADMIN, PASSWORD, PASSWORD_ENV)


def bifrost_config(emu: BifrostEmulator) -> Config:
    return auth_config(emu, ADMIN, PASSWORD_ENV)


def writes(emu: BifrostEmulator) -> list[tuple[str, str]]:
    """Every write the emulator received (method, path)."""
    return [(r.method, r.path) for r in emu.requests() if r.method in ("PUT", "POST", "DELETE")]


def pool_of(name: str, custom: bool, policy: Policy) -> int:
    return policy.custom_pool if custom or name.endswith("__anthropic") else policy.standard_pool


def over_policy(emu: BifrostEmulator, policy: Policy) -> list[str]:
    """Records the emulator still stores with more workers than their kind's pool."""
    state = emu.state_snapshot()
    return [row["name"] for row in state["records"]
            if row["concurrency"] > pool_of(row["name"], row["kind"] == "custom", policy)]


def no_wait() -> ApplyOptions:
    return ApplyOptions(sleep=lambda _s: None)


# -- the snapshot view ---------------------------------------------------------------------------------------


def test_snapshot_view_shows_what_the_emulator_parks(emu: BifrostEmulator, tmp_path: Path) -> None:
    seed = seed_realistic(emu)
    scan = ScanController(config=bifrost_config(emu))
    view = SnapshotView(scan)
    assert "No snapshot yet" in view.sections["leak"].value

    view.scan_button.click()
    view.check()

    pools = scan.pools_frame()
    assert int(pools["parked_workers"].sum()) == emu.parked_workers() == seed.parked_workers
    low, high = emu.boot_memory()
    boot = scan.boot_frame().row(0, named=True)
    assert (boot["stack_bytes_low"], boot["stack_bytes_high"]) == (low, high)
    assert boot["survives_restart"] == ("no" if low > boot["memory_limit_bytes"] else "at risk")
    records = scan.records_frame()
    assert records.height == seed.records
    # dead base URLs do not resolve; the unbuildable record is listed in status error
    assert int(records["unreachable"].sum()) == seed.dead_base_urls + seed.unknown
    assert scan.posture_frame().filter("drifted")["setting"].to_list() == list(SAFE)

    # the tabs went through the same templates as the CLI, and the charts are real pictures
    assert "boot survival" in view.sections["boot"].value and boot["survives_restart"] in view.sections["boot"].value
    assert "DRIFTED" in view.sections["posture"].value
    assert f"{seed.parked_workers - int(pools.filter(kind='standard')['parked_workers'][0]):,}" in \
        view.sections["pools"].value
    pictures = {name: bytes(image.value) for name, image in view.chart_images.items()}
    assert all(png.startswith(PNG_MAGIC) for png in pictures.values())
    assert pictures["boot_memory"] == scan.chart("boot_memory") and len(pictures["boot_memory"]) > 10_000
    assert pictures["orphan_ages"] == scan.chart("orphan_ages")  # "No orphan sessions." (no rLLM target here)

    # the target picker narrows the view to one target; a bad config file is a sentence, not a traceback
    view.target.value = "bifrost"
    assert "bifrost: the pools" in view.sections["pools"].value
    view.config_path.value = str(tmp_path / "missing.toml")
    view.scan_button.click()
    assert isinstance(view.last_error, ConfigError)
    assert "missing.toml" in view.status.value
    with pytest.raises(ConfigError):
        view.check()

    # export for a bug report: a snapshot that loads again, with the report, and no secret in it
    view.export_dir.value = str(tmp_path / "snap")
    view.export_button.click()
    view.check()
    folder = tmp_path / "snap"
    assert (folder / "manifest.json").exists() and (folder / "report.json").exists()
    assert PASSWORD not in "".join(p.read_text(errors="replace") for p in folder.glob("*.json"))
    offline = ScanController(config=bifrost_config(emu))
    offline.load_snapshot(folder)
    assert offline.counts() == scan.counts()


def test_the_controller_reads_findings_made_once_per_snapshot_and_policy(emu: BifrostEmulator) -> None:
    from gatewayscope.scan import scan_report

    seed_small(emu)
    scan = ScanController(config=bifrost_config(emu))
    with pytest.raises(Exception, match="No snapshot yet"):
        scan.findings()
    scan.scan()
    found = scan.findings()
    assert scan.findings() is found  # every frame and view of this snapshot reads these
    assert scan.pools_frame() is found.pools and scan.boot_frame() is found.boot
    assert scan.counts() == found.counts and scan.report() == scan_report(found)
    assert scan.records_frame().height == found.records.height
    scan.config.policy.custom_pool = 32  # a policy change is judged again, without reading the targets again
    again = scan.findings()
    assert again is not found and again.snapshot is found.snapshot and again.policy.custom_pool == 32
    assert again.counts["records_over_pool"] >= found.counts["records_over_pool"]
    scan.deleted_ids["some-session:0"] = 1.0
    assert scan.findings() is not again
    scan.scan()
    assert scan.findings().snapshot is scan.snapshot


def test_the_target_picker_takes_a_config_file(emu: BifrostEmulator, tmp_path: Path) -> None:
    seed_small(emu)
    view = SnapshotView(ScanController())
    view.scan_button.click()
    assert isinstance(view.last_error, ConfigError) and "No targets" in str(view.last_error)

    config = auth_config_file(emu, tmp_path / "gatewayscope.toml", "edge", ADMIN, PASSWORD_ENV)
    view.config_path.value = str(config)
    view.scan_button.click()
    view.check()
    assert view.controller.target_names == ["edge"]
    assert [label for label, _ in view.target.options] == ["all targets", "edge"]
    assert view.controller.counts()["records_over_pool"] == len(over_policy(emu, Policy()))
    assert "edge: the pools" in view.sections["pools"].value


# -- plan review and apply -----------------------------------------------------------------------------------


def test_a_selection_applies_under_its_own_id_only_after_the_typed_confirmations(emu: BifrostEmulator,
                                                                                 tmp_path: Path) -> None:
    seed_small(emu)
    policy = Policy()
    scan = ScanController(config=bifrost_config(emu))
    journal_path = tmp_path / "journal.jsonl"
    plan = PlanController(scan, journal_path=journal_path, apply_options=no_wait())
    review = PlanReview(plan)
    review.include_deletes.value = True
    review.build_button.click()
    review.check()
    full = plan.require_plan()
    kinds = {a.kind for a in full.actions}
    assert kinds == {"posture_fix", "pool_shrink", "record_delete"}
    deletes = [a for a in full.actions if a.kind == "record_delete"]
    shrinks = [a for a in full.actions if a.kind == "pool_shrink"]
    assert len(review.checkboxes) == len(full.actions)

    # keep the posture fix and the deletes: filter to the resizes and deselect what is shown
    review.kind_filter.value = ("pool_shrink",)
    assert [a.id for a in plan.visible_actions()] == [a.id for a in shrinks]
    review.deselect_shown.click()
    # and untick one delete by its checkbox
    kept_delete, dropped_delete = deletes[0], deletes[1]
    review.kind_filter.value = ()
    review.checkboxes[dropped_delete.id].value = False
    assert not plan.is_selected(dropped_delete.id)
    selected = plan.selected_plan()
    assert [a.id for a in selected.actions] == [a.id for a in full.actions
                                                 if a.kind != "pool_shrink" and a.id != dropped_delete.id]
    assert selected.id != full.id and selected.id == plan.selected_plan().id  # deterministic for a selection
    assert any(full.id in w for w in selected.warnings)
    diff = plan.diff_frame()
    assert set(diff["id"]) == {a.id for a in selected.actions}
    assert diff.filter(kind="posture_fix")["field"].to_list() == list(SAFE)
    assert selected.id[:8] in review.selection_summary.value

    # dry run: re-reads, writes nothing, journals nothing
    emu.clear_requests()
    review.dry_run_button.click()
    review.check()
    assert writes(emu) == [] and not journal_path.exists()
    assert plan.tally_line() == f"Dry run, nothing was sent: {len(selected.actions)} would-write."

    # wrong confirmations: a clear error each, and nothing written, not even the journal
    n_deletes = len(deletes) - 1
    for confirm, confirm_deletes, says in [
        ("", "", "at least the first 8 characters"),
        (full.id[:8], "", "does not match the plan being applied"),     # the id of the whole plan, not the selection
        (selected.id[:7], "", "at least the first 8 characters"),
        (selected.id[:8], str(n_deletes + 1), "not the number of deletes"),
        (selected.id[:8], "delete", "not the number of deletes"),
    ]:
        review.confirmation.value, review.delete_confirmation.value = confirm, confirm_deletes
        review.apply_button.click()
        assert isinstance(review.last_error, ConfirmationError), (confirm, confirm_deletes)
        assert says in str(review.last_error)
        with pytest.raises(ConfirmationError):
            plan.apply(confirm, confirm_deletes)
    assert writes(emu) == [] and not journal_path.exists()

    # the right ones: live progress, the tally, the emulator changed exactly as selected
    seen: list[Progress] = []
    plan.on_progress(seen.append)
    review.confirmation.value = selected.id[:12].upper()  # case and length beyond 8 do not matter
    review.delete_confirmation.value = str(n_deletes)
    review.apply_button.click()
    review.check()
    settled = [p.settled for p in seen]
    assert settled == sorted(settled) and settled[-1] == len(selected.actions)
    assert (review.progress.value, review.progress.max) == (len(selected.actions), len(selected.actions))
    assert plan.tally_line() == f"{len(selected.actions)} done, {TAIL}"
    assert plan.tally_line() in review.tally.value
    assert emu.client_config() | SAFE == emu.client_config()
    assert emu.get_record(kept_delete.subject) is None
    assert emu.get_record(dropped_delete.subject) is not None
    assert all(emu.get_record(a.subject).concurrency == a.before["concurrency"] for a in shrinks)  # type: ignore[union-attr]
    assert sorted(writes(emu)) == sorted([("PUT", "/api/config")] + [
        ("DELETE", f"/api/providers/{a.subject}") for a in deletes if a.id != dropped_delete.id])

    # the journal: where the selection came from, every outcome, and the applied plan kept beside it
    rows = plan.journal_rows(plan_id=selected.id)
    assert rows[0]["event"] == "selection" and full.id in rows[0]["detail"]
    assert sorted(r["action"] for r in rows if r["event"] == "outcome") == sorted(a.id for a in selected.actions)
    assert plan.applied_plan_path is not None and load_plan(plan.applied_plan_path).id == selected.id
    assert "journal" in review.journal.value and selected.id[:8] in review.journal.value

    # then everything: the whole plan under its own id; what the selection settled comes out already-done
    review.select_shown.click()  # no filter: every action
    assert plan.selected_plan().id == full.id
    emu.clear_requests()
    plan.apply(full.id[:8], str(len(deletes)))
    tally = plan.tally()
    assert tally["done"] == len(shrinks) + 1  # the resizes and the delete left out before
    assert tally["already-done"] == len(selected.actions)
    assert over_policy(emu, policy) == []
    assert ("PUT", "/api/config") not in writes(emu)

    # a plan is single-use
    emu.clear_requests()
    report = plan.apply(full.id[:8], str(len(deletes)))
    assert report.already_applied and writes(emu) == []


def test_without_the_delete_confirmation_the_deletes_stay_open_and_run_later(emu: BifrostEmulator,
                                                                              tmp_path: Path) -> None:
    seed_small(emu)
    scan = ScanController(config=bifrost_config(emu))
    plan = PlanController(scan, journal_path=tmp_path / "journal.jsonl", include_deletes=True,
                          apply_options=no_wait())
    full = plan.build()
    deletes = [a for a in full.actions if a.destructive]
    assert deletes and plan.required_delete_confirmation() == str(len(deletes))

    report = plan.apply(plan.required_confirmation(), "")
    assert {r.action_id for r in report.skipped} == {a.id for a in deletes}
    assert all(emu.get_record(a.subject) is not None for a in deletes)
    assert report.tally()["done"] == len(full.actions) - len(deletes)

    # the same plan again, with the deletes confirmed: it resumes, and only the deletes run
    emu.clear_requests()
    report = plan.apply(plan.required_confirmation(), plan.required_delete_confirmation())
    assert [r.action_id for r in report.results] == [a.id for a in deletes]
    assert len(report.previous) == len(full.actions) - len(deletes)
    assert all(emu.get_record(a.subject) is None for a in deletes)
    assert sorted(writes(emu)) == sorted(("DELETE", f"/api/providers/{a.subject}") for a in deletes)
    assert plan.tally_line() == f"{len(full.actions)} done, {TAIL}"


def test_a_plan_file_reviews_and_applies_under_its_own_id(emu: BifrostEmulator, tmp_path: Path) -> None:
    seed_small(emu)
    config = bifrost_config(emu)
    maker = PlanController(ScanController(config=config))
    maker.build(only=("posture_fix",))
    path = maker.save_selected(tmp_path / "plan.json")

    plan = PlanController(ScanController(config=config), journal_path=tmp_path / "journal.jsonl",
                          apply_options=no_wait())
    loaded = plan.load(path)
    assert plan.selected_plan().id == loaded.id == load_plan(path).id
    assert plan.scan.snapshot is None  # reviewing a plan file needs no scan
    plan.apply(loaded.id[:8])
    assert emu.client_config() | SAFE == emu.client_config()
    outcomes = Journal(tmp_path / "journal.jsonl").outcomes(loaded.id)
    assert [r["outcome"] for r in outcomes.values()] == ["done"]

    other = Config(targets=[Target(name="bifrost", kind="bifrost", url="http://127.0.0.1:9")], policy=Policy())
    with pytest.raises(ConfigError, match="made against"):
        PlanController(ScanController(config=other)).load(path)
    without_journal = PlanController(ScanController(config=config))
    without_journal.load(path)
    with pytest.raises(PlanError, match="needs a journal"):
        without_journal.apply(loaded.id[:8])


# -- the real rLLM gateway -----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_real_stragglers_are_deleted_and_live_sessions_keep_their_traces(rllm_gateway: Any, tmp_path: Path) -> None:
    from gatewayscope.sandbox.rollouts import run_rollouts

    gateway = rllm_gateway("memory")
    run = run_rollouts(gateway.url, n_rollouts=6, n_stragglers=3, n_live=2, live_calls=[1, 3])
    assert run.ok, run.to_dict()
    before = sessions(gateway.url)
    assert {s: before[s] for s in run.straggler_uids} == dict.fromkeys(run.straggler_uids, 1)

    # the rollouts' own deletes confirm the orphans (as 'plan --deleted-from' does): no idle wait, and the
    # live session with one fresh trace is not an orphan
    scan = ScanController(trace_stores=[gateway.url], deleted_ids=run.deletes)
    view = SnapshotView(scan)
    view.scan_button.click()
    view.check()
    orphans = scan.orphans_frame()
    assert sorted(orphans["session_id"]) == sorted(run.straggler_uids)
    assert set(orphans["confidence"]) == {"confirmed"}
    assert scan.counts()["orphans"] == len(run.straggler_uids)
    assert all(uid in view.orphans.value for uid in run.straggler_uids)

    plan = PlanController(scan, journal_path=tmp_path / "journal.jsonl", apply_options=no_wait())
    review = PlanReview(plan)
    review.build_button.click()
    review.check()
    assert sorted(a.subject for a in plan.actions) == sorted(run.straggler_uids)
    review.confirmation.value = plan.required_confirmation()
    review.delete_confirmation.value = plan.required_delete_confirmation()
    review.apply_button.click()
    review.check()

    after = sessions(gateway.url)
    assert not set(run.straggler_uids) & set(after)
    assert {s: after[s] for s in run.live_uids} == run.live_uids
    assert plan.tally_line().startswith(f"{len(run.straggler_uids)} done, 0 refused")
    outcomes = [r for r in plan.journal_rows() if r["event"] == "outcome"]
    assert sorted(r["subject"] for r in outcomes) == sorted(run.straggler_uids)
    scan.scan()
    assert scan.counts()["orphans"] == 0


@pytest.mark.e2e
def test_guarded_gateway_tombstones_a_suspected_orphan_as_it_deletes_it(guarded_gateway: Any,
                                                                          tmp_path: Path) -> None:
    gateway = guarded_gateway("memory")
    url = gateway.url
    body = {"model": "gatewayscope-stub", "messages": [{"role": "user", "content": "one call, then silence"}]}
    uid = "notebook-task:0"
    httpx.post(f"{url}/sessions/{uid}/v1/chat/completions", json=body, timeout=30).raise_for_status()
    wait_for("the one trace is stored", lambda: sessions(url).get(uid), lambda n: n == 1)

    scan = ScanController(trace_stores=[url], orphan_idle_seconds=0.2)
    wait_for("the session idles past the threshold", lambda: scan.scan() and scan.counts()["orphans"],
             lambda n: n == 1)
    plan = PlanController(scan, journal_path=tmp_path / "journal.jsonl", apply_options=no_wait())
    full = plan.build(include_suspected=True)
    # a suspected orphan may be live: no tombstone ahead of its delete, which records its own
    assert [(a.kind, a.subject) for a in full.actions] == [("session_delete", uid)]
    # without the delete confirmation nothing is written
    plan.apply(plan.required_confirmation())
    assert uid in sessions(url)
    assert httpx.get(f"{url}/guard/status", timeout=10).json()["tombstones"] == 0
    # with it, the delete runs while one more call of the session is still in flight at the worker: that call's
    # late write is dropped, so the orphan cannot come back
    late = land_late_calls(url, [uid], lambda: plan.apply(plan.required_confirmation(), "1"), settle_timeout=2.0)
    assert late.errors == [] and late.landed == []
    assert uid not in sessions(url)
    assert httpx.get(f"{url}/guard/status", timeout=10).json()["tombstones"] == 1
    wait_for("the late write is dropped", lambda: httpx.get(f"{url}/guard/status", timeout=10).json(),
             lambda s: s["dropped_writes"] >= 1)
    assert uid not in sessions(url)
    outcomes = [(r["kind"], r["outcome"]) for r in plan.journal_rows() if r["event"] == "outcome"]
    assert outcomes == [("session_delete", "done")]
