"""Builders the tests share: traces exactly as rLLM's gateway persists them, and rLLM's own SQLite store
driven synchronously in process (the exact SQL the unmodified ``rllm-model-gateway --store sqlite`` runs)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rllm_model_gateway")

from rllm_model_gateway.models import TraceRecord
from rllm_model_gateway.store.sqlite_store import SqliteTraceStore


def trace_data(trace_id: str, session_id: str, **extra: Any) -> dict[str, Any]:
    """A trace exactly as the gateway persists it (``TraceRecord.model_dump()``)."""
    record = TraceRecord(trace_id=trace_id, session_id=session_id, model="stub",
                         messages=[{"role": "user", "content": f"turn of {session_id}"}],
                         prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5],
                         token_counts={"prompt": 3, "completion": 2}, timestamp=1.0)
    return {**record.model_dump(), **extra}


class WalTraceStore(SqliteTraceStore):
    """The gateway's store with upstream's journal mode (WAL; 0.1.0 sets DELETE on connect)."""

    async def _get_conn(self) -> Any:
        fresh = self._conn is None
        conn = await super()._get_conn()
        if fresh:
            await conn.execute("PRAGMA journal_mode=WAL")
        return conn


class Gateway:
    """rLLM's ``SqliteTraceStore`` on a private event loop, with a synchronous face for the tests."""

    def __init__(self, path: Path, *, wal: bool = False) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.store = (WalTraceStore if wal else SqliteTraceStore)(str(path))
        self.sessions()  # opens the persistent connection and creates the gateway's tables

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def write(self, trace_id: str, session_id: str, data: dict[str, Any] | None = None) -> None:
        self.run(self.store.store_trace(trace_id, session_id,
                                        data if data is not None else trace_data(trace_id, session_id)))

    def delete(self, session_id: str) -> int:
        return int(self.run(self.store.delete_session(session_id)))

    def sessions(self) -> dict[str, int]:
        return {row["session_id"]: row["trace_count"] for row in self.run(self.store.list_sessions())}

    def trace_ids(self, session_id: str) -> list[str]:
        return [t["trace_id"] for t in self.run(self.store.get_session_traces(session_id))]

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()


def now_data(trace_id: str, session_id: str) -> dict[str, Any]:
    """A trace of a call the gateway dispatched just now (its record's timestamp, no latency: it is built now)."""
    return trace_data(trace_id, session_id, timestamp=time.time(), latency_ms=0.0)


def late_data(trace_id: str, session_id: str) -> dict[str, Any]:
    """A straggler's trace: an hour-long call dispatched before any delete these tests make, landing now."""
    return trace_data(trace_id, session_id, timestamp=time.time(), latency_ms=3_600_000.0)
