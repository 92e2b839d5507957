"""``gatewayscope guard run``: a trainer-like process starts the real rLLM gateway itself, in each of the two ways
rLLM's ``GatewayManager`` does, and every gateway it starts gets the guard; the exporter finds it on its random
port through the discovery directory and forgets it once the process is gone.

* process mode: ``subprocess.Popen([sys.executable, "-m", "rllm_model_gateway", "--host", ..., "--port", P,
  "--store", S, ...])`` with the trainer's environment;
* thread mode: ``create_app(GatewayConfig(...))`` served by ``uvicorn.Server(...).run`` on a daemon thread.

The trainer script below is what those two code paths do (nothing of gatewayscope in it); it runs under the
gateway flavour's own Python, so upstream main's gateway is tested under its own interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.sandbox.processes import ManagedProcess, free_port
from gatewayscope.sandbox.rollouts import run_rollouts, trainer_steps

pytestmark = pytest.mark.e2e

TRAINER = r"""
import signal, subprocess, sys, threading, time
mode, port, worker, store, db = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] or None
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
if mode == "process":  # rllm/gateway/manager.py GatewayManager._gateway_cmd / _start_process
    cmd = [sys.executable, "-m", "rllm_model_gateway", "--host", "127.0.0.1", "--port", str(port), "--store", store,
           "--worker", worker, "--log-level", "warning"]
    if db:
        cmd += ["--db-path", db]
    child = subprocess.Popen(cmd)
    print("started", flush=True)
    while not stop.is_set() and child.poll() is None:
        time.sleep(0.1)
    child.terminate()
    child.wait(timeout=20)
else:  # GatewayManager._start_thread
    import uvicorn
    from rllm_model_gateway.models import GatewayConfig
    from rllm_model_gateway.server import create_app

    config = GatewayConfig(host="127.0.0.1", port=port, store_worker=store, db_path=db,
                           workers=[{"url": worker, "worker_id": "0"}])
    app = create_app(config=config)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    print("started", flush=True)
    while not stop.is_set():
        time.sleep(0.1)
    server.should_exit = True
    thread.join(timeout=20)
