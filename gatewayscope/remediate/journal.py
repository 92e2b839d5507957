"""The append-only apply journal: one JSON object per line, every attempt and every outcome.

It makes a plan single-use (an action with an outcome is never run again) and lets an interrupted
apply resume where it stopped. Lines are flushed and fsync'd as they are written; a torn last line
(a crash mid-write) is ignored on reading. No secret is ever written here: events carry ids, names,
outcomes and the gateway's error sentences, never request bodies or credentials.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from gatewayscope.errors import PlanError

FINAL_OUTCOMES = ("done", "refused", "unconfirmed", "gone", "stale", "already-done")


class Journal:
    """An append-only JSONL file shared by the threads of one apply."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one event line now (flushed and fsync'd) and return it."""
        record = {"ts": round(time.time(), 6), "event": event, **fields}
        line = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            try:
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(line)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as err:
                raise PlanError(f"Cannot write the journal {self.path}: {err.strerror or err}. Nothing more "
                                "is sent until the journal can be written.") from None
        return record

    def read(self) -> list[dict[str, Any]]:
        """Every well-formed event, oldest first (a torn last line is skipped)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as err:
            raise PlanError(f"Cannot read the journal {self.path}: {err.strerror or err}.") from None
        events = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
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
