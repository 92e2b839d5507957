"""The tombstone guard for the rLLM SQLite trace store, installed INTO the gateway's own file.

The unmodified ``rllm-model-gateway --store sqlite`` resurrects a deleted session when a straggling
trace write lands after its ``DELETE /sessions/{id}``. This module adds three tables and six triggers to
the gateway's database file, so the gateway itself, unchanged, drops those writes (and the orphan index's
two tables and three triggers, below). A tombstone is a **fence in time** (:mod:`gatewayscope.orphan_rule`):
a write whose request reached the gateway before its id's latest delete is dropped; one that came after is a
new use of the id and is kept.

``gatewayscope_tombstones``
    one row per deleted session id: ``session_id`` (primary key), ``deleted_at`` (the fence: the moment of
    its latest delete, or of its backfill), ``dropped_writes``, ``last_dropped_at``, plus ``seq`` (insertion
    order, for the FIFO cap; a new delete of the id moves it to the young end), ``source`` (``delete`` or
    ``backfill``), ``last_dropped_trace_id``, and ``pending_trace_id`` (unused since guard schema 3; kept so
    a file installed by an older gatewayscope keeps its table as it is).
``gatewayscope_reuses``
    one row per tombstoned id written again after its fence: ``kept_writes``, ``first_kept_at``,
    ``last_kept_at``. A scan does not take such a session for an orphan (its id is in use again); the next
    delete of the id takes the row away with the old fence.
``gatewayscope_guard``
    key/value: ``schema_version``, ``installed_at``, ``capacity``, ``tombstones`` (the live count, kept
    by triggers so nothing ever counts the table), ``dropped_writes_total``, ``kept_after_fence_total``,
    ``evicted_total``.

Triggers (the gateway writes a trace with ``INSERT OR REPLACE INTO traces`` then ``INSERT OR IGNORE INTO
trace_sessions``, one commit; it deletes a session's junction rows, then its unshared traces):

* ``gatewayscope_tombstone_on_delete`` (AFTER DELETE ON trace_sessions): when the session's last junction
  row goes while its trace row still exists, the session's fence is set to now (a new tombstone, or the old
  one moved to this delete, forgetting any use since the old fence). The trace-row condition tells the
  gateway's delete (junction rows first) from a foreign-key cascade, which runs after the parent row is gone:
  ``INSERT OR REPLACE`` of an existing trace id cascades to its junction rows, and that must not tombstone a
  live session.
* ``gatewayscope_drop_session_link`` (BEFORE INSERT ON trace_sessions): a junction row for a tombstoned
  session whose trace was dispatched before the fence (``orphan_rule.dispatched_at_sql`` over the trace row's
  JSON, read only for tombstoned sessions) is skipped with ``RAISE(IGNORE)``, counted, and the unshared trace
  row it belongs to is removed, so no orphan trace row remains. A trace whose dispatch time is unknown, or at
  or after the fence, is kept: a kept straggler is an orphan a scan finds later, a dropped new use is lost.
  ``RAISE(IGNORE)`` in a BEFORE trigger skips the row before the foreign-key check.
* ``gatewayscope_keep_shared_trace`` (BEFORE INSERT ON traces): a straggler's ``INSERT OR REPLACE`` of a trace
  id the store already holds (one shared with another session) is skipped, so the replace cannot cascade to the
  other session's junction row. Only a write of an existing trace id pays for its JSON; the gateway writes every
  call under a new id.
* ``gatewayscope_count_reuse`` (AFTER INSERT ON trace_sessions): a junction row that landed for a tombstoned
  session is a write kept after the fence: counted, and its session recorded in ``gatewayscope_reuses``.
* ``gatewayscope_tombstones_after_insert`` / ``gatewayscope_tombstones_after_delete``: keep the live count
  and evict the oldest tombstones beyond the capacity (FIFO, counted). Capacity 0 means unlimited.

The orphan index (guard schema 2), so a scan reads only the candidate sessions:

``gatewayscope_sessions``
    per session: ``trace_count``, ``first_trace_at``, ``last_trace_at`` (the full read's GROUP BY of
    ``trace_sessions``), with a partial index of the one-trace sessions by ``last_trace_at``.
``gatewayscope_session_totals``
    one row: the sessions in the index and their trace counts summed.

``gatewayscope_index_on_insert`` / ``_on_delete`` / ``_on_update`` (on ``trace_sessions``) keep both: an insert
is one totals update and one UPSERT by primary key; a delete drops the session's entry with its last row, or
reads its first and last time again from the gateway's ``(session_id, created_at)`` index. ``install`` fills
the index from the existing rows in short transactions after the triggers are in place, and marks it ready
(``index_ready`` in ``gatewayscope_guard``) with the last one; :func:`read_index_for_scan` reads it only then.

Cost per trace write: two primary-key lookups in the tombstone table (one per trigger on the junction row),
plus the index's recount of the session's junction rows and its UPSERT. Only a write for a tombstoned session
parses the trace's JSON. Nothing scans a table per write.

Every write here is a short ``BEGIN EXCLUSIVE`` transaction taken by :class:`gatewayscope._sqlite.locking.Writer`,
so it can run while the gateway writes (the gateway's own busy timeout is 20 s); reads are plain autocommit
statements. DELETE and WAL journal modes both work; the journal mode is never changed. Every statement on the
guard's tables is in this module: the scan's tombstone reads (:func:`read_for_scan`) and the session deletes'
tombstone checks (:func:`is_tombstoned`) too.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gatewayscope._sqlite.locking import (
    Transaction,
    Writer,
    is_busy,
    open_descriptors,
    retry_while_locked,
    yield_seconds,
)
from gatewayscope._sqlite.open import open_store, store_error
from gatewayscope._sqlite.schema import FIRST_SESSION_PAGE_SQL, SESSION_PAGE_SQL, check_trace_store
from gatewayscope._sqlite.statements import StatementWatch, fetch_all
from gatewayscope.errors import ConfigError, StoreError
from gatewayscope.guard.common import GuardStats
from gatewayscope.orphan_rule import Tombstone, before_fence_sql, dispatched_at_sql
from gatewayscope.sources._batches import batches

#: version of the tables and triggers below; install refuses a file installed by a newer gatewayscope
SCHEMA_VERSION = 4
#: default FIFO capacity of the tombstone table (the in-memory guard's ``max_tombstones`` default too)
DEFAULT_CAPACITY = 1_000_000
#: seconds a write here waits for the gateway's lock before giving up
DEFAULT_BUSY_TIMEOUT = 10.0
#: how many sessions ``status`` lists by dropped writes
DEFAULT_TOP = 10
#: session ids per SQL statement (well under SQLite's variable limit)
QUERY_BATCH = 500
#: session ids per backfill transaction (keeps each write lock short)
WRITE_BATCH = 5_000
#: tombstone ids per key range when the scan reads the tombstoned sessions
TOMBSTONE_PAGE = 4000

#: sessions per orphan-index fill transaction at install (each a few milliseconds of the write lock)
INDEX_FILL_PAGE = 2_000

TOMBSTONES_TABLE = "gatewayscope_tombstones"
META_TABLE = "gatewayscope_guard"
#: the tombstoned ids written again after their fence (a new use of the id)
REUSES_TABLE = "gatewayscope_reuses"
#: the orphan index: per session, its trace count and first and last trace time, kept by triggers
INDEX_TABLE = "gatewayscope_sessions"
#: one row: the number of sessions in the index and the sum of their trace counts
TOTALS_TABLE = "gatewayscope_session_totals"

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"

_TABLES: dict[str, str] = {
    TOMBSTONES_TABLE: f"""
