"""Attaching the guard to gateways gatewayscope does not start (gatewayscope.guard.attach), in process, and the
hook ``guard run`` puts on ``PYTHONPATH`` (gatewayscope/guard/_autoattach/sitecustomize.py), in fresh processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rllm_model_gateway")

from rllm_model_gateway.models import GatewayConfig

from gatewayscope.cli.guard import guard_run_environment
from gatewayscope.guard import attach, discovery
from gatewayscope.guard.memory import GuardedTraceStore

HOOK = Path(attach.__file__).resolve().parent / "_autoattach"


def fake_server(create_app: Any) -> types.ModuleType:
    module = types.ModuleType("rllm_model_gateway.server")
    module.create_app = create_app  # type: ignore[attr-defined]
    return module


def test_a_patched_create_app_builds_rllms_app_around_the_guard(tmp_path: Path) -> None:
    import rllm_model_gateway.server as server

    module = fake_server(server.create_app)
    assert attach.patch_server_module(module, max_tombstones=7, discovery_dir=str(tmp_path))
    assert not attach.patch_server_module(module)  # once is enough
    config = GatewayConfig(host="0.0.0.0", port=45123, store_worker="memory")
    app = module.create_app(config=config)  # the way GatewayManager's thread mode calls it
    guard = app.state.guard
    assert isinstance(guard, GuardedTraceStore) and guard.max_tombstones == 7 and guard.index is not None
    assert {r.path for r in app.routes} >= {"/guard/status", "/metrics", "/guard/index"}
    positional = module.create_app(config)  # the way rLLM's own main calls it
    assert isinstance(positional.state.guard, GuardedTraceStore)

    async def serve_once() -> tuple[list[str], list[str]]:
        async with app.router.lifespan_context(app):
            during = sorted(p.name for p in tmp_path.iterdir())
        return during, sorted(p.name for p in tmp_path.iterdir())

    during, after = asyncio.run(serve_once())
    assert during == [f"gatewayscope-guard-{os.getpid()}-45123.json"] and after == []
    path = discovery.announce(tmp_path, host="0.0.0.0", port=45123, store="memory")
    labels = json.loads(path.read_text())[0]["labels"]
    assert labels["gatewayscope_url"] == "http://127.0.0.1:45123" and labels["gatewayscope_target"] == "guarded-45123"


def test_the_launcher_in_a_guarded_process_is_not_guarded_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gatewayscope gateway`` run under ``guard run``: rLLM's create_app is patched in that process, and the
    launcher builds its app around one guard, not a guard around a guard."""
    import rllm_model_gateway.server as server

    from gatewayscope.guard.gateway import build_app

    monkeypatch.setattr(server, "create_app", server.create_app)  # restored after the test
    assert attach.patch_server_module(server, max_tombstones=5)
    app = build_app(GatewayConfig(store_worker="memory"), max_tombstones=11)
    assert app.state.guard.max_tombstones == 11 and not isinstance(app.state.guard.inner, GuardedTraceStore)
    built = server.create_app(GatewayConfig(store_worker="memory"), store=app.state.guard)  # a guarded store:
    assert not hasattr(built.state, "guard")  # passed through to rLLM as it is, not wrapped again


def test_a_gateway_it_does_not_know_runs_unguarded_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    built: list[tuple[Any, ...]] = []

    def newer_create_app(settings: Any, handler: Any = None) -> str:  # no config, no store
        built.append((settings, handler))
        return "rLLM's own app"

    module = fake_server(newer_create_app)
    attach._said.clear()
    with caplog.at_level(logging.WARNING, logger="gatewayscope.guard"):
        attach.patch_server_module(module, max_tombstones=10)
        assert module.create_app("cfg") == "rLLM's own app"
        assert module.create_app("cfg", "h") == "rLLM's own app"
    assert built == [("cfg", None), ("cfg", "h")]
    assert [r.getMessage() for r in caplog.records].count(
        "gatewayscope guard: this rllm-model-gateway's create_app has no config and store parameters; the gateway "
        "runs UNGUARDED") == 1


def test_a_store_it_cannot_guard_leaves_rllms_app_as_rllm_builds_it(caplog: pytest.LogCaptureFixture) -> None:
    import rllm_model_gateway.server as server

    class NewerStore:
        async def store_trace(self, trace: Any) -> None: ...

    module = fake_server(server.create_app)
    attach._said.clear()
    attach.patch_server_module(module, max_tombstones=10)
    with caplog.at_level(logging.WARNING, logger="gatewayscope.guard"):
        app = module.create_app(GatewayConfig(store_worker="memory"), store=NewerStore())
    assert not hasattr(app.state, "guard")
    assert "UNGUARDED" in caplog.text


def test_the_options_come_from_the_environment_guard_run_sets(tmp_path: Path) -> None:
    env = guard_run_environment({"PYTHONPATH": "/elsewhere"}, max_tombstones=42, discovery_dir=str(tmp_path))
    assert env["PYTHONPATH"].split(os.pathsep) == [str(HOOK), "/elsewhere"]
    assert env[attach.ENABLE_ENV] == "1"
    assert attach.options_from_env(env) == (42, str(tmp_path))
    attach._said.clear()
    assert attach.options_from_env({attach.MAX_TOMBSTONES_ENV: "lots"}) == (1_000_000, None)


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.e2e  # starts a process
def test_the_hook_patches_the_gateway_as_a_fresh_process_imports_it(tmp_path: Path) -> None:
    env = guard_run_environment(dict(os.environ), max_tombstones=9, discovery_dir=None)
    code = ("import sys; print('gatewayscope' in sys.modules); "
            "import rllm_model_gateway.server as s; from rllm_model_gateway.models import GatewayConfig; "
            "app = s.create_app(GatewayConfig(store_worker='memory')); print(app.state.guard.max_tombstones)")
    done = run_python(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "9"], "nothing of gatewayscope loads before the gateway does"
    off = run_python(code.replace("print(app.state.guard.max_tombstones)", "print(hasattr(app.state, 'guard'))"),
                     {**env, attach.ENABLE_ENV: "0"})
    assert off.stdout.split() == ["False", "False"], off.stderr
