"""Keep ``python -m bench`` working: every benchmark end to end at its tiniest size, and the one table.

It asserts only that each row came out with numbers in it and a verdict, never a time or a ratio
(docs/performance.md: timings are measured in ``bench/``, tests never assert wall-clock times).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import BenchResult, Check, render_table
from bench.guard_throughput import upstream_python

#: every test here starts a process (make e2e runs them)
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("rllm_model_gateway.store.sqlite_store")

#: per benchmark: what its details line must say besides the numbers (the fixture it built, what it counted)
EXTRAS = {
    "sqlite-cli-scan": [r"store 2,000 sessions/3,980 traces \(20 orphans\), \d+ MB, (built in \d+ s|reused)"],
    "sqlite-cli-scan-guarded": [r"store 2,000 sessions/3,980 traces \(20 orphans\), \d+ MB, guarded, "],
    "exporter-guarded-10m": [r"store 2,000 sessions/3,980 traces \(20 orphans\), \d+ MB, guarded, ",
                             r"cold \(first\) scrape [\d.]+ s", r"warm scrapes \d+ ms"],
    "exporter-unguarded-1m": [r"store 2,000 sessions", r"warm scrapes \d+ ms", r"full scans [\d.]+ s"],
    "memory-store-scan": [r"store 600 sessions \(9 orphans\), built through the gateway's chat route in \d+ s",
                          r"candidates read 9\b"],
    "memory-store-scan-guarded": [r"store 600 sessions \(9 orphans\), built through the gateway's chat route"],
    "guard-chat-memory-0.1.0": [r"calls/s guarded [\d,]+, plain [\d,]+", r"p95 guarded [\d.]+ ms, plain [\d.]+ ms"],
    "guard-chat-sqlite-0.1.0": [r"calls/s guarded [\d,]+, plain [\d,]+",
                                r"load 1 windows of 0.5 s, both sides at once, 4 connections a side"],
    "guard-chat-memory-upstream": [r"calls/s guarded [\d,]+, plain [\d,]+"],
    "guard-chat-sqlite-upstream": [r"calls/s guarded [\d,]+, plain [\d,]+"],
    "cli-startup": [r"runs 1 a side \(ours \d+-\d+ ms, bare \d+-\d+ ms\)"],
    "bifrost-scan": [r"store 100 records in the emulator", r"findings \d+ over pool, \d+ unreachable, \d+ hosts",
                     r"bare listing alone \d+ ms \(ours [\d.]+x\); the metrics answer [1-9][\d,]* bytes"],
    "exporter-metrics-warm": [r"targets 4 \(2 Bifrost x 100 records, 2 rLLM x 100 sessions\)", r"series \d+ \("],
    "apply-pool-shrinks": [r"ideal 40 actions x 2 calls x 50 ms / 16", r"tally 40 done"],
    "heal-gateway-share": [r"store 300 sessions \(30 one-trace orphans\)",
                           r"heal [1-9][\d,]* orphans deleted in \d+ s by the gateway's count, \d+ passes ended",
                           r"agent chat p95 idle [\d.]+ ms"],
    "heal-pass": [r"store 100 records in the emulator", r"pass [1-9]\d* actions re-read \(would write\), \d+ deferred"],
    "orphan-session-delete": [r"agent chat \(50 ms generation\) p95 idle [\d.]+ ms, during ours [\d.]+ ms",
                              r"bare DELETE median [\d.]+ ms", r"40 deleted"],
    "exporter-fleet-100": [r"targets 10 \(5 rLLM x 100 sessions, 5 Bifrost x 50 records\)",
                           r"exporter RSS \d+ MB with 10 targets, \d+ MB with 1: -?\d+ KiB per target",
                           r"warm scrape \(cached\) [\d.]+ ms, exporter CPU [\d.]+ ms per target"],
    "dispatch-estimate-0.1.0": [r"plain p50 -?[\d.]+, p99 [\d.]+, max [\d.]+, min -?[\d.]+",
                                r"stream p50 -?[\d.]+", r"20 plain and 20 streaming calls"],
    "dispatch-estimate-upstream": [r"plain p50 -?[\d.]+", r"20 plain and 20 streaming calls"],
    "guard-run-startup": [r"runs \d+ a side, medians [\d.]+ ms / [\d.]+ ms"],
    "sqlite-scan": [r"during ours \d[\d,]* ms, during bare \d[\d,]* ms", r"candidates [1-9]"],
    "guard-install-under-load": [r"store 2,000 sessions/3,980 traces \(20 orphans\), \d+ MB, ",
                                 r"8 writers through the real 0\.1\.0 gateway, \d+ calls answered during install",
                                 r"answered [\d,]+ calls, 0 traces lost, 0 gateway lock errors, 0 failed calls"],
}
#: benchmarks whose row has no baseline (absolute goals only)
NO_BASELINE = {"exporter-guarded-10m", "dispatch-estimate-0.1.0", "dispatch-estimate-upstream"}
#: benchmarks that only report figures (no goal)
NO_GOAL = {"exporter-fleet-100"}
NUMBER = r"\d[\d,]*(\.\d+)?"


def run_bench(*args: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def table(stdout: str) -> dict[str, list[str]]:
    """The table's rows by benchmark name: the cells row, benchmark, measured, goal, result."""
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("| "):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            if cells[1] != "benchmark":  # the header
                rows[cells[1]] = cells
    return rows


