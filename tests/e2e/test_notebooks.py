"""Both notebooks, executed unattended by papermill on a real Jupyter kernel, against a running sandbox.

The sandbox (:class:`gatewayscope.sandbox.demo.Sandbox`) runs the stub worker, two real rLLM gateways with
real stragglers, and the Bifrost emulator as its own process. The triage notebook scans it and exports a
snapshot; the remediate notebook is given a plan made beforehand with the core (as CI or a runbook would with
``gatewayscope plan``), runs once as a dry run (no ``confirm``), then once with ``confirm`` set to the plan id's
prefix and ``confirm_deletes`` to the number of deletes. Both run in ``notebooks/``, as JupyterLab runs them,
with the default run directory. The assertions are on outcomes: the exported snapshot's findings, the
gateways' sessions, the emulator's records and posture, the journal and the applied plan in the run
directory (and nothing new in ``notebooks/`` for git to see), the widget state the executed notebook keeps,
and the static record of each run it keeps without widget state. The executed remediate notebook is
rendered to HTML and photographed in headless Chromium; the PNG, the HTML and the executed notebooks are
kept under ``artifacts/notebooks/``.
Everything runs once per rLLM gateway flavour (``module_gateway_flavor``): PyPI's 0.1.0 keeps its artifacts
there, upstream main under ``artifacts/notebooks/upstream-main/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.config import Policy, load_config
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import Plan, build_plan
from gatewayscope.scan import scan_report, take_snapshot
from gatewayscope.snapshot import Snapshot
from tests.e2e._support import N_STRAGGLERS, NOTEBOOKS, execute
from tests.helpers import gateway_sessions as sessions

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "notebooks"
RUNS = "gatewayscope-runs"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


# -- the sandbox and the runs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(module_gateway_flavor: Any) -> Path:
    """Where this flavour's executed notebooks, HTML and screenshot go."""
    return ARTIFACTS if not module_gateway_flavor.upstream else ARTIFACTS / module_gateway_flavor.name


def emulator_state(sandbox: Any) -> dict[str, Any]:
    return dict(httpx.get(f"{sandbox.run.bifrost_url}/_emulator/state", timeout=10).json())


def over_policy(state: dict[str, Any], policy: Policy) -> list[str]:
    """Records the emulator stores with more workers than their kind's pool."""
    def pool(row: dict[str, Any]) -> int:
        custom = row["kind"] == "custom" or row["name"].endswith("__anthropic")
        return policy.custom_pool if custom else policy.standard_pool
    return sorted(row["name"] for row in state["records"] if row["concurrency"] > pool(row))


def gateway_urls(sandbox: Any) -> dict[str, str]:
    """Every rLLM gateway of the sandbox (the unguarded and the guarded ones), by target name."""
    return dict(sandbox.run.gateway_urls())


@dataclass
class Triaged:
    notebook: Any
    snapshot_dir: Path


@dataclass
class Remediated:
    plan: Plan
    before: dict[str, Any]
    dry_run: Any
    dry_run_state: dict[str, Any]
    dry_run_sessions: dict[str, dict[str, int]]
    dry_run_wrote: list[str]
    notebook: Any
    notebook_path: Path
    journal: Path
    run_dir: Path
    git_status: tuple[str, str]
    beside_notebooks: tuple[list[str], list[str]]


@pytest.fixture(scope="module")
def triaged(sandbox: Any, artifacts: Path, kernel_name: str, tmp_path_factory: pytest.TempPathFactory) -> Triaged:
    out = tmp_path_factory.mktemp("triage")
    notebook = execute("triage.ipynb", artifacts / "triage.ipynb", kernel_name,
                       config_path=str(sandbox.run.config_path), export_dir=str(out / "snapshot"))
    return Triaged(notebook=notebook, snapshot_dir=out / "snapshot")


