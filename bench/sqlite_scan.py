"""SQLite scan: ``read_trace_store_sqlite`` on a big 0.1.0-style store while the gateway keeps committing.

What it measures, in one run:

* ours: ``read_trace_store_sqlite(target, Policy(), now=...)``, the whole source as a scan runs it (the
  candidates read: session pages aggregated in SQLite, guard probe, weight version, candidate traces), in a
  fresh child process;
* baseline: the bare ``SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at) FROM trace_sessions
  GROUP BY session_id`` + ``fetchall()`` with the ``sqlite3`` module, in a fresh child process;
* while both run, a writer process commits continuously exactly like the gateway (its own
  ``SqliteTraceStore.store_trace``: one connection, busy timeout 20 s, INSERT OR REPLACE INTO traces +
  INSERT OR IGNORE INTO trace_sessions + commit, DELETE journal mode) and times every commit; the
  longest commit wait that overlaps each scan is what the gateway felt. The bare query holds its read
  lock for the whole aggregate, which is why the source pages.

Order: a warm-up pair (not counted); ``runs`` pairs with no writer (the "no writer" figures); the
writer alone for a second (its undisturbed rate); ``runs`` pairs under the writer, alternating which
side goes first. The ratio, the checks and the peak RSS come from the runs under the writer.

The store (1,000,000 sessions / 3,000,000 traces full size) is built once with the gateway's own DDL and
cached outside the repository, keyed by size and generator version. The writer's rows carry trace ids
starting with ``bench-writer-`` and are removed after every run, so the cached store stays as built.

Optional (``--only sqlite-scan`` or ``--all``): its 7 GB store takes long to build, and the CLI rows
(``bench/cli_scan.py``) measure the scan as a user runs it. Its ``ours-full`` child (every session listed,
``full=True``, as the exporter's full reads do) is the full scan the exporter rows compare against.

Children: ``python -m bench.sqlite_scan ours|ours-full|baseline|writer ...`` (used by the benchmarks only).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from bench import common

NAME = "sqlite-scan"
MODULE = "bench.sqlite_scan"
#: bump when the generated store changes shape, so cached stores are rebuilt
GENERATOR_VERSION = 2
SIZES = {"full": (1_000_000, 3_000_000), "small": (20_000, 60_000), "tiny": (2_000, 6_000)}
RATIO_TARGET = 1.5
RSS_TARGET_MB = 300.0
WRITER_WAIT_TARGET_MS = 100.0
#: how long the writer runs alone first, to show its undisturbed commit rate
SOLO_SECONDS = 1.0

BARE_SQL = ("SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at) "
            "FROM trace_sessions GROUP BY session_id")
WRITER_PREFIX = "bench-writer-"
_WRITER_PREFIX_END = "bench-writer."  # the first string after every id starting with WRITER_PREFIX

DAY = 86400.0
#: the store's history: sessions start evenly over these last 14 days
SPAN = 14 * DAY
#: rLLM uids are f"{uuid4()}:{rollout_idx}": task groups of this many rollouts share the uuid
GROUP_SIZE = 8
#: chance that a task group left stragglers, then 1-4 of its rollouts are one-trace sessions (~1.5% of all)
STRAGGLER_GROUP_CHANCE = 0.048
MAX_TRACES_PER_SESSION = 12
#: the default idle threshold (Policy().orphan_idle_seconds), to know how many candidates to expect
DEFAULT_IDLE = 7200.0
SEED = 20240601
_CHUNK_SESSIONS = 5000


# -- the store ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreFixture:
    """A built trace store and what the generator put in it."""

    path: str
    sessions: int
    traces: int
    one_trace_sessions: int
    #: one-trace sessions idle past the default threshold: the candidates ``Policy()`` must find
    expected_candidates: int
    #: the "now" the store was generated against (scans pass it, so results never drift with the clock)
    now: float
    size_bytes: int
    generator: int = GENERATOR_VERSION


_DATA = (
    '{"trace_id": "%s", "session_id": "%s", "model": "%s", "messages": %s, "prompt_token_ids": %s, '
    '"response_message": %s, "completion_token_ids": %s, "logprobs": null, "finish_reason": "stop", '
    '"latency_ms": %.1f, "token_counts": {"prompt": %d, "completion": %d}, "timestamp": %.6f, '
    '"metadata": {}, "raw_request": null, "raw_response": null%s}'
)
_MODELS = ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B")
_WORDS = ("the", "agent", "must", "solve", "a", "puzzle", "with", "tools", "given", "below", "step", "answer",
          "search", "file", "python", "result", "observation", "call", "function", "return", "value", "list")


class _Pools:
    """Pre-rendered JSON fragments, so a trace's ``data`` is one %-format (the build stays fast)."""

    def __init__(self, rng: random.Random) -> None:
        def ids(count: int) -> str:  # token ids of a 151k vocabulary, frequent (low) ids more often
            return json.dumps([rng.randrange(1, 151_000) if rng.random() < 0.2 else rng.randrange(1, 32_000)
                               for _ in range(count)])

        def text(words: int) -> str:
            return " ".join(rng.choice(_WORDS) for _ in range(words))

        # ~1.6 KB of JSON per trace: two traces fit in one 4 KiB page, as with short real prompts
        self.prompts = [(ids(n), n) for n in (rng.randint(100, 160) for _ in range(97))]
        #: a straggler carries the whole conversation so far: a large prompt
        self.big_prompts = [(ids(n), n) for n in (rng.randint(300, 450) for _ in range(31))]
        self.messages = [json.dumps([{"role": "system", "content": "You are a helpful agent. " + text(6)},
                                     {"role": "user", "content": text(rng.randint(10, 30))}])
                         for _ in range(41)]
        self.completions = []
        for _ in range(23):
            n = rng.randint(5, 15)
            self.completions.append((json.dumps({"role": "assistant", "content": text(n)}), ids(n), n))


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{h[16:20]}-{h[20:]}"