CREATE TABLE {TOMBSTONES_TABLE} (
    session_id TEXT PRIMARY KEY,
    deleted_at REAL NOT NULL,
    dropped_writes INTEGER NOT NULL DEFAULT 0,
    last_dropped_at REAL,
    seq INTEGER NOT NULL,
    source TEXT NOT NULL DEFAULT 'delete',
    last_dropped_trace_id TEXT,
    pending_trace_id TEXT
)""",
    REUSES_TABLE: f"""
CREATE TABLE {REUSES_TABLE} (
    session_id TEXT PRIMARY KEY,
    kept_writes INTEGER NOT NULL,
    first_kept_at REAL,
    last_kept_at REAL
) WITHOUT ROWID""",
    META_TABLE: f"""
CREATE TABLE {META_TABLE} (
    key TEXT PRIMARY KEY,
    value NOT NULL
)""",
    INDEX_TABLE: f"""
CREATE TABLE {INDEX_TABLE} (
    session_id TEXT PRIMARY KEY,
    trace_count INTEGER NOT NULL,
    first_trace_at REAL,
    last_trace_at REAL
) WITHOUT ROWID""",
    TOTALS_TABLE: f"""
CREATE TABLE {TOTALS_TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    sessions INTEGER NOT NULL,
    traces INTEGER NOT NULL
)""",
}

_INDEXES: dict[str, str] = {
    # FIFO order: the oldest tombstone is the smallest seq
    "gatewayscope_tombstones_seq": f"CREATE INDEX gatewayscope_tombstones_seq ON {TOMBSTONES_TABLE}(seq)",
    # partial: only sessions with dropped writes, so a plain tombstone insert never touches it
    "gatewayscope_tombstones_droppers": (
        f"CREATE INDEX gatewayscope_tombstones_droppers ON {TOMBSTONES_TABLE}(dropped_writes) "
        "WHERE dropped_writes > 0"
    ),
    # partial: only one-trace sessions, ordered by their trace's time: the scan's suspected-orphan candidates
    "gatewayscope_sessions_single": (
        f"CREATE INDEX gatewayscope_sessions_single ON {INDEX_TABLE}(last_trace_at) WHERE trace_count = 1"
    ),
}

_META_SQL = f"(SELECT value FROM {META_TABLE} WHERE key = '{{key}}')"
_COUNT = _META_SQL.format(key="tombstones")
_CAPACITY = _META_SQL.format(key="capacity")
_EXCESS = f"(CASE WHEN {_CAPACITY} > 0 AND {_COUNT} > {_CAPACITY} THEN {_COUNT} - {_CAPACITY} ELSE 0 END)"

#: the orphan index's share of a junction row written: the session's entry recounted from the gateway's rows (two
#: seeks and a walk of the session's rows over its indexes), so a replaced row or a NULL time keeps it exact, and
#: the totals moved by the difference
_INDEX_ADD_NEW = f"""
    UPDATE {TOTALS_TABLE}
       SET traces = traces + (SELECT COUNT(*) FROM trace_sessions WHERE session_id = NEW.session_id)
                    - IFNULL((SELECT trace_count FROM {INDEX_TABLE} WHERE session_id = NEW.session_id), 0),
           sessions = sessions + NOT EXISTS (SELECT 1 FROM {INDEX_TABLE} WHERE session_id = NEW.session_id)
     WHERE id = 1;
    INSERT INTO {INDEX_TABLE} (session_id, trace_count, first_trace_at, last_trace_at)
    SELECT NEW.session_id, COUNT(*), MIN(created_at), MAX(created_at) FROM trace_sessions
     WHERE session_id = NEW.session_id
    ON CONFLICT (session_id) DO UPDATE SET trace_count = excluded.trace_count,
           first_trace_at = excluded.first_trace_at, last_trace_at = excluded.last_trace_at;
