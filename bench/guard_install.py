"""``gatewayscope guard install`` on a large store while the real rLLM gateway writes to it from 8 writers.

One row, ``guard-install-under-load``: the 10,000,000-session store of :mod:`bench._stores` (times ``--scale``),
copied fresh for each run, the unmodified 0.1.0 ``rllm-model-gateway --store sqlite`` serving the copy in front
of the stub worker, and 8 writer threads sending paced chat calls on their own live sessions (as the e2e's load
does). Once the load is under way, ``install()`` runs in a fresh child (its seconds and peak RSS are its own);
the load goes on until it has had calls answered after install returned, then stops, and the file is read for
the answered calls' traces (by the worker's response id) once the gateway has persisted its last ones.

Baseline: the same install, in a fresh child, on another fresh copy with no gateway and no load, in the same
run. Goals: the install finishes under the load (an error is an ERROR row), no answered trace is lost, the
gateway logs no lock error, and the load costs the install at most ``RATIO_TARGET`` times its idle time.

Children: ``python -m bench.guard_install install PATH`` (used by the benchmark only).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from bench._stores import SlimStore, ensure_store

MODULE = "bench.guard_install"
NAME = "guard-install-under-load"
ROW = "guard install on a 10M-session store under the gateway's 8-writer load"
WRITERS = 8
SESSIONS_PER_WRITER = 3
#: a writer's pause between two calls (paced agents, as in the e2e's load)
WRITER_PAUSE = 0.01
#: answered calls before install starts, and after it returned, before the load stops
CALLS_BEFORE = 50
CALLS_AFTER = 50
#: liveness bounds (seconds): they only end a run that no longer makes progress
LOAD_BOUND = 120.0
INSTALL_BOUND = 6 * 3600.0
RATIO_TARGET = 3.0
MODEL = "Qwen/Qwen3-8B"


# -- the install child ------------------------------------------------------------------------------

def _child_install(path: str) -> dict[str, Any]:
    from gatewayscope.guard.sqlite import install

    started = time.monotonic()
    result = install(path, busy_timeout=30.0)
    return {"seconds": time.monotonic() - started, "rss": common.peak_rss_bytes(), "changed": result.changed,
            "started": started}


child_main = common.children(MODULE, "install PATH", [("install", _child_install, (str,))])


# -- the loaded run (the load: gatewayscope.sandbox.load, as in the e2e tests) ----------------------

@dataclass
class LoadedRun:
    install: dict[str, Any]
    answered: int
    during: int
    lost: int
    failures: int
    lock_errors: int


def _loaded_run(copy: Path) -> LoadedRun:
    from gatewayscope.sandbox.load import ChatLoad, missing, running, trace_count
    from gatewayscope.sandbox.processes import start_rllm_gateway, start_stub_worker

    with start_stub_worker() as worker, start_rllm_gateway(worker.url, store="sqlite", db_path=copy) as gateway:
        load = ChatLoad(url=gateway.url, prefix=f"bench-install-{uuid.uuid4().hex[:8]}-",
                        sessions_per_writer=SESSIONS_PER_WRITER, pause=WRITER_PAUSE, model=MODEL)
        with running(load, load.writer_threads(WRITERS)):
            _wait_for(load, CALLS_BEFORE)
            before = load.calls
            result = common.run_child(MODULE, "install", str(copy), timeout=INSTALL_BOUND)
            during = load.calls - before
            _wait_for(load, load.calls + CALLS_AFTER)
        answered, found = load.settled(copy, bound=LOAD_BOUND)
        log = gateway.process.output()
    return LoadedRun(install=result, answered=trace_count(answered), during=during, lost=missing(answered, found),
                     failures=load.failures,
                     lock_errors=log.count("database is locked") + log.count("Failed to persist trace"))


def _wait_for(load: Any, calls: int) -> None:
    if not load.wait_for(calls, LOAD_BOUND):
        raise common.BenchError(f"the load stalled at {load.calls} answered calls")


@common.register(NAME)
def guard_install_under_load(ctx: common.BenchContext) -> common.BenchResult:
    sessions = ctx.scaled(10_000_000, 100_000, 2_000, least=1_000)
    fixture: SlimStore = ensure_store(ctx.cache_dir, sessions, max(1, sessions // 100))
    runs = ctx.runs_or(1, 2, 1)
    idle: list[dict[str, Any]] = []
    loaded: list[LoadedRun] = []
    with tempfile.TemporaryDirectory(prefix="bench-install-", dir=ctx.cache_dir) as tmp:
        for i in range(runs):  # each side on a fresh copy: an install on a guarded file changes nothing
            copy = Path(tmp) / "store.db"
            shutil.copyfile(fixture.path, copy)
            if i % 2 == 0:
                loaded.append(_loaded_run(copy))
            idle_copy = Path(tmp) / "idle.db"
            shutil.copyfile(fixture.path, idle_copy)
            idle.append(common.run_child(MODULE, "install", str(idle_copy), timeout=INSTALL_BOUND))
            idle_copy.unlink()
            if i % 2 == 1:
                loaded.append(_loaded_run(copy))
            copy.unlink(missing_ok=True)
    ours = common.median([run.install["seconds"] for run in loaded])
    bare = common.median([run["seconds"] for run in idle])
    lost = sum(run.lost for run in loaded)
    lock_errors = sum(run.lock_errors for run in loaded)
    failures = sum(run.failures for run in loaded)
    return common.ratio_result(
        NAME, ROW, ours, bare, RATIO_TARGET, peak_rss=max(int(run.install["rss"]) for run in loaded),
        checks=[common.Check("lost", float(lost), 0.0),
                common.Check("lock errors", float(lock_errors + failures), 0.0)],
        extras={"store": fixture.describe(),
                "load": f"{WRITERS} writers through the real 0.1.0 gateway, "
                        + ", ".join(f"{run.during} calls answered during install" for run in loaded),
                "answered": f"{sum(run.answered for run in loaded):,} calls, {lost} traces lost, "
                            f"{lock_errors} gateway lock errors, {failures} failed calls",
                "runs": f"{runs} a side"},
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
