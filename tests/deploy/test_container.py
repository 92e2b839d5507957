"""The container recipe (Containerfile) and its contract, tested without a container engine.

No engine runs on these machines, so the image is never built here. Instead:

* **The recipe's structure**, read with ``dockerfile-parse``: two stages on one base pinned by tag, the wheel
  built in the first, the venv copied into the second, a fixed numeric non-root user, the entry point in
  exec form calling the venv's ``gatewayscope export``, the config from a mounted file, the exporter's
  default port exposed, the OCI labels, no RUN (and so no shell) in the runtime stage.
* **The contract**, e2e: the recipe's own steps run here (its COPY sources into a folder, ``pip wheel`` of
  them, a fresh venv, the wheel installed into it), then its ENTRYPOINT and CMD run with its ENV (paths
  mapped into that folder, the listen address moved to loopback) as uid 65532, with no HOME, in ``/``, in
  a private mount namespace where the root filesystem and /dev/shm are read-only and only the state
  folder is writable: what ``readOnlyRootFilesystem`` and a writable emptyDir give the pod. Against the
  sandbox (an unmodified rLLM gateway with real stragglers, over REST and from its SQLite file, and the
  Bifrost emulator with admin auth, credentials from files readable by the group only), ``/metrics`` must
  serve the figures the library computes in-process from the same sandbox, behind basic auth read from
  files, and print nothing on stdout (its log is stderr). Afterwards no file anywhere on the machine's
  filesystems belongs to uid 65532 outside the state folder (the uid owns nothing else, so anything it had
  created would show).

The namespace needs ``unshare`` and ``setpriv`` (util-linux) and root. Without them the contract test is
skipped with the reason, and under CI (``CI`` set) it fails instead.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope import __version__
from gatewayscope.config import load_config
from gatewayscope.exporter.server import Exporter, read_budget, render
from gatewayscope.exporter.settings import DEFAULT_PORT, parse_exporter_settings
from gatewayscope.sandbox.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
#: the image's user and group
UID = GID = 65532
STATE = "/var/lib/gatewayscope"
OCI_LABELS = ("title", "description", "version", "source", "licenses")
#: the figures a scrape must show as the library computes them (every series of these metrics)
FIGURES = ("gatewayscope_up", "gatewayscope_trace_store_sessions", "gatewayscope_trace_store_traces",
           "gatewayscope_trace_store_orphan_sessions", "gatewayscope_bifrost_provider_records",
           "gatewayscope_bifrost_parked_workers", "gatewayscope_bifrost_queue_slots",
           "gatewayscope_bifrost_records_over_pool", "gatewayscope_bifrost_unreachable_records",
           "gatewayscope_bifrost_posture_drift", "gatewayscope_bifrost_worker_stack_bytes",
           "gatewayscope_bifrost_memory_limit_bytes")


@dataclass(frozen=True)
class Instruction:
    name: str
    value: str
    stage: int


def instructions() -> list[Instruction]:
    """The Containerfile's instructions with their stage (0 before the first FROM), as dockerfile-parse reads them."""
    out, stage = [], 0
    for item in parsed().structure:
        if item["instruction"] == "COMMENT":
            continue
        if item["instruction"] == "FROM":
            stage += 1
        out.append(Instruction(item["instruction"], item["value"], stage))
    return out


def parsed() -> Any:
    """The Containerfile through dockerfile-parse (a dev dependency: a missing one fails)."""
    try:
        import dockerfile_parse
    except ImportError as err:  # pragma: no cover - only without the dev extra
        pytest.fail(f"dockerfile-parse is not installed ({err}): pip install -e '.[dev]'")
    return dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(CONTAINERFILE.read_bytes()))


def final(name: str) -> list[Instruction]:
    """The runtime stage's instructions called ``name``."""
    items = instructions()
    last = max(item.stage for item in items)
    return [item for item in items if item.name == name and item.stage == last]


def exec_form(name: str) -> list[str]:
    [item] = final(name)
    value = json.loads(item.value)
    assert isinstance(value, list) and all(isinstance(part, str) for part in value), f"{name} is not exec form"
    return value


# -- the recipe's structure -------------------------------------------------------------------------------