"""
#: ... and of a junction row gone: the session's entry goes with its last row; otherwise one less, its first and
#: last times read again from the gateway's (session_id, created_at) index (two seeks)
_INDEX_REMOVE_OLD = f"""
    UPDATE {TOTALS_TABLE} SET traces = traces - 1,
           sessions = sessions - (SELECT trace_count <= 1 FROM {INDEX_TABLE} WHERE session_id = OLD.session_id)
     WHERE id = 1 AND EXISTS (SELECT 1 FROM {INDEX_TABLE} WHERE session_id = OLD.session_id);
    DELETE FROM {INDEX_TABLE} WHERE session_id = OLD.session_id AND trace_count <= 1;
    UPDATE {INDEX_TABLE} SET trace_count = trace_count - 1,
           first_trace_at = (SELECT MIN(created_at) FROM trace_sessions WHERE session_id = OLD.session_id),
           last_trace_at = (SELECT MAX(created_at) FROM trace_sessions WHERE session_id = OLD.session_id)
     WHERE session_id = OLD.session_id;
"""

#: the fence of NEW.session_id's tombstone (NULL when its time is not a number: such a fence drops nothing)
_FENCE_OF_NEW = (f"(SELECT CASE WHEN typeof(deleted_at) IN ('integer', 'real') THEN deleted_at END "
                 f"FROM {TOMBSTONES_TABLE} WHERE session_id = NEW.session_id)")
#: the session a trace row being written names in its JSON (NULL for text that is not JSON)
_SESSION_OF_NEW_DATA = "(CASE WHEN json_valid(NEW.data) THEN json_extract(NEW.data, '$.session_id') END)"
_FENCE_OF_NEW_DATA = (f"(SELECT CASE WHEN typeof(deleted_at) IN ('integer', 'real') THEN deleted_at END "
                      f"FROM {TOMBSTONES_TABLE} WHERE session_id = {_SESSION_OF_NEW_DATA})")
#: when NEW.trace_id's request was dispatched (the JSON is parsed only where this is evaluated)
_DISPATCH_OF_NEW = f"(SELECT {dispatched_at_sql('data')} FROM traces WHERE trace_id = NEW.trace_id)"

_TRIGGERS: dict[str, str] = {
    "gatewayscope_tombstone_on_delete": f"""
