"""remediate.ipynb driven by hand in a real JupyterLab, in a real browser, against a running sandbox.

JupyterLab runs from this environment (the venv's ``jupyterlab``) on a free loopback port with a token (and
``--allow-root`` when we are root), serving a temporary copy of ``notebooks/`` (the repository's folder is
never written) with ``$GATEWAYSCOPE_CONFIG`` naming the sandbox's config, and with the lab settings the
notebooks ship (:func:`gatewayscope.notebook.lab.write_lab_config`: widget state saved with the notebook).
Debian's Chromium (``/usr/bin/chromium``; never a browser Playwright downloads) is driven headless through
Playwright's Python API, the way a person works the notebook: Run All Cells, tick the options, Build plan,
read the plan id and the number of deletes off the page, type them, Apply, save, reload the page, and
reopen the notebook after its kernel was shut down (a new kernel: the review is drawn from the widget state
the file saved). The assertions are on outcomes: the gateways lost their
orphans and kept their live sessions, the journal closed the plan, the saved ``.ipynb`` holds the tally
line in its record output and in its widget state, and no page ever says "Error displaying widget".

A screenshot of every step goes to ``artifacts/browser/`` (CI keeps ``artifacts/``). Without Chromium or
Playwright the test skips and says why; in CI (``CI=true``) it fails instead. It runs on PyPI's rLLM gateway
only: the notebooks' runs on both gateway flavours are ``tests/e2e/test_notebooks.py``'s.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from gatewayscope.notebook.controllers import RUNS_FOLDER
from gatewayscope.remediate.journal import FINAL_OUTCOMES, Journal
from gatewayscope.sandbox.processes import ManagedProcess, free_port
from tests.e2e._support import NOTEBOOKS
from tests.helpers import PYPI, gateway_sessions

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("module_gateway_flavor", [PYPI], indirect=True)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
NOTEBOOK = "remediate.ipynb"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
#: apply's tally line (``ApplyReport.tally_line``)
TALLY = r"(\d+) done, (\d+) refused, (\d+) unconfirmed, (\d+) gone, (\d+) stale, (\d+) already-done"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_ERROR = "Error displaying widget"
#: one step in the page (a click and what it sets off), and Run All Cells (a scan, a plan, a dry run, a scan)
STEP_MS, RUN_ALL_MS = 90_000, 300_000
#: Apply: every action re-reads its subject, then writes
APPLY_MS = 240_000
#: JupyterLab settings the test adds to the notebooks' own: every cell kept in the page (no windowing), so a
#: check of the page sees every output, and no news toast over the notebook
TEST_LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}
#: JavaScript: the state of the notebook's code cells, from their prompts ("[*]:" runs, "[3]:" ran) and
#: their tracebacks (JupyterLab's own class names, stable across 4.x)
CELLS_STATE = """() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
  const errors = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
    .filter(e => e.getAttribute('data-mime-type') === 'application/vnd.jupyter.stderr'
                 && /Traceback/.test(e.textContent))
    .map(e => e.textContent.slice(-2000));
  return {total: prompts.length,
          ran: prompts.filter(p => /^\\[\\d+\\]:$/.test(p.textContent.trim())).length,
          busy: prompts.filter(p => p.textContent.includes('*')).length,
          errors};
}"""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """A skip that says why; in CI a failure: CI installs what this test needs (.ci/run, the dev extra)."""
    if in_ci():
        pytest.fail(f"{reason} (CI must run the browser test)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's Chromium (or one on PATH), checked before the sandbox starts, with Playwright and JupyterLab.

    The browser Playwright launches is this one, never one it downloads.
    """
    for module, what in (("playwright.sync_api", "Playwright (pip install playwright)"),
                         ("jupyterlab", "JupyterLab (pip install jupyterlab)")):
        try:
            importlib.import_module(module)
        except ImportError:
            missing(f"{what} not installed; the dev extra has it")
    for candidate in CHROMIUM_CANDIDATES:
        found = candidate if os.path.isabs(candidate) and os.access(candidate, os.X_OK) else shutil.which(candidate)
        if found:
            return found
    missing("Chromium not installed (apt-get install chromium; .ci/run installs it)")


# -- JupyterLab ----------------------------------------------------------------------------------------------


