"""Keep ``python -m bench`` working: the SQLite scan benchmark end to end at its tiniest size.

It asserts only that a row came out with numbers in it, never a time or a ratio (docs/performance.md:
timings are measured in ``bench/``, tests never assert wall-clock times).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("rllm_model_gateway.store.sqlite_store")


def test_sqlite_scan_benchmark_prints_a_row_with_numbers(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--size", "tiny", "--runs", "1", "--only", "sqlite-scan",
         "--cache-dir", str(cache)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    # 0 = every target met, 1 = one missed: both are a finished benchmark (a tiny store says nothing
    # about ratios); an ERROR row, a traceback or a bad flag are not
    assert done.returncode in (0, 1), done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("sqlite-scan")]
    assert len(rows) == 1, done.stdout
    row = rows[0]
    assert "ERROR" not in row
    cells = re.match(r"sqlite-scan\s+(\S+) m?s\s+(\S+) m?s\s+(\S+)x\s", row)
    assert cells is not None, row
    ours, baseline, ratio = (float(cell) for cell in cells.groups())
    assert ours > 0 and baseline > 0 and ratio > 0
    assert re.search(r"\s\d+ MB\s", row), "peak RSS of the scan"
    assert re.search(r"during ours \d[\d,]* ms, during bare \d[\d,]* ms", row), "the writer's commit waits"
    assert re.search(r"candidates [1-9]", row), "the scan found the store's one-trace sessions"
    assert row.rstrip().endswith(("met", ")")), "a met/MISSED verdict"
    # the built store stays in the cache folder given, with its metadata, and nothing else is left
    assert sorted(p.suffix for p in cache.iterdir()) == [".db", ".json"]


# -- the HTTP benchmarks, each at its tiniest size: a row with numbers, never a time or a ratio checked --

ROW = r"{name}\s+(\S+) m?s\s+(\S+) m?s\s+(\S+)x\s"
#: per benchmark: what its row must say besides the numbers (the fixture it built, what it counted)
EXTRAS = {
    "memory-store-scan": [r"store 600 sessions \(9 orphans\), built through the gateway's chat route in \d+ s",
                          r"candidates read 9\b"],
    "bifrost-scan": [r"store 100 records in the emulator", r"findings \d+ over pool, \d+ unreachable, \d+ hosts"],
    "exporter-metrics-warm": [r"targets 4 \(2 Bifrost x 100 records, 2 rLLM x 100 sessions\)", r"series \d+ \("],
    "apply-pool-shrinks": [r"ideal 40 actions x 2 calls x 50 ms / 16", r"tally 40 done"],
    "orphan-session-delete": [r"agent chat \(50 ms generation\) p95 idle [\d.]+ ms, during ours [\d.]+ ms",
                              r"bare DELETE median [\d.]+ ms", r"40 deleted"],
    "exporter-fleet-100": [r"targets 10 \(5 rLLM x 100 sessions, 5 Bifrost x 50 records\)",
                           r"exporter RSS \d+ MB with 10 targets, \d+ MB with 1: -?\d+ KiB per target",
                           r"warm scrape \(cached\) [\d.]+ ms, exporter CPU [\d.]+ ms per target"],
}


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_http_benchmark_prints_a_row_with_numbers(name: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--size", "tiny", "--runs", "1", "--only", name,
         "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode in (0, 1), done.stderr  # met or missed: both finished (tiny sizes say nothing)
    rows = [line for line in done.stdout.splitlines() if line.startswith(name + " ")]
    assert len(rows) == 1, done.stdout + done.stderr
    row = rows[0]
    assert "ERROR" not in row
    cells = re.match(ROW.format(name=re.escape(name)), row)
    assert cells is not None, row
    assert all(float(cell.replace(",", "")) > 0 for cell in cells.groups())
    assert re.search(r"\s\d+ MB\s", row), "peak RSS"
    for pattern in EXTRAS[name]:
        assert re.search(pattern, row), f"{pattern!r} not in {row}"
    assert row.rstrip().endswith(("met", ")")), "a met/MISSED verdict"
