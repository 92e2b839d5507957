"""Installing, upgrading and removing the SQLite guard: the integrity check first, then the schema's objects in
short exclusive transactions, and the orphan index filled from the existing rows."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatewayscope._sqlite.locking import (
    Transaction,
    Writer,
    is_busy,
    retry_while_locked,
    yield_seconds,
)
from gatewayscope._sqlite.open import open_store, store_error
from gatewayscope._sqlite.schema import FIRST_SESSION_PAGE_SQL, SESSION_PAGE_SQL
from gatewayscope._sqlite.statements import StatementWatch
from gatewayscope.errors import StoreError
from gatewayscope.guard.sqlite._common import (
    InstallResult,
    UninstallResult,
    _as_int,
    _check_trace_store,
    _connection,
    _has_table,
    _integrity,
    _legacy_objects,
    _meta,
    _objects,
    _validate_capacity,
    _writing,
)
from gatewayscope.guard.sqlite.schema import (
    _COUNTER_KEYS,
    _INDEXES,
    _TABLES,
    _TRIGGERS,
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_CAPACITY,
    INDEX_FILL_PAGE,
    INDEX_TABLE,
    META_TABLE,
    SCHEMA_VERSION,
    TOMBSTONES_TABLE,
    TOTALS_TABLE,
)

# -- install / uninstall ---------------------------------------------------------------------------

#: the longest the integrity check holds the read lock of a store in a rollback-journal mode (0.1.0's DELETE mode),
#: where every gateway commit waits for it: the gateway's writer waits 20 s before it fails, so a quarter of that
CHECK_HOLD_SECONDS = 5.0
#: VM steps between two looks at the clock during the integrity check
_CHECK_STEPS = 20_000


@dataclass
class IntegrityResult:
    """What :func:`check_integrity` checked: ``"full"`` (``PRAGMA quick_check`` of the whole file) or
    ``"schema"`` (the whole file would have held the gateway's writes too long: the schema and the guard's own
    tables were checked, the tables the install writes)."""

    scope: str
    seconds: float


def _quick_check(conn: sqlite3.Connection, *, table: str | None = None) -> list[str]:
    """The problems ``PRAGMA quick_check`` reports (of one table and its indexes with ``table``), none when sound."""
    sql = f"PRAGMA quick_check('{table}')" if table is not None else "PRAGMA quick_check(10)"
    return [str(row[0]) for row in conn.execute(sql).fetchall() if row and row[0] != "ok"]


def _begin_read(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Open a read transaction on ``conn`` (autocommit otherwise) and take its read lock, polling up to
    ``busy_timeout`` seconds for it."""
    conn.execute("BEGIN")
    try:
        retry_while_locked(lambda: conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall(), busy_timeout)
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def check_integrity(path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                    hold_seconds: float = CHECK_HOLD_SECONDS, full: bool = False) -> IntegrityResult:
    """Raise StoreError unless ``PRAGMA quick_check`` finds the file sound: nothing is written into a damaged one.

    The check is a read, made without costing the gateway a write:

    * in WAL mode (upstream main) it reads one snapshot of the file: the gateway's writer never waits for a
      reader, so the whole file is checked however large it is and however busy the gateway;
    * in a rollback-journal mode (0.1.0's DELETE) a reader holds up every commit, so the whole file is checked
      only while that stays within ``hold_seconds`` (the gateway's writer waits 20 s before it gives up); a
      file too large for that gets its schema and the guard's own tables checked instead (scope ``"schema"``:
      the tables the install writes), each in a read of its own; ``full`` checks the whole file however long
      it takes (for a stopped gateway).

    A store another process keeps locked for ``busy_timeout`` seconds is busy, never damaged: StoreError says
    to try again.
    """
    name = str(path)
    started = time.monotonic()
    scope = "full"
    conn = open_store(name, readonly=True, busy_timeout=0, wording="guard")
    # the hold bound is kept twice: the progress handler stops the check's row loops at a VM step, and the
    # watch's sqlite3_interrupt stops its walk of the b-trees, one VM step that can take minutes on a large
    # file (SQLite before 3.43 calls no progress handler inside it)
    watch = StatementWatch(conn)
    try:
        (mode,) = retry_while_locked(lambda: conn.execute("PRAGMA journal_mode").fetchone(), busy_timeout)
        bounded = str(mode).lower() != "wal" and not full
        _begin_read(conn, busy_timeout)
        held_from = time.monotonic()
        if bounded:
            conn.set_progress_handler(lambda: 1 if time.monotonic() - held_from > hold_seconds else 0, _CHECK_STEPS)
            watch.arm(held_from + hold_seconds)
        try:
            problems = _quick_check(conn)
        except sqlite3.OperationalError as err:
            if "interrupt" not in str(err):
                raise
            watch.arm(None)
            conn.execute("ROLLBACK")  # the gateway's waiting commits go through
            scope, problems = "schema", []
            for table in ("sqlite_master", *_TABLES):  # bounded: one table each
                time.sleep(yield_seconds(hold_seconds))
                _begin_read(conn, busy_timeout)  # every statement on this busy_timeout-0 connection under it
                held_from = time.monotonic()
                if table == "sqlite_master" or _has_table(conn, table):
                    watch.arm(held_from + hold_seconds)
                    problems += _quick_check(conn, table=table)
                    watch.arm(None)
                conn.execute("ROLLBACK")
        finally:
            watch.arm(None)
            conn.set_progress_handler(None, 0)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    except sqlite3.OperationalError as err:
        if is_busy(err):
            raise StoreError(f"{name} stayed locked by another process for {busy_timeout:g} s, so its integrity "
                             "could not be checked; nothing was written. It is busy, not damaged: try again, or "
                             "with a longer --busy-timeout.") from None
        if "interrupt" in str(err):  # a single table of the schema-scope check held the lock too long
            raise StoreError(f"{name}: the integrity check could not finish without holding up the gateway's "
                             f"writes longer than {hold_seconds:g} s; nothing was written. Stop the gateway and "
                             "install with --full-check.") from None
        problems = [str(err)]
    except sqlite3.DatabaseError as err:
        if "not a database" in str(err):  # not damaged: some other file
            raise store_error(name, err, wording="guard", busy_timeout=busy_timeout) from None
        problems = [str(err)]
    finally:
        watch.close()
        conn.close()
    if problems:
        raise StoreError(f"{name} is damaged (PRAGMA quick_check: {problems[0]}); nothing was written into it. "
                         "Restore it from a backup or recover it with sqlite3's .recover, then install again.")
    return IntegrityResult(scope=scope, seconds=time.monotonic() - started)


