"""The embedded sandbox: real gateways with real stragglers, so gatewayscope has something to find.

:class:`Sandbox` starts (on free loopback ports, in a work folder of its own):

* the stub inference worker;
* two real, unmodified ``rllm-model-gateway`` processes in front of it, one with the memory store and
  one with the SQLite store, each driven through real rollouts with stragglers, so the straggler race
  (docs/concepts.md) leaves real one-trace orphans behind;
* the same rollouts through two guarded stores: gatewayscope's guarded launcher with the memory store
  (``python -m gatewayscope.guard.gateway``), whose guard drops every straggler's late write, and an
  unmodified gateway whose SQLite file gets the guard's triggers late (``guard.sqlite.install``): its first
  rollouts leave orphans; a journaled cleanup (a real apply) deletes them while each of those rollouts still
  has a call in flight, which lands afterwards and brings its session back; then the guard is installed and
  the next rollouts' late writes are dropped. The sessions that came back are *confirmed* orphans (the
  cleanup's journal proves their delete) without a tombstone (deleted before the guard), so a plan given
  that journal backfills their tombstones before deleting them;
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

import concurrent.futures
import datetime as dt
import functools
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
    from gatewayscope.sandbox.rollouts import RolloutRun
    from gatewayscope.snapshot import Snapshot

#: the sandbox's idle threshold: its orphans are seconds old, not hours
DEMO_IDLE_SECONDS = 5.0
#: the targets of the two guarded stores
GUARDED_MEMORY, GUARDED_SQLITE = "rllm-memory-guarded", "rllm-sqlite-guarded"
#: how long the rollout driver waits for a straggler's late trace behind a guard, which drops it: it never shows
GUARDED_SETTLE_SECONDS = 0.5
#: how long it waits for a straggler's late trace where nothing drops it (the driver's default)
UNGUARDED_SETTLE_SECONDS = 15.0

T = TypeVar("T")


@dataclass
class SandboxRun:
    """Where the sandbox's parts listen and what the rollouts left behind."""

    workdir: Path
    config_path: Path
    worker_url: str = ""
    memory_gateway_url: str = ""
    sqlite_gateway_url: str = ""
    sqlite_path: str = ""
    guarded_memory_gateway_url: str = ""
    guarded_sqlite_gateway_url: str = ""
    guarded_sqlite_path: str = ""
    bifrost_url: str = ""
    exporter_url: str = ""
    #: the orphans each store should hold, by target: suspected ones on the unguarded stores, on the guarded
    #: SQLite store the sessions that came back after the cleanup (confirmed by its journal); none on the
    #: guarded memory gateway
    expected_orphans: dict[str, list[str]] = field(default_factory=dict)
    #: by guarded target: the stragglers whose late write its guard dropped
    dropped_stragglers: dict[str, list[str]] = field(default_factory=dict)
    #: the journal of the cleanup that ran on the guarded SQLite store before its guard (``--deleted-from``)
    cleanup_journal: str = ""

    def deleted_ids(self) -> dict[str, dict[str, float]]:
        """The sessions the cleanup's journal records as deleted, per target, each with the moment of its delete
        (``deleted_ids=``; see :func:`gatewayscope.remediate.journal.deleted_sessions`)."""
        if not self.cleanup_journal or not Path(self.cleanup_journal).exists():
            return {}
        from gatewayscope.remediate.journal import Journal, deleted_sessions

        return deleted_sessions(Journal(self.cleanup_journal))
    live_sessions: dict[str, dict[str, int]] = field(default_factory=dict)

    def endpoints(self) -> dict[str, str]:
        """Every part that listens, by name, with its base URL (empty parts left out)."""
        parts = {"stub worker": self.worker_url, "rllm-memory": self.memory_gateway_url,
                 "rllm-sqlite": self.sqlite_gateway_url, GUARDED_MEMORY: self.guarded_memory_gateway_url,
                 GUARDED_SQLITE: self.guarded_sqlite_gateway_url, "bifrost emulator": self.bifrost_url,
                 "exporter": self.exporter_url}
        return {name: url for name, url in parts.items() if url}

    def gateway_urls(self) -> dict[str, str]:
        """Every rLLM gateway's base URL, by the name of its target."""
        urls = {"rllm-memory": self.memory_gateway_url, "rllm-sqlite": self.sqlite_gateway_url,
                GUARDED_MEMORY: self.guarded_memory_gateway_url, GUARDED_SQLITE: self.guarded_sqlite_gateway_url}
        return {name: url for name, url in urls.items() if url}


