"""The exporter's ``/metrics`` on big SQLite stores: a guarded 10M-session store, an unguarded 1M one.

Two rows, each in a fresh child process holding an :class:`~gatewayscope.exporter.server.Exporter` with one
SQLite target and ``min_interval_seconds = 0``, so every scrape reads the store (a scrape is
``render(exporter.metrics_registry(budget))``, exactly what ``/metrics`` runs). The first scrape is cold
(the exporter's first read); the measured scrapes are warm: each follows the last, after a writer
committed a few traces the way the gateway does (``INSERT OR REPLACE INTO traces`` + ``INSERT OR IGNORE
INTO trace_sessions``, one commit), so there is always something new to read. Every measured scrape is
checked to be a read (not served from the cache) that reports the store's orphans.

* ``exporter-guarded-10m``: the 10,000,000-session store (times ``--scale``) with the guard installed;
  the warm scrape's median time and the child's peak RSS against absolute goals.
* ``exporter-unguarded-1m``: the 1,000,000-session store (times ``--scale``, the CLI scan's store)
  without a guard; the warm scrape's median against a full scan (``read_trace_store_sqlite(full=True)`` in a
  fresh child, ``bench.sqlite_scan``'s ``ours-full`` child: every session listed, as the exporter's own full
  reads do). The scan's default read (the candidates read, ``ours``) is timed beside it, for the record.

The writer's rows carry trace ids starting with ``bench-writer-`` and are removed after the run, so the
cached stores stay as built.

Children: ``python -m bench.exporter_sqlite scrape PATH SCRAPES WRITES`` (used by the benchmark only).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
import uuid
from typing import Any

from bench import common
from bench._stores import SlimStore, ensure_store
from bench.sqlite_scan import WRITER_PREFIX, remove_writer_rows

MODULE = "bench.exporter_sqlite"
GUARDED_SESSIONS = (10_000_000, 50_000, 2_000)
UNGUARDED_SESSIONS = (1_000_000, 20_000, 2_000)
ORPHANS = (10_000, 200, 20)
WARM_LIMIT_SECONDS = 1.0
RSS_TARGET_MB = 300.0
UNGUARDED_TARGET = 0.2
#: traces the writer commits before each warm scrape
WRITES_PER_SCRAPE = 20


def write_like_the_gateway(path: str, count: int) -> None:
    """Commit ``count`` traces of new live sessions as the 0.1.0 gateway does (one transaction each)."""
    conn = sqlite3.connect(path, timeout=20.0, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        for _ in range(count):
            trace_id = f"{WRITER_PREFIX}{uuid.uuid4()}"
            sid = f"{WRITER_PREFIX}{uuid.uuid4()}:0"
            now = time.time()
            data = json.dumps({"trace_id": trace_id, "session_id": sid, "model": "Qwen/Qwen3-8B",
                               "messages": [{"role": "user", "content": "go"}], "prompt_token_ids": [1, 2, 3],
                               "timestamp": now, "metadata": {}})
            conn.execute("BEGIN")
            conn.execute("INSERT OR REPLACE INTO traces (trace_id, data, created_at) VALUES (?, ?, ?)",
                         (trace_id, data, now))
            conn.execute("INSERT OR IGNORE INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)",
                         (trace_id, sid, now))
            conn.execute("COMMIT")
    finally:
        conn.close()


def remove_writes(path: str) -> None:
    """Remove the writer's rows, and on a guarded store the tombstones their removal left (through the
    guard's own function), so the cached store stays as built."""
    from gatewayscope.guard.sqlite import lift_tombstone

    remove_writer_rows(path)
    conn = sqlite3.connect(path, timeout=60.0)
    try:
        guarded = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'gatewayscope_tombstones'").fetchone()
        left = [row[0] for row in conn.execute(
            "SELECT session_id FROM gatewayscope_tombstones WHERE session_id >= ? AND session_id < ?",
            (WRITER_PREFIX, "bench-writer.")).fetchall()] if guarded else []
    finally:
        conn.close()
    for sid in left:
        lift_tombstone(path, sid)


def _orphans_reported(body: bytes) -> float:
    total = 0.0
    for line in body.splitlines():
        if line.startswith(b"gatewayscope_trace_store_orphan_sessions{"):
            total += float(line.rsplit(b" ", 1)[1])
    return total


