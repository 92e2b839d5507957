"""Read an rLLM SQLite trace store file, strictly read-only, without holding up the gateway.

Sessions are read in pages keyed by ``session_id`` over the gateway's own ``idx_ts_session_time`` index, each
page its own short statement (:func:`gatewayscope._sqlite.statements.fetch_for`): the gateway's commit waits
at most for one page, never for the whole scan. A page ends after ``STATEMENT_SECONDS`` of lock, or just before
a waiting writer tries again, whatever the machine or the cache: its rows come in key order and the next page
starts after the last whole session read. Candidate traces are read the same way. Every statement takes its
lock by fine polling, and reads of one file in this process take turns (see :mod:`gatewayscope._sqlite.locking`).

A scan needs of most sessions only that they exist: unless every session is asked for, the pages aggregate inside
SQLite (:func:`iter_candidate_pages`: one row per page, sized to hold the lock about half as long) and only the
candidates are read by key; a guard's ready orphan index spares even that.

The file is opened with ``mode=ro``: gatewayscope never writes to the store from here. The figures of the
tombstone guard installed in the file come from the ``guard_reader`` the caller passes (the guard owns its
tables and every statement on them).
"""

from __future__ import annotations

import bisect
import json
import sqlite3
from collections.abc import Collection, Iterator
from typing import Any, Protocol

import polars as pl

from gatewayscope._sqlite.locking import WriterProbe, one_reader_per_file
from gatewayscope._sqlite.reading import reading_store
from gatewayscope._sqlite.schema import (
    CANDIDATE_PAGE_PROBE_SQL,
    CANDIDATE_PAGE_SQL,
    FIRST_CANDIDATE_PAGE_SQL,
    FIRST_SESSION_PAGE_SQL,
    SESSION_PAGE_SQL,
)
from gatewayscope._sqlite.statements import STATEMENT_SECONDS, StatementWatch, fetch_all, fetch_for, fetch_watched
from gatewayscope.config import Policy, Target
from gatewayscope.errors import StoreError
from gatewayscope.orphan_rule import Tombstone, candidate_expr, dispatched_at_sql
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    SESSIONS_SCHEMA,
    GuardStats,
    TraceStoreData,
    empty_frame,
    frame_from_rows,
)

#: most sessions one page may hold (a memory bound: a page usually ends sooner, on STATEMENT_SECONDS)
SESSION_PAGE = 100_000
#: most session ids one candidate-trace read asks for (SQLite's variable limit before 3.32 is 999);
#: a read also ends after STATEMENT_SECONDS, and the next one resumes at the first unfinished session
TRACE_BATCH = 999
#: rows of a candidate-trace read between two looks at the clock and at the writer (a trace row costs far more
#: than a session row: the JSON of its data is parsed; together still a fraction of a millisecond of work; a
#: long prompt makes its row dearer)
TRACE_CHUNK = 16

#: how long one page of the candidates read should hold the read lock. Its one row comes at its end, so it
#: cannot stop early as fetch_for does: its size is set from the pace of the page before. Half of
#: STATEMENT_SECONDS: a writer whose first try falls as a page starts finds the lock free at its busy handler's
#: 18 ms retry
CANDIDATE_PAGE_SECONDS = STATEMENT_SECONDS / 2
#: sessions in the first page of the candidates read; a page is at most four times the one before
FIRST_CANDIDATE_PAGE = 1_000

#: the figures of named sessions (the candidates a candidates read found, the tombstoned and the ``also`` ones)
_SESSION_ROWS_SQL = """
    SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at)
    FROM trace_sessions
    WHERE session_id IN ({placeholders})
    GROUP BY session_id
    ORDER BY session_id
"""