class Sandbox:
    """Start and stop the sandbox's processes. Use as a context manager."""

    def __init__(self, workdir: str | Path | None = None, *, rollouts: int = 30, stragglers: int = 10,
                 with_bifrost: bool = True, bifrost_seed: str = "realistic", with_exporter: bool = False,
                 say: Callable[[str], None] = print) -> None:
        self._own_workdir = workdir is None
        # absolute: the config it writes names the SQLite files, and the notebooks read it from another folder
        self.workdir = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="gatewayscope-sandbox-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rollouts = rollouts
        self.stragglers = stragglers
        self.with_bifrost = with_bifrost
        self.bifrost_seed = bifrost_seed
        self.with_exporter = with_exporter
        self.say = say
        self.processes: list[ManagedProcess] = []
        self._lock = threading.Lock()
        self._stopping = False
        self.run = SandboxRun(workdir=self.workdir, config_path=self.workdir / "gatewayscope.toml")

    # -- lifecycle -------------------------------------------------------------------------------

    def _start(self, name: str, argv: list[str], health_url: str) -> ManagedProcess:
        process = ManagedProcess(name, argv)
        self._register(process)
        process.wait_http(health_url, timeout=60)
        return process

    def start(self) -> SandboxRun:
        """Start every part, drive the rollouts, write the config. Stops what it started on failure.

        Starting a running sandbox again changes nothing (its run is returned)."""
        if self.processes:
            return self.run
        with self._lock:
            self._stopping = False
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        return self.run

    def _start_all(self) -> None:
        from gatewayscope.guard.sqlite import install

        run = self.run
        self.say("starting the stub inference worker")
        worker = start_stub_worker()
        self._register(worker.process)
        run.worker_url = worker.url
        run.sqlite_path = str(self.workdir / "gateway_traces.db")
        run.guarded_sqlite_path = str(self.workdir / "guarded_traces.db")
        self.say(f"starting, at once: rllm-model-gateway with the memory store; with the SQLite store "
                 f"{run.sqlite_path}; gatewayscope's guarded gateway (the tombstone guard inside) with the memory "
                 f"store; rllm-model-gateway with the SQLite store {run.guarded_sqlite_path} (guarded halfway)"
                 + (f"; the Bifrost emulator (seed {self.bifrost_seed!r})" if self.with_bifrost else ""))
        gateway = functools.partial(start_rllm_gateway, worker.url, register=self._register)
        jobs: dict[str, Callable[[], object]] = {
            "rllm-memory": lambda: gateway(store="memory", name="rllm-memory"),
            "rllm-sqlite": lambda: gateway(store="sqlite", db_path=run.sqlite_path, name="rllm-sqlite"),
            GUARDED_MEMORY: lambda: gateway(store="memory", guarded=True, name=GUARDED_MEMORY),
            GUARDED_SQLITE: lambda: gateway(store="sqlite", db_path=run.guarded_sqlite_path, name=GUARDED_SQLITE),
        }
        if self.with_bifrost:
            port = free_port()
            jobs["bifrost"] = lambda: self._start(
                "bifrost-emulator", python_argv("gatewayscope.sandbox.bifrost_emulator", "--host", "127.0.0.1",
                                                "--port", str(port), "--seed", self.bifrost_seed),
                f"http://127.0.0.1:{port}/health")
            run.bifrost_url = f"http://127.0.0.1:{port}"
        started = self._at_once(jobs)
        urls = {name: str(getattr(gw, "url", "")) for name, gw in started.items()}
        run.memory_gateway_url, run.sqlite_gateway_url = urls["rllm-memory"], urls["rllm-sqlite"]
        run.guarded_memory_gateway_url, run.guarded_sqlite_gateway_url = urls[GUARDED_MEMORY], urls[GUARDED_SQLITE]

        # one gateway at a time: drivers running side by side on a small, busy machine saw calls reset.
        # The store guarded late goes first, so its orphans age past the idle threshold meanwhile.
        before = self._drive(GUARDED_SQLITE, run.guarded_sqlite_gateway_url, guarded=False)
        aged_at = time.monotonic() + DEMO_IDLE_SECONDS + 0.5
        run.live_sessions[GUARDED_SQLITE] = dict(before.live_uids)
        for name, url in (("rllm-memory", run.memory_gateway_url), ("rllm-sqlite", run.sqlite_gateway_url),
                          (GUARDED_MEMORY, run.guarded_memory_gateway_url)):
            result = self._drive(name, url, guarded=name == GUARDED_MEMORY)
            if name == GUARDED_MEMORY:
                run.dropped_stragglers[name] = sorted(result.straggler_uids)
            else:
                run.expected_orphans[name] = sorted(result.straggler_uids)
            run.live_sessions[name] = dict(result.live_uids)
        time.sleep(max(0.0, aged_at - time.monotonic()))
        run.expected_orphans[GUARDED_SQLITE] = self._clean_up_before_the_guard(sorted(before.straggler_uids))
        self.say(f"installing the tombstone guard into {run.guarded_sqlite_path} while its gateway runs")
        install(run.guarded_sqlite_path)
        after = self._drive(GUARDED_SQLITE, run.guarded_sqlite_gateway_url, guarded=True, live=False, seed=1)
        run.dropped_stragglers[GUARDED_SQLITE] = sorted(after.straggler_uids)
        self._write_config()
        if self.with_exporter:
            self.start_exporter()

    def _register(self, process: ManagedProcess) -> None:
        """Own ``process`` (:meth:`stop` stops it); stop it at once when the sandbox is already stopping."""
        with self._lock:
            if not self._stopping:
                self.processes.append(process)
                return
        process.stop()
        raise RuntimeError(f"the sandbox is stopping: {process.name} was not kept")

    def _at_once(self, jobs: dict[str, Callable[[], T]]) -> dict[str, T]:
        """Run ``jobs`` at the same time, each in a thread; their results by name once all have ended.

        The first failure (in the order of ``jobs``) is raised after every job has ended. When the wait is
        interrupted (Ctrl-C), the interruption goes up at once: :meth:`start` then stops every process
        registered so far, and a job still starting one has it stopped by :meth:`_register`.
        """
        pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="sandbox")
        try:
            futures = {name: pool.submit(job) for name, job in jobs.items()}
            concurrent.futures.wait(futures.values())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return {name: future.result() for name, future in futures.items()}

    def _drive(self, name: str, url: str, *, guarded: bool, live: bool = True, seed: int = 0) -> RolloutRun:
        """The sandbox's rollouts through one gateway: ``rollouts`` of them, ``stragglers`` with a late call."""
        from gatewayscope.sandbox.rollouts import run_rollouts

        self.say(f"driving {self.rollouts} rollouts through {name}, {self.stragglers} of them with a call "
                 "still in flight when the rollout deletes its session"
                 + (" (its guard drops those late writes)" if guarded else ""))
        # behind a guard a straggler's late trace never shows, so the driver does not wait long for it
        result = run_rollouts(url, n_rollouts=self.rollouts, n_stragglers=self.stragglers, n_live=3 if live else 0,
                              live_calls=[2, 3, 4] if live else None, seed=seed,
                              settle_timeout=GUARDED_SETTLE_SECONDS if guarded else UNGUARDED_SETTLE_SECONDS)
        if result.errors:
            raise RuntimeError(f"rollouts through {name} failed: {'; '.join(result.errors[:3])}")
        return result

    def _clean_up_before_the_guard(self, orphans: list[str]) -> list[str]:
        """A cleanup of the not yet guarded SQLite store while its orphans' rollouts still have a call in flight.

        A real, journaled apply deletes the ``orphans`` (suspected: one idle trace); each of those rollouts has
        one more call held at the worker meanwhile, released after the apply, whose trace re-creates the
        session. Returns the sessions that came back (all of them): the journal proves their delete.
        """
        from gatewayscope.api import apply_plan
        from gatewayscope.config import Config, Policy, Target
        from gatewayscope.remediate.plan import build_plan
        from gatewayscope.sandbox.rollouts import land_late_calls
        from gatewayscope.scan import take_snapshot

        run = self.run
        run.cleanup_journal = str(self.workdir / "cleanup-before-guard.journal.jsonl")
        config = Config(targets=[Target(name=GUARDED_SQLITE, kind="rllm", path=run.guarded_sqlite_path)],
                        policy=Policy(orphan_idle_seconds=DEMO_IDLE_SECONDS))

        def clean_up() -> None:
            plan = build_plan(take_snapshot(config), config, include_suspected=True, only=["session_delete"])
            planned = sorted(a.subject for a in plan.actions)
            if planned != orphans:
                raise RuntimeError(f"the cleanup found {planned}, not the orphans {orphans}")
            report = apply_plan(plan, config, write=True, allow_delete=True, journal=run.cleanup_journal)
            if report.counts.get("done") != len(orphans):
                raise RuntimeError(f"the cleanup did not delete every orphan: {report}")

        self.say(f"cleaning up {len(orphans)} orphans of {GUARDED_SQLITE} (a journaled apply, before its guard) "
                 "while each of their rollouts still has a call in flight")
        landing = land_late_calls(run.guarded_sqlite_gateway_url, orphans, clean_up)
        if landing.errors or landing.landed != orphans:
            raise RuntimeError(f"the late calls after the cleanup did not all land: {landing.errors[:3]} "
                               f"(landed {len(landing.landed)} of {len(orphans)})")
        return landing.landed

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

        def target(name: str, kind: str, key: str, value: str, comment: str = "") -> list[str]:
            return [*([comment] if comment else []), "[[targets]]", f"name = {toml_string(name)}",
                    f"kind = {toml_string(kind)}", f"{key} = {toml_string(value)}", ""]

        lines = ["# written by `gatewayscope demo`: the sandbox's targets",
                 *target("rllm-memory", "rllm", "url", run.memory_gateway_url),
                 *target("rllm-sqlite", "rllm", "path", run.sqlite_path)]
        if run.guarded_memory_gateway_url:
            lines += target(GUARDED_MEMORY, "rllm", "url", run.guarded_memory_gateway_url,
                            "# gatewayscope's guarded gateway (python -m gatewayscope.guard.gateway), memory store")
        if run.guarded_sqlite_path:
            lines += target(GUARDED_SQLITE, "rllm", "path", run.guarded_sqlite_path,
                            "# an unmodified gateway's SQLite file with the guard's triggers installed")
        if run.bifrost_url:
            lines += target("bifrost", "bifrost", "url", run.bifrost_url)
        lines += ["[policy]", f"orphan_idle_seconds = {DEMO_IDLE_SECONDS}", ""]
        run.config_path.write_text("\n".join(lines))

    def wait_until_idle(self) -> None:
        """Let the orphans age past the sandbox's idle threshold."""
        time.sleep(DEMO_IDLE_SECONDS + 0.5)

    def stop(self) -> None:
        """Stop every process this sandbox started (newest first); remove a work folder it made."""
        with self._lock:
            self._stopping = True
            processes = list(self.processes)
            self.processes.clear()
        for process in reversed(processes):
            process.stop()
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


