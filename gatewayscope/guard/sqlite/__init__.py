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
guard's tables is in this package: the scan's tombstone reads (:func:`read_for_scan`) and the session deletes'
tombstone checks (:func:`is_tombstoned`) too. Its modules: :mod:`.schema` (every table, index and trigger, as
SQL), :mod:`.lifecycle` (install, upgrade, uninstall, the integrity check), :mod:`.state` (status, the figures,
tombstones by hand), :mod:`.reads` (the scan's and the deletes' reads) and :mod:`._common` (results, connections,
checks).
"""

from __future__ import annotations

from gatewayscope.guard.sqlite._common import (
    Dropper,
    GuardStatus,
    InstallResult,
    UninstallResult,
)
from gatewayscope.guard.sqlite.lifecycle import (
    CHECK_HOLD_SECONDS,
    IntegrityResult,
    check_integrity,
    install,
    uninstall,
)
from gatewayscope.guard.sqlite.reads import (
    INDEX_PAGE,
    IndexRead,
    has_tombstone_table,
    is_tombstoned,
    read_for_scan,
    read_index_for_scan,
    tombstone_of,
)
from gatewayscope.guard.sqlite.schema import (
    DEFAULT_BUSY_TIMEOUT,
    DEFAULT_CAPACITY,
    DEFAULT_TOP,
    GUARD_OBJECTS,
    INDEX_FILL_PAGE,
    INDEX_OBJECTS,
    INDEX_TABLE,
    LEGACY_OBJECTS,
    META_TABLE,
    QUERY_BATCH,
    REUSES_TABLE,
    SCHEMA_VERSION,
    TOMBSTONE_PAGE,
    TOMBSTONES_TABLE,
    TOTALS_TABLE,
    TRIGGER_NAMES,
    WRITE_BATCH,
)
from gatewayscope.guard.sqlite.state import (
    add_tombstones,
    lift_tombstone,
    read_guard,
    status,
    tombstone_count,
    tombstoned_among,
)

__all__ = [
    "CHECK_HOLD_SECONDS",
    "DEFAULT_BUSY_TIMEOUT",
    "DEFAULT_CAPACITY",
    "DEFAULT_TOP",
    "GUARD_OBJECTS",
    "INDEX_FILL_PAGE",
    "INDEX_OBJECTS",
    "INDEX_PAGE",
    "INDEX_TABLE",
    "LEGACY_OBJECTS",
    "META_TABLE",
    "QUERY_BATCH",
    "REUSES_TABLE",
    "SCHEMA_VERSION",
    "TOMBSTONES_TABLE",
    "TOMBSTONE_PAGE",
    "TOTALS_TABLE",
    "TRIGGER_NAMES",
    "WRITE_BATCH",
    "Dropper",
    "GuardStatus",
    "IndexRead",
    "InstallResult",
    "IntegrityResult",
    "UninstallResult",
    "add_tombstones",
    "check_integrity",
    "has_tombstone_table",
    "install",
    "is_tombstoned",
    "lift_tombstone",
    "read_for_scan",
    "read_guard",
    "read_index_for_scan",
    "status",
    "tombstone_count",
    "tombstone_of",
    "tombstoned_among",
    "uninstall",
]
