"""The bench runner's machinery: the registry, child processes, timing, peak RSS and the one table.

A benchmark plugs in with one function::

    from bench.common import BenchContext, BenchResult, Check, register

    @register("memory-store")
    def memory_store(ctx: BenchContext) -> BenchResult:
        ...  # measure ours and a bare baseline in this same run, in fresh child processes
        return BenchResult(name="memory-store", ours_seconds=..., baseline_seconds=...,
                           checks=[Check.ratio(ours / bare, 1.5)], peak_rss_bytes=...)

Put it in any module of the ``bench`` package (a name not starting with ``_``): ``discover`` imports
every such module, so no list needs editing. Rules (docs/performance.md): compare against a bare
baseline measured in the same run, report medians of several runs, measure in fresh subprocesses so a
peak RSS is the measured work's own, and never assert a wall-clock time in a test.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

#: the repository root (the folder holding ``bench/`` and ``gatewayscope/``)
REPO_ROOT = Path(__file__).resolve().parent.parent
SIZES = ("full", "small", "tiny")
MIB = 1024 * 1024
T = TypeVar("T")


class BenchError(RuntimeError):
    """A benchmark could not measure (a child failed, a store could not be built)."""


def default_cache_dir() -> Path:
    """Where benchmark fixtures (big stores) are cached between runs: outside the repository."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gatewayscope-bench"


@dataclass(frozen=True)
class BenchContext:
    """How a benchmark should run: its size, how many runs, where its cached fixtures live."""

    #: "full" (the sizes of docs/performance.md#the-rows), "small" (a quick look) or "tiny" (the smoke test)
    size: str = "full"
    #: runs per measured side; None lets the benchmark choose (3 full, more when small)
    runs: int | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    #: multiplies the full-size store sizes of the scaling rows (``make bench BENCH_SCALE=0.1``)
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {self.size!r}")
        if self.runs is not None and not 1 <= self.runs <= 100:
            raise ValueError(f"runs must be from 1 to 100, got {self.runs}")
        if not 0.0001 <= self.scale <= 1.0:
            raise ValueError(f"scale must be from 0.0001 to 1, got {self.scale}")

    def scaled(self, full: int, small: int, tiny: int, *, least: int = 1) -> int:
        """A store size: ``full`` times ``scale`` at full size (at least ``least``), else small or tiny."""
        if self.size == "full":
            return max(least, round(full * self.scale))
        return int(self.pick(full, small, tiny))

    def pick(self, full: Any, small: Any, tiny: Any) -> Any:
        """The value for this context's size."""
        return {"full": full, "small": small, "tiny": tiny}[self.size]

    def runs_or(self, full: int, small: int, tiny: int = 1) -> int:
        """``runs`` when given, else the benchmark's default for this size."""
        return self.runs if self.runs is not None else int(self.pick(full, small, tiny))


