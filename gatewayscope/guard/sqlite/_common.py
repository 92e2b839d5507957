"""What the SQLite guard's modules share: its results, its connections to the gateway's file and the checks of
what is in it."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gatewayscope._sqlite.locking import (
    Writer,
    open_descriptors,
)
from gatewayscope._sqlite.open import open_store, store_error
from gatewayscope._sqlite.schema import check_trace_store
from gatewayscope.errors import ConfigError
from gatewayscope.guard.sqlite.schema import (
    _INDEXES,
    _TABLES,
    _TRIGGERS,
    DEFAULT_CAPACITY,
    GUARD_OBJECTS,
    INDEX_OBJECTS,
    LEGACY_OBJECTS,
    META_TABLE,
)

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
