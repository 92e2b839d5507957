"""The load the under-load e2e tests put on a real rLLM gateway's SQLite file (8 writers with live sessions, 2
readers), the file read directly, and the CLI run in a clean environment: shared by
test_apply_under_load.py and test_guard_install_under_load.py. The writers, and the file read for their traces
once the gateway has persisted them (``Load.settled``), are :mod:`gatewayscope.sandbox.load`'s."""

from __future__ import annotations

import os
import random
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gatewayscope.sandbox.load import ChatLoad, read_only
from gatewayscope.sandbox.load import running as threads_running
from tests.e2e._store import BuiltStore, build_store

#: sessions in the store when the gateway starts, and how many of them are day-old one-trace orphans
STORE_SESSIONS = 20_000
ORPHANS = 2_000
WRITERS = 8
SESSIONS_PER_WRITER = 3
READERS = 2
#: a writer's pause between two calls (ChatLoad.pause says why they pause)
WRITER_PAUSE = 0.01
#: a reader's pause between two reads (a ``GET /sessions`` groups every session of the store)
READER_PAUSE = 0.05
READ_LIMIT = 100
#: answered calls before apply starts: the load is under way when the first delete is sent
CALLS_BEFORE_APPLY = 200
#: liveness bounds (seconds), never timing assertions; apply deletes these orphans in a few seconds with
#: no load, so APPLY_BOUND only ends an apply that no longer makes progress
APPLY_BOUND = 150.0
LOAD_START_BOUND = 60.0
CLIENT_TIMEOUT = 60.0
TALLY = re.compile(r"^\d+ done, \d+ refused, \d+ unconfirmed, \d+ gone, \d+ stale, \d+ already-done$")


# -- the file, read directly --------------------------------------------------------------------------------


def file_sessions(path: Path) -> dict[str, int]:
    """Session id -> its junction rows (traces), for every session in the file."""
    conn = read_only(path)
    try:
        return dict(conn.execute("SELECT session_id, COUNT(*) FROM trace_sessions GROUP BY session_id"))
    finally:
        conn.close()


def file_trace_ids(path: Path) -> set[str]:
    conn = read_only(path)
    try:
        return {row[0] for row in conn.execute("SELECT trace_id FROM traces")}
    finally:
        conn.close()


# -- the load -----------------------------------------------------------------------------------------------


@dataclass
class Load(ChatLoad):
    """What the writers (``ChatLoad``) and the readers saw; shared by their threads."""

    sessions_per_writer: int = SESSIONS_PER_WRITER
    pause: float = WRITER_PAUSE
    timeout: float = CLIENT_TIMEOUT
    #: sessions of the store the readers read besides the live ones
    kept_sample: list[str] = field(default_factory=list)
    reads: int = 0

    def reader(self, index: int) -> None:
        rng = random.Random(index)
        with httpx.Client(base_url=self.url, timeout=CLIENT_TIMEOUT) as client:
            while not self.stop.is_set():
                with self.lock:
                    live = sorted(self.answered)
                sid = rng.choice(live if live and rng.random() < 0.5 else self.kept_sample)
                for path, params in (("/sessions", {"limit": READ_LIMIT}),
                                     (f"/sessions/{quote(sid, safe='')}/traces", {})):
                    try:
                        resp = client.get(path, params=params)
                    except httpx.HTTPError as err:
                        self.fail(f"reader {index}: GET {path}: {err!r}")
                        continue
                    if resp.status_code != 200:
                        self.fail(f"reader {index}: GET {path} answered {resp.status_code}: {resp.text[:200]}")
                        continue
                    with self.lock:
                        self.reads += 1
                self.stop.wait(READER_PAUSE)


def loaded_gateway(db: Path, rllm_gateway: Any, gateway_flavor: Any, *, sessions: int = STORE_SESSIONS,
                   orphans: int = ORPHANS) -> tuple[BuiltStore, Any, Load]:
    """A store of ``sessions`` sessions, ``orphans`` of them day-old one-trace orphans, built at ``db`` with the
    flavour's own schema and pragmas; the flavour's gateway serving it (``--store sqlite``); and a load for it,
    not started."""
    store = build_store(db, sessions=sessions, orphans=orphans, now=time.time(), python=gateway_flavor.python)
    gateway = rllm_gateway("sqlite", db_path=db)
    load = Load(url=gateway.url, prefix=f"load-{uuid.uuid4().hex[:8]}-", kept_sample=sorted(store.kept)[::500])
    return store, gateway, load


def wait_for_calls(load: Load, calls: int, what: str) -> None:
    """Wait until the gateway has answered ``calls`` of the load's calls; fail saying ``what`` after
    ``LOAD_START_BOUND`` s."""
    assert load.wait_for(calls, LOAD_START_BOUND), f"{what}: {load.calls} calls answered"


@contextmanager
def running(load: Load) -> Iterator[Load]:
    """The load's threads, from entry until exit (stopped and joined also when the test fails)."""
    threads = load.writer_threads(WRITERS)
    threads += [threading.Thread(target=load.reader, args=(r,), name=f"load-reader-{r}") for r in range(READERS)]
    try:
        with threads_running(load, threads):
            yield load
    finally:
        assert not any(thread.is_alive() for thread in threads), "a load thread did not stop"


# -- gatewayscope, as its users run it ------------------------------------------------------------------------


def cli_env(home: Path) -> dict[str, str]:
    """A clean environment (no config file from the caller's), importing gatewayscope from where we do."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from gatewayscope.cli import run; run()", *args]