"""


def cli(python: str, *args: str) -> list[str]:
    return [python, "-c", "from gatewayscope.cli import run; run()", *args]


def start_trainer(tmp_path: Path, python: str, mode: str, store: str, worker: str,
                  discovery: Path) -> tuple[ManagedProcess, str]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    db = str(tmp_path / f"traces-{mode}.db") if store == "sqlite" else ""
    for _attempt in range(3):  # a free port can be taken between picking and binding it
        port = free_port()
        proc = ManagedProcess(f"trainer-{mode}", cli(python, "guard", "run", "--discovery-dir", str(discovery), "--",
                                                     python, str(script), mode, str(port), worker.rstrip("/"),
                                                     store, db))
        url = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(url + "/health")
            if store == "sqlite":  # 0.1.0's SQLite store opens its file at the first request
                httpx.get(f"{url}/sessions", timeout=30).raise_for_status()
        except (RuntimeError, httpx.HTTPError):
            proc.stop()
            continue
        return proc, url
    pytest.fail("the trainer's gateway did not start")


def exporter_once(python: str, config: Path) -> str:
    done = subprocess.run(cli(python, "export", "--config", str(config), "--once"), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


@pytest.mark.parametrize("store", ["memory", "sqlite"])
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_trainer_started_gateway_is_guarded_found_and_forgotten(mode: str, store: str, gateway_flavor: Any,
                                                                  stub_worker: str, tmp_path: Path) -> None:
    discovery = tmp_path / "gateways"
    trainer, url = start_trainer(tmp_path, gateway_flavor.python, mode, store, stub_worker, discovery)
    try:
        status = httpx.get(f"{url}/guard/status", timeout=10)
        assert status.status_code == 200 and status.json()["enabled"], "the guard is attached to the gateway"
        port = url.rsplit(":", 1)[1]
        announced = sorted(p.name for p in discovery.glob("gatewayscope-guard-*.json"))
        assert len(announced) == 1 and announced[0].endswith(f"-{port}.json")
        entry = json.loads((discovery / announced[0]).read_text())
        assert entry[0]["targets"] == [f"127.0.0.1:{port}"] and entry[0]["labels"]["gatewayscope_store"] == store

        # the straggler race leaves no orphan, and reuse across steps keeps every trace
        race = run_rollouts(url, n_rollouts=6, n_stragglers=6, straggler_delay=1.0, calls_per_rollout=2, n_live=0,
                            group_size=3, seed=5, settle_timeout=3.0)
        assert race.errors == [] and all(race.in_flight_confirmed.values())
        listed = {s["session_id"] for s in httpx.get(f"{url}/sessions", timeout=30).json()}
        assert not set(race.deleted_uids) & listed
        steps = trainer_steps(url, ["task-g:0", "task-g:1"], steps=2, calls=3, straggler="task-g:0")
        assert steps.errors == [] and steps.kept == [{"task-g:0": 3, "task-g:1": 3}] * 2
        assert steps.straggler_joined is False

        # the exporter, given only the discovery directory, finds the gateway on its random port in one read
        config = tmp_path / "exporter.toml"
        config.write_text(f'[exporter]\ndiscovery_dir = "{discovery}"\n')
        metrics = exporter_once(sys.executable, config)
        assert f'gatewayscope_up{{kind="rllm",target="guarded-{port}"}} 1.0' in metrics
        assert f'gatewayscope_trace_store_dropped_writes_total{{target="guarded-{port}"}}' in metrics
    finally:
        trainer.stop()
    # stopped: its announcement is withdrawn (or, were it killed, its dead pid is ignored) and the exporter forgets it
    deadline = time.monotonic() + 20
    while list(discovery.glob("gatewayscope-guard-*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    metrics = exporter_once(sys.executable, tmp_path / "exporter.toml")
    assert f'target="guarded-{port}"' not in metrics


def test_a_killed_gateway_announcement_is_ignored(tmp_path: Path) -> None:
    """A gateway killed before it could withdraw its file: the exporter skips an entry whose pid is gone."""
    from gatewayscope.guard import discovery

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    folder = tmp_path / "gateways"
    path = discovery.announce(folder, host="0.0.0.0", port=40001, store="memory")
    dead = path.with_name(f"gatewayscope-guard-{gone.pid}-40002.json")
    dead.write_text(path.read_text().replace(str(os.getpid()), str(gone.pid)).replace("40001", "40002"))
    (folder / "gatewayscope-guard-1-1.json").write_text("not json")
    found = discovery.discover(folder)
    assert [(e.name, e.url, e.pid) for e in found] == [("guarded-40001", "http://127.0.0.1:40001", os.getpid())]
    discovery.withdraw(path)
    assert discovery.discover(folder) == []


def test_a_process_that_never_imports_the_gateway_runs_as_it_would(tmp_path: Path) -> None:
    """guard run on a non-gateway program: same output, same exit status; its own sitecustomize still runs."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE_RAN'] = '1'\n")
    code = "import os, sys; print(os.environ.get('OWN_SITECUSTOMIZE_RAN'), 'rllm_model_gateway' in sys.modules); " \
           "sys.exit(3)"
    env = {**os.environ, "PYTHONPATH": str(own)}
    done = subprocess.run(cli(sys.executable, "guard", "run", "--", sys.executable, "-c", code), env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (3, "1 False"), done.stderr
    missing = subprocess.run(cli(sys.executable, "guard", "run", "--", "no-such-program-here"), capture_output=True,
                             text=True, timeout=60, check=False)
    assert missing.returncode == 2 and "not a program on PATH" in missing.stderr
    assert "Traceback" not in missing.stderr