def toml_string(value: str) -> str:
    r"""``value`` as a TOML basic string: quotes and backslashes escaped, control characters as ``\uXXXX``.

    >>> print(toml_string('C:\\runs\\"a"\tb'))
    "C:\\runs\\\"a\"\u0009b"
    """
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def exporter_argv(config_path: str | Path, port: int, *, host: str = "127.0.0.1") -> list[str]:
    """``gatewayscope export --config CONFIG --listen HOST:PORT`` with the interpreter running us."""
    return python_argv("gatewayscope", "export", "--config", str(config_path), "--listen", f"{host}:{port}")


def demo_plan(snapshot: Snapshot, config: Config, *, out: str | Path | None = None,
              deleted_ids: Mapping[str, Any] | None = None) -> Plan:
    """The plan the demo shows (never applies): everything the sandbox's findings call for.

    The unguarded stores' orphans are suspected (they carry no tombstone) and the unreachable Bifrost
    records cannot be resized, so both are included. ``deleted_ids`` (the sandbox's
    :meth:`SandboxRun.deleted_ids`) confirm the guarded SQLite store's orphans, which carry no tombstone:
    the plan backfills theirs before deleting them. Saved to ``out`` when given,
    for ``gatewayscope show`` / ``apply`` and the remediate notebook's ``plan_path``.
    """
    from gatewayscope.remediate.plan import build_plan

    plan = build_plan(snapshot, config, include_suspected=True, include_deletes=True, deleted_ids=deleted_ids or {})
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