@dataclass(frozen=True)
class Check:
    """One target of a benchmark: ``value`` must be at most ``limit`` (at least, with ``at_least``)."""

    label: str
    value: float
    limit: float
    unit: str = ""  # "x", "MB", "ms", "s": how both numbers are printed
    at_least: bool = False

    @property
    def met(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def show_limit(self) -> str:
        return f"{self.label}{'>=' if self.at_least else '<='}{_number(self.limit)}{_unit(self.unit)}"

    def show_value(self) -> str:
        return f"{_number(self.value)}{_unit(self.unit)}"

    @classmethod
    def ratio(cls, value: float, limit: float) -> Check:
        return cls("ratio", value, limit, "x")

    @classmethod
    def rss(cls, peak_bytes: int, limit_mb: float) -> Check:
        return cls("RSS", peak_bytes / MIB, limit_mb, "MB")


@dataclass
class BenchResult:
    """One row of the table."""

    name: str
    #: what the row measures, in words (the table's first column); the name when empty
    row: str = ""
    ours_seconds: float | None = None
    baseline_seconds: float | None = None
    peak_rss_bytes: int | None = None
    checks: list[Check] = field(default_factory=list)
    #: further figures, printed in order as ``label value``
    extras: dict[str, str] = field(default_factory=dict)
    #: set when the benchmark could not measure; the row then reads ERROR
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.ours_seconds is None or not self.baseline_seconds:
            return None
        return self.ours_seconds / self.baseline_seconds

    @property
    def missed(self) -> list[str]:
        return [check.label for check in self.checks if not check.met]

    @property
    def met(self) -> bool:
        return self.error is None and not self.missed


#: the table's row order: the scaling rows first, then the others (any not named here after, as registered)
TABLE_ORDER = ("sqlite-cli-scan", "sqlite-cli-scan-guarded", "exporter-guarded-10m", "memory-store-scan-guarded",
               "memory-store-scan", "exporter-unguarded-1m", "guard-chat-memory-0.1.0", "guard-chat-sqlite-0.1.0",
               "guard-chat-memory-upstream", "guard-chat-sqlite-upstream", "dispatch-estimate-0.1.0",
               "dispatch-estimate-upstream", "guard-run-startup", "cli-startup", "bifrost-scan",
               "exporter-metrics-warm", "apply-pool-shrinks", "heal-pass", "heal-gateway-share",
               "orphan-session-delete", "exporter-fleet-100", "guard-install-under-load", "sqlite-scan")


def in_table_order(names: Sequence[str]) -> list[str]:
    """``names`` in the table's row order."""
    return sorted(names, key=lambda name: TABLE_ORDER.index(name) if name in TABLE_ORDER else len(TABLE_ORDER))


Benchmark = Callable[[BenchContext], BenchResult]
REGISTRY: dict[str, Benchmark] = {}
#: benchmarks ``python -m bench`` runs only when named (``--only``) or with ``--all``
OPTIONAL: set[str] = set()
#: benchmark modules that failed to import: module name -> the error (each becomes an ERROR row)
IMPORT_ERRORS: dict[str, str] = {}


def register(name: str, *, optional: bool = False) -> Callable[[Benchmark], Benchmark]:
    """Register ``fn`` as the benchmark ``name`` (one table row); an ``optional`` one is left out of a
    plain ``python -m bench`` run."""

    def add(fn: Benchmark) -> Benchmark:
        if name in REGISTRY and REGISTRY[name] is not fn:
            raise ValueError(f"two benchmarks are named {name!r}")
        REGISTRY[name] = fn
        if optional:
            OPTIONAL.add(name)
        return fn

    return add


def discover() -> dict[str, Benchmark]:
    """Import every benchmark module of the ``bench`` package and return the registry.

    A module that fails to import does not stop the others: its error is kept in ``IMPORT_ERRORS``
    and ``python -m bench`` shows it as an ERROR row (unless ``--only`` names other benchmarks).
    """
    package = Path(__file__).resolve().parent
    for module in sorted(pkgutil.iter_modules([str(package)]), key=lambda m: m.name):
        if module.name.startswith("_") or module.name == "common":
            continue
        try:
            importlib.import_module(f"bench.{module.name}")
        except Exception as err:  # a broken benchmark is reported, the rest still run
            IMPORT_ERRORS[module.name] = f"{type(err).__name__}: {err}"
    return REGISTRY


# -- measuring -----------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    """The median of several runs (the figure every benchmark reports)."""
    if not values:
        raise ValueError("median of no runs")
    return float(statistics.median(values))


def median_seconds(runs: Sequence[Mapping[str, Any]]) -> float:
    """The median of the ``seconds`` of several children's results."""
    return median([run["seconds"] for run in runs])


def peak_of(runs: Sequence[Mapping[str, Any]]) -> int:
    """The largest ``peak_rss`` of several children's results."""
    return max(run["peak_rss"] for run in runs)


def alternate(runs: int, *sides: Callable[[], T], pause: float = 0.0) -> list[list[T]]:
    """``runs`` rounds of every side, in the order given in even rounds and reversed in odd ones, so that what
    drifts during a run falls on every side alike; each side's results in the order they ran. ``pause``: the
    seconds to sleep after each side."""
    results: list[list[T]] = [[] for _ in sides]
    for i in range(runs):
        for k in (range(len(sides)) if i % 2 == 0 else reversed(range(len(sides)))):
            results[k].append(sides[k]())
            if pause:
                time.sleep(pause)
    return results


def runs_figure(runs: int, ours_runs: Sequence[Mapping[str, Any]], bare_runs: Sequence[Mapping[str, Any]], *,
                ms: bool = False) -> str:
    """``runs (ours a/b, bare c/d s)``: each run's seconds, to the millisecond in ms with ``ms``, else in s to 10 ms."""

    def times(results: Sequence[Mapping[str, Any]]) -> str:
        return "/".join(f"{r['seconds'] * 1000:.0f}" if ms else f"{r['seconds']:.2f}" for r in results)

    return f"{runs} (ours {times(ours_runs)}, bare {times(bare_runs)} {'ms' if ms else 's'})"


def ratio_result(name: str, row: str, ours_seconds: float, baseline_seconds: float, target: float, *,
                 peak_rss: int | None = None, checks: Sequence[Check] = (),
                 extras: dict[str, str] | None = None) -> BenchResult:
    """The row of a benchmark timed against a baseline: its first check ours / baseline at most ``target``, then
    ``checks``."""
    return BenchResult(name=name, row=row, ours_seconds=ours_seconds, baseline_seconds=baseline_seconds,
                       peak_rss_bytes=peak_rss, checks=[Check.ratio(ours_seconds / baseline_seconds, target), *checks],
                       extras=extras or {})


def _proc_status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (VmHWM; ru_maxrss where /proc is missing)."""
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def current_rss_bytes() -> int:
    """This process's resident set now (VmRSS), or the peak where /proc is missing."""
    rss = _proc_status_bytes("VmRSS")
    return rss if rss is not None else peak_rss_bytes()


def child_env() -> dict[str, str]:
    """The environment for a child: the repository first on the path so ``bench`` imports."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def child_command(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def run_child(module: str, *args: str, timeout: float = 3600.0) -> dict[str, Any]:
    """Run ``python -m module args...`` in a fresh process; return the JSON object it printed last.

    Children measure themselves (``time.monotonic()`` stamps, which are system-wide on Linux so
    a parent can line them up with another child's, and ``peak_rss_bytes()`` at the end), so the
    interpreter's start-up is never part of a figure and the peak RSS is the child's alone.
    """
    try:
        done = subprocess.run(child_command(module, *args), capture_output=True, text=True,
                              timeout=timeout, env=child_env(), cwd=REPO_ROOT, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{module} {' '.join(args)} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise BenchError(f"{module} {' '.join(args)} exited with {done.returncode}:\n{tail}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"{module} {' '.join(args)} printed no result")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def emit(result: dict[str, Any]) -> None:
    """Print a child's result as the one JSON line ``run_child`` reads."""
    print(json.dumps(result), flush=True)


#: one command of a benchmark module's children: its word, the function it runs and the type of each argument
#: (the function is given the command's arguments, each converted by its type)
ChildCommand = tuple[str, Callable[..., dict[str, Any]], tuple[Callable[[str], Any], ...]]


def children(module: str, usage: str, commands: Sequence[ChildCommand]) -> Callable[[Sequence[str]], int]:
    """A benchmark module's ``child_main``: it runs the command whose word and number of arguments ``argv`` has and
    prints its result (``emit``), else prints ``usage: python -m MODULE USAGE`` to stderr and returns 2."""

    def child_main(argv: Sequence[str]) -> int:
        for word, run, types in commands:
            if argv and argv[0] == word and len(argv) == len(types) + 1:
                emit(run(*(convert(arg) for convert, arg in zip(types, argv[1:], strict=True))))
                return 0
        print(f"usage: python -m {module} {usage}", file=sys.stderr)
        return 2

    return child_main


# -- printing ------------------------------------------------------------------------------------


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _unit(unit: str) -> str:
    return unit if unit in ("x", "") else f" {unit}"


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def format_bytes(count: int | None) -> str:
    return "-" if count is None else f"{count / MIB:.0f} MB"


def machine_facts() -> str:
    """One line: the date (UTC), cores, CPU model, Python, SQLite, load average (to print with the table: other work
    on the machine while a benchmark ran shows up in the load average)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load average unknown"
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"date: {date}; machine: {os.cpu_count()} cores, {cpu}; Python {platform.python_version()}; "
            f"SQLite {sqlite3.sqlite_version}; {load}")


COLUMNS = ("row", "benchmark", "measured", "goal", "result")


def _cell(text: str) -> str:
    """A table cell: one line, no ``|`` (the table is Markdown as printed)."""
    return " ".join(text.split()).replace("|", "/")


def measured_text(res: BenchResult) -> str:
    """What a row measured: each check's value, then ours vs the baseline when both were timed."""
    parts = [f"{check.label} {check.show_value()}" for check in res.checks]
    if res.ours_seconds is not None and res.baseline_seconds is not None:
        parts.append(f"({format_seconds(res.ours_seconds)} vs {format_seconds(res.baseline_seconds)})")
    elif res.ours_seconds is not None:
        parts.append(f"({format_seconds(res.ours_seconds)})")
    return " ".join(parts) if parts else "-"


def table_rows(results: Sequence[BenchResult]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per result, in ``COLUMNS`` order."""
    rows = []
    for res in results:
        row = res.row or res.name
        if res.error is not None:
            lines = res.error.strip().splitlines() or ["?"]
            text = lines[0][:200] + (" ... " + lines[-1][-200:] if len(lines) > 1 else "")
            rows.append((row, res.name, "-", "-", "ERROR: " + text))
            continue
        goal = ", ".join(check.show_limit() for check in res.checks) or "-"
        verdict = "pass" if res.met else "MISS (" + ", ".join(res.missed) + ")"
        rows.append((row, res.name, measured_text(res), goal, verdict))
    return [tuple(_cell(cell) for cell in row) for row in rows]


def details(results: Sequence[BenchResult]) -> str:
    """Below the table, one line per measured row: times, peak RSS and the benchmark's further figures."""
    lines = []
    for res in results:
        if res.error is not None:
            continue
        ratio = res.ratio
        parts = [f"ours {format_seconds(res.ours_seconds)}", f"baseline {format_seconds(res.baseline_seconds)}",
                 "ratio " + ("-" if ratio is None else f"{ratio:.2f}x"), f"peak RSS {format_bytes(res.peak_rss_bytes)}",
                 *(f"{label} {value}" for label, value in res.extras.items())]
        lines.append(f"- {res.name}: " + "; ".join(_cell(part) for part in parts))
    return "\n".join(lines)


def render_table(results: Sequence[BenchResult]) -> str:
    """The one table ``python -m bench`` prints: a Markdown table with aligned columns."""
    rows = [COLUMNS, *table_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |")
        if index == 0:
            lines.append("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)