def _plan_counts(rng: random.Random, n_sessions: int, n_traces: int) -> list[int]:
    """Traces per session: straggler one-trace sessions in task groups, the rest 2..12 around the mean."""
    counts = [0] * n_sessions
    for start in range(0, n_sessions, GROUP_SIZE):
        if rng.random() < STRAGGLER_GROUP_CHANCE:
            members = range(start, min(start + GROUP_SIZE, n_sessions))
            for index in rng.sample(members, min(rng.randint(1, 4), len(members))):
                counts[index] = 1
    multi = [i for i, c in enumerate(counts) if c == 0]
    rest = n_traces - (n_sessions - len(multi))
    if not multi or not 2 * len(multi) <= rest <= MAX_TRACES_PER_SESSION * len(multi):
        raise ValueError(f"cannot shape {n_sessions} sessions into {n_traces} traces")
    mean = rest / len(multi)
    for i in multi:
        counts[i] = min(MAX_TRACES_PER_SESSION, max(2, round(rng.gauss(mean, 1.0))))
    diff = rest - sum(counts[i] for i in multi)
    for _ in range(100 * len(multi)):  # bounded: each step moves diff one closer when it can
        if diff == 0:
            break
        i = multi[rng.randrange(len(multi))]
        if diff > 0 and counts[i] < MAX_TRACES_PER_SESSION:
            counts[i] += 1
            diff -= 1
        elif diff < 0 and counts[i] > 2:
            counts[i] -= 1
            diff += 1
    if diff:
        raise ValueError(f"cannot shape {n_sessions} sessions into {n_traces} traces")
    return counts


