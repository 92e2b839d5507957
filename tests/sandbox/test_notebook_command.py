"""The JupyterLab command ``gatewayscope demo`` prints opens the notebooks, also for root.

JupyterLab refuses to start as root without ``--allow-root``; the demo's command carries the flag exactly when
the user is root. The real test runs the printed command, as printed, through the shell (as the user pastes
it) and waits until JupyterLab's server answers; as root it also shows the command without the flag failing.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import httpx
import pytest

from gatewayscope.notebook.lab import write_lab_config
from gatewayscope.sandbox import demo
from gatewayscope.sandbox.demo import notebook_command
from gatewayscope.sandbox.processes import ManagedProcess, free_port

#: the bound on JupyterLab's start-up
START_TIMEOUT = 90.0


def test_the_flag_follows_the_effective_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "gatewayscope.toml"
    monkeypatch.delenv("GATEWAYSCOPE_CONFIG", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    as_root = notebook_command(config)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    as_user = notebook_command(config)
    assert " lab --allow-root " in as_root
    assert "--allow-root" not in as_user
    assert as_root.replace(" --allow-root", "") == as_user
    assert notebook_command(config, as_root=True) == as_root
    assert notebook_command(config, as_root=False) == as_user
    assert shlex.split(as_user)[0] == f"GATEWAYSCOPE_CONFIG={config}"
    lab_config = tmp_path / "jupyter config"
    assert shlex.split(notebook_command(config, as_root=False, lab_config=lab_config))[:2] == [
        f"GATEWAYSCOPE_CONFIG={config}", f"JUPYTER_CONFIG_PATH={lab_config}"]


def test_a_hostile_config_path_stays_one_shell_word(tmp_path: Path) -> None:
    config = tmp_path / "a b;$(touch pwned)'.toml"
    words = shlex.split(notebook_command(config, as_root=True))
    assert words[0] == f"GATEWAYSCOPE_CONFIG={config}"
    assert words[2:4] == ["lab", "--allow-root"]


def _start_lab(command: str, tmp_path: Path, name: str) -> tuple[ManagedProcess, str]:
    """``command`` run by the shell with JupyterLab's own flags for a headless, loopback, token-less test."""
    port = free_port()
    flags = (f" --no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --ServerApp.port_retries=0 "
             "--IdentityProvider.token='' --ServerApp.password=''")
    home = tmp_path / name
    env = {"HOME": str(home), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data")}
    return ManagedProcess(f"jupyterlab-{name}", ["/bin/sh", "-c", command + flags], env=env), \
        f"http://127.0.0.1:{port}"


@pytest.mark.e2e
def test_the_printed_command_starts_jupyterlab(tmp_path: Path) -> None:
    if demo.notebooks_folder() is None or not (Path(sys.executable).parent / "jupyter-lab").exists():
        pytest.skip("needs a checkout with notebooks/ and JupyterLab in this environment (the 'notebook' extra)")
    config = tmp_path / "gatewayscope.toml"
    config.write_text("")
    # as the demo prints it for whoever runs this test, with the JupyterLab defaults it writes
    command = notebook_command(config, lab_config=write_lab_config(tmp_path / "jupyter-config"))
    lab, url = _start_lab(command, tmp_path, "printed")
    try:
        lab.wait_http(f"{url}/api", timeout=START_TIMEOUT)
        assert "version" in httpx.get(f"{url}/api", timeout=10).json()
        assert lab.running()
        # the widget manager saves widget state with the notebook: the setting's default, from the folder
        settings = httpx.get(f"{url}/lab/api/settings/@jupyter-widgets/jupyterlab-manager:plugin", timeout=10)
        assert settings.status_code == 200, settings.text[:300]
        assert settings.json()["schema"]["properties"]["saveState"]["default"] is True
    finally:
        lab.stop()

    if os.geteuid() == 0:  # what the demo printed before: without the flag, root is refused
        old, _ = _start_lab(notebook_command(config, as_root=False), tmp_path, "without-flag")
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while old.running() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not old.running(), "JupyterLab started as root without --allow-root"
            assert old.popen.returncode != 0
            assert "--allow-root" in old.output()
        finally:
            old.stop()
