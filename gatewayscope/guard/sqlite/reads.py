"""The reads other parts of gatewayscope make of the guard's tables: the scan's tombstones and orphan index,
the session deletes' tombstone checks."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from gatewayscope._sqlite.statements import StatementWatch, fetch_all
from gatewayscope.guard.common import GuardStats
from gatewayscope.guard.sqlite._common import _has_table, _index_state, _meta, _objects
from gatewayscope.guard.sqlite.schema import (
    INDEX_TABLE,
    META_TABLE,
    QUERY_BATCH,
    REUSES_TABLE,
    TOMBSTONE_PAGE,
    TOMBSTONES_TABLE,
    TOTALS_TABLE,
)
from gatewayscope.guard.sqlite.state import _unique, read_guard
from gatewayscope.orphan_rule import Tombstone
from gatewayscope.sources._batches import batches

# -- the reads of others ---------------------------------------------------------------------------------


def read_for_scan(conn: sqlite3.Connection, tables: set[str], *, busy_timeout: float, page_size: int,
                  watch: StatementWatch) -> tuple[GuardStats | None, dict[str, Tombstone]]:
    """The guard's figures and the tombstones of the sessions that still have rows, for the SQLite source's scan.

    The source's :class:`~gatewayscope.sources.rllm_sqlite.GuardReader`: ``tables`` are the file's tables
    (nothing is read when the guard's are not among them). The figures are read with SQLite's busy handler
    waiting up to ``busy_timeout`` seconds; the tombstoned sessions, only when there are tombstones, a key
    range of at most ``page_size`` (and ``TOMBSTONE_PAGE``) ids at a time, by fine polling, each statement
    watched by ``watch``. The connection's busy handler is off again when this returns.
    """
    if TOMBSTONES_TABLE not in tables:
        return None, {}
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    try:
        guard = read_guard(conn)
    finally:
        conn.execute("PRAGMA busy_timeout = 0")
    if guard is None or not guard.tombstones:
        return guard, {}
    return guard, _tombstoned_with_rows(conn, min(page_size, TOMBSTONE_PAGE), busy_timeout=busy_timeout,
                                        watch=watch, reuses=REUSES_TABLE in tables)


def _fence(value: Any) -> float | None:
    """A tombstone's ``deleted_at`` as its fence (None when it is not a number: such a fence drops nothing)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _tombstoned_with_rows(conn: sqlite3.Connection, page_size: int, *, busy_timeout: float,
                          watch: StatementWatch, reuses: bool) -> dict[str, Tombstone]:
    """The tombstones of ids that still have rows in the store, read a key range at a time."""
    found: dict[str, Tombstone] = {}
    last = ""
    reused = (f"EXISTS (SELECT 1 FROM {REUSES_TABLE} AS ru WHERE ru.session_id = tb.session_id)" if reuses
              else "0")
    while True:  # bounded: every turn moves ``last`` forward through the tombstone table
        page, _ = fetch_all(
            conn, f"SELECT session_id FROM {TOMBSTONES_TABLE} WHERE session_id > ? ORDER BY session_id LIMIT ?",
            (last, page_size), busy_timeout=busy_timeout, watch=watch,
        )
        if not page:
            return found
        upper = page[-1][0]
        present, _ = fetch_all(
            conn, f"SELECT session_id, deleted_at, {reused} FROM {TOMBSTONES_TABLE} AS tb "
            "WHERE session_id > ? AND session_id <= ? "
            "AND EXISTS (SELECT 1 FROM trace_sessions AS ts WHERE ts.session_id = tb.session_id)",
            (last, upper), busy_timeout=busy_timeout, watch=watch,
        )
        for sid, deleted_at, was_reused in present:
            fence = _fence(deleted_at)
            if fence is not None:
                found[str(sid)] = Tombstone(fence=fence, reused=bool(was_reused))
        if len(page) < page_size:
            return found
        last = upper


def has_tombstone_table(conn: sqlite3.Connection) -> bool:
    """Whether the guard's tombstone table is in the file (one read; it may wait in the busy handler)."""
    return _has_table(conn, TOMBSTONES_TABLE)


def is_tombstoned(conn: sqlite3.Connection, session_id: str) -> bool:
    """Whether ``session_id`` carries a tombstone (one read; the tombstone table must exist)."""
    row = conn.execute(f"SELECT 1 FROM {TOMBSTONES_TABLE} WHERE session_id = ?", (session_id,)).fetchone()
    return row is not None


