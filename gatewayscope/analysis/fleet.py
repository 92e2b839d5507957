"""The fleet view: every target the exporters serve, read back from the Prometheus that scrapes them.

When there are many gateways they are already scraped by Prometheus; :func:`read_fleet` asks its HTTP API
for the exporter's series over a window (range queries, at most ``max_points`` points per series, see
:func:`~gatewayscope.sources.prometheus.range_grid`) and makes three frames, one row per target (and per
cluster, with a ``cluster_label``):

* :func:`orphan_growth`: ``gatewayscope_trace_store_orphan_sessions`` (summed over ``confidence``), its
  latest value, the window's lowest value and the rise above it. Growth is read from the gauge alone, as the
  ``GatewayscopeOrphanSessionsGrowing`` alert does: a rise above the window's minimum survives a cleanup
  (a ``delta`` over the window would go negative), and no ``delta``/``rate`` is ever taken of a gauge;
* :func:`boot_memory_ranking`: ``gatewayscope_bifrost_worker_stack_bytes`` (``bound`` low and high)
  against ``gatewayscope_bifrost_memory_limit_bytes``, ranked by the share of the limit the high bound
  takes; the verdict follows the two boot-memory alerts (low bound over the limit: it will not boot; high
  bound over: at risk);
* :func:`posture_drift_by_target`: ``gatewayscope_bifrost_posture_drift``, one row per target and setting:
  drifted now, the share of the window it was drifted, and since when.

One target is often scraped twice (through ``/metrics`` and through ``/probe``), so each query first
aggregates per job and instance and then takes the ``max`` per target: never the sum of two views of the
same target. The window's minimum is the lowest of the points the range query returned (a dip shorter than
the step can fall between two points). A metric without a series gives an empty frame with the same
columns and a plain sentence in :attr:`FleetView.messages`. Label values are kept as Prometheus has them:
the views that show them escape them.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from gatewayscope.analysis.posture import SAFE_POSTURE
from gatewayscope.errors import ConfigError
from gatewayscope.snapshot import frame_from_rows
from gatewayscope.sources.prometheus import (
    DEFAULT_MAX_POINTS,
    PrometheusClient,
    RangeGrid,
    RangeSeries,
    range_grid,
)

#: the jobs of the shipped scrape examples, as the mixin selects them by default (dashboards/build.py)
DEFAULT_JOB_SELECTOR = 'job=~"gatewayscope|gatewayscope-.*"'
#: the window the fleet view looks back over by default: a day
DEFAULT_WINDOW_SECONDS = 86_400

ORPHANS = "gatewayscope_trace_store_orphan_sessions"
STACK_BYTES = "gatewayscope_bifrost_worker_stack_bytes"
MEMORY_LIMIT = "gatewayscope_bifrost_memory_limit_bytes"
POSTURE_DRIFT = "gatewayscope_bifrost_posture_drift"

_TIME = pl.Datetime("ms", "UTC")
ORPHAN_GROWTH_SCHEMA: dict[str, Any] = {
    "target": pl.String, "latest": pl.Int64, "window_min": pl.Int64, "growth": pl.Int64,
    "lowest_at": _TIME, "last_seen": _TIME, "points": pl.Int64,
}
ORPHAN_HISTORY_SCHEMA: dict[str, Any] = {"target": pl.String, "time": _TIME, "orphans": pl.Int64}
BOOT_MEMORY_SCHEMA: dict[str, Any] = {
    "target": pl.String, "stack_bytes_low": pl.Int64, "stack_bytes_high": pl.Int64,
    "memory_limit_bytes": pl.Int64, "low_share": pl.Float64, "high_share": pl.Float64,
    "peak_high_share": pl.Float64, "verdict": pl.String, "last_seen": _TIME,
}
POSTURE_DRIFT_SCHEMA: dict[str, Any] = {
    "target": pl.String, "setting": pl.String, "drifted": pl.Boolean, "drifted_share": pl.Float64,
    "drifted_since": _TIME, "last_seen": _TIME,
}

#: boot-memory verdicts, worst first (the order a ranking breaks ties in)
VERDICTS = ("will not boot", "at risk", "fits", "no limit")

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED = {"job", "instance", "target", "kind", "bound", "setting", "confidence", "__name__"}


def _schema(base: dict[str, Any], cluster: bool) -> dict[str, Any]:
    """``base`` with a ``cluster`` column first when the fleet spans clusters."""
    return {"cluster": pl.String, **base} if cluster else dict(base)


def _when(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


def _finite(series: RangeSeries) -> list[tuple[float, float]]:
    """The samples of ``series`` that are numbers (Prometheus's NaN and infinities left out)."""
    return [(t, v) for t, v in zip(series.times, series.values, strict=True) if math.isfinite(v)]


def _key(series: RangeSeries, cluster_label: str) -> tuple[str, ...] | None:
    """(cluster, target) or (target,) of a series; None when it has no target label."""
    target = series.labels.get("target")
    if target is None:
        return None
    return (series.labels.get(cluster_label, ""), target) if cluster_label else (target,)


def orphan_growth(series: Sequence[RangeSeries], *, cluster_label: str = "") -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(growth, history)`` from the range series of orphan sessions per target.

    ``growth``: one row per target, ranked by ``growth`` (latest minus the window's lowest value), then by
    ``latest``; ``lowest_at`` is the last time the count was at that lowest value. ``history``: every point,
    for a chart.

    >>> s = RangeSeries({"target": "a"}, [0.0, 60.0, 120.0, 180.0], [12.0, 2.0, 3.0, 5.0])
    >>> growth, _ = orphan_growth([s])
    >>> growth.select("target", "latest", "window_min", "growth").row(0)
    ('a', 5, 2, 3)
    """
    rows: list[tuple[Any, ...]] = []
    history: list[tuple[Any, ...]] = []
    for one in series:
        key = _key(one, cluster_label)
        samples = _finite(one)
        if key is None or not samples:
            continue
        counts = [(t, round(v)) for t, v in samples]
        lowest = min(v for _, v in counts)
        lowest_at = max(t for t, v in counts if v == lowest)
        latest_at, latest = counts[-1]
        rows.append((*key, latest, lowest, latest - lowest, _when(lowest_at), _when(latest_at), len(counts)))
        history += [(*key, _when(t), v) for t, v in counts]
    cluster = bool(cluster_label)
    growth = frame_from_rows(rows, _schema(ORPHAN_GROWTH_SCHEMA, cluster))
    keys = ["cluster", "target"] if cluster else ["target"]
    growth = growth.sort(["growth", "latest", *keys], descending=[True, True, *[False] * len(keys)])
    history_frame = frame_from_rows(history, _schema(ORPHAN_HISTORY_SCHEMA, cluster)).sort([*keys, "time"])
    return growth, history_frame


def _verdict(low: float, high: float, limit: float | None) -> str:
    if limit is None or limit <= 0:
        return "no limit"
    if low > limit:
        return "will not boot"
    return "at risk" if high > limit else "fits"


def boot_memory_ranking(stack: Sequence[RangeSeries], limits: Sequence[RangeSeries], *,
                        cluster_label: str = "") -> pl.DataFrame:
    """One row per Bifrost target: its latest boot stack bytes (low and high bound), its memory limit, the
    share of the limit each bound takes, the highest share the high bound took in the window, and the verdict;
    ranked by ``high_share`` (a target without a limit last), then by the verdict.

    >>> stack = [RangeSeries({"target": "b", "bound": "low"}, [0.0], [300.0]),
    ...          RangeSeries({"target": "b", "bound": "high"}, [0.0], [1200.0])]
    >>> ranked = boot_memory_ranking(stack, [RangeSeries({"target": "b"}, [0.0], [1000.0])])
    >>> ranked.select("target", "high_share", "verdict").row(0)
    ('b', 1.2, 'at risk')
    """
    bounds: dict[tuple[str, ...], dict[str, list[tuple[float, float]]]] = {}
    for one in stack:
        key = _key(one, cluster_label)
        bound = one.labels.get("bound")
        samples = _finite(one)
        if key is not None and bound in ("low", "high") and samples:
            bounds.setdefault(key, {})[bound] = samples
    limit_of: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for one in limits:
        key = _key(one, cluster_label)
        samples = _finite(one)
        if key is not None and samples:
            limit_of[key] = samples
    rows: list[tuple[Any, ...]] = []
    for key, by_bound in bounds.items():
        if "low" not in by_bound or "high" not in by_bound:
            continue
        (low_at, low), (high_at, high) = by_bound["low"][-1], by_bound["high"][-1]
        limit_samples = limit_of.get(key)
        limit = limit_samples[-1][1] if limit_samples else None
        usable = limit is not None and limit > 0
        peak: float | None = None
        if limit_samples:
            limit_at = dict(limit_samples)
            shares = [v / limit_at[t] for t, v in by_bound["high"] if limit_at.get(t, 0) > 0]
            peak = max(shares) if shares else None
        rows.append((*key, round(low), round(high), round(limit) if limit is not None else None,
                     low / limit if usable and limit else None, high / limit if usable and limit else None,
                     peak, _verdict(low, high, limit), _when(max(low_at, high_at))))
    cluster = bool(cluster_label)
    frame = frame_from_rows(rows, _schema(BOOT_MEMORY_SCHEMA, cluster))
    keys = ["cluster", "target"] if cluster else ["target"]
    rank = pl.col("verdict").replace_strict({v: i for i, v in enumerate(VERDICTS)}, return_dtype=pl.Int64)
    return frame.with_columns(_rank=rank).sort(
        ["high_share", "_rank", *keys], descending=[True, False, *[False] * len(keys)], nulls_last=True,
    ).drop("_rank")


def posture_drift_by_target(series: Sequence[RangeSeries], *, cluster_label: str = "") -> pl.DataFrame:
    """One row per target and posture setting: ``drifted`` (the latest value is 1), ``drifted_share`` (the
    share of the window's points at 1) and ``drifted_since`` (the first point of the current drifted run;
    empty when not drifted). Drifted rows first, then by share, target and setting.

    >>> s = RangeSeries({"target": "b", "setting": "drop_excess_requests"}, [0.0, 60.0, 120.0], [0.0, 1.0, 1.0])
    >>> posture_drift_by_target([s]).select("target", "drifted", "drifted_share").row(0)
    ('b', True, 0.6666666666666666)
    """
    rows: list[tuple[Any, ...]] = []
    for one in series:
        key = _key(one, cluster_label)
        setting = one.labels.get("setting")
        samples = _finite(one)
        if key is None or setting is None or not samples:
            continue
        drifted = [v >= 1 for _, v in samples]
        since: float | None = None
        for (t, _), on in zip(reversed(samples), reversed(drifted), strict=True):
            if not on:
                break
            since = t
        rows.append((*key, setting, drifted[-1], sum(drifted) / len(drifted),
                     _when(since) if since is not None else None, _when(samples[-1][0])))
    cluster = bool(cluster_label)
    frame = frame_from_rows(rows, _schema(POSTURE_DRIFT_SCHEMA, cluster))
    keys = ["cluster", "target"] if cluster else ["target"]
    order = pl.col("setting").replace_strict({s: i for i, s in enumerate(SAFE_POSTURE)}, default=len(SAFE_POSTURE),
                                             return_dtype=pl.Int64)
    return frame.with_columns(_order=order).sort(
        ["drifted", "drifted_share", *keys, "_order", "setting"],
        descending=[True, True, *[False] * len(keys), False, False]).drop("_order")


@dataclass
class FleetView:
    """The three frames of the fleet, the orphan history behind the first, and what was found missing."""

    prometheus_url: str
    #: the window asked for, in seconds; the grid's start is the last whole step inside it
    window_seconds: float
    grid: RangeGrid
    selector: str
    orphan_growth: pl.DataFrame
    orphan_history: pl.DataFrame
    boot_memory: pl.DataFrame
    posture_drift: pl.DataFrame
    #: one plain sentence per metric Prometheus had no series of in the window
    messages: list[str] = field(default_factory=list)


def _selector_matchers(job_selector: str) -> str:
    text = job_selector.strip()
    if text.startswith("{") or text.endswith("}") or not text:
        raise ConfigError(f"The job selector is PromQL label matchers without braces, such as "
                          f"{DEFAULT_JOB_SELECTOR}; not {job_selector!r}.")
    return text


def window_text(seconds: float) -> str:
    """A window for sentences.

    >>> window_text(86400), window_text(7200), window_text(300), window_text(45)
    ('1 day', '2 hours', '5 minutes', '45 seconds')
    """
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" + ("s" if count != 1 else "")
    return f"{seconds:g} seconds"


def read_fleet(prometheus: str | PrometheusClient, *, window_seconds: float = DEFAULT_WINDOW_SECONDS,
               end: float | None = None, job_selector: str = DEFAULT_JOB_SELECTOR, cluster_label: str = "",
               max_points: int = DEFAULT_MAX_POINTS, timeout: float = 30.0) -> FleetView:
    """Read the fleet from the Prometheus at ``prometheus`` (a base URL, or a client): four range queries over
    the last ``window_seconds`` before ``end`` (default now), each at most ``max_points`` points per series.

    ``job_selector`` (PromQL matchers without braces) picks the exporter's jobs; ``cluster_label`` names the
    label that tells clusters apart (empty: one cluster), and adds a ``cluster`` column to every frame.
    Raises a :class:`~gatewayscope.errors.GatewayscopeError` with a sentence when Prometheus cannot be read.
    """
    if cluster_label and (not _LABEL_NAME.fullmatch(cluster_label) or cluster_label in _RESERVED):
        raise ConfigError(f"cluster_label must be a label name other than gatewayscope's own, not {cluster_label!r}.")
    matchers = _selector_matchers(job_selector)
    grid = range_grid(window_seconds, end=end, max_points=max_points)
    keys = f"{cluster_label}, target" if cluster_label else "target"
    client = prometheus if isinstance(prometheus, PrometheusClient) else PrometheusClient(prometheus, timeout=timeout)
    try:
        orphans = client.query_range(
            f"max by ({keys}) (sum by ({keys}, job, instance) ({ORPHANS}{{{matchers}}}))", grid)
        stack = client.query_range(f"max by ({keys}, bound) ({STACK_BYTES}{{{matchers}}})", grid)
        limits = client.query_range(f"max by ({keys}) ({MEMORY_LIMIT}{{{matchers}}})", grid)
        posture = client.query_range(f"max by ({keys}, setting) ({POSTURE_DRIFT}{{{matchers}}})", grid)
    finally:
        if client is not prometheus:
            client.close()
    growth, history = orphan_growth(orphans, cluster_label=cluster_label)
    view = FleetView(prometheus_url=client.base_url, window_seconds=window_seconds, grid=grid, selector=matchers,
                     orphan_growth=growth, orphan_history=history,
                     boot_memory=boot_memory_ranking(stack, limits, cluster_label=cluster_label),
                     posture_drift=posture_drift_by_target(posture, cluster_label=cluster_label))
    window = window_text(window_seconds)
    for metric, found in ((ORPHANS, orphans), (STACK_BYTES, stack), (MEMORY_LIMIT, limits), (POSTURE_DRIFT, posture)):
        if not found:
            view.messages.append(f"Prometheus has no {metric} series for {{{matchers}}} in the last {window}: no "
                                 "exporter with such targets is scraped there, or the job selector does not match "
                                 "its jobs.")
    return view
