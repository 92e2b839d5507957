"""The emulator's state: the provider store, the core's worker pools, faults and the request log.

All of it sits behind one lock (:attr:`EmulatorState.lock`). Handlers hold it for reads and for the
store+pool mutation of a write, never while they sleep or resolve a hostname.

Worker accounting models the core (§3): every stored record the core can build parks ``concurrency``
worker goroutines from boot on; every successful write restarts that record's pool (counted in
``restarts``); a delete removes it. A record the core cannot build (a non-standard name without custom
config) has no pool and shows ``provider_status: "error"``.

The process around those pools (§7, :class:`ProcessModel`): its goroutines are a baseline plus every
running worker, its resident memory a baseline plus every goroutine's stack, and a process whose resident
memory would exceed its memory limit is killed (:meth:`EmulatorState.check_memory`): it answers nothing
until it is restarted, and a restart that needs more than the limit at boot is killed again.

Section numbers (§) refer to docs/sandbox.md, "The emulated management API".
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from gatewayscope.sandbox.bifrost_emulator.globalconfig import GlobalConfig
from gatewayscope.sandbox.bifrost_emulator.model import ProviderRecord

#: stack bytes per parked goroutine: Go's 2 KiB floor and a typical 8 KiB after growth (§3)
STACK_BYTES_LOW = 2 * 1024
STACK_BYTES_HIGH = 8 * 1024

#: the emulated process (§7): stack bytes per goroutine, memory held besides the workers, goroutines besides them
DEFAULT_STACK_BYTES_PER_GOROUTINE = 8 * 1024
DEFAULT_BASELINE_MEMORY_BYTES = 64 * 1024 * 1024
DEFAULT_BASELINE_GOROUTINES = 64

#: fault targets that are not a provider name
ANY = "*"
LIST = "@list"
CONFIG = "@config"
METRICS = "@metrics"

FAULT_KINDS = ("error", "slow", "no_answer", "delete_after_read", "garbage")


@dataclass
class Pool:
    """A record's worker pool as the core holds it."""

    workers: int
    queue_slots: int
    restarts: int = 0


@dataclass(frozen=True)
class ProcessModel:
    """The emulated gateway's process (§7): what it holds besides the workers, and its memory limit.

    Goroutines = ``baseline_goroutines`` + every running worker; resident memory =
    ``baseline_memory_bytes`` + goroutines x ``stack_bytes_per_goroutine``. ``memory_limit_bytes`` None:
    no limit (the process is never killed).
    """

    stack_bytes_per_goroutine: int = DEFAULT_STACK_BYTES_PER_GOROUTINE
    baseline_memory_bytes: int = DEFAULT_BASELINE_MEMORY_BYTES
    baseline_goroutines: int = DEFAULT_BASELINE_GOROUTINES
    memory_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.stack_bytes_per_goroutine < 1 or self.baseline_memory_bytes < 0 or self.baseline_goroutines < 0:
            raise ValueError("stack bytes per goroutine must be positive, the baselines zero or more")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes < 1:
            raise ValueError("the memory limit must be positive (None: no limit)")

    def goroutines(self, workers: int) -> int:
        return self.baseline_goroutines + workers

    def resident_memory_bytes(self, workers: int) -> int:
        return self.baseline_memory_bytes + self.goroutines(workers) * self.stack_bytes_per_goroutine


