"""One read of a live trace store: the connection and what its statements need, opened and closed as one."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

from gatewayscope._sqlite.locking import WriterProbe, open_descriptors
from gatewayscope._sqlite.open import open_store, store_error
from gatewayscope._sqlite.schema import check_trace_store
from gatewayscope._sqlite.statements import StatementWatch


@dataclass
class StoreRead:
    """An open read-only connection to a trace store, its tables, the probe that sees the gateway's writer wait
    (None where it cannot look) and the watch that interrupts a statement stuck past its end."""

    conn: sqlite3.Connection
    path: str
    #: how long one statement may wait for the lock (seconds)
    wait: float
    tables: set[str]
    probe: WriterProbe | None
    watch: StatementWatch


@contextlib.contextmanager
def reading_store(path: str, wait: float) -> Iterator[StoreRead]:
    """Open the store at ``path`` read-only for statements that poll for the lock themselves (SQLite's busy
    handler off), check that it holds the gateway's tables, find SQLite's descriptor of it for the writer probe
    and start a statement watch; all closed on exit. A SQLite error inside becomes the StoreError that says
    what to do about ``path``."""
    descriptors = open_descriptors()
    conn = open_store(path, readonly=True, busy_timeout=wait)
    watch: StatementWatch | None = None
    try:
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            tables = check_trace_store(conn, path, busy_timeout=wait)
            probe = WriterProbe.for_new_descriptor(path, descriptors)  # SQLite opened the file by now
            watch = StatementWatch(conn)
            yield StoreRead(conn=conn, path=path, wait=wait, tables=tables, probe=probe, watch=watch)
        except sqlite3.Error as err:
            raise store_error(path, err) from None
    finally:
        if watch is not None:
            watch.close()
        conn.close()