@pytest.fixture(scope="module")
def remediated(sandbox: Any, triaged: Triaged, artifacts: Path, kernel_name: str,
               tmp_path_factory: pytest.TempPathFactory) -> Remediated:
    """Plan with the core (as CI does with 'gatewayscope plan'), then the notebook: a dry run, a real apply."""
    work = tmp_path_factory.mktemp("remediate")
    config = load_config(sandbox.run.config_path)
    deleted = sandbox.run.deleted_ids()  # the sandbox's cleanup journal (docs/sandbox.md)
    plan = build_plan(take_snapshot(config, also_sessions=deleted), config, include_suspected=True,
                      include_deletes=True, deleted_ids=deleted)
    plan_path = plan.save(work / "plan.json")
    before = emulator_state(sandbox)
    # no journal_path, no run_dir: the defaults, as a person running the notebook in JupyterLab gets them
    common = {"config_path": str(sandbox.run.config_path), "plan_path": str(plan_path)}
    status_before, beside_before, runs_before = git_status_of_notebooks(), beside_notebooks(), run_dirs()
    try:
        dry_run = execute("remediate.ipynb", artifacts / "remediate-dry-run.ipynb", kernel_name, **common)
        dry_state = emulator_state(sandbox)
        dry_sessions = {name: sessions(url) for name, url in gateway_urls(sandbox).items()}
        dry_wrote = sorted(run_dirs() - runs_before)

        deletes = sum(1 for a in plan.actions if a.destructive)
        path = artifacts / "remediate.ipynb"
        notebook = execute("remediate.ipynb", path, kernel_name, **common, confirm=plan.id[:12],
                           confirm_deletes=str(deletes))
        status_after, beside_after = git_status_of_notebooks(), beside_notebooks()
        created = sorted(run_dirs() - runs_before)
        assert len(created) == 1, created  # the apply's run directory, and only that
        run_dir = NOTEBOOKS / RUNS / created[0]
        kept = work / "run"  # the run's files outlive the clean-up of notebooks/gatewayscope-runs/
        shutil.copytree(run_dir, kept)
    finally:
        for name in run_dirs() - runs_before:  # only what these runs made
            shutil.rmtree(NOTEBOOKS / RUNS / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            (NOTEBOOKS / RUNS).rmdir()  # only if empty: someone else's runs stay
    return Remediated(plan=plan, before=before, dry_run=dry_run, dry_run_state=dry_state,
                      dry_run_sessions=dry_sessions, dry_run_wrote=dry_wrote, notebook=notebook,
                      notebook_path=path, journal=kept / "remediate.journal.jsonl", run_dir=run_dir,
                      git_status=(status_before, status_after), beside_notebooks=(beside_before, beside_after))


def git_status_of_notebooks() -> str:
    """What git sees changed under notebooks/ (the run directories are ignored)."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "notebooks/"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def beside_notebooks() -> list[str]:
    """The files and folders next to the notebooks, the run directories' folder left out."""
    return sorted(p.name for p in NOTEBOOKS.iterdir() if p.name != RUNS)


def run_dirs() -> set[str]:
    """The run directories under notebooks/gatewayscope-runs/."""
    folder = NOTEBOOKS / RUNS
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def outputs_html(cell: Any) -> str:
    """The text/html of a cell's outputs (what a notebook shows without any widget state)."""
    return "".join(str(o.get("data", {}).get("text/html", "")) for o in cell.get("outputs", []))


def expected_tally(remediated: Remediated) -> str:
    """The tally line of the apply, from its journal's closing record."""
    journal = Journal(remediated.journal)
    end = next(r for r in journal.read() if r.get("event") == "apply-end" and r.get("plan_id") == remediated.plan.id)
    counts = end["tally"]
    assert set(counts) >= {"done", "refused", "unconfirmed", "gone", "stale", "already-done"}
    return (f"{counts['done']} done, {counts['refused']} refused, {counts['unconfirmed']} unconfirmed, "
            f"{counts['gone']} gone, {counts['stale']} stale, {counts['already-done']} already-done")


def review_cell(notebook: Any) -> Any:
    return next(c for c in notebook.cells if c.cell_type == "code" and "review.show()" in c.source)


def stream_text(notebook: Any) -> str:
    return "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def widget_models(notebook: Any) -> list[dict[str, Any]]:
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return list(state.values())


# -- triage --------------------------------------------------------------------------------------------------


def test_triage_finds_the_real_orphans_and_exports_a_snapshot(sandbox: Any, triaged: Triaged) -> None:
    snapshot = Snapshot.load(triaged.snapshot_dir)
    config = load_config(sandbox.run.config_path)
    report = scan_report(snapshot, config)
    assert json.loads((triaged.snapshot_dir / "report.json").read_text())["targets"] == \
        json.loads(json.dumps(report["targets"], default=str))
    by_name = {t["name"]: t for t in report["targets"]}
    assert all(t["up"] for t in report["targets"]), report
    for name, expected in sandbox.run.expected_orphans.items():
        found = sorted(s["session_id"] for s in by_name[name]["orphan_sessions"])
        assert found == sorted(expected), name  # the stragglers, and no live session
        assert expected and len(expected) <= N_STRAGGLERS  # the guarded SQLite store: only those before its guard
    bifrost = by_name["bifrost"]
    state = emulator_state(sandbox)
    assert sum(bifrost["parked_workers"].values()) == state["totals"]["parked_workers"]
    assert sum(bifrost["records_over_pool"].values()) == len(over_policy(state, config.policy))
    assert bifrost["posture_drift"] == ["drop_excess_requests", "enforce_auth_on_inference",
                                        "disable_content_logging"]
    # the notebook showed the same: its snapshot view's widgets kept the sections it rendered
    html = " ".join(str(m["state"].get("value", "")) for m in widget_models(triaged.notebook)
                    if m["model_name"] == "HTMLModel")
    assert all(uid in html for uids in sandbox.run.expected_orphans.values() for uid in uids)
    assert "DRIFTED" in html
    # boot survival: the measured prediction beside the band, and it is the emulator's boot memory within 5 %
    memory = bifrost["boot_memory"]
    assert memory["model"] == "measured" and memory["measured"]["trusted"] is True
    boot = state["runtime"]["boot_memory_bytes"]
    assert abs(memory["predicted_bytes"] - boot) <= 0.05 * boot
    shown = " ".join(str(output.get("data", {}).get("text/html", "")) for cell in triaged.notebook.cells
                     if cell.cell_type == "code" for output in cell.get("outputs", []))
    assert "Measured: the gateway holds" in shown and 'class="boot measured"' in shown


# -- remediate -----------------------------------------------------------------------------------------------


def test_remediate_dry_run_then_apply_with_the_confirmation_parameter(sandbox: Any, remediated: Remediated) -> None:
    plan = remediated.plan
    config = load_config(sandbox.run.config_path)
    kinds = {a.kind for a in plan.actions}
    # the guarded SQLite store's orphans were deleted before its guard: their tombstones are backfilled
    assert kinds == {"session_delete", "posture_fix", "pool_shrink", "record_delete", "tombstone_backfill"}
    planned_sessions = sorted(a.subject for a in plan.actions if a.kind == "session_delete")
    assert planned_sessions == sorted(u for uids in sandbox.run.expected_orphans.values() for u in uids)

    # the dry run wrote nothing: same records, same posture, same sessions, no journal line
    assert remediated.dry_run_state["records"] == remediated.before["records"]
    assert remediated.dry_run_state["posture"] == remediated.before["posture"]
    for name, found in remediated.dry_run_sessions.items():
        assert set(sandbox.run.expected_orphans.get(name, [])) <= set(found)
    assert f"Dry run, nothing was sent: {len(plan.actions)} would-write." in stream_text(remediated.dry_run)
    assert f"set confirm = '{plan.id[:8]}'" in stream_text(remediated.dry_run)
    assert remediated.dry_run_wrote == []  # not even the run directory
    dry_record = outputs_html(review_cell(remediated.dry_run))
    assert f"Dry run</b> of plan <code>{plan.id}</code>" in dry_record and "Apply</b>" not in dry_record

    # the apply: orphans gone (a fresh scan), live sessions intact, pools at policy, posture fixed
    snapshot = take_snapshot(config)
    report = scan_report(snapshot, config)
    for target in report["targets"]:
        assert target["up"], target
        if target["kind"] == "rllm":
            assert target["orphans"] == {"confirmed": 0, "suspected": 0}, target["name"]
    for name, url in gateway_urls(sandbox).items():
        now = sessions(url)
        assert not set(sandbox.run.expected_orphans.get(name, [])) & set(now)
        assert {s: now[s] for s in sandbox.run.live_sessions[name]} == sandbox.run.live_sessions[name]
    state = emulator_state(sandbox)
    assert over_policy(state, config.policy) == []
    assert state["posture"] == {"drop_excess_requests": False, "enforce_auth_on_inference": True,
                                "disable_content_logging": True}
    deleted = {a.subject for a in plan.actions if a.kind == "record_delete"}
    assert deleted and not deleted & {row["name"] for row in state["records"]}
    assert state["totals"]["parked_workers"] < remediated.before["totals"]["parked_workers"]

    # the journal: one outcome per action, all done (a backfill may find its tombstones there already), and
    # the closing tally
    journal = Journal(remediated.journal)
    outcomes = journal.outcomes(plan.id)
    assert sorted(outcomes) == sorted(a.id for a in plan.actions)
    by_kind = {a.id: a.kind for a in plan.actions}
    assert {r["outcome"] for i, r in outcomes.items() if by_kind[i] != "tombstone_backfill"} == {"done"}
    assert {r["outcome"] for i, r in outcomes.items() if by_kind[i] == "tombstone_backfill"} <= \
        {"done", "already-done"}
    ends = [r for r in journal.read() if r.get("event") == "apply-end" and r.get("plan_id") == plan.id]
    assert [e["tally"]["done"] + e["tally"]["already-done"] for e in ends] == [len(plan.actions)]
    tally = expected_tally(remediated)

    # the files went to the default run directory, ./gatewayscope-runs/<UTC time>/ under the notebook's folder:
    # nothing new next to the notebooks, nothing new for git
    # the journal's lock, and the per-plan apply lock beside the plan file (every apply of it finds it there)
    locks = {"remediate.journal.jsonl.lock", f".gatewayscope-apply-{plan.id}.lock"}
    written = {p.name for p in remediated.journal.parent.iterdir()} - locks
    assert written == {f"plan-{plan.id}.json", "remediate.journal.jsonl"}
    assert remediated.run_dir.name.endswith("Z") and remediated.run_dir.parent == NOTEBOOKS / RUNS
    assert remediated.git_status[1] == remediated.git_status[0]
    assert remediated.beside_notebooks[1] == remediated.beside_notebooks[0]

    # the executed notebook is the record: the tally, the verification, the live progress bar at its end
    text = stream_text(remediated.notebook)
    assert tally in text
    # and, under the review, the static record the later cells' runs rewrote: the dry run, then the apply
    record = outputs_html(review_cell(remediated.notebook))
    journal_path = f"{RUNS}/{remediated.run_dir.name}/remediate.journal.jsonl"
    assert record.count("<li>") == 2 and record.index("Dry run</b>") < record.index("Apply</b>")
    assert f"<code>{tally}</code>" in record and f"<code>{journal_path}</code>" in record
    assert all(f"<td>{a.id}</td>" in record for a in plan.actions)
    models = widget_models(remediated.notebook)
    bars = [m["state"] for m in models if m["model_name"] == "IntProgressModel"]
    assert [(b["value"], b["max"]) for b in bars] == [(len(plan.actions), len(plan.actions))]
    assert any(tally in str(m["state"].get("value", "")) for m in models
               if m["model_name"] == "HTMLModel")


# -- the screenshot ------------------------------------------------------------------------------------------


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("headless Chromium is needed for the notebook screenshot (.ci/run installs 'chromium')")
    pytest.skip("headless Chromium not installed (apt-get install chromium)")


def run_chromium(args: list[str], profile: Path, timeout: float = 120.0) -> str:
    """Run headless Chromium once (own process group, fresh profile); return its stdout. Leaves nothing behind."""
    argv = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # helpers (zygote, renderers) go with it
        proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def test_screenshot_of_the_executed_notebook_shows_the_plan_and_the_tally(remediated: Remediated, artifacts: Path,
                                                                         tmp_path: Path) -> None:
    from nbconvert import HTMLExporter
    from PIL import Image

    notebook = remediated.notebook
    plan = remediated.plan
    assert WIDGET_STATE in notebook.metadata.get("widgets", {}), "papermill must save the widget state"
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(notebook)
    assert WIDGET_STATE in body  # the widget state travels with the page
    page = artifacts / "remediate.html"
    page.write_text(body)

    dom = run_chromium(["--virtual-time-budget=5000", "--dump-dom", page.as_uri()], tmp_path / "profile-dom")
    assert '<table class="actions">' in dom  # plan.html.j2's action table, as 'gatewayscope show' renders it
    assert all(f"<td>{a.id}</td>" in dom for a in plan.actions)
    tally = expected_tally(remediated)
    assert tally in dom  # the tally

    # offline and without widget state, the export still shows the record of what was done
    import copy

    bare = copy.deepcopy(notebook)
    bare.metadata.pop("widgets")
    bare_body, _ = HTMLExporter(template_name="lab").from_notebook_node(bare)
    assert WIDGET_STATE not in bare_body
    assert "Record of this notebook" in bare_body and f"<code>{tally}</code>" in bare_body

    shot = artifacts / "remediate.png"
    shot.unlink(missing_ok=True)
    run_chromium(["--hide-scrollbars", "--window-size=1280,7000", "--virtual-time-budget=5000",
                  f"--screenshot={shot}", page.as_uri()], tmp_path / "profile-shot")
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(shot) as image:
        assert image.size == (1280, 7000)
        colours = image.convert("RGB").resize((320, 1750)).getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 100, "the screenshot is (almost) blank"
