"""The SQLite guard's state (``status``, the figures the scan and the exporter show) and its tombstones written
by hand (backfill, lift)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gatewayscope.errors import StoreError
from gatewayscope.guard.common import GuardStats
from gatewayscope.guard.sqlite._common import (
    Dropper,
    GuardStatus,
    _as_int,
    _check_trace_store,
    _connection,
    _has_table,
    _index_state,
    _integrity,
    _meta,
    _objects,
    _writing,
)
from gatewayscope.guard.sqlite.schema import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_TOP,
    META_TABLE,
    QUERY_BATCH,
    TOMBSTONES_TABLE,
    WRITE_BATCH,
)
from gatewayscope.sources._batches import batches

# -- reading ---------------------------------------------------------------------------------------


def _top_droppers(conn: sqlite3.Connection, top: int) -> list[Dropper]:
    rows = conn.execute(
        f"SELECT session_id, dropped_writes, deleted_at, last_dropped_at, source FROM {TOMBSTONES_TABLE} "
        "WHERE dropped_writes > 0 ORDER BY dropped_writes DESC, last_dropped_at DESC, session_id LIMIT ?",
        (top,),
    ).fetchall()
    return [Dropper(session_id=str(sid), dropped=int(dropped), deleted_at=float(deleted),
                    last_dropped_at=float(last) if last is not None else None, source=str(source))
            for sid, dropped, deleted, last, source in rows]


def _figures(conn: sqlite3.Connection, top: int) -> dict[str, Any]:
    """Counters, integrity and the worst droppers of an installed (maybe damaged) guard."""
    present = _objects(conn)
    missing, altered = _integrity(conn)
    meta = _meta(conn) if META_TABLE in present and META_TABLE not in altered else {}
    readable = TOMBSTONES_TABLE in present and TOMBSTONES_TABLE not in altered
    with_drops = 0
    droppers: list[Dropper] = []
    if readable:
        (with_drops,) = conn.execute(
            f"SELECT COUNT(*) FROM {TOMBSTONES_TABLE} WHERE dropped_writes > 0").fetchone()
        droppers = _top_droppers(conn, top)
    installed_at = meta.get("installed_at")
    return {
        "installed": bool(present),
        "triggers_intact": not missing and not altered,
        "missing": missing,
        "altered": altered,
        "schema_version": _as_int(meta.get("schema_version")) or None,
        "installed_at": float(installed_at) if isinstance(installed_at, (int, float)) else None,
        "tombstones": _as_int(meta.get("tombstones")),
        "capacity": _as_int(meta.get("capacity")),
        "dropped_writes": _as_int(meta.get("dropped_writes_total")),
        "kept_after_fence": _as_int(meta.get("kept_after_fence_total")),
        "evicted": _as_int(meta.get("evicted_total")),
        "sessions_with_drops": int(with_drops),
        "top_droppers": droppers,
        "index": _index_state(conn, present, meta),
    }


def read_guard(conn: sqlite3.Connection, *, top: int = DEFAULT_TOP) -> GuardStats | None:
    """The guard's figures from an open connection to a trace store, or None when it is not installed.

    Only reads (works on a ``file:...?mode=ro`` connection), each in its own short statement. Counts come
    from the counters the triggers keep, never from counting the table. ``enabled`` and
    ``triggers_intact`` are False when any of the guard's tables, indexes or triggers is missing or
    altered (re-run ``install`` to repair); ``capacity`` 0 means unlimited.
    """
    if not _objects(conn):
        return None
    figures = _figures(conn, top)
    intact = bool(figures["triggers_intact"])
    return GuardStats(
        tombstones=figures["tombstones"],
        capacity=figures["capacity"],
        dropped_writes=figures["dropped_writes"],
        kept_after_fence=figures["kept_after_fence"],
        evicted=figures["evicted"],
        enabled=intact,
        triggers_intact=intact,
        top_droppers=[{"session_id": d.session_id, "dropped": d.dropped} for d in figures["top_droppers"]],
        index=figures["index"],
    )


def status(path: str | Path, *, top: int = DEFAULT_TOP,
           busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> GuardStatus:
    """The guard's state in ``path``, read through a read-only connection.

    ``installed`` is False when none of the guard's objects is in the file (not an error);
    ``triggers_intact`` says whether every table, index and trigger is present with the SQL install
    wrote (``missing`` and ``altered`` name the others). ``top_droppers`` lists the ``top`` sessions with
    the most dropped writes: a live session among them (an rLLM retry that reused a deleted uid) is let
    through again with ``lift_tombstone``. Raises StoreError for a missing file or one that is not a
    trace store.
    """
    name = str(path)
    with _connection(path, readonly=True, busy_timeout=busy_timeout) as conn:
        _check_trace_store(conn, name)
        (journal_mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        return GuardStatus(path=name, journal_mode=str(journal_mode), **_figures(conn, top))


def _unique(session_ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(str(sid) for sid in session_ids))


def tombstoned_among(conn: sqlite3.Connection, session_ids: list[str]) -> list[str]:
    """The ids of ``session_ids`` that carry a tombstone, in the order given (duplicates once).

    Read-only, ``QUERY_BATCH`` ids per statement; an empty list when the guard is not installed.
    """
    wanted = _unique(session_ids)
    if not wanted or not _has_table(conn, TOMBSTONES_TABLE):
        return []
    found: set[str] = set()
    for batch in batches(wanted, QUERY_BATCH):
        marks = ",".join("?" * len(batch))
        found.update(row[0] for row in conn.execute(
            f"SELECT session_id FROM {TOMBSTONES_TABLE} WHERE session_id IN ({marks})", batch))
    return [sid for sid in wanted if sid in found]


# -- writing tombstones -------------------------------------------------------------------------------


def _require_installed(conn: sqlite3.Connection, path: str) -> None:
    if not _has_table(conn, TOMBSTONES_TABLE) or not _has_table(conn, META_TABLE):
        _check_trace_store(conn, path)
        raise StoreError(f"The tombstone guard is not installed in {path}; run "
                         f"'gatewayscope guard install {path}' first.")


def add_tombstones(path: str | Path, session_ids: Iterable[str], *,
                   busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> tuple[int, int]:
    """Record tombstones for ``session_ids`` (backfill): returns ``(new, already)`` over the distinct ids.

    Idempotent: an id that already has a tombstone keeps it (and its counts). Deletes nothing of the
    gateway's; the FIFO capacity may evict the oldest tombstones, as for any tombstone. Record the
    tombstone first, then delete the session, so a straggler landing between the two is dropped.
    One short transaction per ``WRITE_BATCH`` ids, the gateway's waiting writes going first between two.
    """
    name = str(path)
    ids = [sid for sid in _unique(session_ids) if sid]
    new = 0
    with _writing(path, busy_timeout=busy_timeout) as (conn, writer):
        _require_installed(conn, name)
        sql = (f"INSERT OR IGNORE INTO {TOMBSTONES_TABLE} (session_id, deleted_at, seq, source) "
               f"VALUES (?, ?, (SELECT IFNULL(MAX(seq), 0) + 1 FROM {TOMBSTONES_TABLE}), 'backfill')")
        for index, batch in enumerate(batches(ids, WRITE_BATCH)):
            if index:
                time.sleep(writer.pause)  # the gateway's waiting writer goes next
            now = time.time()
            with writer.transaction():
                cursor = conn.executemany(sql, [(sid, now) for sid in batch])
                # rowcount counts the statement's own inserts, not the rows the triggers touch
                new += max(cursor.rowcount, 0)
    return new, len(ids) - new


def lift_tombstone(path: str | Path, session_id: str, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> bool:
    """Remove one tombstone so writes for ``session_id`` land again (an rLLM retry reusing a deleted uid).

    Returns False when the id had no tombstone. The dropped-write totals are kept.
    """
    name = str(path)
    with _writing(path, busy_timeout=busy_timeout) as (conn, writer):
        _require_installed(conn, name)
        with writer.transaction():
            cursor = conn.execute(f"DELETE FROM {TOMBSTONES_TABLE} WHERE session_id = ?", (session_id,))
            return cursor.rowcount > 0


def tombstone_count(path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> int:
    """The number of tombstones in ``path`` (from the guard's counter); StoreError when not installed."""
    name = str(path)
    with _connection(path, readonly=True, busy_timeout=busy_timeout) as conn:
        _require_installed(conn, name)
        return _as_int(_meta(conn).get("tombstones"))
