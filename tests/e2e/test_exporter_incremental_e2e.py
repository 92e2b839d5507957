"""The exporter reading a real gateway's SQLite store incrementally while the gateway writes and deletes.

Every read the exporter makes while calls land must be one a full read could have given at some moment: no
session is ever counted above what the gateway stores in the end, and once the writes stop the exporter's
figures equal a full read's. A delete through the gateway makes the next read a full one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gatewayscope.config import Policy, Target
from gatewayscope.exporter.cache import TargetCache
from gatewayscope.sandbox.rollouts import DEFAULT_MODEL
from gatewayscope.sources.rllm_sqlite import read_trace_store_sqlite
from tests.helpers import session_counts, wait_for

#: sessions the writer calls into, and calls per session
SESSIONS, CALLS = 12, 4
#: the most reads the test makes while the writer runs (it stops at the writer's end)
MAX_READS = 200


def _chat(client: httpx.Client, sid: str, marker: str) -> bool:
    body = {"model": DEFAULT_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": marker}]}
    return client.post(f"/sessions/{quote(sid, safe='')}/v1/chat/completions", json=body).status_code == 200


def _figures(cache: TargetCache, target: Target) -> dict[str, int]:
    result = cache.fetch([target], 30)[0]
    assert result.snapshot.up, result.snapshot.error
    store = result.snapshot.trace_store
    assert store is not None
    return {sid: count for sid, count, *_ in store.sessions.rows()}


def test_incremental_reads_follow_the_gateways_writes_and_deletes(rllm_gateway: Any, gateway_flavor: Any,
                                                                  tmp_path: Path) -> None:
    gw = rllm_gateway("sqlite")
    db = Path(gw.db_path)
    target = Target(name="gw", kind="rllm", path=str(db), timeout_seconds=10)
    policy = Policy()
    cache = TargetCache([target], policy, min_interval_seconds=0)
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        assert _chat(client, "seed:0", "first")
        _figures(cache, target)  # the first, full read
        done = threading.Event()
        failures: list[str] = []

        def write() -> None:
            try:
                for call in range(CALLS):
                    for i in range(SESSIONS):
                        if not _chat(client, f"task-{i}:0", f"call {call}"):
                            failures.append(f"task-{i} call {call}")
            finally:
                done.set()

        thread = threading.Thread(target=write, name="writer", daemon=True)
        thread.start()
        seen: list[dict[str, int]] = []
        while not done.is_set() and len(seen) < MAX_READS:  # bounded by the writer's end and MAX_READS
            seen.append(_figures(cache, target))
            time.sleep(0.02)
        thread.join(timeout=120)
        assert not thread.is_alive() and not failures, failures
        # the gateway may store a trace just after it answers the call: wait until every call's trace is in
        stored = wait_for("every call's trace stored", lambda: session_counts(db),
                          lambda c: all(c.get(f"task-{i}:0") == CALLS for i in range(SESSIONS)))
        final = _figures(cache, target)
        assert final == stored
        for figures in seen:  # never above what the gateway stores: no row counted twice
            assert all(count <= stored.get(sid, 0) for sid, count in figures.items()), figures
        modes = cache.counters()["gw"]["store_reads"]["modes"]
        assert modes["incremental"] >= 1 and modes["full"] == 1, modes

        assert client.delete(f"/sessions/{quote('task-3:0', safe='')}").status_code in (200, 204)
        assert _chat(client, "after:0", "after the delete")
        wait_for("the new call's trace stored", lambda: session_counts(db), lambda c: "after:0" in c)
        after = _figures(cache, target)
    counts = cache.counters()["gw"]["store_reads"]
    assert counts["reasons"]["rows"] == 1, counts
    want = read_trace_store_sqlite(target, policy, now=time.time(), full=True)
    assert "task-3:0" not in after and after == {sid: n for sid, n, *_ in want.sessions.rows()}
