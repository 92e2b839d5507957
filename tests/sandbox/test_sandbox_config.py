"""The config the sandbox writes names its targets exactly, whatever its work folder is called."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatewayscope.config import load_config
from gatewayscope.sandbox.demo import GUARDED_MEMORY, GUARDED_SQLITE, Sandbox


def test_a_hostile_work_folder_round_trips_through_the_config(tmp_path: Path) -> None:
    workdir = tmp_path / 'runs "quoted" \\ back\tslash ünï'
    box = Sandbox(workdir, say=lambda _m: None)
    run = box.run
    assert run.workdir.is_absolute()
    run.memory_gateway_url, run.sqlite_gateway_url = "http://127.0.0.1:1", "http://127.0.0.1:2"
    run.sqlite_path = str(workdir / "gateway_traces.db")
    run.guarded_memory_gateway_url = "http://127.0.0.1:3"
    run.guarded_sqlite_path = str(workdir / "guarded_traces.db")
    run.bifrost_url = "http://127.0.0.1:4"
    box._write_config()
    targets = {t.name: (t.kind, t.url or t.path) for t in load_config(run.config_path).targets}
    assert targets == {
        "rllm-memory": ("rllm", "http://127.0.0.1:1"), "rllm-sqlite": ("rllm", run.sqlite_path),
        GUARDED_MEMORY: ("rllm", "http://127.0.0.1:3"), GUARDED_SQLITE: ("rllm", run.guarded_sqlite_path),
        "bifrost": ("bifrost", "http://127.0.0.1:4"),
    }


def test_a_relative_work_folder_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    box = Sandbox("sandbox", say=lambda _m: None)
    assert box.run.config_path == tmp_path.resolve() / "sandbox" / "gatewayscope.toml"
