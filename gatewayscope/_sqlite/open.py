"""Opening an rLLM SQLite trace store file, and the StoreError sentence for each way SQLite fails on it.

A file is only ever opened, never created (``mode=ro`` or ``mode=rw``), in autocommit mode: every transaction
is begun explicitly, so none stays open by accident and holds up the gateway.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Literal

from gatewayscope._files import kind_of
from gatewayscope.errors import StoreError

#: who the sentence speaks for: a scan of a target (whose remedy is the target's ``timeout_seconds``), or the
#: guard's commands (which take ``--busy-timeout`` and write into the file)
Wording = Literal["scan", "guard"]


def store_error(path: str, err: sqlite3.Error, *, wording: Wording = "scan", busy_timeout: float = 10.0) -> StoreError:
    """The StoreError for SQLite's ``err`` on the file at ``path``: what went wrong and what to do about it.

    >>> locked = sqlite3.OperationalError("database is locked")
    >>> print(store_error("/x.db", locked, wording="guard", busy_timeout=2))  # doctest: +NORMALIZE_WHITESPACE
    /x.db stayed locked by another writer for more than 2 s (database is locked);
    try again, or give a longer busy timeout.
    """
    text = str(err)
    if "not a database" in text or "malformed" in text:
        advice = ("is this the gateway's trace store?" if wording == "scan"
                  else "give the gateway's trace store (rllm-model-gateway --db-path).")
        return StoreError(f"{path} is not a SQLite database ({text}); {advice}")
    if "locked" in text or "busy" in text:
        if wording == "scan":
            return StoreError(f"{path} is locked by another process ({text}); it stayed locked past the busy "
                              "timeout. Try again, or raise timeout_seconds for this target.")
        return StoreError(f"{path} stayed locked by another writer for more than {busy_timeout:g} s "
                          f"({text}); try again, or give a longer busy timeout.")
    if wording == "guard" and ("readonly" in text or "read-only" in text):
        return StoreError(f"{path} is read-only for this user ({text}); run as a user that may write it "
                          "(and its folder, for the journal).")
    if "unable to open" in text:
        wal = " (a WAL store needs its folder to be readable too)" if wording == "scan" else ""
        return StoreError(f"{path} cannot be opened ({text}); check the path and its folder's permissions{wal}.")
    return StoreError(f"{path}: SQLite error: {text}")


def connect(path: str | Path, *, readonly: bool, busy_timeout: float) -> sqlite3.Connection:
    """A connection to the existing file at ``path``: autocommit, ``mode=ro`` (and ``query_only``) or ``mode=rw``,
    usable from any thread (one at a time), SQLite's busy handler waiting ``busy_timeout`` seconds.

    Raises SQLite's own errors; :func:`open_store` words them.
    """
    file = Path(path).expanduser()
    uri = f"{file.resolve().as_uri()}?mode={'ro' if readonly else 'rw'}"
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    if readonly:
        try:
            conn.execute("PRAGMA query_only = ON")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
    return conn


def open_store(path: str | Path, *, readonly: bool, busy_timeout: float,
               wording: Wording = "scan") -> sqlite3.Connection:
    """:func:`connect` to the gateway's file at ``path``, or raise StoreError saying what to do.

    A missing file, a folder and (read-only) a file this user may not read are refused before SQLite sees
    them; SQLite's own errors become :func:`store_error`'s sentences.
    """
    name = str(path)
    file = Path(path).expanduser()
    if not file.exists():
        raise StoreError(f"{name}: no such file. Give the path of the gateway's SQLite store "
                         "(rllm-model-gateway --db-path, default ~/.rllm/gateway_traces.db).")
    if file.is_dir():
        raise StoreError(f"{name} is a folder; give the gateway's SQLite file itself.")
    kind = kind_of(file.stat().st_mode)
    if kind is not None:  # SQLite's open of a FIFO waits for a writer, and a device reads without end
        raise StoreError(f"{name} is {kind}, not a regular file; give the gateway's SQLite file itself.")
    if readonly and not os.access(file, os.R_OK):
        raise StoreError(f"{name}: permission denied; run gatewayscope as a user that may read it.")
    try:
        return connect(file, readonly=readonly, busy_timeout=busy_timeout)
    except sqlite3.Error as err:
        raise store_error(name, err, wording=wording, busy_timeout=busy_timeout) from None
