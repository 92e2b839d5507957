"""Big 0.1.0-schema SQLite trace stores for the scaling rows, built in SQL and cached between runs.

A store of ``sessions`` sessions: the first ``orphans`` are day-old one-trace sessions (the straggler's
shape: one trace with a long prompt), every other session holds two short traces spread over the last
14 days, so exactly the orphans are idle one-trace sessions. The schema is the gateway's own (its
``SqliteTraceStore`` creates the file); the rows come from one recursive CTE per table in one
transaction, with the secondary indexes dropped meanwhile and created again from the gateway's DDL
text. Trace ids grow with the row order (each insert appends to the primary-key b-tree); session ids
look like rLLM's ``{uuid}:{rollout}`` and are spread over the key space like real uuids.

A guarded store is a copy of the plain one with ``gatewayscope guard install`` (its function) run on
it. Its cache key holds a digest of the SQLite guard's source (GUARD_SOURCES), so a change to it rebuilds it.

Cached under the cache folder, keyed by sessions, orphans and the generator version; a half-built file
is never used (built under a temporary name, renamed when done).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import REPO_ROOT, BenchError

#: bump when the generated store changes shape, so cached stores are rebuilt
GENERATOR_VERSION = 1
DAY = 86400.0
SPAN = 14 * DAY
#: the orphans' age: a day, far past the default idle threshold (2 h)
ORPHAN_AGE = DAY
#: how long a run waits for another process building the same store
LOCK_WAIT_SECONDS = 3 * 3600.0
#: bytes of disk a trace of this store takes, data, junction row and indexes (for the free-space check)
BYTES_PER_TRACE = 1000

#: each session's id: a uuid-shaped hash of k, the full k (so it is unique) and a rollout index
_SID = ("printf('%08x-%04x-4%03x-8%03x-%012x:%d', (k * 2654435761) % 4294967296, (k * 40503) % 65536, "
        "(k * 977) % 4096, (k * 631) % 4096, k, k % 8)")
#: trace ids sort in insertion order (n is the trace's running number)
_TID = "printf('%012x-%04x-4%03x-9%03x-%012x', n, (n * 40503) % 65536, (n * 977) % 4096, (n * 631) % 4096, n)"
#: a straggler's prompt: 400 token ids
_LONG_PROMPT = json.dumps(list(range(1000, 1400)))
_SHORT_PROMPT = json.dumps(list(range(1000, 1008)))


@dataclass(frozen=True)
class SlimStore:
    """A built store and what the generator put in it."""

    path: str
    sessions: int
    orphans: int
    traces: int
    #: the "now" the store was generated against
    now: float
    size_bytes: int
    #: seconds the build took (0 when it was reused from the cache)
    built_seconds: float = 0.0
    guarded: bool = False
    generator: int = GENERATOR_VERSION

    def describe(self) -> str:
        size = f"{self.size_bytes / 1e9:.1f} GB" if self.size_bytes > 1e9 else f"{self.size_bytes / 1e6:.0f} MB"
        how = "reused" if not self.built_seconds else f"built in {self.built_seconds:.0f} s"
        return (f"{self.sessions:,} sessions/{self.traces:,} traces ({self.orphans:,} orphans), {size}, "
                f"{'guarded, ' if self.guarded else ''}{how}")


#: the source a guarded store's contents follow from: the SQLite guard (its tables, triggers and index fill) and
#: the statements it pages the fill with; the memory launcher's code does not touch the file
GUARD_SOURCES = (*sorted(path.relative_to(REPO_ROOT).as_posix()
                         for path in (REPO_ROOT / "gatewayscope" / "guard" / "sqlite").glob("*.py")),
                 "gatewayscope/guard/common.py", "gatewayscope/_sqlite/schema.py")


def guard_digest() -> str:
    """A digest of the SQLite guard's source: a guarded store built by other guard code is rebuilt."""
    digest = hashlib.sha256()
    for name in GUARD_SOURCES:
        digest.update((REPO_ROOT / name).read_bytes())
    return digest.hexdigest()[:12]


def _insert_sql(sessions: int, orphans: int, now: float) -> tuple[str, str]:
    """The two INSERT ... SELECT statements (traces, then the junction rows) of the whole store."""
    multi_step = (SPAN - 3600.0) / max(1, sessions - orphans)
    # k: the session; j: its trace (orphans have j = 0 only); n: the trace's running number
    rows = f"""
        WITH RECURSIVE seq(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM seq WHERE k < {sessions - 1}),
        pair(j) AS (SELECT 0 UNION ALL SELECT 1),
        t AS (SELECT k, j,
                     CASE WHEN k < {orphans} THEN k ELSE {orphans} + 2 * (k - {orphans}) + j END AS n,
                     CASE WHEN k < {orphans} THEN {now - ORPHAN_AGE!r} - k * 0.5
                          ELSE {now - SPAN!r} + (k - {orphans}) * {multi_step!r} + j * 30.0 END AS at
              FROM seq, pair WHERE j = 0 OR k >= {orphans})
    """
    data = (f"'{{\"trace_id\": \"' || {_TID} || '\", \"session_id\": \"' || {_SID} || "
            "'\", \"model\": \"Qwen/Qwen3-8B\", \"messages\": [{\"role\": \"user\", \"content\": \"solve it\"}], "
            "\"prompt_token_ids\": ' || CASE WHEN k < " + str(orphans) + f" THEN '{_LONG_PROMPT}' "
            f"ELSE '{_SHORT_PROMPT}' END || "
            "', \"response_message\": {\"role\": \"assistant\", \"content\": \"ok\"}, "
            "\"completion_token_ids\": [1, 2, 3], \"finish_reason\": \"stop\", \"token_counts\": "
            "{\"prompt\": ' || CASE WHEN k < " + str(orphans) + " THEN 400 ELSE 8 END || "
            "', \"completion\": 3}, \"timestamp\": ' || at || ', \"metadata\": {}}'")
    # no ORDER BY: the nested loop (seq outside, pair inside) already yields n in order, and sorting tens of
    # millions of rows would hold them all in memory
    traces = f"{rows} INSERT INTO traces (trace_id, data, created_at) SELECT {_TID}, {data}, at FROM t"
    links = (f"{rows} INSERT INTO trace_sessions (trace_id, session_id, created_at) "
             f"SELECT {_TID}, {_SID}, at FROM t")
    return traces, links


