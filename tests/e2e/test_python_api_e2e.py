"""The public API end to end: the library's six lines against a real rLLM gateway, and a plain install.

* Real rollouts through the unmodified gateway leave real one-trace orphans (stragglers whose late call
  returned after their session was deleted). ``gs.load_config``, ``gs.take_snapshot``, ``gs.findings``,
  ``gs.build_plan``, ``plan.save``/``gs.load_plan`` and ``gs.apply_plan`` then delete exactly those orphans
  and leave every live session with all its traces: on the gateway's SQLite file with the orphans idle past
  the threshold (suspected), and over REST on the memory store with the orphans confirmed by the
  rollouts' own deletes.
* ``pip install <the project>`` into a fresh venv, no extras: the library and the command work, and no
  notebook package came with it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gatewayscope as gs
from gatewayscope.sandbox.rollouts import run_rollouts
from tests.helpers import age
from tests.helpers import gateway_sessions as sessions

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TAIL = "0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"


@pytest.mark.parametrize("store", ["sqlite", "memory"])
def test_the_six_lines_delete_exactly_the_orphans(store: str, rllm_gateway: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = rllm_gateway(store)
    run = run_rollouts(gateway.url, n_rollouts=8, n_stragglers=4, n_live=3, live_calls=[1, 2, 3],
                       straggler_delay=1.0)
    assert run.ok, run.to_dict()
    before = sessions(gateway.url)
    orphans = sorted(s for s in before if s in set(run.deleted_uids))
    assert orphans == sorted(run.straggler_uids) and all(before[s] == 1 for s in orphans)
    assert min(run.live_uids.values()) == 1  # a live session with a single, fresh trace is never an orphan
    if store == "sqlite":
        address = f'path = "{gateway.db_path}"'
        age(str(gateway.db_path), orphans, 3 * 3600)  # idle three hours: suspected
        deleted: dict[str, float] = {}
    else:
        address = f'url = "{gateway.url}"'
        deleted = run.deletes  # the rollouts deleted them and they came back: confirmed
    (tmp_path / "gatewayscope.toml").write_text(f'[[targets]]\nname = "rl"\nkind = "rllm"\n{address}\n')
    monkeypatch.chdir(tmp_path)

    config = gs.load_config("gatewayscope.toml")
    snapshot = gs.take_snapshot(config, also_sessions=deleted)
    found = gs.findings(snapshot, config, deleted_ids=deleted)
    plan = gs.build_plan(found, include_suspected=True, include_deletes=False)
    plan.save("plan.json"); plan = gs.load_plan("plan.json")  # noqa: E702 - the example's own line
    report = gs.apply_plan(plan, config, write=True, allow_delete=True, journal="apply.jsonl", deleted_ids=deleted)
    print(report)

    assert sorted(found.orphans["session_id"]) == orphans
    assert set(found.orphans["confidence"]) == {"suspected" if store == "sqlite" else "confirmed"}
    assert sorted(a.subject for a in plan.actions) == orphans
    assert {a.kind for a in plan.actions} == {"session_delete"}
    assert capsys.readouterr().out == f"{len(orphans)} done, {TAIL}\n"
    assert report.counts == {"done": len(orphans), "refused": 0, "unconfirmed": 0, "gone": 0, "stale": 0,
                             "already-done": 0}
    assert sessions(gateway.url) == {s: before[s] for s in run.live_uids} == run.live_uids
    assert (tmp_path / "apply.jsonl").exists()
    after = gs.findings(gs.take_snapshot(config, also_sessions=deleted), config, deleted_ids=deleted)
    assert after.orphans.height == 0 and after.counts["orphans"] == 0


def test_a_plain_install_has_the_library_and_the_command_and_no_notebook_stack(tmp_path: Path) -> None:
    # the project as it is on disk, copied so that the build leaves nothing in the working tree
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "artifacts", "*.db*"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
                                str(source)], capture_output=True, text=True, timeout=600, check=False)
    if installed.returncode != 0 and ("Could not find a version" in installed.stderr
                                      or "NewConnectionError" in installed.stderr
                                      or "Temporary failure in name resolution" in installed.stderr):
        pytest.skip(f"pip cannot reach a package index here: {installed.stderr.strip()[-300:]}")
    assert installed.returncode == 0, installed.stderr[-2000:]

    library = subprocess.run([python, "-c", "import gatewayscope as gs; gs.take_snapshot; gs.findings; "
                                            "import gatewayscope.notebook; print(gs.__file__)"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert library.returncode == 0, library.stderr
    assert Path(library.stdout.strip()).is_relative_to(venv), library.stdout  # the installed copy, not this tree
    command = subprocess.run([str(venv / "bin" / "gatewayscope"), "--help"], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path, check=False)
    assert command.returncode == 0, command.stderr
    assert "scan" in command.stdout and "apply" in command.stdout
    extras = subprocess.run([python, "-c", "import importlib.util as u; "
                                           "print([m for m in ('ipywidgets', 'IPython', 'matplotlib', 'jupyterlab') "
                                           "if u.find_spec(m)])"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert extras.stdout.strip() == "[]", extras.stdout
    views = subprocess.run([python, "-c", "from gatewayscope.notebook import SnapshotView"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert views.returncode != 0 and "pip install 'gatewayscope[notebook]'" in views.stderr
