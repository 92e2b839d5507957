"""``gatewayscope scan`` output pinned byte for byte (JSON and text) against files under tests/golden/.

Two scans, each through the CLI with the scan's clock fixed (``taken_at``, hence every idle age):

* three rLLM SQLite targets: an unguarded store written by the gateway's own store class (suspected orphans,
  weight-version lags, a multi-trace and a live session), a guarded one (tombstoned orphans are confirmed,
  a dropped straggler write) and a missing file (a target that is down);
* the Bifrost emulator with its small seed (pools over policy, an Anthropic lane, unreachable records,
  posture drift).

What varies from run to run and only that is normalised: the temporary folder (``<tmp>``), the emulator's
port (``<port>``) and each target's read time (``duration_seconds`` becomes 0). Set
``GATEWAYSCOPE_UPDATE_GOLDEN=1`` to rewrite the files (then review the diff: it is an output change).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import gatewayscope.scan
from gatewayscope.cli import main
from gatewayscope.config import Config, Policy, Target
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small
from tests.helpers import NOW, write_store

GOLDEN = Path(__file__).parent / "golden"
#: the scan's clock: every ``taken_at`` and idle age is measured from it
HOUR = 3600.0


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan module reads the wall clock once per scan (``taken_at``); pin it, leave timers alone."""
    clock = types.SimpleNamespace(time=lambda: NOW, perf_counter=time.perf_counter, monotonic=time.monotonic)
    monkeypatch.setattr(gatewayscope.scan, "time", clock)


def set_times(path: Path, session_id: str, ages: list[float], weight: int | None = None) -> None:
    """Give ``session_id``'s traces (oldest first) these ages before NOW, and a weight version when given."""
    with sqlite3.connect(path) as conn:
        trace_ids = [row[0] for row in conn.execute(
            "SELECT trace_id FROM trace_sessions WHERE session_id = ? ORDER BY trace_id", (session_id,))]
        assert len(trace_ids) == len(ages), (session_id, trace_ids)
        for trace_id, age in zip(trace_ids, ages, strict=True):
            conn.execute("UPDATE trace_sessions SET created_at = ? WHERE trace_id = ?", (NOW - age, trace_id))
            conn.execute("UPDATE traces SET created_at = ? WHERE trace_id = ?", (NOW - age, trace_id))
            if weight is not None:
                conn.execute("UPDATE traces SET data = json_set(data, '$.weight_version', ?) WHERE trace_id = ?",
                             (weight, trace_id))


def plain_store(path: Path) -> None:
    write_store(path, {"taskA:0": 1, "taskA:1": 1, "taskA:2": 1, "taskB:0": 1, "taskC:0": 4, "live:0": 1})
    set_times(path, "taskA:0", [3 * HOUR], weight=3)  # six versions behind: suspected
    set_times(path, "taskA:1", [4 * HOUR], weight=8)  # one version behind: within the lag, not an orphan
    set_times(path, "taskA:2", [2.5 * HOUR], weight=5)  # four behind: suspected
    set_times(path, "taskB:0", [5 * HOUR])  # no version: idle decides, suspected
    set_times(path, "taskC:0", [6 * HOUR, 6 * HOUR, 5 * HOUR, 5 * HOUR])  # several traces: never
    set_times(path, "live:0", [60.0], weight=9)  # recent, current version: live


def guarded_store(path: Path) -> None:
    from gatewayscope.guard import sqlite as sqlite_guard

    write_store(path, {"taskX:0": 1, "taskX:1": 1, "taskY:0": 1, "live:1": 2})
    set_times(path, "taskX:0", [120.0])  # recent, but tombstoned: confirmed
    set_times(path, "taskX:1", [90.0])
    set_times(path, "taskY:0", [3 * HOUR])  # suspected
    set_times(path, "live:1", [3 * HOUR, 30.0])
    sqlite_guard.install(path)
    sqlite_guard.add_tombstones(path, ["taskX:0", "taskX:1", "gone:0"])
    write_store(path, {"gone:0": 1}, sent_before=HOUR)  # a straggler for a deleted session: the guard drops it


def normalise(text: str, tmp_path: Path, port: int | None = None) -> str:
    text = text.replace(str(tmp_path), "<tmp>")
    if port is not None:
        text = text.replace(f"127.0.0.1:{port}", "127.0.0.1:<port>")
    text = re.sub(r'"duration_seconds": [0-9.e-]+', '"duration_seconds": 0', text)
    return text


