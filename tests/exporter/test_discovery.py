"""The exporter's discovery directory: guarded gateways that announce themselves become targets while their
process runs (gatewayscope.guard.discovery), and are forgotten when it is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.config import Config, Policy, Target, build_config
from gatewayscope.errors import ConfigError
from gatewayscope.exporter import server as exporter_server
from gatewayscope.exporter.server import Exporter
from gatewayscope.exporter.settings import parse_exporter_settings
from gatewayscope.guard import discovery
from gatewayscope.snapshot import TargetSnapshot


def reader(target: Target, policy: Policy, *, now: float, transport: Any = None) -> TargetSnapshot:
    return TargetSnapshot(name=target.name, kind=target.kind, address=target.address, up=True, started_at=now,
                          duration_seconds=0.0)


@pytest.mark.e2e  # starts a process
def test_announced_gateways_are_targets_while_their_process_runs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exporter_server, "DISCOVERY_INTERVAL_SECONDS", 0.0)
    folder = tmp_path / "gateways"
    settings = parse_exporter_settings({"discovery_dir": str(folder)})
    configured = Target(name="guarded-41000", kind="rllm", url="http://10.0.0.1:41000")  # a name it keeps
    exporter = Exporter(Config(targets=[configured], policy=Policy()), settings, reader=reader)
    assert [t.name for t in exporter.targets] == ["guarded-41000"]  # the directory does not exist yet

    mine = discovery.announce(folder, host="0.0.0.0", port=41001, store="sqlite", db_path="/srv/traces.db")
    discovery.announce(folder, host="127.0.0.1", port=41000, store="memory")  # clashes with the configured one
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    dead = folder / f"gatewayscope-guard-{gone.pid}-41002.json"
    dead.write_text(mine.read_text().replace(str(os.getpid()), str(gone.pid)).replace("41001", "41002"))
    (folder / "gatewayscope-guard-7-7.json").write_bytes(b"\x00" * (discovery.MAX_FILE_BYTES + 1))

    targets = {t.name: t for t in exporter.targets}
    assert set(targets) == {"guarded-41000", "guarded-41001"}
    assert targets["guarded-41000"].url == "http://10.0.0.1:41000"  # the config's, not the announcement's
    assert targets["guarded-41001"].url == "http://127.0.0.1:41001" and targets["guarded-41001"].kind == "rllm"
    text = exporter.metrics_registry(5.0)
    names = {s.labels.get("target") for metric in text.collect() for s in metric.samples}
    assert "guarded-41001" in names

    discovery.withdraw(mine)
    time.sleep(0.01)
    assert [t.name for t in exporter.targets] == ["guarded-41000"]
    assert "guarded-41001" not in exporter.cache.counters()  # its slot is forgotten


def test_a_config_may_hold_only_a_discovery_dir(tmp_path: Path) -> None:
    path = tmp_path / "exporter.toml"
    path.write_text(f'[exporter]\ndiscovery_dir = "{tmp_path}"\n')
    assert build_config(str(path)).targets == []
    path.write_text("[exporter]\n")
    with pytest.raises(ConfigError, match="No targets"):
        build_config(str(path))
    with pytest.raises(ConfigError, match="discovery_dir"):
        parse_exporter_settings({"discovery_dir": 5})


@pytest.mark.e2e  # starts a process
def test_a_fifo_in_the_discovery_dir_is_skipped_without_blocking(tmp_path: Path) -> None:
    folder = tmp_path / "gateways"
    mine = discovery.announce(folder, host="127.0.0.1", port=41003, store="memory")
    os.mkfifo(folder / "gatewayscope-guard-8-8.json")  # its open would wait for a writer that never comes
    done = subprocess.run([sys.executable, "-c", "import sys; from gatewayscope.guard import discovery; "
                           "print(sorted(a.name for a in discovery.discover(sys.argv[1])))", str(folder)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['guarded-41003']"
    discovery.withdraw(mine)