def weight_version_at(t: float, now: float) -> int | None:
    """Weight versions exist in the newer half of the history (an upstream gateway), one per 6 hours."""
    since = now - SPAN / 2
    return None if t < since else 1 + int((t - since) // (6 * 3600))


def generate(n_sessions: int, n_traces: int, now: float,
             seed: int = SEED) -> Iterator[tuple[list[tuple[str, str, float]], list[tuple[str, str, float]]]]:
    """Chunks of (traces rows, trace_sessions rows) in time order, as the gateway would have written them."""
    rng = random.Random(seed)
    pools = _Pools(rng)
    counts = _plan_counts(rng, n_sessions, n_traces)
    first = now - SPAN
    step = (SPAN - 900.0) / n_sessions  # the newest session starts 15 minutes before now
    traces: list[tuple[str, str, float]] = []
    links: list[tuple[str, str, float]] = []
    group = ""
    for k, count in enumerate(counts):
        if k % GROUP_SIZE == 0:
            group = _uuid(rng)
        sid = f"{group}:{k % GROUP_SIZE}"
        t = first + k * step + rng.uniform(0.0, 20.0)
        model = _MODELS[k % len(_MODELS)]
        messages = pools.messages[rng.randrange(len(pools.messages))]
        gap = rng.uniform(5.0, 60.0)
        for _ in range(count):
            prompt, n_prompt = (pools.big_prompts[rng.randrange(len(pools.big_prompts))] if count == 1
                                else pools.prompts[rng.randrange(len(pools.prompts))])
            response, completion, n_completion = pools.completions[rng.randrange(len(pools.completions))]
            version = weight_version_at(t, now)
            tid = _uuid(rng)
            data = _DATA % (tid, sid, model, messages, prompt, response, completion, rng.uniform(200, 9000),
                            n_prompt, n_completion, t, "" if version is None else f', "weight_version": {version}')
            traces.append((tid, data, t))
            links.append((tid, sid, t))
            t += gap
        if (k + 1) % _CHUNK_SESSIONS == 0:
            yield traces, links
            traces, links = [], []
    if traces:
        yield traces, links


async def _gateway_schema(path: Path) -> None:
    """Let the gateway's own SqliteTraceStore create the file (its DDL and pragmas, exactly)."""
    from rllm_model_gateway.store.sqlite_store import SqliteTraceStore

    store = SqliteTraceStore(db_path=str(path))
    try:
        await store.list_sessions(limit=1)  # opens the connection: pragmas + CREATE TABLE/INDEX
    finally:
        await store.close()


def gateway_schema(path: Path) -> None:
    """Create an empty trace store at ``path`` with the gateway's own DDL and pragmas."""
    asyncio.run(_gateway_schema(path))


def build_store(path: Path, n_sessions: int, n_traces: int, now: float) -> int:
    """Write the store at ``path``; return how many one-trace sessions it holds.

    Schema from the gateway's SqliteTraceStore; then its three secondary indexes are dropped,
    rows are bulk-inserted with executemany in one transaction (journal off: a half-built file is
    thrown away, never used), and the indexes are created again from the gateway's own DDL text.
    The file ends in DELETE journal mode, the 0.1.0 gateway's.
    """
    gateway_schema(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "cache_size=-1048576", "temp_store=MEMORY",
                       "locking_mode=EXCLUSIVE"):
            conn.execute(f"PRAGMA {pragma}")
        indexes = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
                               "ORDER BY name").fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        conn.execute("BEGIN")
        for traces, links in generate(n_sessions, n_traces, now):
            conn.executemany("INSERT INTO traces (trace_id, data, created_at) VALUES (?, ?, ?)", traces)
            conn.executemany("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)",
                             links)
        conn.execute("COMMIT")
        for _, sql in indexes:
            conn.execute(sql)
        singles = conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM trace_sessions GROUP BY session_id "
                               "HAVING COUNT(*) = 1)").fetchone()[0]
        conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()
    # flush it now: a background write-back of gigabytes would slow the runs measured next
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return int(singles)


def _count_candidates(path: Path, now: float) -> int:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT COUNT(*) FROM (SELECT MAX(created_at) AS last FROM trace_sessions "
                           "GROUP BY session_id HAVING COUNT(*) = 1) WHERE last <= ?",
                           (now - DEFAULT_IDLE,)).fetchone()
    conn.close()
    return int(row[0])


