"""Plain helpers the end-to-end tests share (their fixtures are in conftest.py): running a notebook on a
kernel, and rollouts with their stragglers, checked."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.sandbox.processes import ManagedProcess
from gatewayscope.sandbox.rollouts import RolloutRun, run_rollouts
from tests.helpers import start_server

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
#: the kernelspec the ``kernel_name`` fixture writes: this interpreter (the venv's) with ipykernel
KERNEL_NAME = "gatewayscope-test-python3"
#: the sandbox's rollouts and stragglers per gateway (the ``sandbox`` fixture)
N_ROLLOUTS, N_STRAGGLERS = 8, 3


def execute(notebook: str, out: Path, kernel: str, **parameters: Any) -> Any:
    """Run ``notebooks/<notebook>`` with papermill on ``kernel`` in ``notebooks/`` (as JupyterLab does); return
    the executed notebook (nbformat), saved to ``out``."""
    import nbformat
    import papermill

    out.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(NOTEBOOKS / notebook), str(out), parameters=parameters, kernel_name=kernel,
                               cwd=str(NOTEBOOKS), progress_bar=False, execution_timeout=240)
    return nbformat.read(str(out), as_version=4)


def rollouts(url: str, n: int, stragglers: int, *, guarded: bool, seed: int) -> RolloutRun:
    run = run_rollouts(url, n_rollouts=n, n_stragglers=stragglers, n_live=0, straggler_delay=1.0, seed=seed,
                       settle_timeout=0.3 if guarded else 20.0)
    if not guarded:
        assert run.ok, run.to_dict()
    assert len(run.deleted_uids) == n, run.to_dict()
    return run


def prometheus_or_skip() -> str:
    """The ``prometheus`` binary; the test is skipped without it (and fails in CI, which installs it)."""
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not on PATH; CI installs Debian's 'prometheus' package (.ci/run)")
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus); CI runs this test")
    return prometheus_bin


def start_prometheus(prometheus_bin: str, config: Path, data_dir: Path) -> tuple[ManagedProcess, str]:
    """Prometheus (``prometheus_bin``) on a free loopback port, reading ``config`` and keeping its TSDB in
    ``data_dir``, once it is ready; its process and URL."""
    return start_server(
        "prometheus",
        lambda port: [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
                      f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        "/-/ready")
