"""The load the under-load e2e tests put on a real rLLM gateway's SQLite file (8 writers with live sessions, 2
readers), the file read directly, and the CLI run in a clean environment: shared by
test_apply_under_load.py and test_guard_install_under_load.py."""

from __future__ import annotations

import os
import random
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from gatewayscope.sandbox.rollouts import DEFAULT_MODEL

#: sessions in the store when the gateway starts, and how many of them are day-old one-trace orphans
STORE_SESSIONS = 20_000
ORPHANS = 2_000
WRITERS = 8
SESSIONS_PER_WRITER = 3
READERS = 2
#: a writer's pause between two calls: agents are paced, and unpaced writers queue persist tasks faster
#: than the 0.1.0 store commits them (every later trace then waits behind the backlog, contention or not)
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
#: the file's load traces are final once their count holds this long (the load and apply have stopped)
SETTLE_QUIET = 5.0
SETTLE_BOUND = 90.0
TALLY = re.compile(r"^\d+ done, \d+ refused, \d+ unconfirmed, \d+ gone, \d+ stale, \d+ already-done$")


# -- the file, read directly --------------------------------------------------------------------------------


def read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)


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


def file_load_traces(path: Path, prefix: str) -> dict[str, set[str]]:
    """Session id -> the worker's response ids of its traces, for the sessions named ``prefix...``."""
    conn = read_only(path)
    try:
        rows = conn.execute(
            "SELECT ts.session_id, json_extract(t.data, '$.raw_response.id') FROM trace_sessions AS ts "
            "JOIN traces AS t ON t.trace_id = ts.trace_id WHERE substr(ts.session_id, 1, ?) = ?",
            (len(prefix), prefix)).fetchall()
    finally:
        conn.close()
    found: dict[str, set[str]] = {}
    for sid, response_id in rows:
        found.setdefault(sid, set()).add(str(response_id))
    return found


def settle(path: Path, prefix: str, expected: int) -> dict[str, set[str]]:
    """The load's traces in the file once the gateway has stopped persisting them: all ``expected`` are
    there, or their number held still for ``SETTLE_QUIET`` s (within ``SETTLE_BOUND`` s in all)."""
    deadline = time.monotonic() + SETTLE_BOUND
    last = -1
    quiet_since = time.monotonic()
    while True:
        found = file_load_traces(path, prefix)
        count = sum(len(ids) for ids in found.values())
        now = time.monotonic()
        if count != last:
            last, quiet_since = count, now
        if count >= expected or now - quiet_since >= SETTLE_QUIET or now >= deadline:
            return found
        time.sleep(0.25)


# -- the load -----------------------------------------------------------------------------------------------


@dataclass
class Load:
    """What the writers and readers saw; shared by their threads (``lock`` guards the containers)."""

    url: str
    prefix: str
    kept_sample: list[str]
    #: live session -> response ids of the calls the gateway answered 200
    answered: dict[str, set[str]] = field(default_factory=dict)
    #: the first few failed calls and reads (``failures`` counts them all)
    errors: list[str] = field(default_factory=list)
    failures: int = 0
    reads: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def calls(self) -> int:
        with self.lock:
            return sum(len(ids) for ids in self.answered.values())

    def fail(self, what: str) -> None:
        """Record a failed call or read; the thread goes on (the run is measured to its end)."""
        with self.lock:
            self.failures += 1
            if len(self.errors) < 10:
                self.errors.append(what)

    def writer(self, worker: int) -> None:
        sessions = [f"{self.prefix}{worker}-{k}" for k in range(SESSIONS_PER_WRITER)]
        with httpx.Client(base_url=self.url, timeout=CLIENT_TIMEOUT) as client:
            n = 0
            while not self.stop.is_set():
                sid = sessions[n % len(sessions)]
                body = {"model": DEFAULT_MODEL, "max_tokens": 8,
                        "messages": [{"role": "user", "content": f"{sid}#{n}"}]}
                try:
                    resp = client.post(f"/sessions/{quote(sid, safe='')}/v1/chat/completions", json=body)
                    if resp.status_code == 200:
                        with self.lock:
                            self.answered.setdefault(sid, set()).add(str(resp.json()["id"]))
                    else:
                        self.fail(f"writer {worker}: {sid} call {n} answered {resp.status_code}: {resp.text[:200]}")
                except (httpx.HTTPError, ValueError, KeyError) as err:
                    self.fail(f"writer {worker}: {sid} call {n}: {err!r}")
                n += 1
                self.stop.wait(WRITER_PAUSE)

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


@contextmanager
def running(load: Load) -> Iterator[Load]:
    """The load's threads, from entry until exit (stopped and joined also when the test fails)."""
    threads = [threading.Thread(target=load.writer, args=(w,), name=f"load-writer-{w}") for w in range(WRITERS)]
    threads += [threading.Thread(target=load.reader, args=(r,), name=f"load-reader-{r}") for r in range(READERS)]
    for thread in threads:
        thread.start()
    try:
        yield load
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=CLIENT_TIMEOUT + 10)
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
