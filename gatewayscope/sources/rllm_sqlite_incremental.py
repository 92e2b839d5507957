"""Read an unguarded rLLM SQLite trace store again, paying only for the rows added since the last read.

The gateway only ever appends to ``trace_sessions`` and ``traces`` (a new row takes the largest rowid plus one)
and deletes from them; it never updates a row. So the per-session figures of the last read (trace count, first
and last trace time) stay right for every row up to the largest ``trace_sessions`` rowid that read saw (the
watermark), as long as none of those rows went away or changed; the rows above the watermark are the ones added
since, and they are merged into the figures. :class:`IncrementalStore` keeps one file's last read and makes each
next read either *incremental* or *full*. It reads everything again (a full read, as the scan does) when it
cannot be sure the rows up to the watermark are the ones it counted:

* ``first``: no earlier read, or the earlier read failed;
* ``interval``: the last full read is ``full_read_interval_seconds`` old (a bound on anything the checks miss);
* ``file``: the file was replaced (another device or inode) or shrank;
* ``schema``: SQLite's schema version or the set of tables changed (a VACUUM, which renumbers rowids, bumps it;
  so does a guard install or uninstall, and any CREATE or DROP);
* ``rows``: the row at the watermark is gone or is another row (SQLite hands the largest rowid plus one to the
  next insert, so a deleted top row's rowid comes back with other content), or the count of the rows up to the
  watermark differs from the last read's (a delete anywhere), or so does their digest (``_DIGEST``, a sum over
  the rows' times: once the top rows went, rows written later take their rowids, so the same count can hold
  other rows). The count is read in rowid ranges of at most about
  ``STATEMENT_SECONDS`` of lock each, like every other statement on the gateway's file. A row changed in place
  (an UPDATE, which the gateway never does) is seen only by the next full read, ``interval`` at the latest.

A store with the tombstone guard installed (any ``gatewayscope_*`` table) is not read here: the caller reads it
as the scan does (the guard's figures, and its orphan index when ready), and the state is dropped.

The candidates' traces (one-trace idle sessions) are kept from one read to the next and read again only for a
session that is new among the candidates, got rows since, or whose trace row was replaced (a ``traces`` row
above that table's watermark with its trace id) or deleted.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gatewayscope._sqlite.locking import WriterProbe, one_reader_per_file
from gatewayscope._sqlite.reading import reading_store
from gatewayscope._sqlite.statements import STATEMENT_SECONDS, StatementWatch, fetch_all, fetch_for
from gatewayscope.config import Policy, Target
from gatewayscope.orphan_rule import candidate_expr
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    SESSIONS_SCHEMA,
    TraceStoreData,
    empty_frame,
    frame_from_rows,
)
from gatewayscope.sources.rllm_sqlite import (
    SESSION_PAGE,
    TRACE_BATCH,
    candidate_trace_row,
    current_weight_version,
    iter_candidate_traces,
    sessions_frame,
)

#: how a read of a SQLite store went: built on the last read, everything read, or the scan's read of a store
#: the guard is installed in
MODES = ("incremental", "full", "guarded")
#: why a read was full (see the module's docstring)
FULL_REASONS = ("first", "interval", "file", "schema", "rows")
#: the longest an incremental store goes without a full read
DEFAULT_FULL_READ_INTERVAL_SECONDS = 600.0
#: tables whose name starts so belong to gatewayscope (the tombstone guard's)
OWN_TABLE_PREFIX = "gatewayscope_"

#: rowids per counting statement at first; then sized to take about half of STATEMENT_SECONDS
_CHECK_SPAN = 32_768
_CHECK_SPAN_BOUNDS = (1_024, 4_194_304)

#: one row's share of the digest of the rows up to the watermark: its time in whole milliseconds, modulo a prime
#: (exact integer sums, whatever the ranges they are summed in). Rows deleted and others written in their rowids
#: since the last read (possible once the top rows went) change it unless their times agree to the millisecond
#: modulo the prime; it costs one multiplication and one remainder a row.
_DIGEST = "CAST(created_at * 1000 AS INTEGER) % 1000003"

#: a full read's page: the scan's session page (same index, same order) of the rows up to the watermark
_PAGE_SQL = f"""
    SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at), IFNULL(SUM({_DIGEST}), 0)
    FROM trace_sessions
    WHERE session_id > ? AND rowid <= ?
    GROUP BY session_id
    ORDER BY session_id
    LIMIT ?