def detail(stdout: str, name: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith(f"- {name}: ")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_every_benchmark_has_a_smoke_test() -> None:
    done = run_bench("--list")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()}
    assert listed == set(EXTRAS), "a new benchmark needs its line in EXTRAS (and this test runs it)"
    assert "sqlite-scan (optional)" in done.stdout.splitlines()


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_benchmark_prints_a_row_with_numbers(name: str, tmp_path: Path) -> None:
    if name.endswith("-upstream") and upstream_python() is None:
        pytest.skip("the upstream gateway is not installed (make upstream)")
    cache = tmp_path / "cache"
    done = run_bench("--size", "tiny", "--runs", "1", "--only", name, "--cache-dir", str(cache))
    assert done.returncode in (0, 1), done.stderr  # met or missed: both finished (tiny sizes say nothing)
    assert "Traceback" not in done.stderr
    assert re.search(r"^date: \d{4}-\d\d-\d\d \d\d:\d\d UTC; machine: \d+ cores, .*; Python [\d.]+; SQLite [\d.]+;",
                     done.stdout, re.M), done.stdout
    rows = table(done.stdout)
    assert list(rows) == [name], done.stdout + done.stderr
    row, _, measured, goal, verdict = rows[name]
    assert not verdict.startswith("ERROR"), verdict
    assert row, "the issue's row"
    assert re.fullmatch(r"pass|MISS \(.+\)", verdict), verdict
    assert re.search(r"(<=|>=)" + NUMBER, goal) if name not in NO_GOAL else goal == "-", goal
    assert re.search(NUMBER + r"(x| MB| s| ms)", measured), measured
    line = detail(done.stdout, name)
    ours = re.search(r"ours (" + NUMBER + r") m?s;", line)
    assert ours is not None and float(ours.group(1).replace(",", "")) > 0, line
    if name not in NO_BASELINE:
        assert re.search(r"baseline " + NUMBER + r" m?s; ratio " + NUMBER + "x;", line), line
    for pattern in EXTRAS[name]:
        assert re.search(pattern, line), f"{pattern!r} not in {line}"
    if cache.exists():  # the stores a benchmark built stay in the cache folder given, with their metadata
        assert {p.suffix for p in cache.iterdir()} <= {".db", ".json", ".lock"}


def test_cached_store_is_reused_and_scale_sets_the_size(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # full size scaled to 1/500: the CLI scan's 1,000,000 sessions and 10,000 orphans become 2,000 and 20
    args = ("--size", "full", "--scale", "0.002", "--runs", "1", "--cache-dir", str(cache))
    first = run_bench(*args, "--only", "sqlite-cli-scan")
    assert first.returncode in (0, 1), first.stderr
    assert re.search(r"store 2,000 sessions/3,980 traces \(20 orphans\), \d+ MB, built in", first.stdout)
    assert "size full, scale 0.002" in first.stdout
    second = run_bench(*args, "--only", "exporter-unguarded-1m")
    assert second.returncode in (0, 1), second.stderr
    assert re.search(r"store 2,000 sessions/3,980 traces \(20 orphans\), \d+ MB, reused", second.stdout), second.stdout
    assert sorted(p.name for p in cache.iterdir()) == ["slim-2000s-20o-g1.db", "slim-2000s-20o-g1.json",
                                                       "slim-2000s-20o-g1.lock"]


@pytest.mark.parametrize("args", [["--scale", "5"], ["--scale", "0"], ["--runs", "0"], ["--only", "nope"],
                                  ["--size", "huge"], ["--cache-dir", str(REPO / "bench-cache")]])
def test_bad_flags_exit_2_without_a_traceback(args: list[str]) -> None:
    done = run_bench(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_table_is_one_markdown_table_with_verdicts() -> None:
    results = [
        BenchResult(name="a", row="row | with a pipe", ours_seconds=2.0, baseline_seconds=1.0,
                    checks=[Check.ratio(2.0, 1.3)]),
        BenchResult(name="b", row="throughput", checks=[Check("throughput", 0.98, 0.97, "x", at_least=True),
                                                         Check("p95", 1.2, 1.15, "x")]),
        BenchResult(name="c", error="BenchError: it broke\nmore\nthe cause"),
    ]
    lines = render_table(results).splitlines()
    assert len(lines) == 5 and all(line.startswith("|") and line.endswith("|") for line in lines)
    assert len({line.count("|") for line in lines}) == 1, "a cell's own pipe would break the table"
    rows = table("\n".join(lines))
    assert rows["a"][4] == "MISS (ratio)" and rows["a"][3] == "ratio<=1.30x"
    assert rows["b"][4] == "MISS (p95)" and rows["b"][3] == "throughput>=0.97x, p95<=1.15x"
    assert rows["c"][4] == "ERROR: BenchError: it broke ... the cause"