def test_two_stages_on_one_slim_python_base_pinned_by_tag() -> None:
    items = instructions()
    froms = [item for item in items if item.name == "FROM"]
    assert [item.value for item in froms] == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    [arg] = [item for item in items if item.name == "ARG" and item.stage == 0]
    name, _, base = arg.value.partition("=")
    assert name == "PYTHON_IMAGE"
    assert re.fullmatch(r"docker\.io/library/python:3\.1[0-9]\.[0-9]+-slim-[a-z]+", base), base
    assert parsed().parent_images == [base, base]


def test_the_build_stage_builds_the_wheel_and_installs_it_into_a_venv() -> None:
    [run] = [item for item in instructions() if item.name == "RUN" and item.stage == 1]
    steps = [step.strip() for step in run.value.split("&&")]
    assert steps[0] == "python -m pip wheel --no-deps --wheel-dir /dist ."
    assert steps[1] == "python -m venv /opt/gatewayscope"
    assert steps[2] == "/opt/gatewayscope/bin/python -m pip install /dist/gatewayscope-*.whl"
    copies = [item.value for item in instructions() if item.name == "COPY" and item.stage == 1]
    for copy in copies:
        for source in copy.split()[:-1]:
            assert (ROOT / source).exists(), source
    assert "--from=build /opt/gatewayscope /opt/gatewayscope" in [item.value for item in final("COPY")]


def test_the_runtime_stage_runs_no_shell_as_a_fixed_non_root_user() -> None:
    assert final("RUN") == [], "the runtime stage must not need a shell, not even to be built"
    [user] = final("USER")
    assert user.value == f"{UID}:{GID}"
    entrypoint = exec_form("ENTRYPOINT")
    assert entrypoint == ["/opt/gatewayscope/bin/gatewayscope", "export"]
    command = exec_form("CMD")
    assert command == ["--config", "/etc/gatewayscope/gatewayscope.toml", "--listen", f"0.0.0.0:{DEFAULT_PORT}"]
    [expose] = final("EXPOSE")
    assert expose.value == str(DEFAULT_PORT)
    [workdir] = final("WORKDIR")
    assert workdir.value == "/"
    env = parsed().envs
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["TMPDIR"] == STATE
    assert f"--from=build --chown={UID}:{GID} {STATE} {STATE}" in [item.value for item in final("COPY")]


def test_oci_labels_carry_version_source_and_license() -> None:
    labels = parsed().labels
    for name in OCI_LABELS:
        assert labels.get(f"org.opencontainers.image.{name}"), name
    [label] = final("LABEL")
    assert 'org.opencontainers.image.version="${VERSION}"' in label.value
    [arg] = final("ARG")
    assert arg.value == f"VERSION={__version__}"
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert labels["org.opencontainers.image.licenses"] == pyproject["project"]["license"]
    assert labels["org.opencontainers.image.source"] == "https://github.com/gatewayscope/gatewayscope"


def test_the_build_context_holds_only_what_the_recipe_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[0] == "*"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = {source.rstrip("/") for item in instructions() if item.name == "COPY" and "--from" not in item.value
              for source in item.value.split()[:-1]}
    assert copied == allowed


# -- the contract, without an engine ------------------------------------------------------------------------

def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the container contract test (.ci/run installs util-linux)")
    pytest.skip(reason)


def runtime_python() -> str:
    """A Python that uid 65532 can run (its files world-readable), like the image's /usr/local/bin/python3."""
    for candidate in ("/usr/bin/python3", getattr(sys, "_base_executable", sys.executable)):
        if not candidate or not Path(candidate).exists():
            continue
        probe = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", candidate, "-c",
                                "import sys, venv, ensurepip; print(sys.version_info >= (3, 10))"],
                               capture_output=True, text=True, timeout=60, cwd="/")
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    unavailable(f"no Python >= 3.10 with venv here that uid {UID} may run")
    raise AssertionError  # unreachable


def in_image(path: str, root: Path) -> str:
    """An image path (/opt/gatewayscope/..., /etc/gatewayscope/..., /var/lib/gatewayscope) under ``root``."""
    for prefix in ("/opt/gatewayscope", "/etc/gatewayscope", STATE):
        if path == prefix or path.startswith(prefix + "/"):
            return str(root) + path
    return path


