"""The embedded sandbox: real gateways with real stragglers, so gatewayscope has something to find.

:class:`Sandbox` starts (on free loopback ports, in a work folder of its own):

* the stub inference worker;
* two real, unmodified ``rllm-model-gateway`` processes in front of it, one with the memory store and
  one with the SQLite store, each driven through real rollouts with stragglers, so the seed-000 race
  leaves real one-trace orphans behind;
* the Bifrost emulator seeded with a realistic store (when available).

It writes a ``gatewayscope.toml`` naming all of them, so every command (scan, and later plan, apply and
export) runs against the sandbox exactly as it would against production. :meth:`Sandbox.stop` stops
everything it started.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gatewayscope.sandbox.processes import (
    ManagedProcess,
    free_port,
    python_argv,
    start_rllm_gateway,
    start_stub_worker,
)

#: the sandbox's idle threshold: its orphans are seconds old, not hours
DEMO_IDLE_SECONDS = 5.0


@dataclass
class SandboxRun:
    """Where the sandbox's parts listen and what the rollouts left behind."""

    workdir: Path
    config_path: Path
    worker_url: str = ""
    memory_gateway_url: str = ""
    sqlite_gateway_url: str = ""
    sqlite_path: str = ""
    bifrost_url: str = ""
    expected_orphans: dict[str, list[str]] = field(default_factory=dict)
    live_sessions: dict[str, dict[str, int]] = field(default_factory=dict)


class Sandbox:
    """Start and stop the sandbox's processes. Use as a context manager."""

    def __init__(self, workdir: str | Path | None = None, *, rollouts: int = 30, stragglers: int = 10,
                 with_bifrost: bool = True, bifrost_seed: str = "realistic",
                 say: Callable[[str], None] = print) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gatewayscope-sandbox-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rollouts = rollouts
        self.stragglers = stragglers
        self.with_bifrost = with_bifrost
        self.bifrost_seed = bifrost_seed
        self.say = say
        self.processes: list[ManagedProcess] = []
        self.run = SandboxRun(workdir=self.workdir, config_path=self.workdir / "gatewayscope.toml")

    # -- lifecycle -------------------------------------------------------------------------------

    def _start(self, name: str, argv: list[str], health_url: str) -> ManagedProcess:
        process = ManagedProcess(name, argv)
        self.processes.append(process)
        process.wait_http(health_url, timeout=60)
        return process

    def start(self) -> SandboxRun:
        """Start every part, drive the rollouts, write the config. Stops what it started on failure."""
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        return self.run

    def _start_all(self) -> None:
        from gatewayscope.sandbox.rollouts import run_rollouts

        run = self.run
        self.say("starting the stub inference worker")
        worker = start_stub_worker()
        self.processes.append(worker.process)
        run.worker_url = worker.url
        self.say("starting rllm-model-gateway with the memory store")
        memory = start_rllm_gateway(worker.url, store="memory")
        self.processes.append(memory.process)
        run.memory_gateway_url = memory.url
        run.sqlite_path = str(self.workdir / "gateway_traces.db")
        self.say(f"starting rllm-model-gateway with the SQLite store {run.sqlite_path}")
        sqlite = start_rllm_gateway(worker.url, store="sqlite", db_path=run.sqlite_path)
        self.processes.append(sqlite.process)
        run.sqlite_gateway_url = sqlite.url

        if self.with_bifrost:
            port = free_port()
            run.bifrost_url = f"http://127.0.0.1:{port}"
            self.say(f"starting the Bifrost emulator (seed {self.bifrost_seed!r})")
            self._start("bifrost-emulator",
                        python_argv("gatewayscope.sandbox.bifrost_emulator", "--host", "127.0.0.1",
                                    "--port", str(port), "--seed", self.bifrost_seed),
                        f"{run.bifrost_url}/health")

        for name, url in (("rllm-memory", run.memory_gateway_url), ("rllm-sqlite", run.sqlite_gateway_url)):
            self.say(f"driving {self.rollouts} rollouts through {name}, {self.stragglers} of them with a call "
                     "still in flight when the rollout deletes its session")
            result = run_rollouts(url, n_rollouts=self.rollouts, n_stragglers=self.stragglers, n_live=3,
                                  live_calls=[2, 3, 4])
            if result.errors:
                raise RuntimeError(f"rollouts through {name} failed: {'; '.join(result.errors[:3])}")
            run.expected_orphans[name] = sorted(result.straggler_uids)
            run.live_sessions[name] = dict(result.live_uids)
        self._write_config()

    def _write_config(self) -> None:
        run = self.run
        lines = [
            "# written by `gatewayscope demo`: the sandbox's targets",
            "[[targets]]", 'name = "rllm-memory"', 'kind = "rllm"', f'url = "{run.memory_gateway_url}"', "",
            "[[targets]]", 'name = "rllm-sqlite"', 'kind = "rllm"', f'path = "{run.sqlite_path}"', "",
        ]
        if run.bifrost_url:
            lines += ["[[targets]]", 'name = "bifrost"', 'kind = "bifrost"', f'url = "{run.bifrost_url}"', ""]
        lines += ["[policy]", f"orphan_idle_seconds = {DEMO_IDLE_SECONDS}", ""]
        run.config_path.write_text("\n".join(lines))

    def wait_until_idle(self) -> None:
        """Let the orphans age past the sandbox's idle threshold."""
        time.sleep(DEMO_IDLE_SECONDS + 0.5)

    def stop(self) -> None:
        """Stop every process this sandbox started (newest first); remove a work folder it made."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