def install(path: str | Path, *, capacity: int | None = None, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
            progress: Callable[[int, int], None] | None = None, full_check: bool = False) -> InstallResult:
    """Install the tombstone guard into the gateway's SQLite file at ``path``.

    Idempotent: when the guard is already there with every object intact and the same capacity, nothing
    is written (nor checked) and ``InstallResult.changed`` is False. Otherwise a file that fails ``PRAGMA
    quick_check`` is refused before anything is written (:func:`check_integrity`; ``full_check`` checks a
    rollback-journal store whole however long that holds up the gateway's writes). Missing or altered guard
    objects are recreated (repair); existing tombstones and counters are kept. ``capacity`` is the FIFO cap
    of the tombstone table (0 = unlimited); ``None`` keeps the installed capacity, or uses 1,000,000 on a first install.
    Lowering it evicts the oldest tombstones now (counted as evictions).

    The orphan index (``gatewayscope_sessions``, kept by triggers from then on) is filled from the existing rows
    when it is new, was damaged, or its fill never completed: ``INDEX_FILL_PAGE`` sessions per transaction, each
    page's rows recomputed from the gateway's table inside that transaction, so the triggers (installed first)
    and the fill never disagree. ``progress(junction_rows_done, junction_rows_estimate)`` is called after each
    page. It is marked ready by the last page's transaction only; an interrupted fill is completed by the next
    install, and until then scans take the full path.

    Safe while the gateway runs: short exclusive transactions (see
    :class:`~gatewayscope._sqlite.locking.Writer`), each waiting at most ``busy_timeout`` seconds for the lock,
    the gateway's waiting writes going first between two; the gateway's own writes wait for ours (its busy
    timeout is 20 s) and then see the triggers. Raises StoreError for a missing file or one that is not an rLLM
    trace store, and ConfigError for a negative capacity.
    """
    _validate_capacity(capacity)
    name = str(path)
    with _connection(path, readonly=True, busy_timeout=busy_timeout) as conn:
        unchanged = _up_to_date(conn, name, capacity)
    if unchanged is not None:  # nothing to write: nothing to check either
        return unchanged
    checked = check_integrity(path, busy_timeout=busy_timeout, full=full_check)
    with _writing(path, busy_timeout=busy_timeout) as (conn, writer):
        with writer.transaction() as txn:
            result = _install_objects(conn, txn, name, capacity)
        if result.indexed_sessions is not None:
            result.indexed_sessions = _fill_index(conn, writer, progress=progress)
    result.checked = checked.scope if result.changed else None
    return result


