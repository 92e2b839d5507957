"""The SQLite guard's schema: every table, index and trigger it puts into the gateway's file, as SQL, and the
names and version that go with them. Nothing here runs a statement: :mod:`.lifecycle` writes these, the other
modules read through them."""

from __future__ import annotations

from gatewayscope.orphan_rule import before_fence_sql, dispatched_at_sql

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
