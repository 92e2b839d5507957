"""Read an rLLM SQLite trace store file, strictly read-only, without holding up the gateway.

The 0.1.0 gateway runs SQLite in DELETE journal mode, where a reader's open transaction blocks
the writer's commit. So every read here is its own short statement in autocommit mode, paged by
key (``session_id``) over the gateway's own ``idx_ts_session_time`` index: the gateway's commit
waits at most for one page, never for the whole scan. It works on WAL files the same way.
The file is opened with ``mode=ro``: gatewayscope never writes to the store from here.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from gatewayscope.config import Policy, Target
from gatewayscope.errors import StoreError
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    SESSIONS_SCHEMA,
    GuardStats,
    TraceStoreData,
    empty_frame,
    frame_from_rows,
)

#: sessions per page of the listing: small enough that one page is a few milliseconds of lock
SESSION_PAGE = 4000
#: session ids per candidate-trace read
TRACE_BATCH = 400
TOMBSTONE_TABLE = "gatewayscope_tombstones"

_REQUIRED_COLUMNS = {
    "traces": {"trace_id", "data", "created_at"},
    "trace_sessions": {"trace_id", "session_id", "created_at"},
}

_PAGE_SQL = """
    SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at)
    FROM trace_sessions
    WHERE session_id > ?
    GROUP BY session_id
    ORDER BY session_id
    LIMIT ?
"""

_TRACES_SQL = """
    SELECT ts.session_id, t.trace_id, t.created_at,
           json_extract(t.data, '$.weight_version'),
           json_array_length(t.data, '$.prompt_token_ids'),
           json_extract(t.data, '$.token_counts.prompt'),
           length(json_extract(t.data, '$.messages')),
           json_extract(t.data, '$.model')
    FROM trace_sessions AS ts JOIN traces AS t ON t.trace_id = ts.trace_id
    WHERE ts.session_id IN ({placeholders})
"""


def open_read_only(path: str, *, busy_timeout: float = 10.0) -> sqlite3.Connection:
    """Open ``path`` read-only in autocommit mode, or raise StoreError with what to do."""
    file = Path(path)
    if not file.exists():
        raise StoreError(f"{path}: no such file. Give the path of the gateway's SQLite store "
                         "(rllm-model-gateway --db-path, default ~/.rllm/gateway_traces.db).")
    if file.is_dir():
        raise StoreError(f"{path} is a folder; give the gateway's SQLite file itself.")
    if not os.access(file, os.R_OK):
        raise StoreError(f"{path}: permission denied; run gatewayscope as a user that may read it.")
    uri = f"{file.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error as err:
        raise _store_error(path, err) from None
    return conn


def _store_error(path: str, err: sqlite3.Error) -> StoreError:
    text = str(err)
    if "not a database" in text or "malformed" in text:
        return StoreError(f"{path} is not a SQLite database ({text}); is this the gateway's trace store?")
    if "locked" in text or "busy" in text:
        return StoreError(f"{path} is locked by another process ({text}); it stayed locked past the busy "
                          "timeout. Try again, or raise timeout_seconds for this target.")
    if "unable to open" in text:
        return StoreError(f"{path} cannot be opened ({text}); check the path and its folder's permissions "
                          "(a WAL store needs its folder to be readable too).")
    return StoreError(f"{path}: SQLite error: {text}")


def check_trace_store(conn: sqlite3.Connection, path: str) -> set[str]:
    """Raise StoreError unless the file holds the gateway's tables; return all table names."""
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, columns in _REQUIRED_COLUMNS.items():
            if table not in tables:
                raise StoreError(
                    f"{path} is not an rLLM trace store: it has no {table!r} table "
                    f"(tables: {', '.join(sorted(tables)) or 'none'})."
                )
            present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            missing = columns - present
            if missing:
                raise StoreError(f"{path} is not an rLLM trace store: table {table!r} lacks "
                                 f"{', '.join(sorted(missing))}.")
    except sqlite3.Error as err:
        raise _store_error(path, err) from None
    return tables


def iter_session_pages(conn: sqlite3.Connection, page_size: int = SESSION_PAGE) -> Iterator[list[tuple[Any, ...]]]:
    """Pages of (session_id, trace_count, first_trace_at, last_trace_at), each read in its own statement."""
    last = ""
    while True:
        # fetchall() finishes the statement, so the read lock is released before the next page
        rows = conn.execute(_PAGE_SQL, (last, page_size)).fetchall()
        if not rows:
            return
        yield rows
        if len(rows) < page_size:
            return
        last = rows[-1][0]


