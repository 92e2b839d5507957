"""Start-up: ``gatewayscope --help`` against ``python -c "import httpx"``, each a fresh process.

ours is the console script a user runs (``gatewayscope --help``), the baseline the same interpreter
importing httpx and nothing else: what every gatewayscope command that reads a gateway loads anyway.
Wall time from launch to exit, alternating the two, medians of the runs after one warm-up pair (the
first launch reads the files into the page cache). Which modules ``--help`` loads is tested in
tests/test_startup.py; this row is the time.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time

from bench.cli_scan import cli_argv
from bench.common import BenchContext, BenchError, BenchResult, alternate, child_env, median, ratio_result, register

NAME = "cli-startup"
RATIO_TARGET = 2.0


def _run(argv: list[str]) -> float:
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, timeout=120, env=child_env(), check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr[-1000:]!r}")
    return seconds


@register(NAME)
def cli_startup(ctx: BenchContext) -> BenchResult:
    """``gatewayscope --help`` vs ``python -c "import httpx"``."""
    runs = ctx.runs_or(15, 9, 3)
    ours_argv = [*cli_argv(), "--help"]
    bare_argv = [sys.executable, "-c", "import httpx"]
    _run(ours_argv), _run(bare_argv)
    ours, bare = alternate(runs, functools.partial(_run, ours_argv), functools.partial(_run, bare_argv))
    return ratio_result(
        NAME, "gatewayscope --help / python -c \"import httpx\"", median(ours), median(bare), RATIO_TARGET,
        extras={"runs": f"{runs} a side (ours {min(ours) * 1000:.0f}-{max(ours) * 1000:.0f} ms, "
                        f"bare {min(bare) * 1000:.0f}-{max(bare) * 1000:.0f} ms)"},
    )