#: a candidate's traces in two steps: their ids and rowids from the indexes (session order), then the rows
#: themselves in rowid order, which is the order they lie in the file (far fewer seeks on a cold page cache)
_TRACE_IDS_SQL = """
    SELECT ts.session_id, t.trace_id, t.rowid
    FROM trace_sessions AS ts JOIN traces AS t ON t.trace_id = ts.trace_id
    WHERE ts.session_id IN ({placeholders})
    ORDER BY ts.session_id
"""
#: ``key`` is ``rowid`` (file order), or ``trace_id`` for traces whose rowid changed between the two steps
_TRACE_ROWS_SQL = """
    SELECT rowid, trace_id, created_at,
           json_extract(data, '$.weight_version'),
           json_array_length(data, '$.prompt_token_ids'),
           json_extract(data, '$.token_counts.prompt'),
           length(json_extract(data, '$.messages')),
           json_extract(data, '$.model'),
           """ + dispatched_at_sql("data").replace("{", "{{").replace("}", "}}") + """
    FROM traces WHERE {key} IN ({placeholders})
    ORDER BY {key}
"""


class GuardReader(Protocol):
    """Reads the tombstone guard's figures from the store, when its tables are among ``tables``.

    Returns the guard's figures (None when it is not installed) and the tombstones of the sessions that still
    have rows in the store (their fences, and whether the guard saw each written again after it). Its
    statements run between the source's own, on its connection (busy handler off: statements poll for the
    lock for up to ``busy_timeout`` seconds), paged by at most ``page_size`` ids and
    watched by ``watch``. :func:`gatewayscope.guard.sqlite.read_for_scan` is the one the scan passes.
    """

    def __call__(self, conn: sqlite3.Connection, tables: set[str], *, busy_timeout: float, page_size: int,
                 watch: StatementWatch) -> tuple[GuardStats | None, dict[str, Tombstone]]: ...


class IndexReader(Protocol):
    """Reads the guard's orphan index, when its tables are among ``tables`` and it is ready; None otherwise.

    Returns an object with ``sessions`` and ``traces`` (the store's totals) and ``rows``: (session_id,
    trace_count, first_trace_at, last_trace_at) of every one-trace session whose trace is at or before
    ``idle_before``, and of those of the ``also`` ids that have rows. Its statements run on the source's
    connection as :class:`GuardReader`'s do. :func:`gatewayscope.guard.sqlite.read_index_for_scan` is the one
    the scan passes.
    """

    def __call__(self, conn: sqlite3.Connection, tables: set[str], *, idle_before: float, also: list[str],
                 busy_timeout: float, page_size: int, watch: StatementWatch) -> Any: ...


def iter_session_pages(conn: sqlite3.Connection, page_size: int = SESSION_PAGE, *,
                       page_seconds: float | None = STATEMENT_SECONDS, busy_timeout: float = 10.0,
                       probe: WriterProbe | None = None,
                       watch: StatementWatch | None = None) -> Iterator[list[tuple[Any, ...]]]:
    """Pages of (session_id, trace_count, first_trace_at, last_trace_at), each read in its own statement.

    A page holds at most ``page_size`` sessions, and ends once its statement has held the read lock
    ``page_seconds`` (None: no time bound), or when a writer ``probe`` saw waiting is due to try again
    (see :func:`~gatewayscope._sqlite.statements.fetch_for`). Either way every row is a whole session (the
    GROUP BY walks the index in key order and emits a session once its last row is counted), so the next page
    starts after the last session read.
    """
    last, sql = "", FIRST_SESSION_PAGE_SQL
    while True:
        if page_seconds is None:
            rows, _ = fetch_all(conn, sql, (last, page_size), busy_timeout=busy_timeout, watch=watch)
            ended = len(rows) < page_size
        else:
            rows, ended = fetch_for(conn, sql, (last, page_size), seconds=page_seconds,
                                    busy_timeout=busy_timeout, probe=probe, watch=watch)
            ended = ended and len(rows) < page_size
        if not rows:
            return
        yield rows
        if ended:
            return
        last, sql = rows[-1][0], SESSION_PAGE_SQL


def supports_candidate_pages(conn: sqlite3.Connection, *, busy_timeout: float = 10.0) -> bool:
    """Whether this SQLite runs the candidates read's statement (aggregate FILTER and the JSON functions)."""
    try:
        fetch_all(conn, CANDIDATE_PAGE_PROBE_SQL, busy_timeout=busy_timeout)
    except sqlite3.OperationalError as err:
        if "locked" in str(err) or "busy" in str(err):
            raise
        return False
    return True


