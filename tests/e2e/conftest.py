"""Fixtures the end-to-end tests share: a real Jupyter kernel, the sandbox (once per module and rLLM gateway
flavour) and the Bifrost emulator. Every process they start is stopped at teardown."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e._support import KERNEL_NAME, N_ROLLOUTS, N_STRAGGLERS

# -- a real kernel -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A kernelspec that runs THIS interpreter (the venv's) with ipykernel, found first on JUPYTER_PATH.

    Not the ``python3`` spec the kernel package installs, whose ``argv[0]`` is a bare ``python`` that a
    machine may resolve to another interpreter without gatewayscope.
    """
    pytest.importorskip("ipykernel", reason="the notebooks run on ipykernel")
    pytest.importorskip("papermill", reason="the notebooks are executed with papermill")
    root = tmp_path_factory.mktemp("jupyter-path")
    spec = root / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gatewayscope tests (venv)", "language": "python",
    }))
    previous = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(root) + (os.pathsep + previous if previous else "")
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        assert KernelSpecManager().get_kernel_spec(KERNEL_NAME).argv[0] == sys.executable
        yield KERNEL_NAME
    finally:
        if previous is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = previous


@pytest.fixture(scope="module")
def sandbox(module_gateway_flavor: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The sandbox, once per rLLM gateway flavour: its two gateways are the flavour's."""
    from gatewayscope.sandbox.demo import Sandbox
    from gatewayscope.sandbox.processes import GATEWAY_PYTHON_ENV

    box = Sandbox(tmp_path_factory.mktemp("sandbox"), rollouts=N_ROLLOUTS, stragglers=N_STRAGGLERS,
                  bifrost_seed="small", say=lambda _m: None)
    with pytest.MonkeyPatch.context() as env:  # the sandbox starts its gateways with the flavour's Python
        env.setenv(GATEWAY_PYTHON_ENV, module_gateway_flavor.python)
        box.start()
    try:
        for url in (box.run.memory_gateway_url, box.run.sqlite_gateway_url):  # only upstream main has it
            answer = httpx.get(f"{url}/admin/weight_version", timeout=10)
            assert answer.status_code == (200 if module_gateway_flavor.weight_version else 404), url
        box.wait_until_idle()
        yield box
    finally:
        box.stop()
    assert not any(box.running().values())


@pytest.fixture
def emulator() -> Iterator[Any]:
    from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator

    with BifrostEmulator() as emu:
        yield emu