"""
#: the first page starts AT the smallest key: an empty session id is a session too
_FIRST_PAGE_SQL = _PAGE_SQL.replace("session_id > ?", "session_id >= ?")
_TOP_SQL = "SELECT rowid, trace_id, session_id, created_at FROM trace_sessions ORDER BY rowid DESC LIMIT 1"
_ROW_SQL = "SELECT trace_id, session_id, created_at FROM trace_sessions WHERE rowid = ?"
_CHECK_SQL = f"SELECT COUNT(*), IFNULL(SUM({_DIGEST}), 0) FROM trace_sessions WHERE rowid > ? AND rowid <= ?"
_LINKS_AFTER_SQL = (f"SELECT rowid, trace_id, session_id, created_at, {_DIGEST} FROM trace_sessions WHERE rowid > ? "
                    "ORDER BY rowid LIMIT ?")
_TRACES_AFTER_SQL = "SELECT rowid, trace_id FROM traces WHERE rowid > ? ORDER BY rowid LIMIT ?"
_TRACES_TOP_SQL = "SELECT MAX(rowid) FROM traces"


@dataclass(frozen=True)
class Watermark:
    """The ``trace_sessions`` rows one read counted: every row up to ``rowid``."""

    rowid: int  # 0: the table was empty
    #: (trace_id, session_id, created_at) of the row at ``rowid``
    identity: tuple[Any, ...] | None
    count: int
    #: the sum of the rows' ``_DIGEST``
    digest: int


@dataclass
class StoreState:
    """What the last read of one file left for the next one."""

    file: tuple[int, int]  # (st_dev, st_ino)
    size: int
    schema_version: int
    tables: frozenset[str]
    links: Watermark
    #: the largest ``traces`` rowid before the candidates' traces were read
    traces_rowid: int
    sessions: pl.DataFrame
    #: candidate session id -> its trace rows (CANDIDATE_TRACES_SCHEMA tuples)
    candidates: dict[str, list[tuple[Any, ...]]]
    #: monotonic time the last full read started
    full_at: float


@dataclass
class _Read:
    """One read in progress on an open connection."""

    conn: sqlite3.Connection
    path: str
    wait: float
    probe: WriterProbe | None
    watch: StatementWatch

    def all(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return fetch_all(self.conn, sql, params, busy_timeout=self.wait, watch=self.watch)[0]

    def after(self, sql: str, start: int) -> Iterator[list[tuple[Any, ...]]]:
        """Rows of ``sql`` (rowid first, in rowid order, ``LIMIT ?``) above ``start``, a statement at a time."""
        last = start
        while True:  # bounded: each turn moves ``last`` up through the table's finitely many rowids
            rows, ended = fetch_for(self.conn, sql, (last, SESSION_PAGE), seconds=STATEMENT_SECONDS,
                                    busy_timeout=self.wait, probe=self.probe, watch=self.watch)
            if rows:
                yield rows
                last, sql = rows[-1][0], _PAGE_SQL
            if not rows or (ended and len(rows) < SESSION_PAGE):
                return


@dataclass
class IncrementalStore:
    """One SQLite target's last read, and the reads that build on it. One read at a time (the exporter's
    per-target single flight); :attr:`reads` and :attr:`full_reasons` count them by mode and reason."""

    full_read_interval_seconds: float = DEFAULT_FULL_READ_INTERVAL_SECONDS
    clock: Callable[[], float] = time.monotonic
    state: StoreState | None = None
    reads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODES, 0))
    full_reasons: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FULL_REASONS, 0))
    #: the mode and (for a full read) the reason of the last read
    last: tuple[str, str | None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{"modes": reads by mode, "reasons": full reads by reason}`` (a copy)."""
        with self._lock:
            return {"modes": dict(self.reads), "reasons": dict(self.full_reasons)}

    def read(self, target: Target, policy: Policy, *, now: float) -> TraceStoreData | None:
        """Read the store at ``target.path``: incrementally when the last read allows it, else in full.

        None when the tombstone guard is installed in the store: the caller reads it as the scan does (the
        guard's figures, and its orphan index when ready), and this read counts as ``guarded``. Raises
        StoreError as :func:`~gatewayscope.sources.rllm_sqlite.read_trace_store_sqlite` does; the next read after
        a failure is full.
        """
        assert target.path, "a SQLite trace-store target needs a path"
        try:
            with one_reader_per_file(target.path):
                data = self._read(target.path, target.timeout_seconds, policy, now=now)
        except BaseException:
            self.state = None
            raise
        if data is None:
            self._count("guarded", None)
        return data

    def _count(self, mode: str, reason: str | None) -> None:
        with self._lock:
            self.reads[mode] += 1
            if reason is not None:
                self.full_reasons[reason] += 1
            self.last = (mode, reason)

    def _full_reason_before_open(self, path: str) -> tuple[str | None, os.stat_result]:
        info = os.stat(path)
        state = self.state
        if state is None:
            return "first", info
        if self.clock() - state.full_at >= self.full_read_interval_seconds:
            return "interval", info
        if (info.st_dev, info.st_ino) != state.file or info.st_size < state.size:
            return "file", info
        return None, info

    def _read(self, path: str, wait: float, policy: Policy, *, now: float) -> TraceStoreData | None:
        try:
            reason, info = self._full_reason_before_open(path)
        except OSError:
            reason, info = "first", None  # open_store says what is wrong with the path
        started = self.clock()
        with reading_store(path, wait) as read:  # every statement polls for the lock
            tables = frozenset(read.tables)
            if any(name.startswith(OWN_TABLE_PREFIX) for name in tables):
                self.state = None
                return None
            run = _Read(read.conn, path, wait, read.probe, read.watch)
            schema_version = int(run.all("PRAGMA schema_version")[0][0])
            state = self.state
            if reason is None and state is not None and (schema_version != state.schema_version
                                                         or tables != state.tables):
                reason = "schema"
            data: TraceStoreData | None = None
            if reason is None and state is not None and info is not None:
                data = self._incremental(run, state, policy, now=now)
                if data is None:
                    reason = "rows"
            if data is None:
                assert info is not None or reason == "first"
                data = self._full(run, policy, now=now, started=started, schema_version=schema_version,
                                  tables=tables, info=info)
                self._count("full", reason or "rows")
            else:
                self._count("incremental", None)
            return data

    # -- a full read ---------------------------------------------------------------------------------

    def _full(self, run: _Read, policy: Policy, *, now: float, started: float, schema_version: int,
              tables: frozenset[str], info: os.stat_result | None) -> TraceStoreData:
        top = run.all(_TOP_SQL)
        links_rowid = int(top[0][0]) if top else 0
        identity = tuple(top[0][1:]) if top else None
        pages: list[pl.DataFrame] = []
        count = digest = 0
        last, sql = "", _FIRST_PAGE_SQL
        while True:  # bounded: each page moves ``last`` forward through the finitely many session ids
            rows, ended = fetch_for(run.conn, sql, (last, links_rowid, SESSION_PAGE),
                                    seconds=STATEMENT_SECONDS, busy_timeout=run.wait, probe=run.probe,
                                    watch=run.watch)
            if rows:  # every row is a whole session (see iter_session_pages), its figures read as the scan's are
                pages.append(sessions_frame(rows, run.path))
                count += sum(int(row[1]) for row in rows)
                digest += sum(int(row[4]) for row in rows)
                last, sql = rows[-1][0], _PAGE_SQL
            if not rows or (ended and len(rows) < SESSION_PAGE):
                break
        sessions = pl.concat(pages, rechunk=True) if pages else empty_frame(SESSIONS_SCHEMA)
        del pages
        traces_rowid = _traces_top(run)
        candidates = _candidate_ids(sessions, policy, now=now)
        kept = _read_candidates(run, candidates)
        if info is None:
            info = os.stat(run.path)
        self.state = StoreState(
            file=(info.st_dev, info.st_ino), size=info.st_size, schema_version=schema_version, tables=tables,
            links=Watermark(links_rowid, identity, count, digest), traces_rowid=traces_rowid,
            sessions=sessions, candidates=kept, full_at=started,
        )
        return _data(run, sessions, candidates, kept)

    # -- an incremental read -------------------------------------------------------------------------

    def _incremental(self, run: _Read, state: StoreState, policy: Policy, *, now: float) -> TraceStoreData | None:
        """The read built on ``state``, or None when the rows up to its watermark are not the ones it counted."""
        links = state.links
        if links.rowid and not _same_rows(run, links):
            return None
        delta: list[tuple[Any, ...]] = []
        for rows in run.after(_LINKS_AFTER_SQL, links.rowid):
            delta += rows
        if any(not isinstance(sid, str) or not isinstance(created, float) for _, _, sid, created, _ in delta):
            return None  # a row the gateway would not write: leave it to the full read's own figures
        traces_rowid = _traces_top(run)
        replaced: set[str] = set()
        if state.candidates:
            for rows in run.after(_TRACES_AFTER_SQL, state.traces_rowid):
                replaced.update(str(row[1]) for row in rows)
        sessions = state.sessions
        touched: set[str] = set()
        if delta:
            sessions = merge_sessions(sessions, [(sid, created) for _, _, sid, created, _ in delta])
            touched = {row[2] for row in delta}
        candidates = _candidate_ids(sessions, policy, now=now)
        kept: dict[str, list[tuple[Any, ...]]] = {}
        for sid in candidates:
            cached = state.candidates.get(sid)
            if cached and sid not in touched and not any(row[1] in replaced for row in cached):
                kept[sid] = cached
        present = _existing_trace_ids(run, [row[1] for rows in kept.values() for row in rows])
        kept = {sid: rows for sid, rows in kept.items() if all(row[1] in present for row in rows)}
        kept.update(_read_candidates(run, [sid for sid in candidates if sid not in kept]))
        new_links = (Watermark(int(delta[-1][0]), tuple(delta[-1][1:4]), links.count + len(delta),
                               links.digest + sum(int(row[4]) for row in delta)) if delta
                     else links)
        self.state = StoreState(
            file=state.file, size=max(state.size, _size(run.path)), schema_version=state.schema_version,
            tables=state.tables, links=new_links, traces_rowid=traces_rowid, sessions=sessions, candidates=kept,
            full_at=state.full_at,
        )
        return _data(run, sessions, candidates, kept)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _traces_top(run: _Read) -> int:
    rows = run.all(_TRACES_TOP_SQL)
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def _same_rows(run: _Read, links: Watermark) -> bool:
    """Whether the rows up to ``links.rowid`` are still the ones counted: the row at the watermark (looked at
    before and after the count, so a top row deleted and written again meanwhile is seen), their count and their
    digest (rows deleted and others written in their rowids)."""
    if _row_at(run, links.rowid) != links.identity:
        return False
    return _count_upto(run, links.rowid) == (links.count, links.digest) and _row_at(run, links.rowid) == links.identity


