"""The rLLM gateway's tables a trace store holds, and the check that a file holds them."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from typing import Any

from gatewayscope._sqlite.locking import retry_while_locked
from gatewayscope._sqlite.open import Wording
from gatewayscope.errors import StoreError

#: the gateway's tables and the columns of each that gatewayscope reads or writes
REQUIRED_COLUMNS: dict[str, set[str]] = {
    "traces": {"trace_id", "data", "created_at"},
    "trace_sessions": {"trace_id", "session_id", "created_at"},
}

#: one page of per-session figures after a key: (session_id, trace count, first and last trace time), over the
#: gateway's (session_id, created_at) index in key order, every row a whole session; the full scan and the
#: guard's index fill read the same figures
SESSION_PAGE_SQL = """
    SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at)
    FROM trace_sessions
    WHERE session_id > ?
    GROUP BY session_id
    ORDER BY session_id
    LIMIT ?
"""
#: the first page starts AT the smallest key: an empty session id is a session too
FIRST_SESSION_PAGE_SQL = SESSION_PAGE_SQL.replace("session_id > ?", "session_id >= ?")

#: one page of the candidates read, aggregated inside SQLite into one row: how many of the next (at most ``?``)
#: sessions after a key there are, their traces, the last key, and a JSON array of the ids of those with one
#: trace at or before a time (the scan's candidates; their figures are read by key afterwards, so every time
#: keeps its exact value). Python handles one row per page instead of one per session. A session id that is not
#: text (a BLOB, which sorts after every text) is left out of the array, and the page's last key shows it to the
#: reader, which refuses the store with a sentence. Parameters: the time,
#: the key, the page size
CANDIDATE_PAGE_SQL = """
    SELECT COUNT(*), SUM(n), MAX(session_id),
           json_group_array(session_id) FILTER (WHERE n = 1 AND last <= ? AND typeof(session_id) = 'text')
    FROM (SELECT session_id, COUNT(*) AS n, MAX(created_at) AS last
          FROM trace_sessions
          WHERE session_id > ?
          GROUP BY session_id
          ORDER BY session_id
          LIMIT ?)
"""
#: the first page starts AT the smallest key, as FIRST_SESSION_PAGE_SQL does
FIRST_CANDIDATE_PAGE_SQL = CANDIDATE_PAGE_SQL.replace("session_id > ?", "session_id >= ?")
#: whether this SQLite runs CANDIDATE_PAGE_SQL: aggregate FILTER clauses came in 3.30, the JSON functions are
#: built in from 3.38 (and usually compiled in before)
CANDIDATE_PAGE_PROBE_SQL = "SELECT json_group_array(1) FILTER (WHERE 1)"

#: what to do with a file that holds none of the gateway's tables yet (the guard's commands say it)
_FIRST_REQUEST_HINT = ("the gateway creates its tables on its first request, so start it with this --db-path, "
                       "send one request (e.g. GET /sessions) and install again")


def check_trace_store(conn: sqlite3.Connection, path: str, *, busy_timeout: float, wording: Wording = "scan",
                      ours: Collection[str] = ()) -> set[str]:
    """Raise StoreError unless the file holds the gateway's tables with their columns; return every table's name.

    Each statement polls for the lock up to ``busy_timeout`` seconds (0: one try, in which the connection's own
    busy handler waits); SQLite's errors are raised as they come. ``ours`` names the tables gatewayscope itself
    adds: the guard's wording tells the user of a file that holds no other table to let the gateway create its
    own first.
    """
    def rows(sql: str) -> list[Any]:
        return retry_while_locked(lambda: conn.execute(sql).fetchall(), busy_timeout)

    tables = {row[0] for row in rows("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table, columns in REQUIRED_COLUMNS.items():
        if table not in tables:
            detail = (_FIRST_REQUEST_HINT if wording == "guard" and not tables - set(ours)
                      else f"tables: {', '.join(sorted(tables)) or 'none'}")
            raise StoreError(f"{path} is not an rLLM trace store: it has no {table!r} table ({detail}).")
        present = {row[1] for row in rows(f"PRAGMA table_info({table})")}
        missing = columns - present
        if missing:
            which = "the column(s) " if wording == "guard" else ""
            raise StoreError(f"{path} is not an rLLM trace store: table {table!r} lacks {which}"
                             f"{', '.join(sorted(missing))}.")
    return tables
