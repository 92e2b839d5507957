"""The fleet view's three frames (gatewayscope.analysis.fleet) from range series, and :func:`read_fleet` over
query_range answers written the way Prometheus writes them (a scripted transport stands in for the network;
tests/e2e/test_fleet_prometheus.py reads a real Prometheus)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gatewayscope.analysis.fleet import (
    BOOT_MEMORY_SCHEMA,
    DEFAULT_JOB_SELECTOR,
    MEMORY_LIMIT,
    ORPHAN_GROWTH_SCHEMA,
    ORPHAN_HISTORY_SCHEMA,
    ORPHANS,
    POSTURE_DRIFT,
    POSTURE_DRIFT_SCHEMA,
    STACK_BYTES,
    boot_memory_ranking,
    orphan_growth,
    posture_drift_by_target,
    read_fleet,
)
from gatewayscope.errors import ConfigError
from gatewayscope.sources.prometheus import PrometheusClient, RangeSeries

T0 = 1_700_000_000.0
MINUTE = 60.0
KIB = 1024


def at(minutes: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(T0 + minutes * MINUTE, tz=dt.timezone.utc)


def series(labels: dict[str, str], values: list[float], every: float = 10.0) -> RangeSeries:
    """One series, a point every ``every`` minutes from T0."""
    return RangeSeries(labels, [T0 + i * every * MINUTE for i in range(len(values))], [float(v) for v in values])


# -- orphan growth -------------------------------------------------------------------------------------------

def test_growth_after_a_cleanup_is_the_rise_above_the_windows_lowest_count() -> None:
    # 10 orphans, deleted at 30 m, then one new orphan every 10 minutes: growth is seen at once, where a
    # delta over the window would still be negative
    after_cleanup = series({"target": "leaky"}, [10, 10, 10, 0, 1, 2, 3])
    steady = series({"target": "steady"}, [4, 4, 4, 4, 4, 4, 4])
    growth, history = orphan_growth([steady, after_cleanup])
    rows = {row["target"]: row for row in growth.iter_rows(named=True)}
    assert after_cleanup.values[-1] - after_cleanup.values[0] < 0  # what delta would say
    assert rows["leaky"] == {"target": "leaky", "latest": 3, "window_min": 0, "growth": 3,
                                  "lowest_at": at(30), "last_seen": at(60), "points": 7}
    assert (rows["steady"]["growth"], rows["steady"]["lowest_at"]) == (0, at(60))  # the last time at the lowest
    assert growth["target"].to_list() == ["leaky", "steady"]
    assert history.schema == ORPHAN_HISTORY_SCHEMA and history.height == 14


def test_growth_ranks_by_growth_then_latest_then_name() -> None:
    growth, _ = orphan_growth([series({"target": "b"}, [1, 3]), series({"target": "a"}, [5, 7]),
                               series({"target": "c"}, [0, 9])])
    assert growth["target"].to_list() == ["c", "a", "b"]


def test_nan_samples_and_series_without_a_target_are_left_out() -> None:
    nan = float("nan")
    growth, history = orphan_growth([series({"target": "a"}, [nan, 2, nan, 5, float("inf")]),
                                     series({}, [1, 2]), series({"target": "gone"}, [nan, nan])])
    assert growth.rows() == [("a", 5, 2, 3, at(10), at(30), 2)]
    assert history.height == 2


def test_a_cluster_label_keeps_the_same_target_name_apart_per_cluster() -> None:
    growth, history = orphan_growth([series({"cluster": "eu", "target": "gw"}, [1, 2]),
                                     series({"cluster": "us", "target": "gw"}, [5, 5])], cluster_label="cluster")
    assert growth.columns[:2] == ["cluster", "target"]
    assert growth.select("cluster", "target", "growth").rows() == [("eu", "gw", 1), ("us", "gw", 0)]
    assert history.columns[:2] == ["cluster", "target"]


def test_no_series_gives_empty_frames_with_their_columns() -> None:
    growth, history = orphan_growth([])
    assert growth.is_empty() and growth.schema == ORPHAN_GROWTH_SCHEMA
    assert history.is_empty() and history.schema == ORPHAN_HISTORY_SCHEMA
    assert boot_memory_ranking([], []).schema == BOOT_MEMORY_SCHEMA
    assert posture_drift_by_target([]).schema == POSTURE_DRIFT_SCHEMA
    assert list(boot_memory_ranking([], [], cluster_label="c").schema) == ["cluster", *BOOT_MEMORY_SCHEMA]


# -- boot memory ---------------------------------------------------------------------------------------------

def stack(target: str, low: list[float], high: list[float]) -> list[RangeSeries]:
    return [series({"target": target, "bound": "low"}, low), series({"target": target, "bound": "high"}, high)]


def test_boot_memory_is_ranked_by_the_share_of_the_limit_with_the_alerts_verdicts() -> None:
    ranked = boot_memory_ranking(
        [*stack("fits", [100], [400]), *stack("over", [600], [2400]), *stack("risk", [300], [1200]),
         *stack("unlimited", [10], [40]), *stack("zero", [10], [40])],
        [series({"target": t}, [limit]) for t, limit in (("fits", 1000), ("over", 500), ("risk", 1000),
                                                         ("zero", 0))])
    assert ranked.select("target", "verdict").rows() == [
        ("over", "will not boot"), ("risk", "at risk"), ("fits", "fits"), ("unlimited", "no limit"),
        ("zero", "no limit")]
    over = ranked.row(0, named=True)
    assert (over["low_share"], over["high_share"], over["memory_limit_bytes"]) == (1.2, 4.8, 500)
    assert ranked.filter(target="unlimited")["memory_limit_bytes"].to_list() == [None]
    assert ranked.filter(target="zero")["high_share"].to_list() == [None]


def test_the_peak_share_is_the_highest_the_high_bound_took_of_the_limit_at_the_same_time() -> None:
    ranked = boot_memory_ranking(stack("gw", [100, 100, 100], [900, 1500, 400]),
                                 [series({"target": "gw"}, [1000, 2000, 1000])])
    row = ranked.row(0, named=True)
    assert (row["high_share"], row["peak_high_share"], row["verdict"]) == (0.4, 0.9, "fits")
    assert row["last_seen"] == at(20)


def test_a_target_missing_a_bound_is_not_ranked() -> None:
    assert boot_memory_ranking([series({"target": "half", "bound": "low"}, [1])], []).is_empty()


# -- posture drift -------------------------------------------------------------------------------------------

def test_posture_drift_says_drifted_now_for_what_share_and_since_when() -> None:
    frame = posture_drift_by_target([
        series({"target": "gw", "setting": "disable_content_logging"}, [1, 0, 0, 1, 1]),
        series({"target": "gw", "setting": "drop_excess_requests"}, [1, 1, 0, 0, 0]),
        series({"target": "gw", "setting": "enforce_auth_on_inference"}, [1, 1, 1, 1, 1]),
        series({"target": "ok", "setting": "drop_excess_requests"}, [0, 0]),
    ])
    assert frame.select("target", "setting", "drifted", "drifted_share", "drifted_since").rows() == [
        ("gw", "enforce_auth_on_inference", True, 1.0, at(0)),
        ("gw", "disable_content_logging", True, 0.6, at(30)),
        ("gw", "drop_excess_requests", False, 0.4, None),
        ("ok", "drop_excess_requests", False, 0.0, None),
    ]


# -- read_fleet over Prometheus's answers --------------------------------------------------------------------

def matrix(result: list[dict[str, Any]]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def prometheus(answers: dict[str, list[dict[str, Any]]], seen: list[str]) -> PrometheusClient:
    """A client whose Prometheus answers each query with the result of the first metric name it contains."""
    def handle(request: httpx.Request) -> httpx.Response:
        expr = parse_qs(urlsplit(str(request.url)).query)["query"][0]
        seen.append(expr)
        metric = next(name for name in (ORPHANS, STACK_BYTES, MEMORY_LIMIT, POSTURE_DRIFT) if name in expr)
        return httpx.Response(200, content=matrix(answers.get(metric, [])))

    return PrometheusClient("http://prometheus.test:9090", transport=httpx.MockTransport(handle))


def values(*numbers: float) -> list[list[Any]]:
    return [[T0 + i * 600, str(n)] for i, n in enumerate(numbers)]


def test_read_fleet_asks_four_range_queries_with_the_selector_and_no_delta_or_rate() -> None:
    seen: list[str] = []
    answers = {
        ORPHANS: [{"metric": {"target": "rllm-a"}, "values": values(10, 0, 2)}],
        STACK_BYTES: [{"metric": {"target": "bf", "bound": "low"}, "values": values(2 * KIB)},
                      {"metric": {"target": "bf", "bound": "high"}, "values": values(8 * KIB)}],
        MEMORY_LIMIT: [{"metric": {"target": "bf"}, "values": values(4 * KIB)}],
    }
    view = read_fleet(prometheus(answers, seen), window_seconds=3600, end=T0 + 1200,
                      job_selector='job="gs", cluster="eu"')
    assert len(seen) == 4
    assert all('{job="gs", cluster="eu"}' in expr and expr.startswith("max by (target") for expr in seen)
    assert not any(word in expr for expr in seen for word in ("delta", "rate(", "increase"))
    assert "sum by (target, job, instance)" in seen[0]  # one target's two scrape jobs are not added up
    assert view.orphan_growth.select("target", "latest", "growth").rows() == [("rllm-a", 2, 2)]
    assert view.boot_memory.select("target", "verdict").rows() == [("bf", "at risk")]
    assert view.posture_drift.is_empty() and view.posture_drift.schema == POSTURE_DRIFT_SCHEMA
    assert view.messages == [f"Prometheus has no {POSTURE_DRIFT} series for {{job=\"gs\", cluster=\"eu\"}} in the "
                             "last 1 hour: no exporter with such targets is scraped there, or the job selector does "
                             "not match its jobs."]
    assert view.grid.end == T0 + 1200 and view.grid.points <= 300


def test_read_fleet_groups_by_the_cluster_label_when_given() -> None:
    seen: list[str] = []
    view = read_fleet(prometheus({ORPHANS: [{"metric": {"dc": "eu", "target": "gw"}, "values": values(1, 2)}]},
                                 seen), window_seconds=3600, end=T0 + 600, cluster_label="dc")
    assert all(expr.startswith("max by (dc, target") for expr in seen)
    assert view.orphan_growth.select("cluster", "target", "growth").rows() == [("eu", "gw", 1)]


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"cluster_label": "target"}, "cluster_label"),
    ({"cluster_label": "not a label"}, "cluster_label"),
    ({"job_selector": '{job="x"}'}, "without braces"),
    ({"job_selector": "  "}, "without braces"),
    ({"window_seconds": -1}, "positive number of seconds"),
])
def test_read_fleet_refuses_a_wrong_parameter_before_asking_prometheus(kwargs: dict[str, Any], said: str) -> None:
    seen: list[str] = []
    with pytest.raises(ConfigError, match=said):
        read_fleet(prometheus({}, seen), **kwargs)
    assert seen == []


def test_the_default_selector_is_the_mixins() -> None:
    build = (Path(__file__).resolve().parents[2] / "dashboards" / "build.py").read_text()
    assert f"DEFAULT_JOB_SELECTOR = {DEFAULT_JOB_SELECTOR!r}" in build
