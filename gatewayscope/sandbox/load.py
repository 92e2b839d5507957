"""A chat load on a running rLLM gateway, and the traces it leaves in a SQLite store: writer threads calling the
gateway on live sessions of their own, what it answered, and the file read for those calls' traces once the
gateway has persisted them (the 0.1.0 gateway answers first and persists afterwards). Used by the under-load
e2e tests and the ``guard-install-under-load`` benchmark."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from gatewayscope.sandbox.rollouts import DEFAULT_MODEL

#: the file's load traces are final once their count holds this long (the load has stopped)
SETTLE_QUIET = 5.0
#: how long ``settle`` waits at the most (seconds), a liveness bound
SETTLE_BOUND = 90.0
#: the first failures a load keeps the words of (it counts them all)
KEPT_ERRORS = 10


def read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file at ``path``."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)


def trace_count(traces: Mapping[str, set[str]]) -> int:
    """How many traces ``traces`` (session id -> the worker's response ids) holds."""
    return sum(len(ids) for ids in traces.values())


def missing(answered: Mapping[str, set[str]], found: Mapping[str, set[str]]) -> int:
    """How many of the ``answered`` calls have no trace among ``found`` (both session id -> response ids)."""
    return sum(len(ids - found.get(sid, set())) for sid, ids in answered.items())


def file_load_traces(path: Path, prefix: str) -> dict[str, set[str]]:
    """Session id -> the worker's response ids of its traces, for the sessions named ``prefix...`` (a range of
    the session id index)."""
    conn = read_only(path)
    try:
        rows = conn.execute(
            "SELECT ts.session_id, json_extract(t.data, '$.raw_response.id') FROM trace_sessions AS ts "
            "JOIN traces AS t ON t.trace_id = ts.trace_id WHERE ts.session_id >= ? AND ts.session_id < ?",
            (prefix, prefix + "\U0010ffff")).fetchall()
    finally:
        conn.close()
    found: dict[str, set[str]] = {}
    for sid, response_id in rows:
        found.setdefault(str(sid), set()).add(str(response_id))
    return found


def settle(path: Path, prefix: str, expected: int, *, bound: float = SETTLE_BOUND) -> dict[str, set[str]]:
    """The load's traces in the file once the gateway has stopped persisting them: all ``expected`` are
    there, or their number held still for ``SETTLE_QUIET`` s (within ``bound`` s in all)."""
    deadline = time.monotonic() + bound
    last = -1
    quiet_since = time.monotonic()
    while True:  # bounded by the deadline
        found = file_load_traces(path, prefix)
        count = trace_count(found)
        now = time.monotonic()
        if count != last:
            last, quiet_since = count, now
        if count >= expected or now - quiet_since >= SETTLE_QUIET or now >= deadline:
            return found
        time.sleep(0.25)


@dataclass
class ChatLoad:
    """What the writers saw; shared by their threads (``lock`` guards the containers).

    Writer ``w`` calls the gateway at ``url`` on its sessions ``f"{prefix}{w}:{k}"`` (task ``w``, rollout ``k`` below
    ``sessions_per_writer``) in turn, pausing ``pause`` s between two calls, until ``stop`` is set."""

    url: str
    prefix: str
    sessions_per_writer: int = 3
    #: a writer's pause between two calls: agents are paced, and unpaced writers queue persist tasks faster
    #: than the 0.1.0 store commits them (every later trace then waits behind the backlog, contention or not)
    pause: float = 0.01
    model: str = DEFAULT_MODEL
    timeout: float = 60.0
    #: live session -> response ids of the calls the gateway answered 200
    answered: dict[str, set[str]] = field(default_factory=dict)
    #: the first few failures (``failures`` counts them all)
    errors: list[str] = field(default_factory=list)
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def calls(self) -> int:
        with self.lock:
            return trace_count(self.answered)

    def fail(self, what: str) -> None:
        """Record a failed call (or read); the thread goes on (the run is measured to its end)."""
        with self.lock:
            self.failures += 1
            if len(self.errors) < KEPT_ERRORS:
                self.errors.append(what)

    def writer(self, worker: int) -> None:
        sessions = [f"{self.prefix}{worker}:{k}" for k in range(self.sessions_per_writer)]
        with httpx.Client(base_url=self.url, timeout=self.timeout) as client:
            n = 0
            while not self.stop.is_set():  # bounded: the caller sets stop
                sid = sessions[n % len(sessions)]
                body = {"model": self.model, "max_tokens": 8, "messages": [{"role": "user", "content": f"{sid}#{n}"}]}
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
                self.stop.wait(self.pause)

    def writer_threads(self, writers: int) -> list[threading.Thread]:
        """``writers`` writer threads, not started."""
        return [threading.Thread(target=self.writer, args=(w,), name=f"load-writer-{w}", daemon=True)
                for w in range(writers)]

    def wait_for(self, calls: int, bound: float) -> bool:
        """Wait until the gateway has answered ``calls`` calls, ``bound`` seconds at the most; whether it has."""
        deadline = time.monotonic() + bound
        while self.calls < calls:  # bounded by the deadline
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def settled(self, path: Path, *, bound: float = SETTLE_BOUND) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """The calls the gateway answered, and the load's traces in its SQLite file at ``path`` once it has
        persisted them (``settle``); both session id -> response ids. Call it once the load has stopped."""
        with self.lock:
            answered = {sid: set(ids) for sid, ids in self.answered.items()}
        return answered, settle(path, self.prefix, trace_count(answered), bound=bound)


@contextmanager
def running(load: ChatLoad, threads: Sequence[threading.Thread]) -> Iterator[ChatLoad]:
    """``threads`` (the load's) started on entry; on exit, also when the caller fails, the load stopped and the
    threads joined."""
    for thread in threads:
        thread.start()
    try:
        yield load
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=load.timeout + 10)
