"""The systemd unit (deploy/systemd/gatewayscope-exporter.service) and its credentials drop-in.

``systemd-analyze verify`` must accept them without a single warning, and ``systemd-analyze security
--offline=yes`` must score the unit at or below the exposure docs/deploy.md states. Both run on a copy of the
unit in a folder laid out as a host (``--root``): the host's own unit files (for the targets the unit needs)
and the unit's ExecStart program in place. The unit's ExecStart, with ``%d`` as systemd fills it, must start
the exporter on the config and credentials a credentials folder holds.

``systemd-analyze`` comes from Debian's ``systemd`` package: without it these tests are skipped with the
reason, and under CI (``CI`` set) they fail instead (``.ci/run`` installs it).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gatewayscope.sandbox.processes import free_port
from tests.helpers import ci_program, wait_for

#: every test here starts a process (make e2e runs them)
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"
UNIT = SYSTEMD / "gatewayscope-exporter.service"
DROP_IN = SYSTEMD / "credentials.conf"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
#: what the issue asks of the unit, setting by setting
REQUIRED = {"DynamicUser": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "NoNewPrivileges": "yes",
            "PrivateTmp": "yes", "StateDirectory": "gatewayscope"}


def systemd_analyze() -> str:
    return ci_program("systemd-analyze", "systemd", ".ci/run does")


def settings(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of every assignment of a unit file, in order (keys repeat: LoadCredential=)."""
    out, section = [], ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key, value))
    return out


def values(path: Path, key: str) -> list[str]:
    return [value for _, name, value in settings(path) if name == key]


def host_root(tmp_path: Path, unit_text: str | None = None, drop_in: bool = True) -> Path:
    """A folder laid out as a host with the unit (and its drop-in) installed and its ExecStart program in place."""
    root = tmp_path / "root"
    system = root / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    shutil.copytree(Path("/usr/lib/systemd/system"), root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    (system / UNIT.name).write_text(unit_text if unit_text is not None else UNIT.read_text())
    if drop_in:
        (system / f"{UNIT.name}.d").mkdir()
        shutil.copy(DROP_IN, system / f"{UNIT.name}.d" / DROP_IN.name)
    [exec_start] = values(UNIT, "ExecStart")
    program = root / shlex.split(exec_start)[0].lstrip("/")
    program.parent.mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "bin" / "gatewayscope", program)
    return root


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([systemd_analyze(), *args], capture_output=True, text=True, timeout=120)


def test_the_unit_has_what_a_hardened_exporter_needs() -> None:
    found = {key: value for _, key, value in settings(UNIT)}
    for key, value in REQUIRED.items():
        assert found.get(key) == value, key
    assert values(UNIT, "LoadCredential") == ["gatewayscope.toml:/etc/gatewayscope/gatewayscope.toml"]
    [exec_start] = values(UNIT, "ExecStart")
    assert shlex.split(exec_start) == ["/opt/gatewayscope/bin/gatewayscope", "export", "--config",
                                       "%d/gatewayscope.toml"]
    credentials = [value.split(":")[0] for value in values(DROP_IN, "LoadCredential")]
    assert credentials == ["bifrost-username", "bifrost-password", "exporter-password"]


def test_systemd_analyze_verify_accepts_the_unit_and_its_drop_in(tmp_path: Path) -> None:
    done = analyze("verify", f"--root={host_root(tmp_path)}", UNIT.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout + done.stderr == "", "verify warned: " + done.stdout + done.stderr


def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    """verify exits 0 on an unknown key or a bad value, so the test above also demands silence: this shows
    both kinds of mistake do speak."""
    text = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=strickt").replace(
        "NoNewPrivileges=yes", "NoNewPrivilege=yes")
    done = analyze("verify", f"--root={host_root(tmp_path, text)}", UNIT.name)
    assert "strickt" in done.stderr and "Unknown key 'NoNewPrivilege'" in done.stderr, done.stderr


def documented_exposure() -> float:
    match = re.search(r"`systemd-analyze security` scores it ([0-9.]+) ", DEPLOY_DOC.read_text())
    assert match, "docs/deploy.md states the unit's exposure as: `systemd-analyze security` scores it X.Y ..."
    return float(match.group(1))


def test_systemd_analyze_security_scores_it_at_most_the_documented_exposure(tmp_path: Path) -> None:
    done = analyze("security", "--offline=yes", f"--root={host_root(tmp_path)}", "--no-pager", UNIT.name)
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(rf"Overall exposure level for {re.escape(UNIT.name)}: ([0-9.]+) ", done.stdout)
    assert match, done.stdout[-500:]
    assert float(match.group(1)) <= documented_exposure(), done.stdout


@pytest.mark.e2e
def test_exec_start_runs_the_exporter_on_its_credentials_folder(tmp_path: Path) -> None:
    """As systemd starts it: %d is the credentials folder (also $CREDENTIALS_DIRECTORY), holding the config
    and the secrets it names as $CREDENTIALS_DIRECTORY/NAME; TMPDIR as Environment= sets it."""
    from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small

    credentials = tmp_path / "credentials"
    credentials.mkdir(mode=0o500)
    port = free_port()
    with BifrostEmulator(auth=("admin", "bifrost-pw")) as emulator:
        seed_small(emulator)
        (credentials / "bifrost-username").write_text("admin\n")
        (credentials / "bifrost-password").write_text("bifrost-pw\n")
        (credentials / "exporter-password").write_text("exporter-pw\n")
        (credentials / "gatewayscope.toml").write_text(f"""
[[targets]]
name = "bifrost"
kind = "bifrost"
url = "{emulator.url}"
[targets.auth]
username_file = "$CREDENTIALS_DIRECTORY/bifrost-username"
password_file = "$CREDENTIALS_DIRECTORY/bifrost-password"

[exporter]
listen = "127.0.0.1:{port}"
basic_auth_username = "prometheus"
basic_auth_password_file = "$CREDENTIALS_DIRECTORY/exporter-password"
""")
        [exec_start] = values(UNIT, "ExecStart")
        argv = [part.replace("%d", str(credentials)) for part in shlex.split(exec_start)]
        argv[0] = str(Path(sys.prefix) / "bin" / "gatewayscope")
        state = tmp_path / "state"
        state.mkdir()
        env = {"PATH": "/usr/bin:/bin", "CREDENTIALS_DIRECTORY": str(credentials)}
        for assignment in shlex.split(" ".join(values(UNIT, "Environment"))):
            key, _, value = assignment.partition("=")
            env[key] = value.replace("%S/gatewayscope", str(state))
        process = subprocess.Popen(argv, cwd="/", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        try:
            url = f"http://127.0.0.1:{port}"

            def ready() -> int:
                assert process.poll() is None, process.communicate()[1]
                try:
                    return httpx.get(f"{url}/-/ready", timeout=5).status_code
                except httpx.HTTPError:
                    return 0

            wait_for("the exporter", ready, lambda status: status == 200, timeout=60)
            answer = httpx.get(f"{url}/metrics", auth=("prometheus", "exporter-pw"), timeout=60)
            assert answer.status_code == 200
            assert 'gatewayscope_up{kind="bifrost",target="bifrost"} 1.0' in answer.text
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "bifrost-pw" not in stderr and "exporter-pw" not in stderr