def _tombstoned_sessions(conn: sqlite3.Connection, page_size: int = SESSION_PAGE) -> list[str]:
    """Ids that carry a tombstone and still have rows in the store, read a key range at a time."""
    found: list[str] = []
    last = ""
    while True:
        page = conn.execute(
            f"SELECT session_id FROM {TOMBSTONE_TABLE} WHERE session_id > ? ORDER BY session_id LIMIT ?",
            (last, page_size),
        ).fetchall()
        if not page:
            return found
        upper = page[-1][0]
        found.extend(row[0] for row in conn.execute(
            f"SELECT session_id FROM {TOMBSTONE_TABLE} AS tb WHERE session_id > ? AND session_id <= ? "
            "AND EXISTS (SELECT 1 FROM trace_sessions AS ts WHERE ts.session_id = tb.session_id)",
            (last, upper),
        ))
        if len(page) < page_size:
            return found
        last = upper


def read_guard_stats(conn: sqlite3.Connection, tables: set[str]) -> GuardStats | None:
    """The SQLite guard's figures when it is installed in this file."""
    if TOMBSTONE_TABLE not in tables:
        return None
    from gatewayscope.guard import sqlite as sqlite_guard

    return sqlite_guard.read_guard(conn)


def current_weight_version(conn: sqlite3.Connection) -> int | None:
    """The newest weight version the store's recent traces carry (upstream gateways record one)."""
    row = conn.execute(
        "SELECT MAX(json_extract(data, '$.weight_version')) FROM "
        "(SELECT data FROM traces ORDER BY created_at DESC LIMIT 200)"
    ).fetchone()
    value = row[0] if row else None
    return int(value) if isinstance(value, (int, float)) else None


def read_trace_store_sqlite(target: Target, policy: Policy, *, now: float,
                            page_size: int = SESSION_PAGE) -> TraceStoreData:
    """Read the sessions and candidate traces of the SQLite store at ``target.path``."""
    assert target.path, "a SQLite trace-store target needs a path"
    path = target.path
    conn = open_read_only(path, busy_timeout=target.timeout_seconds)
    try:
        tables = check_trace_store(conn, path)
        try:
            pages: list[pl.DataFrame] = []
            for rows in iter_session_pages(conn, page_size):
                pages.append(frame_from_rows(rows, SESSIONS_SCHEMA))
            sessions = pl.concat(pages, rechunk=True) if pages else empty_frame(SESSIONS_SCHEMA)
            guard = read_guard_stats(conn, tables)
            tombstoned = _tombstoned_sessions(conn, page_size) if guard and guard.tombstones else []
            weight = current_weight_version(conn)

            idle_before = now - policy.orphan_idle_seconds
            candidates = sessions.filter(
                (pl.col("trace_count") == 1) & (pl.col("last_trace_at") <= idle_before)
            )["session_id"].to_list()
            if tombstoned:
                seen = set(candidates)
                candidates.extend(sid for sid in tombstoned if sid not in seen)
            trace_rows: list[tuple[Any, ...]] = []
            for start in range(0, len(candidates), TRACE_BATCH):
                batch = candidates[start:start + TRACE_BATCH]
                sql = _TRACES_SQL.format(placeholders=",".join("?" * len(batch)))
                for (sid, trace_id, created, weight_v, n_ids, n_prompt, chars, model) in conn.execute(sql, batch):
                    prompt_tokens = n_ids if n_ids else n_prompt
                    trace_rows.append((
                        sid, trace_id, created,
                        int(weight_v) if isinstance(weight_v, (int, float)) else None,
                        int(prompt_tokens) if isinstance(prompt_tokens, (int, float)) else None,
                        chars, model if isinstance(model, str) else None,
                    ))
        except sqlite3.Error as err:
            raise _store_error(path, err) from None
    finally:
        conn.close()
    return TraceStoreData(
        sessions=sessions,
        candidate_traces=frame_from_rows(trace_rows, CANDIDATE_TRACES_SCHEMA),
        tombstoned_ids=tombstoned,
        current_weight_version=weight,
        guard=guard,
        capabilities={"weight_version": weight is not None, "batch_delete": False, "guard": guard is not None},
        access="sqlite",
    )
