"""The embedded sandbox: real gateways with real stragglers, so gatewayscope has something to find.

:class:`Sandbox` starts (on free loopback ports, in a work folder of its own):

* the stub inference worker;
* two real, unmodified ``rllm-model-gateway`` processes in front of it, one with the memory store and
  one with the SQLite store, each driven through real rollouts with stragglers, so the straggler race
  (docs/concepts.md) leaves real one-trace orphans behind;
* the Bifrost emulator seeded with a realistic store (when available);
* optionally (``with_exporter``) the Prometheus exporter against the sandbox's config, as its own process
  (``gatewayscope export --config ... --listen 127.0.0.1:PORT``).

It writes a ``gatewayscope.toml`` naming all of them, so every command (scan, plan, apply, export, and the
notebooks) runs against the sandbox exactly as it would against production. :meth:`Sandbox.stop` stops
everything it started.

:func:`demo_plan` and :func:`plan_preview` give the plan the demo prints (never applied), and
:func:`notebook_command` the command that opens the notebooks on the sandbox.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gatewayscope.sandbox.processes import (
    ManagedProcess,
    free_port,
    python_argv,
    start_rllm_gateway,
    start_stub_worker,
)

if TYPE_CHECKING:
    from gatewayscope.config import Config
    from gatewayscope.remediate.plan import Plan
    from gatewayscope.snapshot import Snapshot

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
    exporter_url: str = ""
    expected_orphans: dict[str, list[str]] = field(default_factory=dict)
    live_sessions: dict[str, dict[str, int]] = field(default_factory=dict)

    def endpoints(self) -> dict[str, str]:
        """Every part that listens, by name, with its base URL (empty parts left out)."""
        parts = {"stub worker": self.worker_url, "rllm-memory": self.memory_gateway_url,
                 "rllm-sqlite": self.sqlite_gateway_url, "bifrost emulator": self.bifrost_url,
                 "exporter": self.exporter_url}
        return {name: url for name, url in parts.items() if url}


class Sandbox:
    """Start and stop the sandbox's processes. Use as a context manager."""

    def __init__(self, workdir: str | Path | None = None, *, rollouts: int = 30, stragglers: int = 10,
                 with_bifrost: bool = True, bifrost_seed: str = "realistic", with_exporter: bool = False,
                 say: Callable[[str], None] = print) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gatewayscope-sandbox-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rollouts = rollouts
        self.stragglers = stragglers
        self.with_bifrost = with_bifrost
        self.bifrost_seed = bifrost_seed
        self.with_exporter = with_exporter
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
        if self.with_exporter:
            self.start_exporter()

    def start_exporter(self, *, attempts: int = 3) -> str:
        """Start the exporter against the sandbox's config on a free port (its own process); its base URL.

        Runs ``gatewayscope export --config CONFIG --listen 127.0.0.1:PORT`` with this interpreter and
        waits for ``/-/healthy``; :meth:`stop` stops it with the rest.
        """
        last: RuntimeError | None = None
        for _ in range(max(1, attempts)):  # a free port can be taken between picking and binding it
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            self.say(f"starting the exporter on {url}")
            try:
                self._start("exporter", exporter_argv(self.run.config_path, port), f"{url}/-/healthy")
            except RuntimeError as err:
                last = err
                continue
            self.run.exporter_url = url
            return url
        assert last is not None
        raise last

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

    def running(self) -> dict[str, bool]:
        """Whether each process this sandbox started is still running, by name."""
        return {p.name: p.running() for p in self.processes}

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exporter_argv(config_path: str | Path, port: int, *, host: str = "127.0.0.1") -> list[str]:
    """``gatewayscope export --config CONFIG --listen HOST:PORT`` with the interpreter running us."""
    return python_argv("gatewayscope", "export", "--config", str(config_path), "--listen", f"{host}:{port}")


def demo_plan(snapshot: Snapshot, config: Config, *, out: str | Path | None = None) -> Plan:
    """The plan the demo shows (never applies): everything the sandbox's findings call for.

    The sandbox's orphans are suspected (they carry no tombstone: its gateways run without the guard) and
    its unreachable Bifrost records cannot be resized, so both are included. Saved to ``out`` when given,
    for ``gatewayscope show`` / ``apply`` and the remediate notebook's ``plan_path``.
    """
    from gatewayscope.remediate.plan import build_plan

    plan = build_plan(snapshot, config, include_suspected=True, include_deletes=True)
    if out is not None:
        plan.save(out)
    return plan


def plan_preview(plan: Plan, *, max_actions: int = 8) -> str:
    """The plan as ``gatewayscope show`` prints it (plan.txt.j2), with only its first ``max_actions`` actions."""
    from gatewayscope.remediate.plan import plan_summary
    from gatewayscope.remediate.review import before_after
    from gatewayscope.render import render

    data = plan.to_dict()
    left_out = max(0, len(plan.actions) - max_actions)
    data["actions"] = data["actions"][:max_actions]
    created = dt.datetime.fromtimestamp(plan.created_at, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = render("plan.txt.j2", plan=data, summary=plan_summary(plan), created=created, before_after=before_after)
    if left_out:
        text += f"  ... and {left_out:,} more actions.\n"
    return text


def notebooks_folder() -> Path | None:
    """The repository's ``notebooks/`` folder, when gatewayscope runs from a checkout (editable install)."""
    folder = Path(__file__).resolve().parents[2] / "notebooks"
    return folder if (folder / "triage.ipynb").exists() else None


def notebook_command(config_path: str | Path) -> str:
    """The shell command that opens the notebooks on ``config_path`` (JupyterLab from this environment)."""
    folder = notebooks_folder()
    where = shlex.quote(str(folder)) if folder else "notebooks/"
    jupyter = Path(sys.executable).parent / "jupyter"
    program = shlex.quote(str(jupyter)) if jupyter.exists() else "jupyter"
    prefix = f"GATEWAYSCOPE_CONFIG={shlex.quote(str(config_path))}"
    if os.environ.get("GATEWAYSCOPE_CONFIG") == str(config_path):
        prefix = ""
    return f"{prefix} {program} lab {where}".strip()