@dataclass
class Lab:
    url: str
    token: str
    root: Path  # the copy of notebooks/ it serves
    process: ManagedProcess

    def api(self, method: str, path: str) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", headers={"Authorization": f"token {self.token}"},
                             timeout=30)

    def page_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}"


def lab_settings(folder: Path) -> Path:
    """The Jupyter config folder JupyterLab gets on ``JUPYTER_CONFIG_PATH``: the notebooks' settings + ours."""
    from gatewayscope.notebook.lab import OVERRIDES_FILE, write_lab_config

    path = folder / OVERRIDES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(TEST_LAB_SETTINGS))
    return write_lab_config(folder)  # keeps ours, adds the notebooks' (widget state saved)


def processes_mentioning(text: str) -> list[int]:
    """Pids of the processes whose command line contains ``text`` (the kernels of our runtime folder)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def lab(sandbox: Any, tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab from this venv on a free loopback port, on a copy of notebooks/ and the sandbox's config."""
    root = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "gatewayscope-runs"))
    home = tmp_path / "jupyter"
    runtime = home / "runtime"
    for folder in ("runtime", "config", "data", "settings", "workspaces", "ipython"):
        (home / folder).mkdir(parents=True)
    venv_bin = str(Path(sys.executable).parent)
    env = {
        "GATEWAYSCOPE_CONFIG": str(sandbox.run.config_path),
        # the kernelspec 'python3' runs a bare 'python': this venv's comes first
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_CONFIG_PATH": str(lab_settings(home / "labconfig")),
        "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(runtime),
        "IPYTHONDIR": str(home / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
    }
    token = secrets.token_hex(16)
    process: ManagedProcess | None = None
    url, last = "", ""
    for _attempt in range(3):  # a free port can be taken between picking and binding it
        port = free_port()
        argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={home / 'settings'}",
                f"--LabApp.workspaces_dir={home / 'workspaces'}", "--LabApp.extension_manager=readonly"]
        if os.geteuid() == 0:
            argv.append("--allow-root")
        process = ManagedProcess("jupyterlab", argv, env=env, cwd=root)
        url = f"http://127.0.0.1:{port}"
        try:
            process.wait_http(f"{url}/api/status?token={token}", timeout=90)
            break
        except RuntimeError as err:  # wait_http stopped it
            last = str(err)
            process = None
    if process is None:
        pytest.fail(f"JupyterLab did not start: {last}")
    server = Lab(url=url, token=token, root=root, process=process)
    try:
        yield server
    finally:
        with contextlib.suppress(httpx.HTTPError):
            for kernel in server.api("GET", "/api/kernels").json():
                server.api("DELETE", f"/api/kernels/{kernel['id']}")
        process.stop(grace=15)
        for pid in processes_mentioning(str(runtime)):  # a kernel the server did not take down
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while processes_mentioning(str(runtime)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not processes_mentioning(str(runtime)), "a kernel outlived JupyterLab"


# -- the page ------------------------------------------------------------------------------------------------


class Steps:
    """Numbered screenshots of the page under artifacts/browser/."""

    def __init__(self, page: Any, folder: Path) -> None:
        self.page, self.folder, self.count = page, folder, 0
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.png"):
            old.unlink()

    def shot(self, name: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        self.page.screenshot(path=str(path))
        return path


def open_notebook(page: Any, lab: Lab) -> None:
    """Open (or reload) the notebook and wait for its kernel to be idle."""
    page.goto(lab.page_url(NOTEBOOK), wait_until="domcontentloaded")
    page.locator(".jp-Notebook").first.wait_for(timeout=STEP_MS)
    page.get_by_text(re.compile(r"\| Idle$")).first.wait_for(timeout=STEP_MS)


def run_all(page: Any, expected_cells: int) -> None:
    """Run > Run All Cells, then wait (bounded) until every code cell ran; fail on a cell's traceback."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    deadline = time.monotonic() + RUN_ALL_MS / 1000
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = page.evaluate(CELLS_STATE)
        if state["errors"]:
            pytest.fail(f"a cell failed in the browser:\n{state['errors'][0]}")
        if state["total"] == expected_cells and state["ran"] == expected_cells and not state["busy"]:
            return
        page.wait_for_timeout(500)
    pytest.fail(f"Run All Cells did not finish within {RUN_ALL_MS / 1000:.0f} s: {state}")


def assert_no_widget_error(page: Any, where: str) -> None:
    body = page.locator("body").inner_text()
    assert WIDGET_ERROR not in body, f"{where}: {body[body.find(WIDGET_ERROR):][:300]}"
    assert WIDGET_ERROR not in page.content(), where  # also in outputs that are not shown


def review_drawn(page: Any, where: str) -> None:
    """Wait (bounded) until the review widget is drawn or a widget failed to draw; fail on the latter."""
    from playwright.sync_api import expect

    apply_button = page.get_by_role("button", name="Apply")
    expect(apply_button.or_(page.get_by_text(WIDGET_ERROR)).first).to_be_visible(timeout=STEP_MS)
    assert_no_widget_error(page, where)
    apply_button.scroll_into_view_if_needed()


def saved_notebook(path: Path, must_contain: str, timeout: float) -> dict[str, Any]:
    """The .ipynb on disk once it holds ``must_contain`` (the save is asynchronous); bounded."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text()
        if must_contain in text:
            return dict(json.loads(text))
        if time.monotonic() >= deadline:
            pytest.fail(f"{path.name} was not saved with {must_contain!r} within {timeout:.0f} s")
        time.sleep(0.2)


def html_outputs(notebook: dict[str, Any]) -> list[str]:
    return ["".join(output["data"]["text/html"]) for cell in notebook["cells"] if cell["cell_type"] == "code"
            for output in cell.get("outputs", []) if "text/html" in output.get("data", {})]


def rllm_gateways(box: Any) -> dict[str, str]:
    """The sandbox's rLLM gateways (each has orphans or live sessions to check), by target name: base URL."""
    endpoints = box.run.endpoints()
    names = set(box.run.expected_orphans) | set(box.run.live_sessions)
    return {name: endpoints[name] for name in sorted(names) if name in endpoints}


# -- the test ------------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_remediate_in_jupyterlab_run_build_confirm_apply_save_reload(chromium: str, sandbox: Any,
                                                                     lab: Lab) -> None:
    from playwright.sync_api import expect, sync_playwright

    repo_notebooks = sorted(p.name for p in NOTEBOOKS.iterdir())
    notebook_path = lab.root / NOTEBOOK
    code_cells = sum(1 for c in json.loads(notebook_path.read_text())["cells"] if c["cell_type"] == "code")
    gateways = rllm_gateways(sandbox)
    assert gateways, "the sandbox runs no rLLM gateway"
    for name, url in gateways.items():  # the stragglers are there to be deleted
        assert set(sandbox.run.expected_orphans.get(name, [])) <= set(gateway_sessions(url)), name

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, timeout=STEP_MS,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(STEP_MS)
        steps = Steps(page, ARTIFACTS)
        try:
            # open and Run All: the notebook scans, builds its plan and dry-runs it
            open_notebook(page, lab)
            steps.shot("opened")
            run_all(page, code_cells)
            build = page.get_by_role("button", name="Build plan")
            build.scroll_into_view_if_needed()
            steps.shot("ran-all")
            assert_no_widget_error(page, "after Run All Cells")

            # build a plan with the suspected orphans and the record deletes, as a person ticks them
            summary = page.get_by_text(re.compile("plan id of the selection"))
            first_summary = summary.inner_text()
            page.get_by_role("checkbox", name="include suspected orphans").check()
            page.get_by_role("checkbox", name="include record deletes").check()
            build.click()
            expect(summary).not_to_have_text(first_summary, timeout=STEP_MS)
            text = summary.inner_text()
            found = re.search(r"(\d+) of (\d+) actions selected.*plan id of the selection (\w+)", text, re.S)
            assert found, text
            selected, plan_id = int(found.group(1)), found.group(3)
            assert selected == int(found.group(2)) > 0, text  # a new plan: all of its actions selected
            deletes = re.search(r"to run its (\d+) delete", text)
            assert deletes, f"the plan has no delete to confirm: {text}"
            steps.shot("plan-built")

            # dry run, then the typed confirmations, then Apply
            page.get_by_role("button", name="Dry run").click()
            page.get_by_text(re.compile(rf"Dry run, nothing was sent: {selected} would-write")).first.wait_for()
            steps.shot("dry-run")
            page.get_by_label("confirm", exact=True).fill(plan_id[:12])
            page.get_by_label("deletes", exact=True).fill(deletes.group(1))
            steps.shot("confirmed")
            page.get_by_role("button", name="Apply").click()
            shown = page.get_by_text(re.compile(TALLY)).first
            shown.wait_for(timeout=APPLY_MS)
            tally_match = re.search(TALLY, shown.inner_text())
            assert tally_match, shown.inner_text()
            tally = tally_match.group(0)  # the tally line, as the page shows it
            steps.shot("applied")
            assert_no_widget_error(page, "after Apply")

            # save (Ctrl+S on the notebook, in command mode) and read the file
            page.get_by_role("heading", name=re.compile("^Remediate")).first.click()
            page.keyboard.press("Escape")
            page.keyboard.press("Control+s")
            saved = saved_notebook(notebook_path, tally, timeout=STEP_MS / 1000)
            outputs = [h for h in html_outputs(saved) if tally in h]
            assert any(plan_id in h for h in outputs), "the saved notebook has no record output with the tally"
            errors = [o for c in saved["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
            assert not errors, errors
            state = saved["metadata"].get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
            assert any(tally in str(m.get("state", {}).get("value", "")) for m in state.values()), \
                "the saved widget state does not hold the tally"

            # reload: the page reconnects to the kernel; the record and the review are there, no widget error
            open_notebook(page, lab)
            expect(page.get_by_text(tally).first).to_be_attached(timeout=STEP_MS)
            record = page.locator(".jp-OutputArea-output").filter(has_text=re.compile("Record of this notebook"))
            expect(record.filter(has_text=tally).first).to_be_attached(timeout=STEP_MS)
            review_drawn(page, "after the reload")
            steps.shot("reloaded-review")
            record.filter(has_text=tally).first.scroll_into_view_if_needed()
            steps.shot("reloaded-record")

            # shut the kernel down and reopen: a new kernel, so the review is drawn from the saved widget state
            for kernel in lab.api("GET", "/api/kernels").json():
                assert lab.api("DELETE", f"/api/kernels/{kernel['id']}").status_code == 204
            page.goto("about:blank")
            open_notebook(page, lab)
            expect(record.filter(has_text=tally).first).to_be_attached(timeout=STEP_MS)
            record.filter(has_text=tally).first.scroll_into_view_if_needed()
            steps.shot("reopened-new-kernel-record")
            review_drawn(page, "reopened with a new kernel")  # from the saved widget state
            steps.shot("reopened-new-kernel-review")
        except BaseException:
            with contextlib.suppress(Exception):
                steps.shot("failed")
            raise
        finally:
            browser.close()

    # what the Apply did, read from the gateways and the journal
    for name, url in gateways.items():
        now = gateway_sessions(url)
        assert not set(sandbox.run.expected_orphans.get(name, [])) & set(now), name
        live = sandbox.run.live_sessions.get(name, {})
        assert {s: now.get(s) for s in live} == live, name
    journals = [p for p in lab.root.rglob("*.jsonl") if plan_id in p.read_text()]
    assert journals, f"no journal under {lab.root} names plan {plan_id}"
    records = [r for j in journals for r in Journal(j).read() if r.get("plan_id") == plan_id]
    ends = [r["tally"] for r in records if r.get("event") == "apply-end"]
    assert len(ends) == 1, ends
    counts = dict(zip(FINAL_OUTCOMES, map(int, tally_match.groups()), strict=True))
    assert {k: ends[0].get(k, 0) for k in counts} == counts  # the page said what the journal closed with
    not_done = sorted((r.get("action_id"), r.get("kind"), r.get("outcome")) for r in records
                      if r.get("event") == "outcome" and r.get("outcome") != "done")
    # every selected action settled, and none was refused, left unconfirmed or found changed
    assert sum(counts.values()) == selected and counts["done"] > 0, (counts, not_done)
    assert counts["refused"] == counts["unconfirmed"] == counts["stale"] == 0, not_done
    # the notebook's files went to its run directory, none beside the notebooks, none into the repository's
    assert all(j.relative_to(lab.root).parts[0] == RUNS_FOLDER for j in journals), journals
    assert {p.name for p in lab.root.iterdir()} <= {*repo_notebooks, RUNS_FOLDER, ".ipynb_checkpoints"}
    assert sorted(p.name for p in NOTEBOOKS.iterdir()) == repo_notebooks