def notebook_command(config_path: str | Path, *, as_root: bool | None = None,
                     lab_config: str | Path | None = None) -> str:
    """The shell command that opens the notebooks on ``config_path`` (JupyterLab from this environment).

    JupyterLab refuses to start as root unless told ``--allow-root``, so the command carries it when the
    user running the demo is root (``as_root``; default: whether this process's effective uid is 0).
    ``lab_config`` is a folder made by :func:`gatewayscope.notebook.write_lab_config`, put on
    ``JUPYTER_CONFIG_PATH`` so that JupyterLab saves the widgets' state with a notebook.
    """
    folder = notebooks_folder()
    where = shlex.quote(str(folder)) if folder else "notebooks/"
    jupyter = Path(sys.executable).parent / "jupyter"
    program = shlex.quote(str(jupyter)) if jupyter.exists() else "jupyter"
    prefix = f"GATEWAYSCOPE_CONFIG={shlex.quote(str(config_path))}"
    if os.environ.get("GATEWAYSCOPE_CONFIG") == str(config_path):
        prefix = ""
    if lab_config is not None:
        prefix = f"{prefix} JUPYTER_CONFIG_PATH={shlex.quote(str(lab_config))}".strip()
    if as_root is None:
        as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    allow_root = " --allow-root" if as_root else ""
    return f"{prefix} {program} lab{allow_root} {where}".strip()