CREATE TRIGGER gatewayscope_tombstone_on_delete
AFTER DELETE ON trace_sessions
WHEN EXISTS (SELECT 1 FROM traces WHERE trace_id = OLD.trace_id)
 AND NOT EXISTS (SELECT 1 FROM trace_sessions WHERE session_id = OLD.session_id)
BEGIN
    INSERT INTO {TOMBSTONES_TABLE} (session_id, deleted_at, seq, source)
    VALUES (OLD.session_id, {_NOW}, (SELECT IFNULL(MAX(seq), 0) + 1 FROM {TOMBSTONES_TABLE}), 'delete')
    ON CONFLICT (session_id) DO UPDATE SET deleted_at = excluded.deleted_at, seq = excluded.seq,
           source = 'delete';
    DELETE FROM {REUSES_TABLE} WHERE session_id = OLD.session_id;
END""",
    "gatewayscope_drop_session_link": f"""
CREATE TRIGGER gatewayscope_drop_session_link
BEFORE INSERT ON trace_sessions
WHEN CASE WHEN EXISTS (SELECT 1 FROM {TOMBSTONES_TABLE} WHERE session_id = NEW.session_id)
          THEN {before_fence_sql(_DISPATCH_OF_NEW, _FENCE_OF_NEW)} ELSE 0 END
BEGIN
    UPDATE {META_TABLE} SET value = value + 1 WHERE key = 'dropped_writes_total';
    UPDATE {TOMBSTONES_TABLE}
       SET dropped_writes = dropped_writes + 1, last_dropped_at = {_NOW}, last_dropped_trace_id = NEW.trace_id
     WHERE session_id = NEW.session_id;
    DELETE FROM traces WHERE trace_id = NEW.trace_id
       AND NOT EXISTS (SELECT 1 FROM trace_sessions WHERE trace_id = NEW.trace_id);
    SELECT RAISE(IGNORE);
END""",
    "gatewayscope_keep_shared_trace": f"""
CREATE TRIGGER gatewayscope_keep_shared_trace
BEFORE INSERT ON traces
WHEN EXISTS (SELECT 1 FROM traces WHERE trace_id = NEW.trace_id)
 AND CASE WHEN EXISTS (SELECT 1 FROM {TOMBSTONES_TABLE} WHERE session_id = {_SESSION_OF_NEW_DATA})
          THEN {before_fence_sql(dispatched_at_sql("NEW.data"), _FENCE_OF_NEW_DATA)} ELSE 0 END
BEGIN
    SELECT RAISE(IGNORE);
END""",
    "gatewayscope_count_reuse": f"""
CREATE TRIGGER gatewayscope_count_reuse
AFTER INSERT ON trace_sessions
WHEN EXISTS (SELECT 1 FROM {TOMBSTONES_TABLE} WHERE session_id = NEW.session_id)
BEGIN
    UPDATE {META_TABLE} SET value = value + 1 WHERE key = 'kept_after_fence_total';
    INSERT INTO {REUSES_TABLE} (session_id, kept_writes, first_kept_at, last_kept_at)
    VALUES (NEW.session_id, 1, {_NOW}, {_NOW})
    ON CONFLICT (session_id) DO UPDATE SET kept_writes = kept_writes + 1, last_kept_at = excluded.last_kept_at;