def _up_to_date(conn: sqlite3.Connection, name: str, capacity: int | None) -> InstallResult | None:
    """The "nothing changed" result when the guard is installed exactly as asked (a read), else None."""
    _check_trace_store(conn, name)
    present = _objects(conn)
    meta = _meta(conn) if META_TABLE in present else {}
    if _as_int(meta.get("schema_version"), 0) != SCHEMA_VERSION or _legacy_objects(conn):
        return None
    missing, altered = _integrity(conn)
    index_missing, index_altered = _integrity(conn, index=True)
    previous = _as_int(meta.get("capacity"), DEFAULT_CAPACITY) if "capacity" in meta else None
    wanted = capacity if capacity is not None else (previous if previous is not None else DEFAULT_CAPACITY)
    keys_missing = [key for key in ("schema_version", "installed_at", "capacity", *_COUNTER_KEYS) if key not in meta]
    if missing or altered or index_missing or index_altered or keys_missing or previous != wanted \
            or meta.get("index_ready") != 1:
        return None
    return InstallResult(path=name, changed=False, created=False, capacity=wanted,
                         tombstones=_as_int(meta.get("tombstones")))


def _install_objects(conn: sqlite3.Connection, txn: Transaction, name: str, capacity: int | None) -> InstallResult:
    """Create or repair the guard's objects in one transaction; ``indexed_sessions`` is 0 when the orphan
    index must be filled next (its fill marked not ready), None when it is ready."""
    unchanged = _up_to_date(conn, name, capacity)
    if unchanged is not None:  # installed meanwhile by another install, exactly as asked
        txn.rollback_only()
        return unchanged
    present = _objects(conn)
    meta = _meta(conn) if META_TABLE in present else {}
    installed_version = _as_int(meta.get("schema_version"), 0)
    if installed_version > SCHEMA_VERSION:
        raise StoreError(f"{name} has the tombstone guard schema {installed_version}, newer than this "
                         f"gatewayscope's {SCHEMA_VERSION}; upgrade gatewayscope to manage it.")
    first = TOMBSTONES_TABLE not in present and META_TABLE not in present
    legacy = _legacy_objects(conn)
    missing, altered = _integrity(conn)
    index_missing, index_altered = _integrity(conn, index=True)
    refill = bool(index_missing or index_altered) or meta.get("index_ready") != 1
    previous = _as_int(meta.get("capacity"), DEFAULT_CAPACITY) if "capacity" in meta else None
    fallback = previous if previous is not None else DEFAULT_CAPACITY
    wanted = capacity if capacity is not None else fallback
    keys_missing = [key for key in ("schema_version", "installed_at", "capacity", *_COUNTER_KEYS)
                    if key not in meta]
    missing += index_missing
    altered += index_altered

    # triggers first: nothing may fire against a half-built schema
    for trigger in _TRIGGERS:
        if trigger in present:
            conn.execute(f"DROP TRIGGER {trigger}")
    for name, kind in sorted(legacy.items(), key=lambda item: item[1] != "TRIGGER"):
        conn.execute(f"DROP {kind} {name}")
    for table, sql in _TABLES.items():
        if table in altered:
            raise StoreError(f"{name} has a {table!r} table that the tombstone guard did not create; "
                             "rename or drop it, then install again.")
        if table not in present:
            conn.execute(sql)
    for index, sql in _INDEXES.items():
        if index in altered:
            conn.execute(f"DROP INDEX {index}")
        if index in altered or index not in present:
            conn.execute(sql)

    now = time.time()
    defaults: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "installed_at": now, "capacity": wanted,
                                "dropped_writes_total": 0, "kept_after_fence_total": 0, "evicted_total": 0}
    if 0 < installed_version < 4:
        # a fence is a time: a tombstone an older guard left without a usable one (edited by hand) gets this
        # moment, which drops only writes that reached the gateway before the upgrade
        conn.execute(f"UPDATE {TOMBSTONES_TABLE} SET deleted_at = ? "
                     "WHERE typeof(deleted_at) NOT IN ('integer', 'real')", (now,))
    for key, value in defaults.items():
        conn.execute(f"INSERT OR IGNORE INTO {META_TABLE} (key, value) VALUES (?, ?)", (key, value))
    conn.execute(f"UPDATE {META_TABLE} SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
    conn.execute(f"UPDATE {META_TABLE} SET value = ? WHERE key = 'capacity'", (wanted,))
    # the live count is kept by triggers from here on; (re)count once, at install time only
    (count,) = conn.execute(f"SELECT COUNT(*) FROM {TOMBSTONES_TABLE}").fetchone()
    conn.execute(f"INSERT OR REPLACE INTO {META_TABLE} (key, value) VALUES ('tombstones', ?)", (count,))

    evicted = 0
    if wanted > 0 and count > wanted:
        evicted = count - wanted
        conn.execute(f"DELETE FROM {TOMBSTONES_TABLE} WHERE seq IN "
                     f"(SELECT seq FROM {TOMBSTONES_TABLE} ORDER BY seq LIMIT ?)", (evicted,))
        conn.execute(f"UPDATE {META_TABLE} SET value = value - ? WHERE key = 'tombstones'", (evicted,))
        conn.execute(f"UPDATE {META_TABLE} SET value = value + ? WHERE key = 'evicted_total'", (evicted,))
        count -= evicted
    if refill:
        # the totals row always sums the index rows (the triggers and each fill page change both together); it is
        # reset with a new index table, and summed once when it is missing beside an existing one
        if INDEX_TABLE not in present:
            conn.execute(f"INSERT OR REPLACE INTO {TOTALS_TABLE} (id, sessions, traces) VALUES (1, 0, 0)")
        elif conn.execute(f"SELECT 1 FROM {TOTALS_TABLE} WHERE id = 1").fetchone() is None:
            conn.execute(f"INSERT INTO {TOTALS_TABLE} (id, sessions, traces) "
                         f"SELECT 1, COUNT(*), IFNULL(SUM(trace_count), 0) FROM {INDEX_TABLE}")
        conn.execute(f"INSERT OR REPLACE INTO {META_TABLE} (key, value) VALUES ('index_ready', 0)")
    for sql in _TRIGGERS.values():
        conn.execute(sql)

    repaired = [] if first else sorted(set(missing + altered) | ({"counters"} if keys_missing else set())
                                       | ({f"schema {installed_version} to {SCHEMA_VERSION}"}
                                          if 0 < installed_version < SCHEMA_VERSION else set()))
    return InstallResult(
        path=name, changed=True, created=first, repaired=repaired, capacity=wanted,
        previous_capacity=previous if previous is not None and previous != wanted else None,
        evicted=evicted, tombstones=count, indexed_sessions=0 if refill else None,
    )




def _fill_index(conn: sqlite3.Connection, writer: Writer, *,
                progress: Callable[[int, int], None] | None) -> int:
    """Fill the orphan index from the gateway's rows, one key range of ``INDEX_FILL_PAGE`` sessions per
    transaction; returns the sessions indexed.

    The triggers are in place already, so a write landing between two pages is counted by them; each page
    replaces its key range's entries (and adjusts the totals by the difference) with the figures recomputed
    inside the same transaction, so an entry a trigger made for a session not yet filled is corrected, and an
    entry of a session filled before is exact. The last page has no upper bound and marks the index ready.
    """
    last = ""
    done_rows = done_sessions = 0
    estimate = 0
    page = 0
    while True:  # bounded: every page moves ``last`` forward through the sessions; a short page is the last
        if page:
            time.sleep(writer.pause)  # the gateway's waiting writer goes next
        page += 1
        with writer.transaction():
            if page == 1:
                # the gateway's rowids only grow: the largest one is an estimate of the rows to read
                (estimate,) = conn.execute("SELECT IFNULL(MAX(rowid), 0) FROM trace_sessions").fetchone()
            # the full scan's page (the first one starts AT the smallest key: an empty session id is a session too)
            after = "session_id >= ?" if page == 1 else "session_id > ?"
            rows = conn.execute(FIRST_SESSION_PAGE_SQL if page == 1 else SESSION_PAGE_SQL,
                                (last, INDEX_FILL_PAGE)).fetchall()
            final = len(rows) < INDEX_FILL_PAGE
            bound, args = ((after, (last,)) if final
                           else (f"{after} AND session_id <= ?", (last, rows[-1][0])))
            old_sessions, old_traces = conn.execute(
                f"SELECT COUNT(*), IFNULL(SUM(trace_count), 0) FROM {INDEX_TABLE} WHERE {bound}", args).fetchone()
            conn.execute(f"DELETE FROM {INDEX_TABLE} WHERE {bound}", args)
            conn.executemany(f"INSERT INTO {INDEX_TABLE} (session_id, trace_count, first_trace_at, last_trace_at) "
                             "VALUES (?, ?, ?, ?)", rows)
            traces = sum(int(row[1]) for row in rows)
            conn.execute(f"UPDATE {TOTALS_TABLE} SET sessions = sessions - ? + ?, traces = traces - ? + ? "
                         "WHERE id = 1", (old_sessions, len(rows), old_traces, traces))
            if final:
                conn.execute(f"UPDATE {META_TABLE} SET value = 1 WHERE key = 'index_ready'")
        done_rows += traces
        done_sessions += len(rows)
        if progress is not None:
            progress(done_rows, max(estimate, done_rows))
        if final:
            return done_sessions
        last = rows[-1][0]


def uninstall(path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> UninstallResult:
    """Drop the guard's triggers, indexes and tables from ``path``; the gateway's own objects and rows
    stay exactly as they are. Tombstones are discarded: stragglers resurrect sessions again afterwards."""
    name = str(path)
    with _writing(path, busy_timeout=busy_timeout) as (conn, writer), writer.transaction():
        present = _objects(conn)
        tombstones = 0
        if TOMBSTONES_TABLE in present:
            (tombstones,) = conn.execute(f"SELECT COUNT(*) FROM {TOMBSTONES_TABLE}").fetchone()
        removed: list[str] = []
        for trigger in _TRIGGERS:
            if trigger in present:
                conn.execute(f"DROP TRIGGER {trigger}")
                removed.append(trigger)
        for name, kind in sorted(_legacy_objects(conn).items(), key=lambda item: item[1] != "TRIGGER"):
            conn.execute(f"DROP {kind} {name}")
            removed.append(name)
        for index in _INDEXES:
            if index in present:
                conn.execute(f"DROP INDEX {index}")
                removed.append(index)
        for table in _TABLES:
            if table in present:
                conn.execute(f"DROP TABLE {table}")
                removed.append(table)
    return UninstallResult(path=name, removed=removed, tombstones=int(tombstones))
