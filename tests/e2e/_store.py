"""An rLLM SQLite trace store with known orphans, built directly in the file.

The schema is the gateway's own (0.1.0's, or upstream's with ``build_store(python=...)``): its
``SqliteTraceStore`` opens the file once (pragmas, journal mode, CREATE TABLE and CREATE INDEX exactly as the
gateway runs them). The rows are then written with ``executemany`` in one
transaction, shaped like the gateway's: ``traces.data`` is a ``TraceRecord.model_dump()`` as JSON (every
field, ``session_id`` and ``timestamp`` included), ``created_at`` of a trace and of its junction row is the
time the gateway stored it.

A store holds

* kept sessions: rLLM uids (``<task uuid>:<rollout>``) of 2-4 traces each, spread over the last 14 days;
  never an orphan (more than one trace);
* orphans: one-trace sessions idle a day or more (stragglers of deleted rollouts), the suspected orphans
  ``gatewayscope plan --include-suspected`` plans to delete under the default 2 h idle threshold.

Call it before the gateway opens the file: the build holds the file's write lock throughout.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DAY = 86400.0
#: kept sessions start evenly over this much history
SPAN = 14 * DAY
#: rollouts per task: kept sessions come in task groups sharing the uuid
GROUP_SIZE = 8
MODEL = "Qwen/Qwen3-8B"
_WORDS = ("the", "agent", "reads", "a", "file", "and", "then", "calls", "tool", "with", "result", "so",
          "answer", "is", "done", "step", "next", "plan", "check", "value", "output", "input")


@dataclass(frozen=True)
class BuiltStore:
    """What :func:`build_store` wrote."""

    path: Path
    #: kept session id -> its trace count
    kept: dict[str, int]
    #: orphan session id -> its one trace id
    orphans: dict[str, str]
    #: the "now" the rows were generated against
    now: float

    @property
    def traces(self) -> int:
        return sum(self.kept.values()) + len(self.orphans)


_SCHEMA_SCRIPT = """
import asyncio, sys
from rllm_model_gateway.store.sqlite_store import SqliteTraceStore

async def main(path):
    store = SqliteTraceStore(db_path=path)
    try:
        await store.list_sessions(limit=1)  # the first use opens the connection: pragmas + DDL
    finally:
        await store.close()

asyncio.run(main(sys.argv[1]))
"""


def _gateway_schema(path: Path, python: str | None) -> None:
    """The gateway's own pragmas and DDL, run by ``python`` (the gateway's interpreter; default ours)."""
    done = subprocess.run([python or sys.executable, "-c", _SCHEMA_SCRIPT, str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the gateway's SqliteTraceStore could not create {path}: {done.stderr[-2000:]}")


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{h[16:20]}-{h[20:]}"


def _trace_data(rng: random.Random, trace_id: str, session_id: str, timestamp: float, prompt_words: int) -> str:
    """One trace's ``data`` as the gateway serialises a non-streamed chat call's ``TraceRecord``."""
    prompt = " ".join(rng.choice(_WORDS) for _ in range(prompt_words))
    answer = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12)))
    messages = [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": prompt}]
    prompt_ids = [rng.randrange(1, 32_000) for _ in range(prompt_words + 8)]
    completion_ids = [rng.randrange(1, 32_000) for _ in range(len(answer.split()))]
    response_id = f"chatcmpl-{rng.getrandbits(128):032x}"
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
             "total_tokens": len(prompt_ids) + len(completion_ids)}
    message = {"role": "assistant", "content": answer, "tool_calls": []}
    record = {
        "trace_id": trace_id, "session_id": session_id, "model": MODEL, "messages": messages,
        "prompt_token_ids": prompt_ids, "response_message": message, "completion_token_ids": completion_ids,
        "logprobs": None, "finish_reason": "stop", "latency_ms": round(rng.uniform(200.0, 4000.0), 1),
        "token_counts": {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"]},
        "timestamp": timestamp, "metadata": {},
        "raw_request": {"model": MODEL, "messages": messages, "max_tokens": 64},
        "raw_response": {"id": response_id, "object": "chat.completion", "created": int(timestamp), "model": MODEL,
                         "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}],
                         "usage": usage},
    }
    return json.dumps(record)


def build_store(path: Path, *, sessions: int, orphans: int, now: float, seed: int = 13,
                python: str | None = None) -> BuiltStore:
    """Write a store of ``sessions`` sessions at ``path``, ``orphans`` of them one-trace orphans idle 1-2 days.

    ``path`` must not exist yet. Deterministic for a given ``seed`` and ``now``. The schema (and the journal
    mode) is that of the gateway ``python`` runs (default: the one in our environment, PyPI's 0.1.0).
    """
    if not 0 <= orphans <= sessions:
        raise ValueError(f"orphans must be between 0 and sessions ({sessions}), not {orphans}")
    if path.exists():
        raise ValueError(f"{path} exists; the store is built into a new file")
    _gateway_schema(path, python)
    rng = random.Random(seed)
    traces: list[tuple[str, str, float]] = []
    links: list[tuple[str, str, float]] = []
    kept: dict[str, int] = {}
    orphan_traces: dict[str, str] = {}

    n_kept = sessions - orphans
    step = (SPAN - DAY) / max(1, n_kept)  # the newest kept session starts a day before now
    group = ""
    for k in range(n_kept):
        if k % GROUP_SIZE == 0:
            group = _uuid(rng)
        sid = f"{group}:{k % GROUP_SIZE}"
        t = now - SPAN + k * step
        count = rng.randint(2, 4)
        for _ in range(count):
            tid = _uuid(rng)
            traces.append((tid, _trace_data(rng, tid, sid, t, rng.randint(10, 40)), t))
            links.append((tid, sid, t))
            t += rng.uniform(5.0, 60.0)
        kept[sid] = count
    for k in range(orphans):
        if k % GROUP_SIZE == 0:
            group = _uuid(rng)
        sid = f"{group}:{k % GROUP_SIZE}"
        t = now - DAY - rng.uniform(0.0, DAY)
        tid = _uuid(rng)
        # a straggler carries its whole conversation so far: a longer prompt
        traces.append((tid, _trace_data(rng, tid, sid, t, rng.randint(80, 160)), t))
        links.append((tid, sid, t))
        orphan_traces[sid] = tid
    traces.sort(key=lambda row: row[2])  # in the order the gateway would have stored them
    links.sort(key=lambda row: row[2])

    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO traces (trace_id, data, created_at) VALUES (?, ?, ?)", traces)
        conn.executemany("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)", links)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return BuiltStore(path=path, kept=kept, orphans=orphan_traces, now=now)