def _row_at(run: _Read, rowid: int) -> tuple[Any, ...] | None:
    rows = run.all(_ROW_SQL, (rowid,))
    return tuple(rows[0]) if rows else None


def _count_upto(run: _Read, upto: int) -> tuple[int, int]:
    """COUNT and digest (``_DIGEST``) of the ``trace_sessions`` rows with rowid <= ``upto``, in rowid ranges each
    sized to hold the lock about half of STATEMENT_SECONDS."""
    count = digest = 0
    low, span = 0, _CHECK_SPAN
    while low < upto:  # bounded: every turn moves ``low`` up by at least the smallest span
        high = min(upto, low + span)
        rows, held = fetch_all(run.conn, _CHECK_SQL, (low, high), busy_timeout=run.wait, watch=run.watch)
        count += int(rows[0][0])
        digest += int(rows[0][1])
        low = high
        scale = (STATEMENT_SECONDS / 2) / held if held > 0 else 2.0
        span = max(_CHECK_SPAN_BOUNDS[0], min(_CHECK_SPAN_BOUNDS[1], int(span * min(2.0, scale))))
    return count, digest


def merge_sessions(sessions: pl.DataFrame, rows: Iterable[tuple[str, float]]) -> pl.DataFrame:
    """``sessions`` (SESSIONS_SCHEMA, in session id order) with the ``(session_id, created_at)`` rows added:
    counts summed, first and last trace times widened, new sessions inserted in order.

    >>> base = pl.DataFrame({"session_id": ["a", "c"], "trace_count": [1, 2], "created_at": [1.0, 2.0],
    ...                      "last_trace_at": [1.0, 3.0]}, schema=SESSIONS_SCHEMA)
    >>> merge_sessions(base, [("b", 5.0), ("c", 4.0), ("c", 0.5)]).rows()
    [('a', 1, 1.0, 1.0), ('b', 1, 5.0, 5.0), ('c', 4, 0.5, 4.0)]
    """
    added = pl.DataFrame(list(rows), schema={"session_id": pl.String, "t": pl.Float64}, orient="row")
    if not added.height:
        return sessions
    delta = added.group_by("session_id").agg(
        pl.len().cast(pl.Int64).alias("trace_count"), pl.col("t").min().alias("created_at"),
        pl.col("t").max().alias("last_trace_at"),
    )
    hit = pl.col("session_id").is_in(delta["session_id"].implode())
    combined = (
        pl.concat([sessions.filter(hit), delta.select(list(SESSIONS_SCHEMA))])
        .group_by("session_id")
        .agg(pl.col("trace_count").sum(), pl.col("created_at").min(), pl.col("last_trace_at").max())
        .cast(SESSIONS_SCHEMA)  # type: ignore[arg-type]
        .sort("session_id")
    )
    return sessions.filter(~hit).merge_sorted(combined, key="session_id").select(list(SESSIONS_SCHEMA))


