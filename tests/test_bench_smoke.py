"""Keep ``python -m bench`` working: the SQLite scan benchmark end to end at its tiniest size.

It asserts only that a row came out with numbers in it, never a time or a ratio (DESIGN.md: timings
are measured in ``bench/``, tests never assert wall-clock times).
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
