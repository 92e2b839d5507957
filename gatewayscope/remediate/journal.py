"""The append-only apply journal: one JSON object per line, every attempt and every outcome.

It makes a plan single-use (an action with an outcome is never run again) and lets an interrupted
apply resume where it stopped. Lines are flushed and fsync'd as they are written; a torn last line
(a crash mid-write) is ignored on reading. No secret is ever written here: events carry ids, names,
outcomes and the gateway's error sentences, never request bodies or credentials.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gatewayscope._files import MAX_JOURNAL_BYTES, check_regular, read_text
from gatewayscope.errors import PlanError

FINAL_OUTCOMES = ("done", "refused", "unconfirmed", "gone", "stale", "already-done")


class Journal:
    """An append-only JSONL file shared by the threads of one apply."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one event line now (flushed and fsync'd) and return it."""
        return self.append_many([(event, fields)])[0]

    def append_many(self, events: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Write several event lines with one flush and fsync (all of them are on disk when it returns)."""
        now = round(time.time(), 6)
        records = [{"ts": now, "event": event, **fields} for event, fields in events]
        text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":"), default=str) + "\n" for r in records)
        with self._lock:
            try:
                check_regular(self.path)  # a FIFO's open for writing waits for a reader
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as err:
                raise PlanError(f"Cannot write the journal {self.path}: {err.strerror or err}. Nothing more "
                                "is sent until the journal can be written.") from None
        return records

    def read(self) -> list[dict[str, Any]]:
        """Every well-formed event, oldest first (a torn last line is skipped)."""
        try:
            text = read_text(self.path, limit=MAX_JOURNAL_BYTES)
        except FileNotFoundError:
            return []
        except OSError as err:
            raise PlanError(f"Cannot read the journal {self.path}: {err.strerror or err}.") from None
        except UnicodeDecodeError:
            raise PlanError(f"Cannot read the journal {self.path}: it is not UTF-8 text, so not a journal "
                            "gatewayscope wrote.") from None
        events = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # a torn line, or one nested too deeply: no event of ours
                continue
            if isinstance(record, dict):
                events.append(record)
        return events

    def outcomes(self, plan_id: str) -> dict[str, dict[str, Any]]:
        """The outcome event of each action of ``plan_id`` that has one (the last, should there be two)."""
        settled: dict[str, dict[str, Any]] = {}
        for record in self.read():
            if (record.get("plan_id") == plan_id and record.get("event") == "outcome"
                    and record.get("outcome") in FINAL_OUTCOMES):
                settled[str(record.get("action_id"))] = record
        return settled

    def attempted(self, plan_id: str) -> set[str]:
        """Actions of ``plan_id`` with at least one write attempt recorded."""
        return {str(r.get("action_id")) for r in self.read()
                if r.get("plan_id") == plan_id and r.get("event") == "attempt"}


def deleted_sessions(*journals: Journal) -> dict[str, dict[str, float]]:
    """The sessions earlier applies deleted, per target, each with the moment its delete was first sent:
    ``{target: {session_id: epoch seconds}}``, from the ``session_delete`` actions whose outcome is ``done``.

    The moment is the first recorded attempt of that action (written before anything was sent, so at or before
    the delete itself): a trace dispatched before it surely came before the delete. A done delete without a
    recorded attempt proves nothing and is left out; of several deletes of one session, the latest counts.
    """
    found: dict[str, dict[str, float]] = {}
    for journal in journals:
        events = journal.read()
        first: dict[tuple[str, str], float] = {}
        for event in events:
            if event.get("event") == "attempt" and event.get("kind") == "session_delete":
                key = (str(event.get("plan_id")), str(event.get("action_id")))
                stamp = event.get("ts")
                if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and stamp == stamp:
                    first[key] = min(float(stamp), first.get(key, float(stamp)))
        for event in events:
            if event.get("event") != "outcome" or event.get("kind") != "session_delete" \
                    or event.get("outcome") != "done":
                continue
            sent = first.get((str(event.get("plan_id")), str(event.get("action_id"))))
            if sent is None:
                continue
            ids = found.setdefault(str(event.get("target")), {})
            subject = str(event.get("subject"))
            ids[subject] = max(sent, ids.get(subject, sent))
    return found


class ApplyLockedError(PlanError):
    """Another apply of the same plan, or into the same journal, is running."""

    kind = "locked"


def _holder(lock_path: Path) -> str:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        info = json.loads(read_text(lock_path, limit=4096))
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["since"])))
        return f"process {int(info['pid'])} (since {since})"
    return "another process"


@contextlib.contextmanager
def _exclusive(lock_path: Path, plan_id: str, what: str) -> Iterator[None]:
    try:
        handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole apply
    except OSError as err:
        raise PlanError(f"Cannot create the lock file {lock_path}: {err.strerror or err}.") from None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ApplyLockedError(f"{what} is being applied by {_holder(lock_path)}; nothing was sent. Wait for "
                                   "it to finish (its journal resumes where it stopped), then run again.") from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps({"pid": os.getpid(), "since": time.time(), "plan_id": plan_id}))
            handle.flush()
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.seek(0)
                handle.truncate()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def plan_lock_path(plan_id: str, folder: Path) -> Path:
    """The per-plan lock file of ``plan_id`` in ``folder`` (the plan file's folder)."""
    return folder / f".gatewayscope-apply-{plan_id}.lock"


@contextlib.contextmanager
def apply_lock(journal: Journal, plan_id: str, plan_folder: Path | None = None) -> Iterator[None]:
    """Hold the only apply of ``plan_id`` and the only writer of ``journal`` until exit.

    Two locks (``flock``, released by the kernel when the process dies, so a crash never leaves one
    behind): one beside the journal (``<journal>.lock``) and one per plan id in ``plan_folder``, the folder of
    the plan file (:func:`plan_lock_path`; the journal's folder for a plan that is in no file), so the same plan
    applied with two journals is refused too. The per-plan lock depends on no environment variable (a lock in
    ``TMPDIR`` let two applies with different ``TMPDIR`` run at once): every apply of one plan file finds it,
    whoever runs it. A second apply raises ApplyLockedError naming the process that holds the lock, before
    anything is written.
    """
    plan_lock = plan_lock_path(plan_id, plan_folder if plan_folder is not None else journal.path.parent)
    journal_lock = journal.path.with_name(journal.path.name + ".lock")
    with _exclusive(plan_lock, plan_id, f"Plan {plan_id}"), \
            _exclusive(journal_lock, plan_id, f"The journal {journal.path}"):
        yield
