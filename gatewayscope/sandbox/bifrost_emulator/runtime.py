"""``GET /metrics`` of the emulated gateway (§7): its telemetry plugin's Prometheus text exposition.

The series carry the names and types the gateway's telemetry plugin serves: the Go runtime and process
collectors (``go_goroutines``, ``go_memstats_*``, ``process_*``), the HTTP series (``http_requests_total``) and
the plugin's own ``bifrost_*`` series. Their values follow the process model of
:class:`~gatewayscope.sandbox.bifrost_emulator.state.ProcessModel`: goroutines are the baseline plus every
running worker, the stacks in use are goroutines x the stack per goroutine, and resident memory is the
baseline plus those stacks. The HELP texts are the emulator's own words. The exposition is written by
prometheus_client, so label values (key names come from the store) are escaped as the format requires.

``metrics_goroutines`` (an option) makes the process report that many goroutines whatever it runs: a
gateway whose metrics lie, for tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gatewayscope.sandbox.bifrost_emulator.state import EmulatorState

#: the Go version the emulated process reports in go_info
GO_VERSION = "go1.24"
#: what the process reports as its file-descriptor limit and use
MAX_FDS = 1_048_576
OPEN_FDS = 64
#: address space reserved beyond what is resident (what a Go process maps but does not touch)
VIRTUAL_EXTRA_BYTES = 1 << 30


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


class _ProcessCollector:
    """One scrape's families, from the state as it is now."""

    def __init__(self, state: EmulatorState, metrics_goroutines: int | None) -> None:
        self.state = state
        self.metrics_goroutines = metrics_goroutines

    def collect(self) -> Iterator[Metric]:
        state = self.state
        with state.lock:
            process = state.process
            running = state.running_workers()
            goroutines = process.goroutines(running)
            stacks = goroutines * process.stack_bytes_per_goroutine
            resident = process.resident_memory_bytes(running)
            started = state.started_at
            requests = dict(state.http_requests)
            keys = [(record.name, key.id, key.name) for record in state.records.values() if record.name in state.pools
                    for key in record.keys if key.enabled]
        baseline = process.baseline_memory_bytes
        # how the baseline splits: half heap in use, a quarter heap idle but resident, a quarter runtime and binary
        heap_inuse = baseline // 2
        heap_idle = baseline // 4
        other = baseline - heap_inuse - heap_idle
        reported = goroutines if self.metrics_goroutines is None else self.metrics_goroutines

        gc = Metric("go_gc_duration_seconds", "Pause times of the garbage collector's stop-the-world phases.",
                    "summary")
        for quantile in ("0", "0.25", "0.5", "0.75", "1"):
            gc.add_sample("go_gc_duration_seconds", {"quantile": quantile}, 0.0)
        gc.add_sample("go_gc_duration_seconds_sum", {}, 0.0)
        gc.add_sample("go_gc_duration_seconds_count", {}, 0.0)
        yield gc
        yield _gauge("go_goroutines", "Goroutines that exist now.", reported)
        info = GaugeMetricFamily("go_info", "The Go version the gateway was built with.", labels=["version"])
        info.add_metric([GO_VERSION], 1.0)
        yield info
        yield _gauge("go_memstats_alloc_bytes", "Heap bytes allocated and still in use.", heap_inuse * 3 // 4)
        yield _gauge("go_memstats_heap_alloc_bytes", "Heap bytes allocated and still in use.", heap_inuse * 3 // 4)
        yield _gauge("go_memstats_heap_idle_bytes", "Heap bytes held but not in use.", heap_idle)
        yield _gauge("go_memstats_heap_inuse_bytes", "Heap bytes in spans in use.", heap_inuse)
        yield _gauge("go_memstats_heap_released_bytes", "Heap bytes returned to the operating system.", 0)
        yield _gauge("go_memstats_heap_sys_bytes", "Heap bytes obtained from the operating system.",
                     heap_inuse + heap_idle)
        yield _gauge("go_memstats_stack_inuse_bytes", "Bytes of goroutine stacks in use.", stacks)
        yield _gauge("go_memstats_stack_sys_bytes", "Bytes of goroutine stacks obtained from the operating system.",
                     stacks)
        yield _gauge("go_memstats_other_sys_bytes", "Other runtime bytes obtained from the operating system.", other)
        yield _gauge("go_memstats_sys_bytes", "All bytes the runtime obtained from the operating system.",
                     baseline + stacks)
        yield _gauge("go_threads", "Operating-system threads the runtime created.", threading.active_count())
        yield CounterMetricFamily("process_cpu_seconds", "CPU time the process used, in seconds.",
                                  value=time.process_time())
        yield _gauge("process_max_fds", "The process's limit of open file descriptors.", MAX_FDS)
        yield _gauge("process_open_fds", "File descriptors the process holds open.", OPEN_FDS)
        yield _gauge("process_resident_memory_bytes", "Resident memory of the process, in bytes.", resident)
        yield _gauge("process_start_time_seconds", "When the process started, in seconds since the epoch.", started)
        yield _gauge("process_virtual_memory_bytes", "Virtual memory of the process, in bytes.",
                     resident + VIRTUAL_EXTRA_BYTES)

        http = CounterMetricFamily("http_requests", "HTTP requests the gateway answered.",
                                   labels=["path", "method", "status"])
        for (route, method, status), count in sorted(requests.items()):
            http.add_metric([route, method, status], float(count))
        yield http
        yield CounterMetricFamily("bifrost_upstream_requests", "Requests sent to upstream providers.",
                                  labels=["provider", "model", "method", "virtual_key_id", "app"])
        key_up = GaugeMetricFamily("bifrost_provider_key_up", "1 while a provider key is usable, else 0.",
                                   labels=["provider", "key_id", "key_name"])
        for provider, key_id, key_name in sorted(keys):
            key_up.add_metric([provider, key_id, key_name], 1.0)
        yield key_up


def exposition(state: EmulatorState, *, metrics_goroutines: int | None = None) -> bytes:
    """The text exposition of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProcessCollector(state, metrics_goroutines))
    return generate_latest(registry)