@dataclass
class Fault:
    """One injected misbehaviour, matched on (method, target) and used up after ``times`` matches.

    ``target`` is a provider name, :data:`LIST` (``GET /api/providers``), :data:`CONFIG`
    (``/api/config``), :data:`METRICS` (``GET /metrics``) or :data:`ANY`. ``times=None`` never runs out.

    kinds:
      * ``error``: answer ``status``/``message`` in the error envelope. With ``apply_write`` the request
        is processed first (the write lands) and its success answer is replaced by the error.
      * ``slow``: wait ``delay`` seconds; with ``apply_write`` the write lands before the wait,
        otherwise after it. The answer itself is the normal one.
      * ``no_answer``: process the request (``apply_write``, default on), then send nothing: ``mode``
        ``"close"`` closes the connection at once, ``"hang"`` holds it ``hang_seconds`` first.
      * ``delete_after_read``: answer the GET of the record normally, then delete the record, as
        another process would between a client's read and its write.
      * ``garbage``: answer ``status`` with ``body`` (not JSON) and ``content_type``.
    """

    kind: str
    method: str = ANY
    target: str = ANY
    times: int | None = 1
    status: int = 500
    message: str = ""
    delay: float = 0.0
    apply_write: bool = False
    mode: str = "close"
    hang_seconds: float = 30.0
    body: str = "<html><body><h1>502 Bad Gateway</h1></body></html>"
    content_type: str = "text/html"
    id: int = 0
    hits: int = 0

    def matches(self, method: str, target: str | None) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method != ANY and self.method.upper() != method.upper():
            return False
        return self.target == ANY or self.target == target

    @property
    def remaining(self) -> int | None:
        return None if self.times is None else max(0, self.times - self.hits)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["remaining"] = self.remaining
        return out


@dataclass
class LoggedRequest:
    """One request as it arrived (emulator control requests are not logged)."""

    seq: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)
    status: int | None = None
    outcome: str = "pending"  # answered | dropped | pending

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "method": self.method, "path": self.path, "headers": dict(self.headers),
                "body": self.text(), "at": self.at, "status": self.status, "outcome": self.outcome}