def check(name: str, text: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("GATEWAYSCOPE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"the output differs from {golden}"


def scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["scan", *args])
    return code, capsys.readouterr().out


def test_sqlite_scan_output_is_pinned(tmp_path: Path, fixed_clock: None,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    plain_store(tmp_path / "plain.db")
    guarded_store(tmp_path / "guarded.db")
    config = tmp_path / "gatewayscope.toml"
    config.write_text(f"""
[[targets]]
name = "plain"
kind = "rllm"
path = "{tmp_path / 'plain.db'}"

[[targets]]
name = "guarded"
kind = "rllm"
path = "{tmp_path / 'guarded.db'}"

[[targets]]
name = "missing"
kind = "rllm"
path = "{tmp_path / 'missing.db'}"

[policy]
orphan_idle_seconds = 7200
max_weight_lag = 2
""")
    code, out = scan(capsys, "--config", str(config), "--format", "json")
    assert code == 1  # the missing file is down
    report = json.loads(out)
    assert report["taken_at"] == NOW
    check("scan_sqlite.json", normalise(out, tmp_path))
    code, out = scan(capsys, "--config", str(config), "--show-orphans", "3")
    assert code == 1
    check("scan_sqlite.txt", normalise(out, tmp_path))


def test_bifrost_scan_output_is_pinned(tmp_path: Path, fixed_clock: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with BifrostEmulator() as emu:
        seed_small(emu)
        code, out = scan(capsys, "--bifrost", emu.url, "--format", "json")
        assert code == 0
        check("scan_bifrost.json", normalise(out, tmp_path, emu.port))
        code, out = scan(capsys, "--bifrost", emu.url)
        assert code == 0
        check("scan_bifrost.txt", normalise(out, tmp_path, emu.port))


@contextlib.contextmanager
def every_target(tmp_path: Path) -> Iterator[tuple[Config, BifrostEmulator]]:
    """The config of both scans' targets in one (the plain and the guarded store, the missing file, the seeded
    emulator), and the emulator, running until exit."""
    plain_store(tmp_path / "plain.db")
    guarded_store(tmp_path / "guarded.db")
    with BifrostEmulator() as emu:
        seed_small(emu)
        yield Config(targets=[Target(name="plain", kind="rllm", path=str(tmp_path / "plain.db")),
                              Target(name="guarded", kind="rllm", path=str(tmp_path / "guarded.db")),
                              Target(name="missing", kind="rllm", path=str(tmp_path / "missing.db")),
                              Target(name="bifrost", kind="bifrost", url=emu.url)],
                     policy=Policy()), emu


def test_notebook_html_is_pinned(tmp_path: Path, fixed_clock: None) -> None:
    """The notebooks' HTML view of the same scans (every section, every target), through the controller."""
    from gatewayscope.notebook.controllers import ScanController

    with every_target(tmp_path) as (config, emu):
        controller = ScanController(config=config)
        controller.scan()
        html = controller.html(show_orphans=2) + controller.orphans_html() + controller.records_html()
        html = re.sub(r'<td class="num">[0-9]+\.[0-9]{2} s</td>', '<td class="num">0.00 s</td>', html)
        check("scan_notebook.html", normalise(html, tmp_path, emu.port))


def test_plan_and_metrics_of_the_same_reads_are_pinned(tmp_path: Path, fixed_clock: None) -> None:
    """The plan (its id hashes every action and warning) and the exporter's exposition of the same reads."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gatewayscope.exporter.cache import TargetResult
    from gatewayscope.exporter.collectors import TargetsCollector
    from gatewayscope.remediate.plan import build_plan
    from gatewayscope.scan import take_snapshot

    with every_target(tmp_path) as (config, emu):
        snapshot = take_snapshot(config)
        port = emu.port
    plan = build_plan(snapshot, config, include_suspected=True, include_deletes=True, created_at=NOW)
    # the id hashes the addresses too: after normalising them, the id is that of the normalised content
    data = json.loads(normalise(json.dumps(plan.to_dict()), tmp_path, port))
    del data["id"]
    data["id"] = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
    assert plan.id == plan.compute_id()
    check("plan.json", json.dumps(data, indent=2, sort_keys=True) + "\n")

    for snap in snapshot.targets:
        snap.started_at, snap.duration_seconds = NOW, 0.5
    results = [TargetResult(target=config.target(s.name), snapshot=s, source="read", age_seconds=1.0)
               for s in snapshot.targets]
    registry = CollectorRegistry()
    registry.register(TargetsCollector(results, config.policy, max_record_series=5, min_interval_seconds=30.0))
    check("metrics.txt", generate_latest(registry).decode())