@pytest.fixture(scope="module")
def image_root() -> Iterator[Path]:
    """The recipe's steps run here: a folder laid out as the image (/opt/gatewayscope, /etc/gatewayscope,
    /var/lib/gatewayscope), world-readable like the image's, its state folder the image user's."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        unavailable("the container contract test needs root, unshare and setpriv (util-linux)")
    python = runtime_python()
    root = Path(tempfile.mkdtemp(prefix="gatewayscope-image-"))
    root.chmod(0o755)
    try:
        source = root / "src"
        source.mkdir()
        for item in instructions():  # the build stage's COPY lines, as they are
            if item.name == "COPY" and item.stage == 1:
                for name in item.value.split()[:-1]:
                    origin = ROOT / name
                    if origin.is_dir():
                        shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                    else:
                        shutil.copy(origin, source / name)
        dist = root / "dist"
        run = {"capture_output": True, "text": True, "timeout": 600, "cwd": source}
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), "."], **run)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        [wheel] = dist.glob("gatewayscope-*.whl")
        venv = root / "opt" / "gatewayscope"
        done = subprocess.run([python, "-m", "venv", str(venv)], **run)
        assert done.returncode == 0, done.stderr
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", str(wheel)], **run)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--yes", "--quiet", "pip"],
                              **run)
        assert done.returncode == 0, done.stderr
        (root / "etc" / "gatewayscope").mkdir(parents=True)
        state = root / STATE.lstrip("/")
        state.mkdir(parents=True)
        os.chown(state, UID, GID)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def files_of_the_image_user(skip: Path) -> list[str]:
    """Every file and folder owned by the image's uid, on every filesystem it could write, ``skip`` left out."""
    done = subprocess.run(["find", "/", "/dev/shm", "-xdev", "(", "-path", "/proc", "-o", "-path", "/sys",
                           "-o", "-path", str(skip), ")", "-prune", "-o", "-uid", str(UID), "-print"],
                          capture_output=True, text=True, timeout=300)
    return sorted(set(done.stdout.split()))