class EmulatorState:
    """Store, pools, global config, faults and request log of one emulator, behind one lock."""

    def __init__(self, *, request_log_limit: int = 10_000, process: ProcessModel | None = None) -> None:
        self.lock = threading.RLock()
        self.records: dict[str, ProviderRecord] = {}
        self.pools: dict[str, Pool] = {}
        self.process = process or ProcessModel()
        #: workers of old pools still running beside their record's new pool (an update's overlap, §3)
        self.retiring: dict[str, list[int]] = {}
        #: killed for going over the memory limit: answers nothing until restarted (§7)
        self.dead = False
        self.deaths = 0
        self.death_reason: str | None = None
        #: the most resident memory the process held since it booted (never above the limit)
        self.peak_resident_bytes = self.process.resident_memory_bytes(0)
        self.started_at = time.time()
        #: answered requests by (route, method, status), for the metrics' http_requests_total
        self.http_requests: dict[tuple[str, str, str], int] = {}
        self.config = GlobalConfig()
        self.sessions: set[str] = set()
        self.faults: list[Fault] = []
        self._fault_ids = itertools.count(1)
        self.requests: deque[LoggedRequest] = deque(maxlen=request_log_limit)
        self._request_seq = itertools.count(1)

    # -- store + pools ---------------------------------------------------------------------------

    def load(self, records: list[ProviderRecord], config: GlobalConfig | None = None) -> bool:
        """Replace the store with ``records`` as they were at boot: every buildable record's pool is
        started once, with no restarts counted. A fresh process: deaths are forgotten. Returns whether it
        survives its boot (False: killed while it boots, §7)."""
        with self.lock:
            self.records = {r.name: copy.deepcopy(r) for r in records}
            if config is not None:
                self.config = copy.deepcopy(config)
            self.deaths = 0
            return self.boot()

    def boot(self) -> bool:
        """Start the process again over the stored records (a restart, §7): every buildable record's pool
        starts, no overlap runs, the restart counts are zero. Returns False when the boot needs more than the
        memory limit: the process is killed again (``deaths`` counts it)."""
        with self.lock:
            self.pools = {name: Pool(max(0, r.concurrency), max(0, r.buffer_size))
                          for name, r in self.records.items() if r.buildable}
            self.retiring = {}
            self.dead = False
            self.death_reason = None
            self.peak_resident_bytes = 0
            self.started_at = time.time()
            return self.check_memory("boot")

    # -- the process (§7) ------------------------------------------------------------------------

    def running_workers(self) -> int:
        """Worker goroutines running now: every pool's, plus old pools still retiring."""
        with self.lock:
            return sum(p.workers for p in self.pools.values()) + sum(sum(w) for w in self.retiring.values())

    def resident_memory_bytes(self) -> int:
        return self.process.resident_memory_bytes(self.running_workers())

    def boot_memory_bytes(self) -> int:
        """What a restart would hold once booted: the baseline plus every stored buildable record's workers."""
        with self.lock:
            workers = sum(max(0, r.concurrency) for r in self.records.values() if r.buildable)
        return self.process.resident_memory_bytes(workers)

    def check_memory(self, what: str) -> bool:
        """After ``what`` changed the running workers: is the process still within its memory limit? When it
        is not, it is killed (``dead``, counted in ``deaths``, ``death_reason`` says what did it)."""
        with self.lock:
            resident = self.resident_memory_bytes()
            limit = self.process.memory_limit_bytes
            if limit is not None and resident > limit:
                self.dead = True
                self.deaths += 1
                self.death_reason = (f"{what}: resident memory would reach {resident} bytes, over the memory "
                                     f"limit of {limit} bytes")
                return False
            self.peak_resident_bytes = max(self.peak_resident_bytes, resident)
            return True

    def begin_overlap(self, name: str, workers: int) -> None:
        """An old pool of ``workers`` keeps running beside its record's new one (an update's overlap)."""
        with self.lock:
            if workers > 0:
                self.retiring.setdefault(name, []).append(workers)

    def end_overlap(self, name: str, workers: int) -> None:
        """The old pool of an overlap has retired (nothing to do after a restart cleared it)."""
        with self.lock:
            running = self.retiring.get(name)
            if running and workers in running:
                running.remove(workers)
                if not running:
                    del self.retiring[name]

    def count_request(self, route: str, method: str, status: int) -> None:
        with self.lock:
            key = (route, method, str(status))
            self.http_requests[key] = self.http_requests.get(key, 0) + 1

    def store_record(self, record: ProviderRecord, *, restart: bool) -> bool:
        """Store ``record``; when ``restart``, (re)start its pool as UpdateProvider does.

        Returns whether the core could build the record (False leaves it without a pool).
        """
        with self.lock:
            self.records[record.name] = record
            if not restart:
                return record.name in self.pools
            previous = self.pools.pop(record.name, None)
            if not record.buildable:
                return False
            restarts = (previous.restarts if previous else 0) + 1
            self.pools[record.name] = Pool(max(0, record.concurrency), max(0, record.buffer_size), restarts)
            return True

    def remove_record(self, name: str) -> bool:
        """Delete a record and its pool; True if it existed."""
        with self.lock:
            self.pools.pop(name, None)
            return self.records.pop(name, None) is not None

    def previous_workers(self, name: str) -> int:
        """The workers of the record's running pool (0 without one)."""
        with self.lock:
            pool = self.pools.get(name)
            return pool.workers if pool else 0

    def get_record(self, name: str) -> ProviderRecord | None:
        """A deep copy of the stored record (unmasked), or None."""
        with self.lock:
            record = self.records.get(name)
            return copy.deepcopy(record) if record is not None else None

    def provider_status(self, name: str) -> str:
        with self.lock:
            return "active" if name in self.pools else "error"

    def snapshot(self, *, version: str) -> dict[str, Any]:
        """What ``GET /_emulator/state`` answers: per-record pools, totals, boot memory, posture."""
        with self.lock:
            rows = []
            totals = {"records": 0, "standard": 0, "custom": 0, "unknown": 0, "with_pool": 0,
                      "parked_workers": 0, "queue_slots": 0, "restarts": 0}
            for name in sorted(self.records):
                record = self.records[name]
                pool = self.pools.get(name)
                row: dict[str, Any] = {
                    "name": name,
                    "kind": record.kind,
                    "provider_status": "active" if pool else "error",
                    "concurrency": record.concurrency,
                    "buffer_size": record.buffer_size,
                    "parked_workers": pool.workers if pool else 0,
                    "queue_slots": pool.queue_slots if pool else 0,
                    "restarts": pool.restarts if pool else 0,
                    "base_url": record.base_url,
                }
                rows.append(row)
                totals["records"] += 1
                totals[record.kind] += 1
                totals["with_pool"] += 1 if pool else 0
                totals["parked_workers"] += row["parked_workers"]
                totals["queue_slots"] += row["queue_slots"]
                totals["restarts"] += row["restarts"]
            workers = totals["parked_workers"]
            client = self.config.client_config
            return {
                "emulator": "bifrost-management-api-emulator",
                "version": version,
                "records": rows,
                "totals": totals,
                "boot_memory": {
                    "parked_workers": workers,
                    "stack_bytes_per_worker_low": STACK_BYTES_LOW,
                    "stack_bytes_per_worker_high": STACK_BYTES_HIGH,
                    "low_bytes": workers * STACK_BYTES_LOW,
                    "high_bytes": workers * STACK_BYTES_HIGH,
                },
                "runtime": self.runtime_snapshot(),
                "posture": {
                    "drop_excess_requests": client.get("drop_excess_requests"),
                    "enforce_auth_on_inference": client.get("enforce_auth_on_inference"),
                    "disable_content_logging": client.get("disable_content_logging"),
                },
                "auth_enabled": self.config.auth.is_enabled,
                "faults": [f.to_json() for f in self.faults],
            }

    def runtime_snapshot(self) -> dict[str, Any]:
        """The process (§7): goroutines, stacks, resident and boot memory, the limit, deaths."""
        with self.lock:
            process = self.process
            running = self.running_workers()
            return {
                "stack_bytes_per_goroutine": process.stack_bytes_per_goroutine,
                "baseline_memory_bytes": process.baseline_memory_bytes,
                "baseline_goroutines": process.baseline_goroutines,
                "running_workers": running,
                "retiring_workers": sum(sum(w) for w in self.retiring.values()),
                "goroutines": process.goroutines(running),
                "resident_memory_bytes": process.resident_memory_bytes(running),
                "peak_resident_memory_bytes": self.peak_resident_bytes,
                "boot_memory_bytes": self.boot_memory_bytes(),
                "memory_limit_bytes": process.memory_limit_bytes,
                "dead": self.dead,
                "deaths": self.deaths,
                "death_reason": self.death_reason,
            }

    # -- faults ----------------------------------------------------------------------------------

    def add_fault(self, fault: Fault) -> Fault:
        if fault.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {fault.kind!r}; one of {', '.join(FAULT_KINDS)}")
        if fault.mode not in ("close", "hang"):
            raise ValueError("no_answer mode must be 'close' or 'hang'")
        if fault.kind == "delete_after_read" and fault.target in (ANY, LIST, CONFIG, METRICS):
            raise ValueError("delete_after_read needs a provider name as target")
        with self.lock:
            fault.id = next(self._fault_ids)
            fault.hits = 0
            self.faults.append(fault)
            return fault

    def take_fault(self, method: str, target: str | None) -> Fault | None:
        """The first live fault matching (method, target), with its use counted."""
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, target):
                    fault.hits += 1
                    return copy.copy(fault)
            return None

    def reset_faults(self) -> int:
        with self.lock:
            count = len(self.faults)
            self.faults.clear()
            return count

    # -- request log -----------------------------------------------------------------------------

    def log_request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> LoggedRequest:
        with self.lock:
            entry = LoggedRequest(seq=next(self._request_seq), method=method, path=path,
                                  headers=headers, body=body)
            self.requests.append(entry)
            return entry

    def finish_request(self, entry: LoggedRequest, status: int | None, outcome: str) -> None:
        with self.lock:
            entry.status = status
            entry.outcome = outcome