def ensure_store(cache_dir: Path, n_sessions: int, n_traces: int) -> tuple[StoreFixture, float | None]:
    """The cached store of this size, built first when missing; also the build time (None: reused)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    stem = f"rllm-store-{n_sessions}s-{n_traces}t"
    db = cache_dir / f"{stem}-g{GENERATOR_VERSION}.db"
    meta = cache_dir / f"{stem}-g{GENERATOR_VERSION}.json"
    if db.exists() and meta.exists():
        fixture = StoreFixture(**json.loads(meta.read_text()))
        if (fixture.sessions, fixture.traces, fixture.generator) == (n_sessions, n_traces, GENERATOR_VERSION):
            return StoreFixture(**{**asdict(fixture), "path": str(db)}), None
    for stale in cache_dir.glob(f"{stem}-g*"):  # older generator versions of this size
        stale.unlink(missing_ok=True)
    need = n_traces * 2600
    free = shutil.disk_usage(cache_dir).free
    if free < need:
        raise common.BenchError(f"{cache_dir} has {free / 1e9:.1f} GB free; the store needs about {need / 1e9:.1f} GB. "
                                "Free some space or pass --cache-dir elsewhere.")
    building = cache_dir / f"{stem}.{os.getpid()}.building"
    started = time.monotonic()
    try:
        now = time.time()
        singles = build_store(building, n_sessions, n_traces, now)
        fixture = StoreFixture(path=str(db), sessions=n_sessions, traces=n_traces, one_trace_sessions=singles,
                               expected_candidates=_count_candidates(building, now), now=now,
                               size_bytes=building.stat().st_size)
        os.replace(building, db)
        meta_tmp = meta.with_suffix(f".{os.getpid()}.tmp")
        meta_tmp.write_text(json.dumps(asdict(fixture), indent=2))
        os.replace(meta_tmp, meta)
    finally:
        for leftover in (building, Path(f"{building}-journal")):
            leftover.unlink(missing_ok=True)
    return fixture, time.monotonic() - started


def remove_writer_rows(path: str) -> int:
    """Delete what the benchmark's writer added (trace ids starting with ``bench-writer-``)."""
    conn = sqlite3.connect(path, timeout=60.0)
    try:
        with conn:
            conn.execute("DELETE FROM trace_sessions WHERE trace_id >= ? AND trace_id < ?",
                         (WRITER_PREFIX, _WRITER_PREFIX_END))
            removed = conn.execute("DELETE FROM traces WHERE trace_id >= ? AND trace_id < ?",
                                   (WRITER_PREFIX, _WRITER_PREFIX_END)).rowcount
    finally:
        conn.close()
    return int(removed)


# -- the gateway's writer -------------------------------------------------------------------------


