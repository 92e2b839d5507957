"""End-to-end CLI scan of a big SQLite store, unguarded and guarded, against the bare ``GROUP BY``.

What it measures, in one run, as a user runs it:

* ours: ``gatewayscope scan --trace-store FILE --format json`` in a fresh process, wall time from the
  launch to its exit (interpreter start-up, imports, the read, the findings, the JSON), and the
  orphans it reports are checked against the store's;
* baseline: a fresh ``python -c`` process running the bare ``SELECT session_id, COUNT(*),
  MIN(created_at), MAX(created_at) FROM trace_sessions GROUP BY session_id`` + ``fetchall()``, wall time
  the same way.

The store (``bench._stores``): 1,000,000 sessions full size (times ``--scale``), 10,000 of them day-old
one-trace orphans, 0.1.0 schema. The guarded row runs on a copy with the guard installed by
``gatewayscope guard install``'s function, so the scan reads whatever the guard keeps for it.

Order: a warm-up pair (not counted, it warms the page cache), then ``runs`` pairs alternating which side
goes first; medians.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._stores import SlimStore, ensure_store
from bench.common import BenchContext, BenchError, BenchResult, alternate, child_env, median, ratio_result, register

SESSIONS = (1_000_000, 20_000, 2_000)
ORPHANS = (10_000, 200, 20)
UNGUARDED_TARGET = 1.3
GUARDED_TARGET = 0.1

BARE_CODE = ("import sqlite3, sys\n"
             "conn = sqlite3.connect(sys.argv[1])\n"
             "rows = conn.execute('SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at) "
             "FROM trace_sessions GROUP BY session_id').fetchall()\n"
             "print(len(rows))\n")


def cli_argv() -> list[str]:
    """The ``gatewayscope`` command a user runs: the console script next to this interpreter."""
    script = Path(sys.executable).with_name("gatewayscope")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gatewayscope"]


def _timed(argv: list[str], timeout: float = 3600.0) -> tuple[float, str]:
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=child_env(),
                              check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(argv[:4])} did not finish within {timeout:.0f} s") from None
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv[:4])} exited with {done.returncode}: {done.stderr[-1500:]}")
    return seconds, done.stdout


def scan_once(store: SlimStore) -> tuple[float, int]:
    """One end-to-end ``gatewayscope scan``: its wall time and how many orphan sessions it reported."""
    seconds, out = _timed([*cli_argv(), "scan", "--trace-store", store.path, "--format", "json"])
    report: dict[str, Any] = json.loads(out)
    target = report["targets"][0]
    if target.get("error"):
        raise BenchError(f"the scan failed: {target['error']}")
    return seconds, len(target["orphan_sessions"])


def bare_once(store: SlimStore) -> tuple[float, int]:
    seconds, out = _timed([sys.executable, "-c", BARE_CODE, store.path])
    return seconds, int(out.strip())


def measure(ctx: BenchContext, store: SlimStore) -> tuple[list[float], list[float]]:
    """``runs`` alternating pairs (after a warm-up pair) of our scan and the bare query, checked."""
    runs = ctx.runs_or(5, 5, 1)

    def ours() -> float:
        seconds, orphans = scan_once(store)
        if orphans != store.orphans:
            raise BenchError(f"the scan reported {orphans} orphans; the store holds {store.orphans}")
        return seconds

    def bare() -> float:
        seconds, sessions = bare_once(store)
        if sessions != store.sessions:
            raise BenchError(f"the bare query returned {sessions} sessions; the store holds {store.sessions}")
        return seconds

    bare(), ours()
    bare_runs, ours_runs = alternate(runs, bare, ours)
    return ours_runs, bare_runs


def _result(name: str, row: str, store: SlimStore, ours_runs: list[float], bare_runs: list[float],
            target: float) -> BenchResult:
    return ratio_result(
        name, row, median(ours_runs), median(bare_runs), target,
        extras={"store": store.describe(),
                "runs": f"{len(ours_runs)} (ours " + "/".join(f"{s:.2f}" for s in ours_runs)
                        + ", bare " + "/".join(f"{s:.2f}" for s in bare_runs) + " s)"},
    )


def _store(ctx: BenchContext, *, guarded: bool) -> SlimStore:
    sessions = ctx.scaled(*SESSIONS, least=100)
    orphans = ctx.scaled(*ORPHANS, least=1)
    return ensure_store(ctx.cache_dir, sessions, orphans, guarded=guarded)


@register("sqlite-cli-scan")
def sqlite_cli_scan(ctx: BenchContext) -> BenchResult:
    """``gatewayscope scan`` end to end on an unguarded store vs the bare GROUP BY."""
    store = _store(ctx, guarded=False)
    ours_runs, bare_runs = measure(ctx, store)
    return _result("sqlite-cli-scan", f"{store.sessions:,}-session SQLite, unguarded: CLI scan / bare GROUP BY",
                   store, ours_runs, bare_runs, UNGUARDED_TARGET)


@register("sqlite-cli-scan-guarded")
def sqlite_cli_scan_guarded(ctx: BenchContext) -> BenchResult:
    """``gatewayscope scan`` end to end on a guarded copy of the store vs the bare GROUP BY on it."""
    store = _store(ctx, guarded=True)
    ours_runs, bare_runs = measure(ctx, store)
    return _result("sqlite-cli-scan-guarded",
                   f"{store.sessions:,}-session SQLite, guarded: CLI scan / bare GROUP BY",
                   store, ours_runs, bare_runs, GUARDED_TARGET)