END""",
    "gatewayscope_tombstones_after_insert": f"""
CREATE TRIGGER gatewayscope_tombstones_after_insert
AFTER INSERT ON {TOMBSTONES_TABLE}
BEGIN
    UPDATE {META_TABLE} SET value = value + 1 WHERE key = 'tombstones';
    UPDATE {META_TABLE} SET value = value + {_EXCESS} WHERE key = 'evicted_total' AND {_EXCESS} > 0;
    DELETE FROM {TOMBSTONES_TABLE} WHERE seq IN
        (SELECT seq FROM {TOMBSTONES_TABLE} ORDER BY seq LIMIT {_EXCESS});
END""",
    "gatewayscope_tombstones_after_delete": f"""
CREATE TRIGGER gatewayscope_tombstones_after_delete
AFTER DELETE ON {TOMBSTONES_TABLE}
BEGIN
    UPDATE {META_TABLE} SET value = value - 1 WHERE key = 'tombstones';
    DELETE FROM {REUSES_TABLE} WHERE session_id = OLD.session_id;
END""",
    # the orphan index: one recount and UPSERT by primary key per junction row written, in step with the totals row
    "gatewayscope_index_on_insert": f"""
CREATE TRIGGER gatewayscope_index_on_insert
AFTER INSERT ON trace_sessions
BEGIN
{_INDEX_ADD_NEW}END""",
    "gatewayscope_index_on_delete": f"""
CREATE TRIGGER gatewayscope_index_on_delete
AFTER DELETE ON trace_sessions
BEGIN
{_INDEX_REMOVE_OLD}END""",
    # the gateway never updates a junction row; any other writer that does is counted as a delete and an insert
    "gatewayscope_index_on_update": f"""
