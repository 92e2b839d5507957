"""Per-target reads for the exporter: a minimum interval, single-flight, and a deadline per scrape.

Each target has one slot holding its last completed read and the read running now, if any:

* a scrape within ``min_interval_seconds`` of the last completed read reuses it (several Prometheus
  replicas do not multiply the load on a gateway);
* otherwise the scrape joins the read already running for that target, or starts one (never two at once);
* the scrape waits for it until its deadline; a read that misses the deadline keeps running in its own
  thread, its result lands in the slot and serves the next scrape, and this scrape reports the target
  down (``source="deadline"``).

Reads run in daemon threads, one per running read, so at most one thread per target is ever busy with a
hung gateway, and that read ends: each of its requests, answer included, ends within the target's
``timeout_seconds`` however slowly the gateway sends (see :mod:`gatewayscope.sources._http`).
``reader`` is the seam tests use; it defaults to :func:`gatewayscope.scan.read_target`,
keeping each rLLM gateway's candidate traces between reads, and each SQLite trace store's last read so the
next one reads only what was added since (:class:`_DefaultReader`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gatewayscope._text import terminal_safe
from gatewayscope.config import Policy, Target
from gatewayscope.exporter.settings import DEFAULT_FULL_READ_INTERVAL_SECONDS
from gatewayscope.snapshot import TargetSnapshot

if TYPE_CHECKING:
    from gatewayscope.sources.rllm_http import KnownTraces
    from gatewayscope.sources.rllm_sqlite_incremental import IncrementalStore

log = logging.getLogger(__name__)

#: ``reader(target, policy, now=..., transport=...)`` -> TargetSnapshot, never raising
Reader = Callable[..., TargetSnapshot]

#: how a scrape got a target's values (the ``source`` label of gatewayscope_exporter_target_scrapes_total)
SOURCES = ("read", "joined", "cached", "deadline")
#: how a read ended (the ``result`` label of gatewayscope_exporter_target_reads_total)
RESULTS = ("ok", "error")


@dataclass(frozen=True)
class Reading:
    """One completed read of a target."""

    snapshot: TargetSnapshot
    started_mono: float
    finished_mono: float


@dataclass(frozen=True)
class TargetResult:
    """What one scrape serves for one target."""

    target: Target
    snapshot: TargetSnapshot
    #: one of SOURCES
    source: str
    #: seconds since the read behind these values started; None when the scrape missed its deadline
    age_seconds: float | None


@dataclass
class _Slot:
    last: Reading | None = None
    inflight: Future[Reading] | None = None
    reads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    scrapes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))


class _DefaultReader:
    """:func:`gatewayscope.scan.read_target` without plan fingerprints (the exporter never plans), keeping
    each rLLM gateway's candidate traces from one read to the next (orphans stay until deleted, and
    re-reading their traces at every read would cost the gateway the most of any part of a warm read).

    A SQLite trace store is read by its :class:`~gatewayscope.sources.rllm_sqlite_incremental.IncrementalStore`: only
    the rows added since its last read, with a full read whenever it cannot be sure and at least every
    ``full_read_interval_seconds`` (docs/exporter.md, "What a scrape reads").
    """

    def __init__(self, *, full_read_interval_seconds: float = DEFAULT_FULL_READ_INTERVAL_SECONDS,
                 fingerprints: bool = False, also: Callable[[str], Sequence[str]] | None = None) -> None:
        self.full_read_interval_seconds = full_read_interval_seconds
        #: True when a plan is made from these reads (``export --heal``): Bifrost records keep their fingerprints
        self.fingerprints = fingerprints
        #: per target name, the session ids a read must include (ids a heal knows were deleted before)
        self.also = also
        self._known: dict[str, KnownTraces] = {}
        self._stores: dict[str, IncrementalStore] = {}
        self._lock = threading.Lock()

    def __call__(self, target: Target, policy: Policy, *, now: float, transport: Any = None) -> TargetSnapshot:
        from gatewayscope.scan import read_target
        from gatewayscope.sources.rllm_http import KnownTraces

        also = list(self.also(target.name)) if self.also is not None and target.kind == "rllm" else []
        if target.kind == "rllm" and not target.is_remote:
            if also:  # the incremental read names no extra sessions: the scan's read does
                return read_target(target, policy, now=now, fingerprints=False, also_sessions=also)
            return self._read_store(target, policy, now=now)
        known = None
        if target.kind == "rllm" and target.is_remote:
            with self._lock:
                known = self._known.setdefault(target.name, KnownTraces())
        return read_target(target, policy, now=now, transport=transport, fingerprints=self.fingerprints,
                           known_traces=known, also_sessions=also)

    def _read_store(self, target: Target, policy: Policy, *, now: float) -> TargetSnapshot:
        """A SQLite target's read, every failure described on the snapshot as :func:`read_target` does."""
        from gatewayscope.errors import GatewayscopeError
        from gatewayscope.scan import read_target
        from gatewayscope.sources.rllm_sqlite_incremental import IncrementalStore

        with self._lock:
            store = self._stores.get(target.name)
            if store is None:
                store = self._stores[target.name] = IncrementalStore(self.full_read_interval_seconds)
        snap = TargetSnapshot(name=target.name, kind=target.kind, address=target.address, up=False,
                              started_at=time.time(), duration_seconds=0.0)
        clock = time.perf_counter()
        try:
            data = store.read(target, policy, now=now)
            if data is None:  # the guard is installed: the scan's read serves it
                return read_target(target, policy, now=now, fingerprints=False)
            snap.trace_store = data
            snap.up = True
        except GatewayscopeError as err:
            snap.error, snap.error_kind = str(err), err.kind
        except Exception as err:  # a bug or an unforeseen file must not stop the exporter
            log.debug("reading %s failed", target.name, exc_info=True)
            snap.error = f"unexpected {type(err).__name__} while reading {target.address}: {err}"
            snap.error_kind = "internal"
        snap.duration_seconds = time.perf_counter() - clock
        return snap

    def store_reads(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per SQLite target read so far: its reads by mode and its full reads by reason (see
        :meth:`~gatewayscope.sources.rllm_sqlite_incremental.IncrementalStore.counts`)."""
        with self._lock:
            stores = dict(self._stores)
        return {name: store.counts() for name, store in stores.items()}


def log_error_change(name: str, before: str | None, after: str | None) -> None:
    """Log a target's read error once each time it changes: a new or other error, and the first good read after one.

    The lines are warnings, so a default logging setup prints them; name and error are escaped for terminals
    (:func:`~gatewayscope._text.terminal_safe`) whatever the process's log setup, since an error quotes what the
    gateway answered.
    """
    if after == before:
        return
    if after is not None:
        log.warning("gatewayscope exporter: target %s cannot be read: %s", terminal_safe(name), terminal_safe(after))
    else:
        log.warning("gatewayscope exporter: target %s is read again (the error above is over)", terminal_safe(name))


class TargetCache:
    """The exporter's per-target slots. Thread-safe; every method may be called from any thread."""

    def __init__(
        self,
        targets: Sequence[Target],
        policy: Policy,
        *,
        min_interval_seconds: float,
        reader: Reader | None = None,
        transports: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        full_read_interval_seconds: float = DEFAULT_FULL_READ_INTERVAL_SECONDS,
        plan_reads: bool = False,
        also: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        self.targets = list(targets)
        self.policy = policy
        self.min_interval_seconds = float(min_interval_seconds)
        self.reader: Reader = reader or _DefaultReader(full_read_interval_seconds=full_read_interval_seconds,
                                                       fingerprints=plan_reads, also=also)
        self.transports = dict(transports or {})
        self.clock = clock
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {t.name: _Slot() for t in self.targets}

    # -- reads ---------------------------------------------------------------------------------

    def _start_read(self, target: Target, slot: _Slot) -> Future[Reading]:
        """Start a read of ``target`` in its own daemon thread. Call with the lock held."""
        future: Future[Reading] = Future()
        slot.inflight = future

        def run() -> None:
            started = self.clock()
            wall = self.wall_clock()
            try:
                snapshot = self.reader(target, self.policy, now=wall, transport=self.transports.get(target.name))
            except Exception as err:  # read_target never raises; a custom reader might
                log.debug("reading %s failed", target.name, exc_info=True)
                snapshot = TargetSnapshot(
                    name=target.name, kind=target.kind, address=target.address, up=False, started_at=wall,
                    duration_seconds=self.clock() - started,
                    error=f"unexpected {type(err).__name__} while reading {target.address}: {err}",
                    error_kind="internal",
                )
            reading = Reading(snapshot=snapshot, started_mono=started, finished_mono=self.clock())
            with self._lock:
                before = slot.last.snapshot.error if slot.last is not None else None
                slot.last = reading
                slot.inflight = None
                slot.reads["ok" if snapshot.up else "error"] += 1
            log_error_change(target.name, before, snapshot.error)
            future.set_result(reading)

        thread = threading.Thread(target=run, name=f"gatewayscope-export-{target.name}", daemon=True)
        thread.start()
        return future

    def fetch(self, targets: Sequence[Target], timeout: float) -> list[TargetResult]:
        """The values of ``targets`` for one scrape, waiting at most ``timeout`` seconds in all.

        Reads are started (or joined) for every target first, so they run concurrently; each result is
        then awaited until the common deadline.
        """
        start = self.clock()
        deadline = start + max(0.0, timeout)
        results: dict[str, TargetResult] = {}
        waiting: list[tuple[Target, Future[Reading], str]] = []
        with self._lock:
            for target in targets:
                slot = self._slots.setdefault(target.name, _Slot())
                now = self.clock()
                last = slot.last
                if last is not None and now - last.finished_mono < self.min_interval_seconds:
                    slot.scrapes["cached"] += 1
                    results[target.name] = TargetResult(target, last.snapshot, "cached", now - last.started_mono)
                elif slot.inflight is not None:
                    waiting.append((target, slot.inflight, "joined"))
                else:
                    waiting.append((target, self._start_read(target, slot), "read"))
        for target, future, source in waiting:
            try:
                reading = future.result(timeout=max(0.0, deadline - self.clock()))
            except FutureTimeout:
                waited = self.clock() - start
                snapshot = TargetSnapshot(
                    name=target.name, kind=target.kind, address=target.address, up=False,
                    started_at=self.wall_clock() - waited, duration_seconds=waited,
                    error=(f"no answer within this scrape's deadline of {timeout:.2f} s; the read goes on and "
                           "its result serves the next scrape"),
                    error_kind="deadline",
                )
                result = TargetResult(target, snapshot, "deadline", None)
            else:
                result = TargetResult(target, reading.snapshot, source, self.clock() - reading.started_mono)
            with self._lock:
                self._slots[target.name].scrapes[result.source] += 1
            results[target.name] = result
        return [results[t.name] for t in targets]

    # -- state for the self-metrics and the landing page ---------------------------------------

    def counters(self) -> dict[str, dict[str, Any]]:
        """Per target: ``reads`` (by result), ``scrapes`` (by source), ``in_flight`` (0/1) and ``last``; a SQLite
        target the default reader has read also has ``store_reads`` (``modes`` and full-read ``reasons``)."""
        store_reads = getattr(self.reader, "store_reads", None)
        stores = store_reads() if callable(store_reads) else {}
        with self._lock:
            out = {
                name: {
                    "reads": dict(slot.reads),
                    "scrapes": dict(slot.scrapes),
                    "in_flight": 1 if slot.inflight is not None else 0,
                    "last": slot.last,
                }
                for name, slot in self._slots.items()
            }
        for name, counts in stores.items():
            if name in out:
                out[name]["store_reads"] = counts
        return out

    def forget(self, names: set[str]) -> None:
        """Drop the slots of targets that are gone (discovered gateways whose process ended)."""
        with self._lock:
            for name in names:
                self._slots.pop(name, None)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no read is running (tests and orderly shutdown). True when idle in time."""
        deadline = self.clock() + timeout
        while True:
            with self._lock:
                futures = [s.inflight for s in self._slots.values() if s.inflight is not None]
            if not futures:
                return True
            remaining = deadline - self.clock()
            if remaining <= 0:
                return False
            try:
                futures[0].result(timeout=remaining)
            except FutureTimeout:
                return False
