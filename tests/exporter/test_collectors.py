"""The exporter's metric families, built from hand-made snapshots (no HTTP, no gateway)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gatewayscope import __version__
from gatewayscope.config import Policy, Target
from gatewayscope.exporter.cache import TargetResult
from gatewayscope.exporter.collectors import (
    CONTRACT_METRICS,
    METRICS,
    ExporterCollector,
    TargetsCollector,
    record_series,
)
from gatewayscope.snapshot import GuardStats, RuntimeMetrics, TargetSnapshot
from tests.helpers import bifrost_target, trace_store_target

NOW = 1_700_000_000.0
RLLM = Target(name="rl-gateway", kind="rllm", url="http://rl.test:9090")
BIFROST = Target(name="bifrost", kind="bifrost", url="http://bf.test:8080", memory_limit_bytes=512 * 1024 * 1024)

# ids that must never appear in a label
ORPHAN_ID = "5f0c2c9e-1111-4c4c-8888-aaaaaaaaaaaa:3"
TOMBSTONED_ID = "9d9d9d9d-2222-4d4d-9999-bbbbbbbbbbbb:0"
LIVE_ID = "77777777-3333-4e4e-aaaa-cccccccccccc:1"
TRACE_ID = "trace-0f0f0f0f-secret-trace-id"
SECRET_URL = "https://admin:hunter2-SECRET@upstream.example/v1?key=sk-THE-KEY"
FINGERPRINT = "sha256-fingerprint-of-a-record"


def rllm_snapshot(*, guard: GuardStats | None = None, up: bool = True) -> TargetSnapshot:
    snap = trace_store_target(
        [
            (ORPHAN_ID, 1, NOW - 9000, None),  # one trace, idle 8,000 s: suspected
            (TOMBSTONED_ID, 1, NOW - 50, NOW - 40),  # carries a tombstone: confirmed
            (LIVE_ID, 3, NOW - 100, NOW - 10),  # live
        ],
        [(ORPHAN_ID, TRACE_ID, NOW - 8000, None, 100, 400, "m", NOW - 8001)],
        name=RLLM.name, address=RLLM.address, started_at=NOW, duration_seconds=0.25,
        tombstoned_ids=[TOMBSTONED_ID], guard=guard)
    if up:
        return snap
    return dataclasses.replace(snap, up=False, trace_store=None, error="Cannot reach the rLLM gateway",
                               error_kind="unreachable")


def bifrost_snapshot(custom_records: int = 8, *, client_config: dict | None = None,
                     runtime: RuntimeMetrics | None = None, runtime_error: str | None = None) -> TargetSnapshot:
    rows: list[tuple[Any, ...]] = [("openai", False, None, 512, 8192, None, "active", FINGERPRINT),
            ("anthropic", False, None, 2000, 8192, None, "active", FINGERPRINT),
            # provider_status error: the core could not build it, so it has no pool and parks nothing
            ("legacy-lan", False, None, 100, 800, None, "error", FINGERPRINT)]
    rows += [(f"org{i:02d}__vllm__m", True, "openai", 1000 - i, 5000, SECRET_URL if i == 0 else None,
              "active", FINGERPRINT) for i in range(custom_records)]
    return bifrost_target(
        rows, [("upstream.example", False, "no such host")],
        client_config=client_config if client_config is not None else {"drop_excess_requests": True,
                                                                         "enforce_auth_on_inference": True},
        name=BIFROST.name, address=BIFROST.address, started_at=NOW, duration_seconds=1.5,
        runtime=runtime, runtime_error=runtime_error)


def exposition(results: list[TargetResult], *, max_record_series: int = 50, policy: Policy | None = None,
               counters: dict | None = None) -> str:
    registry = CollectorRegistry(auto_describe=False)
    if counters is not None:
        registry.register(ExporterCollector(lambda: counters))
    registry.register(TargetsCollector(results, policy or Policy(), max_record_series=max_record_series,
                                       min_interval_seconds=15.0))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def names_of(found: dict) -> set[str]:
    return {name for name, _ in found}


def test_trace_store_families() -> None:
    guard = GuardStats(tombstones=900, capacity=1000, dropped_writes=17)
    found = samples(exposition([TargetResult(RLLM, rllm_snapshot(guard=guard), "read", 0.5)]))
    t = {"target": "rl-gateway"}
    assert value(found, "gatewayscope_up", kind="rllm", **t) == 1
    assert value(found, "gatewayscope_scrape_duration_seconds", **t) == 0.25
    assert value(found, "gatewayscope_exporter_snapshot_age_seconds", **t) == 0.5
    assert value(found, "gatewayscope_trace_store_sessions", **t) == 3
    assert value(found, "gatewayscope_trace_store_traces", **t) == 5
    assert value(found, "gatewayscope_trace_store_orphan_sessions", confidence="confirmed", **t) == 1
    assert value(found, "gatewayscope_trace_store_orphan_sessions", confidence="suspected", **t) == 1
    assert value(found, "gatewayscope_trace_store_oldest_orphan_age_seconds", **t) == 8000
    assert value(found, "gatewayscope_trace_store_tombstones", **t) == 900
    assert value(found, "gatewayscope_trace_store_tombstone_capacity", **t) == 1000
    assert value(found, "gatewayscope_trace_store_dropped_writes_total", **t) == 17
    assert not any(name.startswith("gatewayscope_bifrost_") for name in names_of(found))


def test_both_confidences_present_when_there_are_no_orphans_and_no_guard_series_without_a_guard() -> None:
    snap = rllm_snapshot()
    assert snap.trace_store is not None
    snap.trace_store.sessions = snap.trace_store.sessions.filter(snap.trace_store.sessions["session_id"] == LIVE_ID)
    snap.trace_store.tombstoned_ids = []
    found = samples(exposition([TargetResult(RLLM, snap, "read", 0.0)]))
    t = {"target": "rl-gateway"}
    assert value(found, "gatewayscope_trace_store_orphan_sessions", confidence="confirmed", **t) == 0
    assert value(found, "gatewayscope_trace_store_orphan_sessions", confidence="suspected", **t) == 0
    assert value(found, "gatewayscope_trace_store_oldest_orphan_age_seconds", **t) == 0
    assert "gatewayscope_trace_store_tombstones" not in names_of(found)
    assert "gatewayscope_trace_store_dropped_writes_total" not in names_of(found)


def test_bifrost_families() -> None:
    found = samples(exposition([TargetResult(BIFROST, bifrost_snapshot(8), "cached", 3.0)]))
    t = {"target": "bifrost"}
    custom_workers = sum(1000 - i for i in range(8))
    assert value(found, "gatewayscope_up", kind="bifrost", **t) == 1
    assert value(found, "gatewayscope_bifrost_provider_records", kind="standard", **t) == 3
    assert value(found, "gatewayscope_bifrost_provider_records", kind="custom", **t) == 8
    assert value(found, "gatewayscope_bifrost_parked_workers", kind="standard", **t) == 2512
    assert value(found, "gatewayscope_bifrost_parked_workers", kind="custom", **t) == custom_workers
    assert value(found, "gatewayscope_bifrost_queue_slots", kind="custom", **t) == 8 * 5000
    assert value(found, "gatewayscope_bifrost_records_over_pool", kind="standard", **t) == 1  # anthropic 2000 > 512
    assert value(found, "gatewayscope_bifrost_records_over_pool", kind="custom", **t) == 8
    assert value(found, "gatewayscope_bifrost_worker_stack_bytes", bound="low", **t) == (2512 + custom_workers) * 2048
    assert value(found, "gatewayscope_bifrost_worker_stack_bytes", bound="high", **t) == (2512 + custom_workers) * 8192
    assert value(found, "gatewayscope_bifrost_memory_limit_bytes", **t) == 512 * 1024 * 1024
    assert value(found, "gatewayscope_bifrost_unreachable_records", **t) == 2  # a DNS failure and a status error
    assert value(found, "gatewayscope_bifrost_posture_drift", setting="drop_excess_requests", **t) == 1
    assert value(found, "gatewayscope_bifrost_posture_drift", setting="enforce_auth_on_inference", **t) == 0
    assert value(found, "gatewayscope_bifrost_posture_drift", setting="disable_content_logging", **t) == 1
    assert value(found, "gatewayscope_bifrost_record_parked_workers", record="anthropic", kind="standard", **t) == 2000
    assert not any(name.startswith("gatewayscope_trace_store_") for name in names_of(found))


def test_all_three_posture_settings_present_even_when_safe() -> None:
    safe = {"drop_excess_requests": False, "enforce_auth_on_inference": True, "disable_content_logging": True}
    found = samples(exposition([TargetResult(BIFROST, bifrost_snapshot(2, client_config=safe), "read", 0.0)]))
    drift = {labels: v for (name, labels), v in found.items() if name == "gatewayscope_bifrost_posture_drift"}
    assert sorted(dict(labels)["setting"] for labels in drift) == [
        "disable_content_logging", "drop_excess_requests", "enforce_auth_on_inference"]
    assert set(drift.values()) == {0.0}


def test_record_series_are_capped_and_the_rest_summed_per_kind() -> None:
    found = samples(exposition([TargetResult(BIFROST, bifrost_snapshot(40), "read", 0.0)], max_record_series=5))
    records = {dict(labels)["record"] + "/" + dict(labels)["kind"]: v
               for (name, labels), v in found.items() if name == "gatewayscope_bifrost_record_parked_workers"}
    # top 5 by parked workers: anthropic 2000, then org00 1000, org01 999, org02 998, org03 997
    assert set(records) == {"anthropic/standard", "org00__vllm__m/custom", "org01__vllm__m/custom",
                            "org02__vllm__m/custom", "org03__vllm__m/custom", "_other/standard", "_other/custom"}
    assert records["_other/standard"] == 512  # openai 512 + legacy-lan 0
    assert records["_other/custom"] == sum(1000 - i for i in range(4, 40))
    # nothing is lost: the capped series add up to the per-kind totals
    total_custom = value(found, "gatewayscope_bifrost_parked_workers", target="bifrost", kind="custom")
    assert sum(v for k, v in records.items() if k.endswith("/custom")) == total_custom


def test_no_other_series_when_under_the_cap_and_zero_cap_sums_everything() -> None:
    found = samples(exposition([TargetResult(BIFROST, bifrost_snapshot(3), "read", 0.0)], max_record_series=50))
    records = [dict(labels)["record"] for (name, labels) in found
               if name == "gatewayscope_bifrost_record_parked_workers"]
    assert len(records) == 6 and "_other" not in records
    found = samples(exposition([TargetResult(BIFROST, bifrost_snapshot(3), "read", 0.0)], max_record_series=0))
    records = [dict(labels)["record"] for (name, labels) in found
               if name == "gatewayscope_bifrost_record_parked_workers"]
    assert sorted(records) == ["_other", "_other"]


def test_record_series_order_is_stable_on_ties() -> None:
    import polars as pl

    frame = pl.DataFrame({"name": ["b", "a", "c"], "kind": ["custom"] * 3, "parked_workers": [5, 5, 5]})
    assert record_series(frame, 2) == [("a", "custom", 5), ("b", "custom", 5), ("_other", "custom", 5)]


def test_no_session_id_trace_id_url_or_secret_in_any_label() -> None:
    guard = GuardStats(tombstones=1, capacity=10, dropped_writes=1,
                       top_droppers=[{"session_id": TOMBSTONED_ID, "dropped": 1}])
    text = exposition([TargetResult(RLLM, rllm_snapshot(guard=guard), "read", 0.0),
                       TargetResult(BIFROST, bifrost_snapshot(60), "read", 0.0)], max_record_series=50,
                      counters={"rl-gateway": {"reads": {"ok": 1}, "scrapes": {"read": 1}, "in_flight": 0}})
    label_values = {v for (_, labels) in samples(text) for _, v in labels}
    forbidden = [ORPHAN_ID, TOMBSTONED_ID, LIVE_ID, TRACE_ID, "hunter2", "sk-THE-KEY", "upstream.example",
                 FINGERPRINT, "rl.test", "bf.test"]
    for needle in forbidden:
        assert not any(needle in v for v in label_values), needle
        assert needle not in text, needle  # nor anywhere else in the exposition
    # every label value is a target name, a fixed vocabulary, the version, or a record name
    allowed = {"rl-gateway", "bifrost", "rllm", "confirmed", "suspected", "standard", "custom", "low", "high",
               "drop_excess_requests", "enforce_auth_on_inference", "disable_content_logging", "_other",
               "ok", "error", "read", "joined", "cached", "deadline", __version__, "openai", "anthropic",
               "legacy-lan", "measured", "band", "trusted", "untrusted", "absent",
               ""}  # the pod labels of a target whose config names no pod
    unexpected = {v for v in label_values if v not in allowed and not re.fullmatch(r"org\d\d__vllm__m", v)}
    assert unexpected == set()


def test_up_is_zero_and_findings_absent_when_the_read_failed() -> None:
    found = samples(exposition([TargetResult(RLLM, rllm_snapshot(up=False), "read", 0.1),
                                TargetResult(BIFROST, bifrost_snapshot(2), "read", 0.1)]))
    assert value(found, "gatewayscope_up", target="rl-gateway", kind="rllm") == 0
    assert value(found, "gatewayscope_scrape_duration_seconds", target="rl-gateway") == 0.25
    assert not any(name.startswith("gatewayscope_trace_store_") for name in names_of(found))
    assert value(found, "gatewayscope_up", target="bifrost", kind="bifrost") == 1  # the other target is intact


def test_missed_deadline_has_no_age_and_up_zero() -> None:
    snap = TargetSnapshot(name=RLLM.name, kind="rllm", address=RLLM.address, up=False, started_at=NOW,
                          duration_seconds=4.5, error="no answer", error_kind="deadline")
    found = samples(exposition([TargetResult(RLLM, snap, "deadline", None)]))
    assert value(found, "gatewayscope_up", target="rl-gateway", kind="rllm") == 0
    assert value(found, "gatewayscope_scrape_duration_seconds", target="rl-gateway") == 4.5
    assert "gatewayscope_exporter_snapshot_age_seconds" not in names_of(found)


def test_an_analysis_failure_reports_the_target_down_and_keeps_the_others(caplog: pytest.LogCaptureFixture) -> None:
    broken = bifrost_snapshot(2)
    assert broken.bifrost is not None
    broken.bifrost.records = broken.bifrost.records.drop("concurrency")  # a shape the analysis cannot use
    found = samples(exposition([TargetResult(BIFROST, broken, "read", 0.0),
                                TargetResult(RLLM, rllm_snapshot(), "read", 0.0)]))
    assert value(found, "gatewayscope_up", target="bifrost", kind="bifrost") == 0
    assert not any(name.startswith("gatewayscope_bifrost_") for name in names_of(found))
    assert value(found, "gatewayscope_up", target="rl-gateway", kind="rllm") == 1
    assert "reporting it down" in caplog.text


def test_build_info_and_self_metrics() -> None:
    counters = {"rl-gateway": {"reads": {"ok": 3, "error": 1}, "scrapes": {"read": 4, "cached": 7}, "in_flight": 1}}
    found = samples(exposition([], counters=counters))
    assert value(found, "gatewayscope_build_info", version=__version__) == 1
    assert value(found, "gatewayscope_exporter_target_reads_total", target="rl-gateway", result="ok") == 3
    assert value(found, "gatewayscope_exporter_target_reads_total", target="rl-gateway", result="error") == 1
    assert value(found, "gatewayscope_exporter_target_scrapes_total", target="rl-gateway", source="cached") == 7
    assert value(found, "gatewayscope_exporter_target_scrapes_total", target="rl-gateway", source="deadline") == 0
    assert value(found, "gatewayscope_exporter_read_in_progress", target="rl-gateway") == 1


def runtime_of(workers: int, others: int = 40, stack: int = 6144, baseline: int = 80 * 2**20) -> RuntimeMetrics:
    goroutines = workers + others
    return RuntimeMetrics(url="http://bf.test:8080/metrics", goroutines=goroutines,
                          stack_inuse_bytes=goroutines * stack, resident_memory_bytes=baseline + goroutines * stack)


def test_help_and_type_lines_follow_the_contract() -> None:
    guard = GuardStats(tombstones=1, capacity=10, dropped_writes=1)
    # bifrost_snapshot(3): openai 512 + anthropic 2000 + 1000 + 999 + 998 custom = 5,509 parked workers
    text = exposition([TargetResult(RLLM, rllm_snapshot(guard=guard), "read", 0.0),
                       TargetResult(BIFROST, bifrost_snapshot(3, runtime=runtime_of(5509)), "read", 0.0)],
                      counters={"x": {"reads": {}, "scrapes": {}, "in_flight": 0}})
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (*CONTRACT_METRICS, "gatewayscope_exporter_snapshot_age_seconds"):
        spec = METRICS[name]
        base = name[: -len("_total")] if spec.type == "counter" else name
        assert base in families, name
        assert families[base].type == spec.type
        if spec.per_target:
            assert "may be up to min_interval_seconds (15 s)" in families[base].documentation, name
        for sample in families[base].samples:
            assert tuple(sorted(sample.labels)) == tuple(sorted(spec.labels)), name


def test_the_contract_names_are_exactly_those_of_the_design() -> None:
    design = {
        "gatewayscope_up": ("target", "kind"), "gatewayscope_scrape_duration_seconds": ("target",),
        "gatewayscope_build_info": ("version",), "gatewayscope_trace_store_sessions": ("target",),
        "gatewayscope_trace_store_traces": ("target",),
        "gatewayscope_trace_store_orphan_sessions": ("target", "confidence"),
        "gatewayscope_trace_store_oldest_orphan_age_seconds": ("target",),
        "gatewayscope_trace_store_tombstones": ("target",), "gatewayscope_trace_store_tombstone_capacity": ("target",),
        "gatewayscope_trace_store_dropped_writes_total": ("target",),
        "gatewayscope_bifrost_provider_records": ("target", "kind"),
        "gatewayscope_bifrost_parked_workers": ("target", "kind"),
        "gatewayscope_bifrost_queue_slots": ("target", "kind"),
        "gatewayscope_bifrost_record_parked_workers": ("target", "record", "kind"),
        "gatewayscope_bifrost_worker_stack_bytes": ("target", "bound"),
        "gatewayscope_bifrost_memory_limit_bytes": ("target",),
        "gatewayscope_bifrost_records_over_pool": ("target", "kind"),
        "gatewayscope_bifrost_unreachable_records": ("target",),
        "gatewayscope_bifrost_posture_drift": ("target", "setting"),
        # boot memory from the gateway's own runtime metrics (issue 27)
        "gatewayscope_bifrost_boot_memory_predicted_bytes": ("target", "model"),
        "gatewayscope_bifrost_goroutines": ("target",),
        "gatewayscope_bifrost_resident_memory_bytes": ("target",),
        "gatewayscope_bifrost_measured_stack_bytes_per_goroutine": ("target",),
        "gatewayscope_bifrost_measured_baseline_bytes": ("target",),
        "gatewayscope_bifrost_boot_memory_calibration_error_ratio": ("target",),
        "gatewayscope_bifrost_runtime_metrics_status": ("target", "status"),
        "gatewayscope_bifrost_kubernetes_info": ("target", "gateway_namespace", "gateway_pod",
                                                  "gateway_container"),
    }
    # every name of the design, with its labels; the names added since are extensions, listed here on purpose
    assert {name: METRICS[name].labels for name in design} == design
    assert set(CONTRACT_METRICS) - set(design) == {"gatewayscope_trace_store_kept_after_fence_writes_total"}
    assert METRICS["gatewayscope_trace_store_dropped_writes_total"].type == "counter"


# -- boot memory from the gateway's runtime metrics -----------------------------------------------------

def test_the_measured_figures_and_the_model_used() -> None:
    from gatewayscope.config import KubernetesPod

    target = Target(name="bifrost", kind="bifrost", url="http://bf.test:8080", memory_limit_bytes=512 * 2**20,
                    kubernetes=KubernetesPod(namespace="llm", pod="bifrost-0", container="bifrost"))
    found = samples(exposition([TargetResult(target, bifrost_snapshot(3, runtime=runtime_of(5509)), "read", 0.0)]))
    assert value(found, "gatewayscope_bifrost_boot_memory_predicted_bytes", target="bifrost", model="measured") == \
        80 * 2**20 + 5509 * 6144
    assert value(found, "gatewayscope_bifrost_goroutines", target="bifrost") == 5549
    assert value(found, "gatewayscope_bifrost_resident_memory_bytes", target="bifrost") == 80 * 2**20 + 5549 * 6144
    assert value(found, "gatewayscope_bifrost_measured_stack_bytes_per_goroutine", target="bifrost") == 6144
    assert value(found, "gatewayscope_bifrost_measured_baseline_bytes", target="bifrost") == 80 * 2**20
    assert value(found, "gatewayscope_bifrost_boot_memory_calibration_error_ratio", target="bifrost") == \
        pytest.approx(-40 * 6144 / (80 * 2**20 + 5549 * 6144))
    assert {labels: v for (name, labels), v in found.items() if name == "gatewayscope_bifrost_runtime_metrics_status"} \
        == {(("status", s), ("target", "bifrost")): 1.0 if s == "trusted" else 0.0
            for s in ("trusted", "untrusted", "absent")}
    assert value(found, "gatewayscope_bifrost_kubernetes_info", target="bifrost", gateway_namespace="llm",
                 gateway_pod="bifrost-0", gateway_container="bifrost") == 1.0


def test_untrusted_and_absent_metrics_give_the_band() -> None:
    lying = samples(exposition([TargetResult(BIFROST, bifrost_snapshot(3, runtime=runtime_of(50, others=0)),
                                             "read", 0.0)]))
    assert value(lying, "gatewayscope_bifrost_boot_memory_predicted_bytes", target="bifrost", model="band") == \
        5509 * 8192
    assert value(lying, "gatewayscope_bifrost_runtime_metrics_status", target="bifrost", status="untrusted") == 1.0
    assert value(lying, "gatewayscope_bifrost_goroutines", target="bifrost") == 50  # what it reported, shown
    absent = samples(exposition([TargetResult(BIFROST, bifrost_snapshot(3, runtime_error="404"), "read", 0.0)]))
    assert value(absent, "gatewayscope_bifrost_runtime_metrics_status", target="bifrost", status="absent") == 1.0
    assert not any(name == "gatewayscope_bifrost_goroutines" for name, _ in absent)
    assert value(absent, "gatewayscope_bifrost_kubernetes_info", target="bifrost", gateway_namespace="",
                 gateway_pod="", gateway_container="") == 1.0


# -- the findings cache: a scrape served from the per-target cache does not analyse again ------------

def test_findings_are_analysed_once_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from gatewayscope.analysis import findings
    from gatewayscope.exporter.collectors import FindingsCache

    calls = {"orphans": 0, "pools": 0}
    real_orphans, real_classify = findings.find_orphans, findings.classify_records

    def counting_orphans(*args: Any, **kwargs: Any) -> Any:
        calls["orphans"] += 1
        return real_orphans(*args, **kwargs)

    def counting_classify(*args: Any, **kwargs: Any) -> Any:
        calls["pools"] += 1
        return real_classify(*args, **kwargs)

    monkeypatch.setattr(findings, "find_orphans", counting_orphans)
    monkeypatch.setattr(findings, "classify_records", counting_classify)
    cache = FindingsCache()
    rllm, bifrost = rllm_snapshot(), bifrost_snapshot()

    def scrape(rllm_snap: TargetSnapshot, age: float) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(TargetsCollector(
            [TargetResult(RLLM, rllm_snap, "cached", age), TargetResult(BIFROST, bifrost, "cached", age)],
            Policy(), max_record_series=50, min_interval_seconds=15.0, cache=cache))
        return generate_latest(registry).decode()

    first = scrape(rllm, 1.0)
    second = scrape(rllm, 2.0)
    assert calls == {"orphans": 1, "pools": 1}
    # the same findings, with this scrape's own age
    def without_age(found: dict) -> dict:
        return {k: v for k, v in found.items() if k[0] != "gatewayscope_exporter_snapshot_age_seconds"}

    assert without_age(samples(first)) == without_age(samples(second))
    assert value(samples(second), "gatewayscope_exporter_snapshot_age_seconds", target="rl-gateway") == 2.0
    uncached = exposition([TargetResult(RLLM, rllm, "cached", 2.0), TargetResult(BIFROST, bifrost, "cached", 2.0)])
    assert samples(second) == samples(uncached)
    calls.update(orphans=1, pools=1)  # the uncached exposition analysed both again

    # a new read of one target is analysed again; the other target's findings stay cached
    fresh = rllm_snapshot(guard=GuardStats(tombstones=3, capacity=10, dropped_writes=1))
    third = samples(scrape(fresh, 0.1))
    assert calls == {"orphans": 2, "pools": 1}
    assert value(third, "gatewayscope_trace_store_tombstones", target="rl-gateway") == 3


def test_a_failed_read_is_never_served_findings_of_an_earlier_one() -> None:
    from gatewayscope.exporter.collectors import FindingsCache

    cache = FindingsCache()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TargetsCollector([TargetResult(RLLM, rllm_snapshot(), "read", 0.0)], Policy(),
                                       max_record_series=50, min_interval_seconds=15.0, cache=cache))
    assert "gatewayscope_trace_store_sessions" in generate_latest(registry).decode()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TargetsCollector([TargetResult(RLLM, rllm_snapshot(up=False), "read", 0.0)], Policy(),
                                       max_record_series=50, min_interval_seconds=15.0, cache=cache))
    found = samples(generate_latest(registry).decode())
    assert value(found, "gatewayscope_up", target="rl-gateway", kind="rllm") == 0
    assert "gatewayscope_trace_store_sessions" not in names_of(found)