CREATE TRIGGER gatewayscope_index_on_update
AFTER UPDATE OF session_id, created_at ON trace_sessions
BEGIN
{_INDEX_REMOVE_OLD}{_INDEX_ADD_NEW}END""",
}

#: names of every object the guard adds to the gateway's file (all dropped by ``uninstall``)
TRIGGER_NAMES: tuple[str, ...] = tuple(_TRIGGERS)
GUARD_OBJECTS: tuple[str, ...] = (*_TRIGGERS, *_INDEXES, *_TABLES)
#: the orphan index's objects (schema 2): checked apart from the tombstone guard's, so a guard installed by an
#: older gatewayscope (schema 1, no index) still counts as intact; its scans take the full path
INDEX_OBJECTS: tuple[str, ...] = (INDEX_TABLE, TOTALS_TABLE, "gatewayscope_sessions_single",
                                  "gatewayscope_index_on_insert", "gatewayscope_index_on_delete",
                                  "gatewayscope_index_on_update")

_COUNTER_KEYS = ("tombstones", "dropped_writes_total", "kept_after_fence_total", "evicted_total")
#: objects an older gatewayscope installed that this one no longer has: install and uninstall drop them (the
#: schema-3 trace trigger parsed every trace's JSON; its pending table only served it)
LEGACY_OBJECTS: dict[str, str] = {"gatewayscope_drop_trace": "TRIGGER", "gatewayscope_pending_drops": "TABLE"}


# -- results -----------------------------------------------------------------------------------


@dataclass
class InstallResult:
    """What ``install`` did. ``changed`` is False when the guard was already there exactly as asked."""

    path: str
    changed: bool
    created: bool  # tables created now (first install)
    repaired: list[str] = field(default_factory=list)  # objects that were missing or altered, now recreated
    capacity: int = DEFAULT_CAPACITY
    previous_capacity: int | None = None  # set when the capacity changed
    evicted: int = 0  # tombstones evicted now because the capacity went down
    tombstones: int = 0
    indexed_sessions: int | None = None  # set when the orphan index was (re)built now: the sessions it holds
    #: what the integrity check before the writes covered ("full", or "schema": see check_integrity)
    checked: str | None = None

    @property
    def message(self) -> str:
        """One sentence for the user."""
        cap = _capacity_text(self.capacity)
        if not self.changed:
            return (f"The tombstone guard is already installed in {self.path} (capacity {cap}, "
                    f"{self.tombstones:,} tombstones); nothing changed.")
        index = ("" if self.indexed_sessions is None else
                 f" Built its orphan index of {self.indexed_sessions:,} sessions: scans read only the candidates.")
        if self.created:
            return (f"Installed the tombstone guard into {self.path} (capacity {cap}): the gateway now drops "
                    f"the trace writes of calls sent before their session's delete instead of resurrecting it, "
                    f"and keeps every later use of the id.{index}{self._checked}")
        parts = []
        if self.repaired:
            parts.append(f"recreated {', '.join(self.repaired)}")
        if self.previous_capacity is not None:
            text = f"changed the capacity from {_capacity_text(self.previous_capacity)} to {cap}"
            if self.evicted:
                text += f" (evicted the {self.evicted:,} oldest tombstones)"
            parts.append(text)
        if not parts:
            parts.append("completed the orphan index")
        return f"Updated the tombstone guard in {self.path}: {'; '.join(parts)}.{index}{self._checked}"

    @property
    def _checked(self) -> str:
        if self.checked != "schema":
            return ""
        return (" The file is too large to check whole without holding up the gateway's writes: its schema and the "
                "guard's tables were checked (stop the gateway and run with --full-check for the whole file).")


@dataclass
class UninstallResult:
    """What ``uninstall`` removed."""

    path: str
    removed: list[str]  # names of the guard's objects that were present and are now dropped
    tombstones: int  # tombstones that were discarded with the table

    @property
    def message(self) -> str:
        """One sentence for the user."""
        if not self.removed:
            return f"The tombstone guard is not installed in {self.path}; nothing changed."
        return (f"Removed the tombstone guard from {self.path} ({len(self.removed)} objects, "
                f"{self.tombstones:,} tombstones discarded); the gateway's tables are untouched.")


@dataclass
class Dropper:
    """A tombstoned session whose straggling writes were dropped."""

    session_id: str
    dropped: int
    deleted_at: float
    last_dropped_at: float | None
    source: str


@dataclass
class GuardStatus:
    """Everything ``status`` reports about the guard in one file."""

    path: str
    installed: bool
    triggers_intact: bool
    missing: list[str] = field(default_factory=list)  # guard objects absent from the file
    altered: list[str] = field(default_factory=list)  # guard objects whose SQL is not what install wrote
    schema_version: int | None = None
    installed_at: float | None = None
    tombstones: int = 0
    capacity: int = 0
    dropped_writes: int = 0
    #: trace writes kept for a tombstoned id because they reached the gateway after its fence (new uses)
    kept_after_fence: int = 0
    evicted: int = 0
    sessions_with_drops: int = 0
    top_droppers: list[Dropper] = field(default_factory=list)
    journal_mode: str | None = None
    #: the orphan index: "ready", "building" (install's fill not completed), "damaged" or "absent"
    index: str = "absent"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


# -- connections and checks ------------------------------------------------------------------------


def _capacity_text(capacity: int) -> str:
    return "unlimited" if capacity == 0 else f"{capacity:,}"


def _normalise(sql: str | None) -> str:
    return " ".join((sql or "").split())


@contextlib.contextmanager
def _connection(path: str | Path, *, readonly: bool, busy_timeout: float) -> Iterator[sqlite3.Connection]:
    """An open connection to the existing file at ``path``; SQLite's errors become the guard's StoreErrors."""
    conn = open_store(path, readonly=readonly, busy_timeout=busy_timeout, wording="guard")
    try:
        yield conn
    except sqlite3.Error as err:
        raise store_error(str(path), err, wording="guard", busy_timeout=busy_timeout) from None
    finally:
        conn.close()


@contextlib.contextmanager
def _writing(path: str | Path, *, busy_timeout: float) -> Iterator[tuple[sqlite3.Connection, Writer]]:
    """A read-write connection to ``path`` and the :class:`~gatewayscope._sqlite.locking.Writer` that takes its
    transactions (exclusive, into silence, waiting up to ``busy_timeout`` seconds for the lock)."""
    before = open_descriptors()
    with _connection(path, readonly=False, busy_timeout=busy_timeout) as conn:
        yield conn, Writer.for_connection(conn, path, before, busy_timeout=busy_timeout)


def _check_trace_store(conn: sqlite3.Connection, path: str) -> None:
    """Raise StoreError unless the file holds the gateway's ``traces`` and ``trace_sessions`` tables."""
    check_trace_store(conn, path, busy_timeout=0, wording="guard", ours=_TABLES)