def tombstone_of(conn: sqlite3.Connection, session_id: str) -> Tombstone | None:
    """``session_id``'s tombstone (its fence, and whether the id was written again after it), or None (two reads
    by key; the tombstone table must exist). A tombstone whose time is not a number fences nothing: None."""
    row = conn.execute(f"SELECT deleted_at FROM {TOMBSTONES_TABLE} WHERE session_id = ?", (session_id,)).fetchone()
    fence = _fence(row[0]) if row is not None else None
    if fence is None:
        return None
    reused = _has_table(conn, REUSES_TABLE) and conn.execute(
        f"SELECT 1 FROM {REUSES_TABLE} WHERE session_id = ?", (session_id,)).fetchone() is not None
    return Tombstone(fence=fence, reused=reused)


#: candidate sessions per read of the orphan index (each its own short statement)
INDEX_PAGE = 4000

_INDEX_COLUMNS = "session_id, trace_count, first_trace_at, last_trace_at"
#: one-trace sessions idle since ``?``, in (last_trace_at, session_id) order, over the partial index
_CANDIDATES_SQL = (f"SELECT {_INDEX_COLUMNS} FROM {INDEX_TABLE} INDEXED BY gatewayscope_sessions_single "
                   "WHERE trace_count = 1 AND last_trace_at <= ? {after} ORDER BY last_trace_at, session_id LIMIT ?")


@dataclass
class IndexRead:
    """What the orphan index gives a scan: the store's totals, and the rows of the sessions the scan needs."""

    sessions: int  # sessions in the store
    traces: int  # their trace counts summed (junction rows)
    #: (session_id, trace_count, first_trace_at, last_trace_at): the one-trace sessions idle since the cut-off,
    #: then those of the ``also`` ids that have rows, each once
    rows: list[tuple[Any, ...]]


def read_index_for_scan(conn: sqlite3.Connection, tables: set[str], *, idle_before: float, also: list[str],
                        busy_timeout: float, page_size: int, watch: StatementWatch) -> IndexRead | None:
    """The orphan index's totals and candidate rows, or None when the file has no ready index (the scan then
    reads every session: the index is absent, damaged, or its fill at install has not completed).

    The source's :class:`~gatewayscope.sources.rllm_sqlite.IndexReader`. The candidates are the sessions the
    full scan's rule picks from its pages (one trace, last trace at or before ``idle_before``), read over the
    partial index of one-trace sessions a key range of at most ``page_size`` (and ``INDEX_PAGE``) at a time, so
    the read costs what the candidates are, not the store; the ``also`` ids (the tombstoned ones) are looked up
    by key. The state and totals are read with SQLite's busy handler waiting up to ``busy_timeout`` seconds,
    the rows by fine polling, each statement watched by ``watch``.
    """
    if INDEX_TABLE not in tables:
        return None
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    try:
        present = _objects(conn)
        meta = _meta(conn) if META_TABLE in present else {}
        if _index_state(conn, present, meta) != "ready":
            return None
        totals = conn.execute(f"SELECT sessions, traces FROM {TOTALS_TABLE} WHERE id = 1").fetchone()
    finally:
        conn.execute("PRAGMA busy_timeout = 0")
    if totals is None:
        return None
    page = max(1, min(page_size, INDEX_PAGE))
    rows: list[tuple[Any, ...]] = []
    after: tuple[Any, ...] = ()
    while True:  # bounded: every turn moves the (last_trace_at, session_id) cursor forward
        sql = _CANDIDATES_SQL.format(after="AND (last_trace_at, session_id) > (?, ?)" if after else "")
        found, _ = fetch_all(conn, sql, (idle_before, *after, page), busy_timeout=busy_timeout, watch=watch)
        rows.extend(found)
        if len(found) < page:
            break
        after = (found[-1][3], found[-1][0])
    seen = {row[0] for row in rows}
    wanted = [sid for sid in _unique(also) if sid not in seen]
    for batch in batches(wanted, QUERY_BATCH):
        found, _ = fetch_all(conn, f"SELECT {_INDEX_COLUMNS} FROM {INDEX_TABLE} WHERE session_id IN "
                                   f"({','.join('?' * len(batch))})", batch, busy_timeout=busy_timeout, watch=watch)
        rows.extend(found)
    return IndexRead(sessions=int(totals[0]), traces=int(totals[1]), rows=rows)