def parse_figures(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in FIGURES:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def total(figures: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(value for (metric, pairs), value in figures.items()
               if metric == name and set(labels.items()) <= set(pairs))


@pytest.mark.e2e
def test_the_entry_point_serves_the_sandbox_as_uid_65532_on_a_read_only_root(
        image_root: Path, rllm_gateway: Any, tmp_path: Path) -> None:
    from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_realistic
    from gatewayscope.sandbox.rollouts import run_rollouts

    if files_of_the_image_user(image_root / STATE.lstrip("/")):
        pytest.fail(f"uid {UID} already owns files on this machine; the check below needs a uid that owns none")
    sandbox = Path(tempfile.mkdtemp(prefix="gatewayscope-sandbox-"))
    sandbox.chmod(0o755)
    emulator = BifrostEmulator(auth=("admin", "bifrost-pw")).start()
    process = None
    try:
        # the sandbox: the unmodified gateway on its SQLite store with real stragglers, and the emulator
        gateway = rllm_gateway("sqlite", db_path=sandbox / "gateway_traces.db")
        run = run_rollouts(gateway.url, n_rollouts=4, n_stragglers=2, n_live=0, straggler_delay=1.0, seed=25,
                           settle_timeout=20.0)
        assert run.ok, run.to_dict()
        seeded = seed_realistic(emulator)
        for path in sandbox.iterdir():
            path.chmod(0o644)

        # the mounted config and secrets: readable by the image's group only
        etc = image_root / "etc" / "gatewayscope"
        secrets = etc / "secrets"
        secrets.mkdir(exist_ok=True)
        for name, value in {"bifrost-username": "admin", "bifrost-password": "bifrost-pw",
                            "exporter-username": "prometheus", "exporter-password": "exporter-pw"}.items():
            (secrets / name).write_text(value + "\n")
            os.chown(secrets / name, 0, GID)
            (secrets / name).chmod(0o640)
        config = etc / "gatewayscope.toml"
        config.write_text(f"""
[[targets]]
name = "rl-rest"
kind = "rllm"
url = "{gateway.url}"

[[targets]]
name = "rl-sqlite"
kind = "rllm"
path = "{sandbox / 'gateway_traces.db'}"

[[targets]]
name = "bifrost"
kind = "bifrost"
url = "{emulator.url}"
[targets.auth]
username_file = "/etc/gatewayscope/secrets/bifrost-username"
password_file = "/etc/gatewayscope/secrets/bifrost-password"

[policy]
orphan_idle_seconds = 1

[exporter]
min_interval_seconds = 0
basic_auth_username_file = "/etc/gatewayscope/secrets/exporter-username"
basic_auth_password_file = "/etc/gatewayscope/secrets/exporter-password"
""".replace("/etc/gatewayscope", str(etc)))

        # the image's ENTRYPOINT and CMD with its ENV, paths mapped, the listen address on loopback
        port = free_port()
        argv = [in_image(part, image_root) for part in exec_form("ENTRYPOINT") + exec_form("CMD")]
        argv[argv.index(f"0.0.0.0:{DEFAULT_PORT}")] = f"127.0.0.1:{port}"
        env = {name: in_image(value, image_root) for name, value in parsed().envs.items()}
        env["PATH"] = "/usr/bin:/bin"
        state = str(image_root / STATE.lstrip("/"))
        # a private mount namespace: / and /dev/shm read-only, the state folder alone writable, then the uid
        script = ("mount --make-rprivate / && mount --rbind / / && mount -o remount,bind,ro / "
                  "&& mount -o remount,bind,ro /dev/shm "
                  f"&& mount --bind {state} {state} && mount -o remount,bind,rw {state} {state} "
                  f"&& exec setpriv --reuid={UID} --regid={GID} --clear-groups --inh-caps=-all -- \"$@\"")
        command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
                   "env", "-i", *[f"{key}={value}" for key, value in env.items()], *argv]
        log, out = tmp_path / "exporter.log", tmp_path / "exporter.out"
        with log.open("w") as err, out.open("w") as printed:
            process = subprocess.Popen(command, cwd="/", stdout=printed, stderr=err)
        url = f"http://127.0.0.1:{port}"
        from tests.helpers import wait_for

        wait_for("the exporter", lambda: probe(url, process), lambda status: status != 0, timeout=60)
        assert process.poll() is None, log.read_text()
        assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401

        def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            answer = httpx.get(f"{url}/metrics", auth=("prometheus", "exporter-pw"), timeout=60)
            assert answer.status_code == 200, answer.text
            return parse_figures(answer.text)

        # the stragglers become orphans once idle past orphan_idle_seconds (1 s)
        served = wait_for("the stragglers as orphans", scrape, lambda figures: total(
            figures, "gatewayscope_trace_store_orphan_sessions") == 2 * len(run.straggler_uids), timeout=60,
            interval=0.5)

        # the same figures, computed by the library in this process from the same sandbox
        local = load_config(config)
        settings = parse_exporter_settings(local.exporter, str(config))
        expected = parse_figures(render(Exporter(local, settings).metrics_registry(read_budget(None, settings)))[0]
                                 .decode())
        assert served == expected
        for target, kind in (("rl-rest", "rllm"), ("rl-sqlite", "rllm"), ("bifrost", "bifrost")):
            assert served[("gatewayscope_up", (("kind", kind), ("target", target)))] == 1, target
        for target in ("rl-rest", "rl-sqlite"):
            assert total(served, "gatewayscope_trace_store_orphan_sessions", target=target) == len(run.straggler_uids)
        assert total(served, "gatewayscope_bifrost_provider_records", target="bifrost") == seeded.records
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        emulator.stop()
        shutil.rmtree(sandbox, ignore_errors=True)
    assert process is not None and process.returncode == 0, log.read_text()
    stderr = log.read_text()
    assert out.read_text() == "", "the exporter logs to stderr alone"
    assert "gatewayscope exporter serving" in stderr and stderr.rstrip().endswith("gatewayscope exporter stopped.")
    for sign in ("Traceback", "Read-only file system", "Permission denied", "exporter-pw", "bifrost-pw"):
        assert sign not in stderr, stderr
    assert files_of_the_image_user(image_root / STATE.lstrip("/")) == []


def probe(url: str, process: subprocess.Popen[bytes]) -> int:
    """The status of /-/ready, 0 while nothing answers; raises once the process has ended."""
    if process.poll() is not None:
        raise AssertionError(f"the exporter ended with {process.returncode} before it answered")
    try:
        return httpx.get(f"{url}/-/ready", timeout=5).status_code
    except httpx.HTTPError:
        return 0