def _objects(conn: sqlite3.Connection) -> dict[str, str | None]:
    """The guard's objects present in the file: name -> SQL."""
    marks = ",".join("?" * len(GUARD_OBJECTS))
    return {name: sql for name, sql in conn.execute(
        f"SELECT name, sql FROM sqlite_master WHERE name IN ({marks})", GUARD_OBJECTS)}


def _expected_sql() -> dict[str, str]:
    return {**_TABLES, **_INDEXES, **_TRIGGERS}


def _integrity(conn: sqlite3.Connection, *, index: bool = False) -> tuple[list[str], list[str]]:
    """(missing, altered) objects of the tombstone guard (with ``index``: of the orphan index), compared by their
    SQL with whitespace normalised."""
    present = _objects(conn)
    missing: list[str] = []
    altered: list[str] = []
    for name, sql in _expected_sql().items():
        if (name in INDEX_OBJECTS) != index:
            continue
        if name not in present:
            missing.append(name)
        elif _normalise(present[name]) != _normalise(sql):
            altered.append(name)
    return missing, altered


def _legacy_objects(conn: sqlite3.Connection) -> dict[str, str]:
    """The objects of :data:`LEGACY_OBJECTS` present in the file: name -> its kind (TRIGGER or TABLE)."""
    marks = ",".join("?" * len(LEGACY_OBJECTS))
    return {name: LEGACY_OBJECTS[name] for (name,) in conn.execute(
        f"SELECT name FROM sqlite_master WHERE name IN ({marks})", tuple(LEGACY_OBJECTS))}


def _meta(conn: sqlite3.Connection) -> dict[str, Any]:
    return {key: value for key, value in conn.execute(f"SELECT key, value FROM {META_TABLE}")}


def _index_state(conn: sqlite3.Connection, present: dict[str, str | None], meta: dict[str, Any]) -> str:
    """The orphan index's state: ``absent`` (none of its objects: a guard installed by an older gatewayscope),
    ``damaged`` (some missing or altered), ``building`` (its fill at install has not completed) or ``ready``."""
    if not any(name in present for name in INDEX_OBJECTS):
        return "absent"
    missing, altered = _integrity(conn, index=True)
    if missing or altered:
        return "damaged"
    return "ready" if meta.get("index_ready") == 1 else "building"


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def _as_int(value: Any, default: int = 0) -> int:
    return int(value) if isinstance(value, (int, float)) else default


def _validate_capacity(capacity: int | None) -> None:
    if capacity is None:
        return
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ConfigError("The tombstone capacity must be a whole number >= 0 (0 = unlimited), "
                          f"not {capacity!r}.")


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
    try:
        (mode,) = retry_while_locked(lambda: conn.execute("PRAGMA journal_mode").fetchone(), busy_timeout)
        bounded = str(mode).lower() != "wal" and not full
        _begin_read(conn, busy_timeout)
        held_from = time.monotonic()
        if bounded:
            conn.set_progress_handler(lambda: 1 if time.monotonic() - held_from > hold_seconds else 0, _CHECK_STEPS)
        try:
            problems = _quick_check(conn)
        except sqlite3.OperationalError as err:
            if "interrupt" not in str(err):
                raise
            conn.execute("ROLLBACK")  # the gateway's waiting commits go through
            scope, problems = "schema", []
            tables = ["sqlite_master", *(t for t in _TABLES if _has_table(conn, t))]
            for table in tables:  # bounded: one table each
                time.sleep(yield_seconds(hold_seconds))
                _begin_read(conn, busy_timeout)
                held_from = time.monotonic()
                problems += _quick_check(conn, table=table)
                conn.execute("ROLLBACK")
        finally:
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
