"""A Snapshot: what the sources read from every target at one moment, as plain data.

Polars frames plus small dataclasses, nothing live: a Snapshot can be saved to a folder
(``manifest.json`` plus one parquet file per frame) and loaded again, so an analysis can be
re-run offline and a bug report can carry one. It never holds a secret: sources strip them
before anything reaches a Snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from gatewayscope import __version__
from gatewayscope._files import MAX_MANIFEST_BYTES, check_regular, read_text
from gatewayscope.errors import GatewayscopeError
from gatewayscope.guard.common import GuardStats

SNAPSHOT_FORMAT = 1

#: one row per session the trace store lists
SESSIONS_SCHEMA: dict[str, Any] = {
    "session_id": pl.String,
    "trace_count": pl.Int64,
    "created_at": pl.Float64,  # epoch seconds; the gateway's creation time or its first trace's
    "last_trace_at": pl.Float64,  # epoch seconds of the newest trace, when the source knows it cheaply
}

#: one row per trace read for a candidate session (one-trace or tombstoned sessions only)
CANDIDATE_TRACES_SCHEMA: dict[str, Any] = {
    "session_id": pl.String,
    "trace_id": pl.String,
    "timestamp": pl.Float64,
    "weight_version": pl.Int64,  # null when the gateway does not record weight versions
    "prompt_tokens": pl.Int64,
    "prompt_chars": pl.Int64,
    "model": pl.String,
    #: the latest moment the trace's request can have reached the gateway (gatewayscope.orphan_rule.dispatched_at)
    "dispatched_at": pl.Float64,
}

#: one row per Bifrost provider record, secrets already stripped
RECORDS_SCHEMA: dict[str, Any] = {
    "name": pl.String,
    "is_custom": pl.Boolean,  # carries custom_provider_config
    "base_provider_type": pl.String,
    "concurrency": pl.Int64,
    "buffer_size": pl.Int64,
    "base_url": pl.String,
    "provider_status": pl.String,
    "fingerprint": pl.String,  # hash of the record's state, secrets replaced by their hash
}

#: one row per distinct base URL host checked for reachability
REACHABILITY_SCHEMA: dict[str, Any] = {
    "host": pl.String,
    "resolves": pl.Boolean,
    "error": pl.String,
}


def empty_frame(schema: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def frame_from_rows(rows: list[dict[str, Any]] | list[tuple[Any, ...]], schema: dict[str, Any]) -> pl.DataFrame:
    """Build a frame with exactly ``schema`` from dict rows or tuples in schema order."""
    if not rows:
        return empty_frame(schema)
    if isinstance(rows[0], tuple):
        return pl.DataFrame(rows, schema=schema, orient="row")
    return pl.DataFrame(rows, schema=schema)


@dataclass
class TraceStoreData:
    """What one rLLM trace store holds, as far as the findings need it."""

    sessions: pl.DataFrame
    candidate_traces: pl.DataFrame
    #: ids among ``sessions`` that carry a tombstone (the guard says they were deleted before)
    tombstoned_ids: list[str] = field(default_factory=list)
    #: the fence of each of ``tombstoned_ids`` whose time the guard gave: the moment of its latest delete (or
    #: backfill). A tombstoned id missing here has an unknown fence (an older guard's ban: see orphan_rule)
    fences: dict[str, float] = field(default_factory=dict)
    #: those of ``tombstoned_ids`` that the guard saw written again after their fence (a new use of the id)
    reused_ids: list[str] = field(default_factory=list)
    current_weight_version: int | None = None
    guard: GuardStats | None = None
    #: feature probes: {"weight_version": bool, "batch_delete": bool, "guard": bool, ...}
    capabilities: dict[str, bool] = field(default_factory=dict)
    #: "rest" or "sqlite"
    access: str = "rest"
    #: the store's session and trace totals when ``sessions`` holds only the candidate sessions (read from the
    #: guard's orphan index, or a SQLite file's candidates read); None when ``sessions`` lists every session
    session_total: int | None = None
    trace_total: int | None = None
    #: the session ids the read was asked to include beside the candidates, traces and all (those given as
    #: deleted before); the findings can confirm no other deleted id (see :func:`gatewayscope.findings`)
    also_read: frozenset[str] = frozenset()

    @property
    def session_count(self) -> int:
        """The number of sessions in the store."""
        return self.sessions.height if self.session_total is None else self.session_total

    @property
    def trace_count(self) -> int:
        """The number of traces in the store (its sessions' trace counts summed)."""
        if self.trace_total is not None:
            return self.trace_total
        return int(self.sessions["trace_count"].sum() or 0) if self.sessions.height else 0


@dataclass(frozen=True)
class RuntimeMetrics:
    """What a Bifrost gateway's own Prometheus metrics (its telemetry plugin's Go runtime and process
    collectors) said about its process at the read: goroutines, their stacks, resident memory.

    ``url`` is where they were read (no credentials). The heap and runtime figures are kept when the gateway
    serves them (None otherwise); the boot-memory model uses the first three.
    """

    url: str
    goroutines: float
    stack_inuse_bytes: float
    resident_memory_bytes: float
    heap_inuse_bytes: float | None = None
    sys_bytes: float | None = None


@dataclass
class BifrostData:
    """What one Bifrost management API reports."""

    records: pl.DataFrame
    client_config: dict[str, Any]
    reachability: pl.DataFrame
    version: str | None = None
    health: str | None = None
    auth_enabled: bool | None = None
    #: the gateway's runtime metrics, when they were read and usable
    runtime: RuntimeMetrics | None = None
    #: why there are none (not read, the read failed, or the answer was unusable): a sentence
    runtime_error: str | None = None


@dataclass
class TargetSnapshot:
    """One target's read: its data, or the error that stopped the read, and how long it took."""

    name: str
    kind: str  # "rllm" | "bifrost"
    address: str  # URL or SQLite path, never with credentials
    up: bool
    started_at: float
    duration_seconds: float
    error: str | None = None
    error_kind: str | None = None
    warnings: list[str] = field(default_factory=list)
    trace_store: TraceStoreData | None = None
    bifrost: BifrostData | None = None


@dataclass
class Snapshot:
    """Every target's read at one moment."""

    taken_at: float
    targets: list[TargetSnapshot]
    tool_version: str = __version__

    def target(self, name: str) -> TargetSnapshot:
        for snap in self.targets:
            if snap.name == name:
                return snap
        raise KeyError(name)

    # -- persistence -------------------------------------------------------------------------

    def save(self, folder: str | Path) -> Path:
        """Write the snapshot to ``folder`` (created if needed): manifest.json plus parquet frames.

        Raises GatewayscopeError, saying why, when the folder cannot be made or written."""
        try:
            return self._save(Path(folder))
        except OSError as err:
            raise GatewayscopeError(f"Cannot save the snapshot to {folder}: {err.strerror or err}; give a folder "
                                    "this user may create and write.") from None

    def _save(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        manifest: dict[str, Any] = {
            "format": SNAPSHOT_FORMAT,
            "tool_version": self.tool_version,
            "taken_at": self.taken_at,
            "targets": [],
        }
        for index, snap in enumerate(self.targets):
            entry = {k: v for k, v in dataclasses.asdict(_shallow(snap)).items()}
            entry.pop("trace_store", None)
            entry.pop("bifrost", None)
            prefix = f"t{index}"
            if snap.trace_store is not None:
                data = snap.trace_store
                entry["trace_store"] = {
                    **_write_frames(out, prefix, sessions=data.sessions, candidate_traces=data.candidate_traces),
                    "tombstoned_ids": data.tombstoned_ids,
                    "fences": data.fences,
                    "reused_ids": data.reused_ids,
                    "current_weight_version": data.current_weight_version,
                    "guard": dataclasses.asdict(data.guard) if data.guard else None,
                    "capabilities": data.capabilities,
                    "access": data.access,
                }
                if data.session_total is not None:  # only for candidates reads: full listings keep their bytes
                    entry["trace_store"].update(session_total=data.session_total, trace_total=data.trace_total)
                if data.also_read:
                    entry["trace_store"]["also_read"] = sorted(data.also_read)
            if snap.bifrost is not None:
                bif = snap.bifrost
                entry["bifrost"] = {
                    **_write_frames(out, prefix, records=bif.records, reachability=bif.reachability),
                    "client_config": bif.client_config,
                    "version": bif.version,
                    "health": bif.health,
                    "auth_enabled": bif.auth_enabled,
                    "runtime": dataclasses.asdict(bif.runtime) if bif.runtime is not None else None,
                    "runtime_error": bif.runtime_error,
                }
            manifest["targets"].append(entry)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return out

    @classmethod
    def load(cls, folder: str | Path) -> Snapshot:
        """Read a snapshot written by :meth:`save`; GatewayscopeError, saying why, for anything else."""
        src = Path(folder)
        manifest_path = src / "manifest.json"
        try:
            manifest = json.loads(read_text(manifest_path, limit=MAX_MANIFEST_BYTES))
        except FileNotFoundError:
            raise GatewayscopeError(f"{src} is not a saved snapshot: it has no manifest.json.") from None
        except NotADirectoryError:
            raise GatewayscopeError(f"{src} is not a saved snapshot: give the folder scan --save-snapshot "
                                    "wrote.") from None
        except OSError as err:
            raise GatewayscopeError(f"Cannot read the snapshot manifest {manifest_path}: {err.strerror or err}.") \
                from None
        except (ValueError, RecursionError) as err:
            raise GatewayscopeError(f"Cannot read the snapshot manifest {manifest_path}: it is not the JSON a "
                                    f"snapshot saves ({type(err).__name__}).") from None
        if not isinstance(manifest, dict):
            raise GatewayscopeError(f"{manifest_path} is not a snapshot manifest (no JSON object).")
        try:
            return cls._load(src, manifest_path, manifest)
        except (OSError, KeyError, TypeError, ValueError, AttributeError, pl.exceptions.PolarsError) as err:
            raise GatewayscopeError(f"{src} is not a snapshot this gatewayscope can read: "
                                    f"{type(err).__name__} ({err}); save it again with scan --save-snapshot.") \
                from None

    @classmethod
    def _load(cls, src: Path, manifest_path: Path, manifest: dict[str, Any]) -> Snapshot:
        def frame(name: Any) -> pl.DataFrame:
            path = src / str(name)
            check_regular(path)  # a FIFO would block the read
            return pl.read_parquet(path)

        if manifest.get("format") != SNAPSHOT_FORMAT:
            raise GatewayscopeError(
                f"{manifest_path} has snapshot format {manifest.get('format')!r}; "
                f"this gatewayscope reads format {SNAPSHOT_FORMAT}."
            )
        targets: list[TargetSnapshot] = []
        for entry in manifest["targets"]:
            ts_entry = entry.pop("trace_store", None)
            bif_entry = entry.pop("bifrost", None)
            snap = TargetSnapshot(**entry)
            if ts_entry:
                guard = ts_entry.get("guard")
                traces = frame(ts_entry["candidate_traces"])
                if "dispatched_at" not in traces.columns:  # saved before fences: no dispatch times were read
                    traces = traces.with_columns(pl.lit(None, dtype=pl.Float64).alias("dispatched_at"))
                snap.trace_store = TraceStoreData(
                    sessions=frame(ts_entry["sessions"]),
                    candidate_traces=traces,
                    tombstoned_ids=list(ts_entry.get("tombstoned_ids") or []),
                    fences={str(k): float(v) for k, v in (ts_entry.get("fences") or {}).items()},
                    reused_ids=list(ts_entry.get("reused_ids") or []),
                    current_weight_version=ts_entry.get("current_weight_version"),
                    guard=GuardStats(**guard) if guard else None,
                    capabilities=dict(ts_entry.get("capabilities") or {}),
                    access=ts_entry.get("access", "rest"),
                    session_total=ts_entry.get("session_total"),
                    trace_total=ts_entry.get("trace_total"),
                    also_read=frozenset(str(sid) for sid in ts_entry.get("also_read") or ()),
                )
            if bif_entry:
                runtime = bif_entry.get("runtime")
                snap.bifrost = BifrostData(
                    records=frame(bif_entry["records"]),
                    reachability=frame(bif_entry["reachability"]),
                    client_config=dict(bif_entry.get("client_config") or {}),
                    version=bif_entry.get("version"),
                    health=bif_entry.get("health"),
                    auth_enabled=bif_entry.get("auth_enabled"),
                    runtime=RuntimeMetrics(**runtime) if isinstance(runtime, dict) else None,
                    runtime_error=bif_entry.get("runtime_error"),
                )
            targets.append(snap)
        return cls(taken_at=manifest["taken_at"], targets=targets, tool_version=manifest.get("tool_version", ""))


def _write_frames(out: Path, prefix: str, **frames: pl.DataFrame) -> dict[str, str]:
    """Write each frame to ``out`` as ``{prefix}_{name}.parquet``; the file's name by the frame's, for the
    manifest."""
    names = {name: f"{prefix}_{name}.parquet" for name in frames}
    for name, frame in frames.items():
        frame.write_parquet(out / names[name])
    return names


def _shallow(snap: TargetSnapshot) -> TargetSnapshot:
    """A copy without the frames, so ``dataclasses.asdict`` does not try to deep-copy them."""
    return dataclasses.replace(snap, trace_store=None, bifrost=None)


def now() -> float:
    """The wall clock, in one place so views pass it into the pure analysis."""
    return time.time()