def _candidate_ids(sessions: pl.DataFrame, policy: Policy, *, now: float) -> list[str]:
    """The sessions the scan reads the traces of: one trace, idle past the policy's threshold (no tombstones in
    an unguarded store)."""
    idle_before = now - policy.orphan_idle_seconds
    return list(sessions.filter(candidate_expr(pl.col("trace_count"), pl.col("last_trace_at"), idle_before,
                                               pl.lit(False)))["session_id"].to_list())


def _read_candidates(run: _Read, session_ids: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Session id -> its trace rows (CANDIDATE_TRACES_SCHEMA tuples), as the scan's read makes them."""
    out: dict[str, list[tuple[Any, ...]]] = {sid: [] for sid in session_ids}
    for rows in iter_candidate_traces(run.conn, session_ids, seconds=STATEMENT_SECONDS, busy_timeout=run.wait,
                                       probe=run.probe, watch=run.watch):
        for raw in rows:
            out[raw[0]].append(candidate_trace_row(raw))
    return out


def _existing_trace_ids(run: _Read, trace_ids: list[str]) -> set[str]:
    """Which of ``trace_ids`` the ``traces`` table still holds (its primary-key index only)."""
    found: set[str] = set()
    for start in range(0, len(trace_ids), TRACE_BATCH):
        batch = trace_ids[start:start + TRACE_BATCH]
        rows = run.all(f"SELECT trace_id FROM traces WHERE trace_id IN ({','.join('?' * len(batch))})",
                       tuple(batch))
        found.update(row[0] for row in rows)
    return found


def _data(run: _Read, sessions: pl.DataFrame, candidates: list[str],
          traces: dict[str, list[tuple[Any, ...]]]) -> TraceStoreData:
    weight = current_weight_version(run.conn, busy_timeout=run.wait, watch=run.watch)
    rows = [row for sid in candidates for row in traces.get(sid, ())]
    return TraceStoreData(
        sessions=sessions,
        candidate_traces=frame_from_rows(rows, CANDIDATE_TRACES_SCHEMA),
        tombstoned_ids=[],
        current_weight_version=weight,
        guard=None,
        capabilities={"weight_version": weight is not None, "batch_delete": False, "guard": False},
        access="sqlite",
    )