def build(path: Path, sessions: int, orphans: int, now: float) -> int:
    """Write the store at ``path``; return how many traces it holds."""
    from bench.sqlite_scan import gateway_schema

    gateway_schema(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "cache_size=-262144", "locking_mode=EXCLUSIVE"):
            conn.execute(f"PRAGMA {pragma}")
        indexes = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
                               "ORDER BY name").fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        traces_sql, links_sql = _insert_sql(sessions, orphans, now)
        conn.execute("BEGIN")
        conn.execute(traces_sql)
        conn.execute(links_sql)
        conn.execute("COMMIT")
        for _, sql in indexes:
            conn.execute(sql)
        count = int(conn.execute("SELECT COUNT(*) FROM traces").fetchone()[0])
        conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()
    fd = os.open(path, os.O_RDONLY)  # flush now: a background write-back would slow the runs measured next
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return count


def _free_space(folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < need:
        raise BenchError(f"{folder} has {free / 1e9:.1f} GB free; the store needs about {need / 1e9:.1f} GB. "
                         "Free some space, pass --cache-dir elsewhere or a smaller --scale.")


def _cached(db: Path, meta: Path) -> SlimStore | None:
    if not (db.exists() and meta.exists()):
        return None
    try:
        fixture = SlimStore(**{**json.loads(meta.read_text()), "built_seconds": 0.0, "path": str(db)})
    except (ValueError, TypeError):
        return None
    return fixture if fixture.generator == GENERATOR_VERSION else None


def _publish(building: Path, db: Path, meta: Path, fixture: SlimStore) -> None:
    os.replace(building, db)
    tmp = meta.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(fixture), indent=2))
    os.replace(tmp, meta)


@contextlib.contextmanager
def _build_lock(cache_dir: Path, stem: str) -> Iterator[None]:
    """One builder per store: a second run waits for the first one's build instead of starting its own."""
    with open(cache_dir / f"{stem}.lock", "w") as handle:
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BenchError(f"another process has been building {stem} for over "
                                     f"{LOCK_WAIT_SECONDS / 3600:.0f} h") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_store(cache_dir: Path, sessions: int, orphans: int, *, guarded: bool = False) -> SlimStore:
    """The cached store of these parameters, built when missing; a ``guarded`` one is a guarded copy of the
    plain one (also cached), so a change to the guard costs a copy and an install, not a build."""
    orphans = min(orphans, max(1, sessions // 2))
    cache_dir.mkdir(parents=True, exist_ok=True)
    stem = f"slim-{sessions}s-{orphans}o-g{GENERATOR_VERSION}"
    if guarded:
        stem += f"-guard{guard_digest()}"
    with _build_lock(cache_dir, stem):
        return _ensure(cache_dir, stem, sessions, orphans, guarded=guarded)


def _ensure(cache_dir: Path, stem: str, sessions: int, orphans: int, *, guarded: bool) -> SlimStore:
    db, meta = cache_dir / f"{stem}.db", cache_dir / f"{stem}.json"
    found = _cached(db, meta)
    if found is not None:
        return found
    prefix = stem.split("-guard")[0] + "-guard" if guarded else None
    for stale in cache_dir.glob(f"{prefix}*") if prefix else ():  # a guarded copy built by older guard code
        if stale.suffix in (".db", ".json"):
            stale.unlink(missing_ok=True)
    building = cache_dir / f"{stem}.{os.getpid()}.building"
    started = time.monotonic()
    try:
        if guarded:
            from gatewayscope.guard.sqlite import install

            plain = ensure_store(cache_dir, sessions, orphans)
            _free_space(cache_dir, plain.size_bytes * 6 // 5)  # the copy, and room for what the guard adds
            shutil.copyfile(plain.path, building)
            install(building)
            fixture = SlimStore(**{**asdict(plain), "path": str(db), "guarded": True,
                                   "size_bytes": building.stat().st_size})
        else:
            _free_space(cache_dir, 2 * sessions * BYTES_PER_TRACE)
            now = time.time()
            traces = build(building, sessions, orphans, now)
            fixture = SlimStore(path=str(db), sessions=sessions, orphans=orphans, traces=traces, now=now,
                                size_bytes=building.stat().st_size)
        _publish(building, db, meta, fixture)
    finally:
        for leftover in (building, Path(f"{building}-journal")):
            leftover.unlink(missing_ok=True)
    return SlimStore(**{**asdict(fixture), "built_seconds": time.monotonic() - started})