def iter_candidate_pages(conn: sqlite3.Connection, idle_before: float, *, path: str = "",
                         busy_timeout: float = 10.0, watch: StatementWatch | None = None,
                         page_limit: int = SESSION_PAGE) -> Iterator[tuple[int, int, list[str]]]:
    """Pages of (sessions, traces, candidate ids) covering every session once, in key order: the ids are those
    of the one-trace sessions whose trace is at or before ``idle_before``.

    Each page is one statement (``CANDIDATE_PAGE_SQL``) that aggregates inside SQLite, so Python handles one
    row per page. Its size follows the pace of the page before, aiming at ``CANDIDATE_PAGE_SECONDS`` of lock
    (at most ``page_limit`` sessions, and four times the page before). With ``watch``, a page still running
    ``STATEMENT_SECONDS + WATCH_GRACE_SECONDS`` after it took the lock (a page cache miss) is interrupted and
    tried again a quarter of its size; one of a single session runs unwatched to its end. A session id that is
    not text raises :func:`not_text_id_error` naming ``path``, as :func:`sessions_frame` does.
    """
    last, sql, size = "", FIRST_CANDIDATE_PAGE_SQL, min(FIRST_CANDIDATE_PAGE, page_limit)
    while True:  # bounded: every page moves ``last`` forward; an interrupted one shrinks to a single session
        params = (idle_before, last, size)
        done = (fetch_watched(conn, sql, params, busy_timeout=busy_timeout, watch=watch)
                if watch is not None and size > 1 else fetch_all(conn, sql, params, busy_timeout=busy_timeout))
        if done is None:
            size = max(1, size // 4)
            continue
        rows, seconds = done
        count, traces, top, ids = rows[0]
        if count and not isinstance(top, str):  # a BLOB sorts after every text: the page's last key shows one
            raise not_text_id_error(path, top)
        if count:
            yield int(count), int(traces or 0), [str(sid) for sid in json.loads(ids)]
        if count < size:
            return
        last, sql = top, CANDIDATE_PAGE_SQL
        pace = max(seconds, 1e-6) / count
        size = max(1, min(page_limit, size * 4, int(CANDIDATE_PAGE_SECONDS / pace)))


def current_weight_version(conn: sqlite3.Connection, *, busy_timeout: float = 10.0,
                           watch: StatementWatch | None = None) -> int | None:
    """The newest weight version the store's recent traces carry (upstream gateways record one)."""
    rows, _ = fetch_all(
        conn,
        "SELECT MAX(json_extract(data, '$.weight_version')) FROM "
        "(SELECT data FROM traces ORDER BY created_at DESC LIMIT 200)",
        busy_timeout=busy_timeout, watch=watch,
    )
    value = rows[0][0] if rows else None
    return int(value) if isinstance(value, (int, float)) else None


def _iter_by_session(conn: sqlite3.Connection, sql: str, session_ids: list[str], *, seconds: float,
                     busy_timeout: float, probe: WriterProbe | None,
                     watch: StatementWatch | None) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``sql`` (first column: the session id, rows ordered by it) for ``session_ids``, in
    statements of at most ``seconds`` of lock each (see :func:`fetch_for`).

    When a statement stops early every session before the last one read is whole; the next statement
    starts again at that last session.
    """
    todo = sorted(set(session_ids))  # Python's str order is SQLite's BINARY order (UTF-8 bytes)
    start = 0
    while start < len(todo):  # bounded: every turn moves ``start`` forward
        batch = todo[start:start + TRACE_BATCH]
        rows, ended = fetch_for(conn, sql.format(placeholders=",".join("?" * len(batch))), batch, seconds=seconds,
                                busy_timeout=busy_timeout, probe=probe, watch=watch, chunk=TRACE_CHUNK)
        if ended:
            yield rows
            start += len(batch)
            continue
        last = rows[-1][0]
        whole = [row for row in rows if row[0] != last]
        if whole:
            yield whole
            start = bisect.bisect_left(todo, last, start)
        else:  # one session's rows filled the whole statement: read that session alone, to its end
            rows, _ = fetch_all(conn, sql.format(placeholders="?"), [last], busy_timeout=busy_timeout)
            yield rows
            start = bisect.bisect_right(todo, last, start)


def iter_candidate_traces(conn: sqlite3.Connection, session_ids: list[str], *, seconds: float,
                           busy_timeout: float, probe: WriterProbe | None = None,
                           watch: StatementWatch | None = None) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of (session_id, trace_id, created_at, weight_version, prompt ids, prompt tokens, prompt chars,
    model, dispatched_at) for every trace of ``session_ids``, in statements of at most ``seconds`` of lock each.

    First the traces' ids and rowids (``_TRACE_IDS_SQL``, by session), then their rows (``_TRACE_ROWS_SQL``)
    in rowid order; a statement that stops early is resumed after the last rowid it read. A trace whose
    rowid now holds another trace id (deleted and its rowid reused, or renumbered by a VACUUM, between the
    two steps) is looked up again by its id: found, it counts; gone, it is left out, as any trace deleted
    meanwhile is.
    """
    links: dict[int, list[tuple[str, str]]] = {}  # rowid -> [(session_id, trace_id)]: a trace may be shared
    for rows in _iter_by_session(conn, _TRACE_IDS_SQL, session_ids, seconds=seconds, busy_timeout=busy_timeout,
                                 probe=probe, watch=watch):
        for sid, trace_id, rowid in rows:
            links.setdefault(rowid, []).append((sid, trace_id))
    found: set[str] = set()
    for rows in _iter_trace_rows(conn, "rowid", sorted(links), seconds=seconds, busy_timeout=busy_timeout,
                                 probe=probe, watch=watch):
        matched = [(sid, trace_id, *values) for rowid, trace_id, *values in rows
                   for sid, expected in links[rowid] if trace_id == expected]
        found.update(row[1] for row in matched)
        yield matched
    # a trace not found under its rowid was deleted, or moved (VACUUM renumbers rowids): look it up by id
    by_id: dict[str, list[str]] = {}
    for pairs in links.values():
        for sid, trace_id in pairs:
            if trace_id not in found:
                by_id.setdefault(trace_id, []).append(sid)
    for rows in _iter_trace_rows(conn, "trace_id", sorted(by_id), seconds=seconds, busy_timeout=busy_timeout,
                                 probe=probe, watch=watch):
        yield [(sid, trace_id, *values) for _, trace_id, *values in rows for sid in by_id[trace_id]]


def _iter_trace_rows(conn: sqlite3.Connection, key: str, keys: list[Any], *, seconds: float, busy_timeout: float,
                     probe: WriterProbe | None, watch: StatementWatch | None) -> Iterator[list[tuple[Any, ...]]]:
    """``_TRACE_ROWS_SQL`` rows for the sorted ``keys`` of column ``key`` (``rowid`` or ``trace_id``), in
    statements of at most ``seconds`` of lock each; one that stops early is resumed after the last key read."""
    column = 0 if key == "rowid" else 1
    start = 0
    while start < len(keys):  # bounded: every turn moves ``start`` forward (a stopped statement read rows)
        batch = keys[start:start + TRACE_BATCH]
        sql = _TRACE_ROWS_SQL.format(key=key, placeholders=",".join("?" * len(batch)))
        rows, ended = fetch_for(conn, sql, batch, seconds=seconds, busy_timeout=busy_timeout, probe=probe,
                                watch=watch, chunk=TRACE_CHUNK)
        yield rows
        start = start + len(batch) if ended else bisect.bisect_right(keys, rows[-1][column], start)


def candidate_trace_row(raw: tuple[Any, ...]) -> tuple[Any, ...]:
    """A CANDIDATE_TRACES_SCHEMA row from one row of :func:`iter_candidate_traces` (the token ids' count, else
    the recorded prompt count; a value of the wrong type, a time that is no number included, as None)."""
    sid, trace_id, created, weight_v, n_ids, n_prompt, chars, model, dispatched = raw
    prompt_tokens = n_ids if n_ids else n_prompt
    return (
        sid, trace_id, trace_time(created),
        int(weight_v) if isinstance(weight_v, (int, float)) else None,
        int(prompt_tokens) if isinstance(prompt_tokens, (int, float)) else None,
        chars, model if isinstance(model, str) else None,
        float(dispatched) if isinstance(dispatched, (int, float)) else None,
    )


def trace_time(value: Any) -> float | None:
    """A trace time as every read of a store takes it: a number of seconds, else None (unknown).

    The gateway writes REAL seconds; a TEXT or BLOB ``created_at`` (a row something else wrote) is an unknown time,
    and a session whose last time is unknown is no candidate, as SQLite's own comparison makes it in the
    candidates read (a TEXT value sorts after every number, so ``MAX(created_at) <= ?`` is false).
    """
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def not_text_id_error(path: str, value: Any) -> StoreError:
    """The StoreError for a session id that is not text (the gateway writes text ids only)."""
    kind = "a BLOB" if isinstance(value, (bytes, bytearray, memoryview)) else f"a {type(value).__name__}"
    return StoreError(f"{path} holds a session id that is not text ({kind}); the rLLM gateway writes text ids only, "
                      "so another program wrote that row: find it with SELECT rowid FROM trace_sessions WHERE "
                      "typeof(session_id) != 'text', and remove or repair it.")


def sessions_frame(rows: list[tuple[Any, ...]], path: str) -> pl.DataFrame:
    """One page of (session_id, count, first, last) rows of the store at ``path`` as a SESSIONS_SCHEMA frame, built
    column by column (cheaper than row by row). Times are read by :func:`trace_time`; a session id that is not text
    raises :func:`not_text_id_error` (every read of a store, the scan's and the exporter's, builds its frames here,
    so they read the same rows the same way)."""
    ids = [row[0] for row in rows]
    for sid in ids:
        if not isinstance(sid, str):
            raise not_text_id_error(path, sid)
    counts = [row[1] for row in rows]
    firsts = [trace_time(row[2]) for row in rows]
    lasts = [trace_time(row[3]) for row in rows]
    return pl.DataFrame([pl.Series(name, column, dtype=dtype)
                         for column, (name, dtype) in zip((ids, counts, firsts, lasts), SESSIONS_SCHEMA.items(),
                                                          strict=True)])


def read_trace_store_sqlite(target: Target, policy: Policy, *, now: float, page_size: int = SESSION_PAGE,
                            guard_reader: GuardReader | None = None, index_reader: IndexReader | None = None,
                            full: bool = False, also: Collection[str] = ()) -> TraceStoreData:
    """Read the sessions and candidate traces of the SQLite store at ``target.path``.

    ``page_size`` caps the sessions of one page; a page also ends after ``STATEMENT_SECONDS`` of lock,
    and so do candidate-trace reads. ``target.timeout_seconds`` is how long one statement may wait for
    the lock before the read fails with StoreError. ``guard_reader`` reads the tombstone guard's figures and
    tombstoned sessions (see :class:`GuardReader`); without one the read reports no guard.

    Unless ``full``, ``sessions`` holds only the candidate sessions (one trace, idle past the policy's
    threshold, the tombstoned ones, and those of ``also`` that exist: the ids the findings will be given as
    deleted before), ``session_total`` and ``trace_total`` the store's totals, and the findings are those of
    a full read. They come from the guard's orphan index when ``index_reader`` (see :class:`IndexReader`)
    finds one ready; otherwise from a candidates read (:func:`iter_candidate_pages`), which aggregates every
    session inside SQLite and hands Python only the totals and the candidates' ids. ``full=True`` lists every
    session in ``sessions`` (as does a SQLite too old for the candidates read). Which path was taken is decided
    at read time.
    """
    assert target.path, "a SQLite trace-store target needs a path"
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, not {page_size}")
    with one_reader_per_file(target.path):
        return _read_trace_store_sqlite(target.path, target.timeout_seconds, policy, now=now, page_size=page_size,
                                        guard_reader=guard_reader, index_reader=None if full else index_reader,
                                        also=list(also), listing=full)


def _read_trace_store_sqlite(path: str, wait: float, policy: Policy, *, now: float, page_size: int,
                             guard_reader: GuardReader | None,
                             index_reader: IndexReader | None = None, also: list[str] | None = None,
                             listing: bool = True) -> TraceStoreData:
    # every statement polls for the lock (fetch_all, fetch_for): SQLite's busy handler stays off
    with reading_store(path, wait) as read:
        conn, tables, probe, watch = read.conn, read.tables, read.probe, read.watch
        idle_before = now - policy.orphan_idle_seconds
        indexed = None

        def read_guard() -> tuple[GuardStats | None, dict[str, Tombstone]]:
            if guard_reader is None:
                return None, {}
            return guard_reader(conn, tables, busy_timeout=wait, page_size=page_size, watch=watch)

        def fenced(tombstones: dict[str, Tombstone]) -> list[str]:
            """The ids a fence may prove orphans: tombstoned and not used again since, and those of ``also``."""
            return [*(sid for sid, stone in tombstones.items() if not stone.reused), *(also or [])]

        guard_read: tuple[GuardStats | None, dict[str, Tombstone]] | None = None
        if index_reader is not None and guard_reader is not None:
            # the guard first: its tombstoned sessions are candidates too, looked up in the index by key
            guard_read = read_guard()
            indexed = index_reader(conn, tables, idle_before=idle_before, also=fenced(guard_read[1]),
                                   busy_timeout=wait, page_size=page_size, watch=watch)
        if indexed is not None:
            assert guard_read is not None
            guard, tombstoned = guard_read
            sessions = sessions_frame(indexed.rows, path) if indexed.rows else empty_frame(SESSIONS_SCHEMA)
            totals: tuple[int, int] | None = (indexed.sessions, indexed.traces)
        elif not listing and supports_candidate_pages(conn, busy_timeout=wait):
            guard, tombstoned = guard_read or read_guard()
            session_total = trace_total = 0
            wanted: list[str] = []
            for count, traces, ids in iter_candidate_pages(conn, idle_before, path=path, busy_timeout=wait,
                                                           watch=watch, page_limit=page_size):
                session_total, trace_total = session_total + count, trace_total + traces
                wanted += ids
            rows = [row for page in _iter_by_session(conn, _SESSION_ROWS_SQL, [*wanted, *fenced(tombstoned)],
                                                     seconds=STATEMENT_SECONDS, busy_timeout=wait, probe=probe,
                                                     watch=watch)
                    for row in page]
            sessions = sessions_frame(rows, path) if rows else empty_frame(SESSIONS_SCHEMA)
            totals = (session_total, trace_total)
        else:
            totals = None
            pages: list[pl.DataFrame] = []
            for rows in iter_session_pages(conn, page_size, busy_timeout=wait, probe=probe, watch=watch):
                # built between statements: the gateway commits meanwhile
                pages.append(sessions_frame(rows, path))
            sessions = pl.concat(pages, rechunk=True) if pages else empty_frame(SESSIONS_SCHEMA)
            del pages
            guard, tombstoned = guard_read or read_guard()  # read once: before the pages when the index was looked for
        weight = current_weight_version(conn, busy_timeout=wait, watch=watch)

        proof = fenced(tombstoned)
        candidates = sessions.filter(candidate_expr(
            pl.col("trace_count"), pl.col("last_trace_at"), idle_before,
            pl.col("session_id").is_in(pl.Series(proof, dtype=pl.String).implode()))
        )["session_id"].to_list()
        trace_rows: list[tuple[Any, ...]] = []
        for rows in iter_candidate_traces(conn, candidates, seconds=STATEMENT_SECONDS, busy_timeout=wait,
                                           probe=probe, watch=watch):
            trace_rows += map(candidate_trace_row, rows)
    return TraceStoreData(
        sessions=sessions,
        candidate_traces=frame_from_rows(trace_rows, CANDIDATE_TRACES_SCHEMA),
        tombstoned_ids=list(tombstoned),
        fences={sid: stone.fence for sid, stone in tombstoned.items()},
        reused_ids=[sid for sid, stone in tombstoned.items() if stone.reused],
        current_weight_version=weight,
        guard=guard,
        capabilities={"weight_version": weight is not None, "batch_delete": False, "guard": guard is not None},
        access="sqlite",
        session_total=totals[0] if totals is not None else None,
        trace_total=totals[1] if totals is not None else None,
        also_read=frozenset(also or ()),
    )