def _child_scrape(path: str, scrapes: int, writes: int) -> dict[str, Any]:
    from gatewayscope.config import Config, Policy, Target
    from gatewayscope.exporter.server import Exporter, render
    from gatewayscope.exporter.settings import ExporterSettings

    target = Target(name="store", kind="rllm", path=path, timeout_seconds=3600.0)
    exporter = Exporter(Config(targets=[target], policy=Policy()), ExporterSettings(min_interval_seconds=0.0))
    start = time.monotonic()
    body, _ = render(exporter.metrics_registry(3600.0))
    cold = time.monotonic() - start
    times: list[float] = []
    orphans: list[float] = [_orphans_reported(body)]
    for _ in range(scrapes):
        write_like_the_gateway(path, writes)
        start = time.monotonic()
        body, _ = render(exporter.metrics_registry(3600.0))
        times.append(time.monotonic() - start)
        orphans.append(_orphans_reported(body))
        if not any(line.startswith(b"gatewayscope_up{") and line.endswith(b" 1.0") for line in body.splitlines()):
            raise common.BenchError(f"a scrape found the store down; `gatewayscope scan --trace-store {path}` says why")
    scrapes_by_source = exporter.cache.counters()["store"]["scrapes"]
    return {"seconds": common.median(times), "runs": times, "cold": cold, "peak_rss": common.peak_rss_bytes(),
            "rss_end": common.current_rss_bytes(), "orphans": orphans, "sources": scrapes_by_source}


child_main = common.children(MODULE, "scrape PATH SCRAPES WRITES", [("scrape", _child_scrape, (str, int, int))])


def scrape(store: SlimStore, scrapes: int) -> dict[str, Any]:
    """The exporter child on ``store``; its figures, checked (every scrape a read, every orphan reported)."""
    remove_writes(store.path)  # leftovers of an interrupted run
    try:
        result = common.run_child(MODULE, "scrape", store.path, str(scrapes), str(WRITES_PER_SCRAPE))
    finally:
        remove_writes(store.path)
    if result["sources"].get("cached", 0) or result["sources"].get("read", 0) != scrapes + 1:
        raise common.BenchError(f"every scrape should read the store once: {result['sources']}")
    if any(count != store.orphans for count in result["orphans"]):
        raise common.BenchError(f"the scrapes reported {result['orphans']} orphans; the store holds {store.orphans}")
    return result


def _runs(result: dict[str, Any]) -> str:
    return "/".join(f"{s * 1000:.0f}" for s in result["runs"]) + " ms"


@common.register("exporter-guarded-10m")
def exporter_guarded_10m(ctx: common.BenchContext) -> common.BenchResult:
    """Warm /metrics on the guarded 10M-session store: time and the exporter's peak RSS."""
    sessions = ctx.scaled(*GUARDED_SESSIONS, least=100)
    store = ensure_store(ctx.cache_dir, sessions, ctx.scaled(*ORPHANS), guarded=True)
    result = scrape(store, ctx.runs_or(5, 5, 1))
    warm, peak = result["seconds"], int(result["peak_rss"])
    return common.BenchResult(
        name="exporter-guarded-10m",
        row=f"{store.sessions:,}-session SQLite, guarded: warm /metrics",
        ours_seconds=warm, peak_rss_bytes=peak,
        checks=[common.Check("warm", warm, WARM_LIMIT_SECONDS, "s"), common.Check.rss(peak, RSS_TARGET_MB)],
        extras={"store": store.describe(), "cold (first) scrape": f"{result['cold']:.2f} s",
                "warm scrapes": _runs(result), "writes before each": str(WRITES_PER_SCRAPE)},
    )


@common.register("exporter-unguarded-1m")
def exporter_unguarded_1m(ctx: common.BenchContext) -> common.BenchResult:
    """Warm /metrics on the unguarded 1M-session store vs a full scan of it."""
    sessions = ctx.scaled(*UNGUARDED_SESSIONS, least=100)
    store = ensure_store(ctx.cache_dir, sessions, ctx.scaled(*ORPHANS))
    runs = ctx.runs_or(3, 5, 1)

    def full(child: str = "ours-full") -> float:
        out = common.run_child("bench.sqlite_scan", child, store.path, repr(time.time()))
        if out["candidates"] != store.orphans:
            raise common.BenchError(f"the full scan found {out['candidates']} candidates; "
                                    f"the store holds {store.orphans}")
        return float(out["seconds"])

    full()  # warm-up: the page cache
    full_runs = [full() for _ in range(runs)]
    candidates_runs = [full("ours") for _ in range(runs)]
    result = scrape(store, ctx.runs_or(5, 5, 1))
    warm, full_s = result["seconds"], common.median(full_runs)
    return common.ratio_result(
        "exporter-unguarded-1m", f"exporter warm /metrics, unguarded {store.sessions:,}-session SQLite / a full scan",
        warm, full_s, UNGUARDED_TARGET, peak_rss=int(result["peak_rss"]),
        extras={"store": store.describe(), "cold (first) scrape": f"{result['cold']:.2f} s",
                "warm scrapes": _runs(result), "full scans": "/".join(f"{s:.2f}" for s in full_runs) + " s",
                "candidates reads (the scan's)": "/".join(f"{s:.2f}" for s in candidates_runs) + " s",
                "writes before each": str(WRITES_PER_SCRAPE)},
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
