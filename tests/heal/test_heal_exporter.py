"""Heal inside the exporter (``gatewayscope export --heal``): one read serves both, the ``gatewayscope_heal_*``
metrics follow the contract (promtool checks a real scrape), and the kill switch answers on
``POST /-/heal/pause`` and ``/-/heal/resume`` only behind the exporter's basic auth."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gatewayscope.cli import main
from gatewayscope.config import parse_config
from gatewayscope.exporter.collectors import HEAL_METRICS
from gatewayscope.exporter.server import make_server
from gatewayscope.exporter.settings import parse_exporter_settings
from gatewayscope.heal.loop import HealLoop
from gatewayscope.heal.settings import parse_heal_settings
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small
from tests.mixin.mixin_files import run_promtool

PASSWORD_ENV = "GS_TEST_HEAL_EXPORTER_PASSWORD"


@pytest.fixture
def emu() -> Iterator[BifrostEmulator]:
    with BifrostEmulator() as emulator:
        seed_small(emulator)
        yield emulator


def heal_config(emu: BifrostEmulator, state: Path) -> dict:
    return {"targets": [{"name": "bifrost", "kind": "bifrost", "url": emu.url}],
            "exporter": {"basic_auth_username": "prometheus", "basic_auth_password_env": PASSWORD_ENV,
                         "min_interval_seconds": 60},
            "heal": {"state_dir": str(state), "first_pass_max_delay_seconds": 0}}


@pytest.mark.e2e  # starts a process (promtool checks the scrape)
def test_heal_metrics_pause_and_resume_behind_basic_auth(emu: BifrostEmulator, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    config = parse_config(heal_config(emu, tmp_path), "test.toml")
    loop = HealLoop(config, parse_heal_settings(config.heal), share_reads=True)
    loop.prepare()
    server = make_server(config, parse_exporter_settings(config.exporter), listen="127.0.0.1:0", heal=loop).start()
    auth = ("prometheus", "s3cret")
    try:
        emu.clear_requests()
        first = loop.run_pass()  # the pass reads through the exporter's cache ...
        reads = len(emu.requests("GET", "/api/providers"))
        scrape = httpx.get(server.url + "/metrics", auth=auth, timeout=30)
        assert scrape.status_code == 200
        # ... so the scrape after it reads no target again (one read serves both)
        assert len(emu.requests("GET", "/api/providers")) == reads
        assert first.result == "ok" and first.would
        text = scrape.text
        exposed = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))
        # no action was enforced and none deferred: those two have no sample yet
        assert set(HEAL_METRICS) - exposed == {"gatewayscope_heal_actions_total", "gatewayscope_heal_deferred_actions"}
        assert re.search(r'^gatewayscope_heal_dry_run_actions\{kind="pool_shrink",target="bifrost"\} [1-9]', text,
                         flags=re.M)
        assert 'gatewayscope_heal_passes_total{result="ok"} 1.0' in text
        assert "gatewayscope_heal_paused 0.0" in text
        done = run_promtool("check", "metrics", stdin=text)
        assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout

        refused = httpx.post(server.url + "/-/heal/pause", timeout=10)
        assert refused.status_code == 401 and not loop.settings.pause_file.exists()
        assert httpx.post(server.url + "/-/heal/pause", auth=("prometheus", "wrong"), timeout=10).status_code == 401
        paused = httpx.post(server.url + "/-/heal/pause", auth=auth, timeout=10)
        assert paused.status_code == 200 and loop.settings.pause_file.exists()
        assert "gatewayscope_heal_paused 1.0" in httpx.get(server.url + "/exporter-metrics", auth=auth,
                                                            timeout=30).text
        assert loop.run_pass().blocked.keys() == {"paused"}
        assert httpx.post(server.url + "/-/heal/resume", auth=auth, timeout=10).status_code == 200
        assert not loop.settings.pause_file.exists()
        assert httpx.post(server.url + "/-/heal/other", auth=auth, timeout=10).status_code == 404
        events = [e["event"] for e in loop.journal.read()]
        assert "heal-pause" in events and "heal-resume" in events
    finally:
        server.stop()


def test_pause_without_heal_is_a_404(emu: BifrostEmulator, tmp_path: Path) -> None:
    config = parse_config({"targets": [{"name": "bifrost", "kind": "bifrost", "url": emu.url}]}, "test.toml")
    server = make_server(config, parse_exporter_settings({}), listen="127.0.0.1:0").start()
    try:
        answer = httpx.post(server.url + "/-/heal/pause", timeout=10)
        assert answer.status_code == 404 and "export --heal" in answer.text
    finally:
        server.stop()


def test_export_heal_once_runs_one_pass_and_prints_its_metrics(emu: BifrostEmulator, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.toml"
    path.write_text(f'[[targets]]\nname = "bifrost"\nkind = "bifrost"\nurl = "{emu.url}"\n'
                    f'[heal]\nstate_dir = "{tmp_path / "state"}"\n')
    emu.clear_requests()
    assert main(["export", "--config", str(path), "--heal", "--once"]) == 0
    out = capsys.readouterr()
    assert 'gatewayscope_heal_passes_total{result="ok"} 1.0' in out.out
    assert "heal pass ok" in out.err and "dry-run would write" in out.err
    assert [r for r in emu.requests() if r.method != "GET"] == []  # the default table writes nothing
    assert main(["heal", "status", "--config", str(path), "--format", "json"]) == 0
    assert '"result": "ok"' in capsys.readouterr().out


def test_heal_refuses_a_bad_table_in_one_line_and_needs_a_config(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[heal]\nmode = "yes"\n')
    assert main(["heal", "--config", str(path), "--once"]) == 2
    assert capsys.readouterr().err == (f"gatewayscope: {path}: heal.mode: expected \"dry-run\" or \"enforce\", "
                                       "got 'yes'\n")
    assert main(["heal", "status"]) == 2
    assert "heal needs --config FILE" in capsys.readouterr().err