class GatewayWriter:
    """A child process committing traces through the gateway's SqliteTraceStore until stopped.

    Use as a context manager: entering waits for its first commit; ``stop()`` ends it and returns
    every commit as (monotonic start, seconds waited); leaving kills it if it is still running.
    """

    def __init__(self, path: str, *, max_seconds: float = 3600.0) -> None:
        self.path = path
        self.max_seconds = max_seconds
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None

    def __enter__(self) -> GatewayWriter:
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(common.child_command(MODULE, "writer", self.path, str(self.max_seconds)),
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=common.child_env())
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], 60.0)
        line = self._proc.stdout.readline().strip() if ready else ""
        if line != "ready":
            self._close()
            raise common.BenchError(f"the writer did not start: {line or 'no answer in 60 s'} {self._errors()}")
        return self

    def _errors(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return "\n".join(self._stderr.read().strip().splitlines()[-10:])

    def stop(self) -> list[tuple[float, float]]:
        """Ask the writer to finish its commit and exit; return its commit log."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self._proc.communicate(timeout=120.0)
        except subprocess.TimeoutExpired:
            raise common.BenchError("the writer did not stop within 120 s") from None
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if self._proc.returncode != 0 or not lines:
            raise common.BenchError(f"the writer failed (exit {self._proc.returncode}): {self._errors()}")
        return [(float(t0), float(wait)) for t0, wait in json.loads(lines[-1])["commits"]]

    def _close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30.0)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __exit__(self, *exc: object) -> None:
        self._close()


def longest_wait(commits: Sequence[tuple[float, float]], start: float, end: float) -> tuple[float, int]:
    """The longest commit wait overlapping [start, end] and how many commits overlapped it."""
    waits = [wait for t0, wait in commits if t0 <= end and t0 + wait >= start]
    return max(waits, default=0.0), len(waits)


# -- children -------------------------------------------------------------------------------------


def _child_ours(path: str, now: float, *, full: bool = False) -> dict[str, Any]:
    from gatewayscope.config import Policy, Target
    from gatewayscope.sources.rllm_sqlite import read_trace_store_sqlite

    target = Target(name="bench", kind="rllm", path=path)
    rss_imported = common.current_rss_bytes()
    start = time.monotonic()
    data = read_trace_store_sqlite(target, Policy(), now=now, full=full)
    end = time.monotonic()
    return {"start": start, "end": end, "seconds": end - start, "peak_rss": common.peak_rss_bytes(),
            "rss_imported": rss_imported, "sessions": data.session_count, "listed": data.sessions.height,
            "candidates": data.candidate_traces.height}


def _child_baseline(path: str) -> dict[str, Any]:
    start = time.monotonic()
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    rows = conn.execute(BARE_SQL).fetchall()
    conn.close()
    end = time.monotonic()
    return {"start": start, "end": end, "seconds": end - start, "peak_rss": common.peak_rss_bytes(),
            "sessions": len(rows)}


async def _write_like_the_gateway(path: str, max_seconds: float, stopping: list[bool]) -> list[list[float]]:
    from rllm_model_gateway.store.sqlite_store import SqliteTraceStore

    rng = random.Random()
    pools = _Pools(rng)
    store = SqliteTraceStore(db_path=path)
    parent = os.getppid()
    deadline = time.monotonic() + max_seconds
    commits: list[list[float]] = []
    group = _uuid(rng)
    try:
        for k in range(10_000_000):  # bounded; stops on SIGTERM, the deadline or the parent's exit
            if stopping or time.monotonic() > deadline or os.getppid() != parent:
                break
            if k % (GROUP_SIZE * 3) == 0:
                group = _uuid(rng)
            sid = f"{group}:{(k // 3) % GROUP_SIZE}"  # each rollout makes three calls
            trace_id = f"{WRITER_PREFIX}{_uuid(rng)}"
            prompt, n_prompt = pools.prompts[rng.randrange(len(pools.prompts))]
            data = {"trace_id": trace_id, "session_id": sid, "model": _MODELS[0],
                    "messages": json.loads(pools.messages[k % len(pools.messages)]),
                    "prompt_token_ids": json.loads(prompt), "response_message": {"role": "assistant",
                                                                                 "content": "ok"},
                    "completion_token_ids": [1, 2, 3], "logprobs": None, "finish_reason": "stop",
                    "latency_ms": 1200.0, "token_counts": {"prompt": n_prompt, "completion": 3},
                    "timestamp": time.time(), "metadata": {}, "raw_request": None, "raw_response": None}
            start = time.monotonic()
            await store.store_trace(trace_id, sid, data)
            commits.append([round(start, 6), round(time.monotonic() - start, 6)])
            if k == 0:
                print("ready", flush=True)
    finally:
        await store.close()
    return commits


def _child_writer(path: str, max_seconds: float) -> dict[str, Any]:
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    return {"commits": asyncio.run(_write_like_the_gateway(path, max_seconds, stopping))}


#: the children: ``ours PATH NOW``, ``baseline PATH``, ``writer PATH MAX_SECONDS``
child_main = common.children(MODULE, "ours|ours-full PATH NOW | baseline PATH | writer PATH MAX_SECONDS", [
    ("ours", _child_ours, (str, float)),
    ("ours-full", functools.partial(_child_ours, full=True), (str, float)),
    ("baseline", _child_baseline, (str,)),
    ("writer", _child_writer, (str, float)),
])


# -- the benchmark --------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


@common.register(NAME, optional=True)
def sqlite_scan(ctx: common.BenchContext) -> common.BenchResult:
    """Our SQLite source vs the bare GROUP BY, both under a committing gateway writer."""
    n_sessions, n_traces = SIZES[ctx.size]
    runs = ctx.runs_or(3, 7, 1)
    store, built = ensure_store(ctx.cache_dir, n_sessions, n_traces)
    remove_writer_rows(store.path)  # leftovers of an interrupted run

    def ours() -> dict[str, Any]:
        result = common.run_child(MODULE, "ours", store.path, repr(store.now))
        if result["candidates"] != store.expected_candidates or result["sessions"] < store.sessions:
            raise common.BenchError(f"our scan read {result['sessions']} sessions and {result['candidates']} candidate "
                                    f"traces; the store holds {store.sessions} and {store.expected_candidates}")
        return result

    def bare() -> dict[str, Any]:
        return common.run_child(MODULE, "baseline", store.path)

    # no writer first: the first pair warms the OS page cache and is not counted
    bare(), ours()
    quiet_ours: list[float] = []
    quiet_bare: list[float] = []
    for _ in range(runs):
        quiet_bare.append(bare()["seconds"])
        quiet_ours.append(ours()["seconds"])

    try:
        with GatewayWriter(store.path) as writer:
            alone = (time.monotonic(), time.monotonic() + SOLO_SECONDS)
            time.sleep(SOLO_SECONDS)  # the writer undisturbed: its own commit rate and wait
            bare_runs, ours_runs = common.alternate(runs, bare, ours, pause=0.2)
            commits = writer.stop()
    finally:
        remove_writer_rows(store.path)

    over = sum(1 for r in ours_runs for t0, wait in commits
               if t0 <= r["end"] and t0 + wait >= r["start"] and wait * 1000 > WRITER_WAIT_TARGET_MS)
    ours_waits = [longest_wait(commits, r["start"], r["end"]) for r in ours_runs]
    bare_waits = [longest_wait(commits, r["start"], r["end"]) for r in bare_runs]
    worst_ours_wait = max(wait for wait, _ in ours_waits)
    worst_bare_wait = max(wait for wait, _ in bare_waits)
    solo_wait, solo_commits = longest_wait(commits, *alone)
    ours_rate = sum(n for _, n in ours_waits) / sum(r["seconds"] for r in ours_runs)
    ours_s, bare_s = common.median_seconds(ours_runs), common.median_seconds(bare_runs)
    peak = common.peak_of(ours_runs)
    all_waits = sorted(wait for _, wait in commits)
    size = f"{store.size_bytes / 1e9:.1f} GB" if store.size_bytes > 1e9 else f"{store.size_bytes / 1e6:.0f} MB"
    return common.ratio_result(
        NAME, "SQLite in-process scan under a committing gateway writer / bare GROUP BY", ours_s, bare_s, RATIO_TARGET,
        peak_rss=peak, checks=[common.Check.rss(peak, RSS_TARGET_MB),
                               common.Check("writer wait", worst_ours_wait * 1000, WRITER_WAIT_TARGET_MS, "ms")],
        extras={
            "store": f"{store.sessions:,} sessions/{store.traces:,} traces, {size}, "
                     + ("reused" if built is None else f"built in {built:.0f} s"),
            "runs": common.runs_figure(runs, ours_runs, bare_runs),
            "writer's longest commit wait": f"during ours {_ms(worst_ours_wait)}, during bare {_ms(worst_bare_wait)}",
            "writer alone": f"{solo_commits / SOLO_SECONDS:,.0f} commits/s, longest {_ms(solo_wait)}",
            "writer during ours": f"{ours_rate:,.0f} commits/s, {over} of "
                                  f"{sum(n for _, n in ours_waits)} over {WRITER_WAIT_TARGET_MS:.0f} ms",
            "commit wait median": _ms(common.median(all_waits)),
            "no writer": f"ours {common.median(quiet_ours):.2f} s, bare {common.median(quiet_bare):.2f} s, "
                         f"ratio {common.median(quiet_ours) / common.median(quiet_bare):.2f}x",
            "RSS after imports": f"{min(r['rss_imported'] for r in ours_runs) / 2**20:.0f} MB",
            "candidates": f"{store.expected_candidates:,}",
        },
    )


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
