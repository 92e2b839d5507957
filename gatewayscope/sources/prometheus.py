"""Read series from a Prometheus HTTP API: range queries (``GET /api/v1/query_range``) into plain values.

The fleet view (:mod:`gatewayscope.analysis.fleet`) reads the exporter's series back from the Prometheus that
scrapes it. Every request goes through the one HTTP layer (:mod:`gatewayscope.sources._http`): the whole
exchange bounded by the client's timeout, the answer by ``max_body_bytes``, no redirect followed. What can go
wrong becomes a gatewayscope error with a sentence:

* nothing answers -> :class:`~gatewayscope.errors.UnreachableError`; too slow ->
  :class:`~gatewayscope.errors.GatewayTimeoutError`;
* an error status (a bad query is 400 or 422, an overloaded Prometheus 503) ->
  :class:`~gatewayscope.errors.HTTPStatusError` with Prometheus's own ``error`` sentence;
* an answer that is not JSON, not Prometheus's envelope, says ``"status": "error"``, or holds a result that is
  not a matrix of ``[time, "value"]`` pairs -> :class:`~gatewayscope.errors.BadResponseError`.

A query never asks for more than ``max_points`` points per series: :func:`range_grid` picks the step from the
window. Label values come back exactly as Prometheus stores them (hostile strings included): whoever shows
them escapes them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlencode, urlsplit

import httpx

from gatewayscope.errors import BadResponseError, ConfigError
from gatewayscope.sources._http import HttpClient, strip_control_chars

#: the most points a range query asks for per series (Prometheus itself refuses more than 11,000)
DEFAULT_MAX_POINTS = 300
#: the finest step a range query uses, in seconds
MIN_STEP_SECONDS = 1
#: the most bytes of one query_range answer gatewayscope reads
DEFAULT_PROMETHEUS_MAX_BODY_BYTES = 32 * 1024 * 1024
#: the most series of one answer gatewayscope keeps (each target has a handful of series per metric)
MAX_SERIES = 10_000
_RAISE_CAP = "narrow the query (a job selector) or raise max_body_bytes of the Prometheus client"


@dataclass(frozen=True)
class RangeGrid:
    """The times a range query evaluates at: ``start``, ``start + step``, ... ``end`` (Unix seconds)."""

    start: float
    end: float
    step: int

    @property
    def points(self) -> int:
        return round((self.end - self.start) / self.step) + 1


def range_grid(window_seconds: float, *, end: float | None = None, max_points: int = DEFAULT_MAX_POINTS) -> RangeGrid:
    """The grid of a range query over the last ``window_seconds`` before ``end`` (default now): the smallest
    whole-second step (at least :data:`MIN_STEP_SECONDS`) that needs at most ``max_points`` points, and a start
    a whole number of steps before ``end``, so the last point is ``end`` itself.

    >>> grid = range_grid(86400, end=1_000_000.0)
    >>> grid.step, grid.points, grid.end - grid.start <= 86400
    (289, 299, True)
    >>> range_grid(60, end=100.0, max_points=300).step
    1
    """
    if not (isinstance(window_seconds, (int, float)) and math.isfinite(window_seconds) and window_seconds > 0):
        raise ConfigError(f"The fleet window must be a positive number of seconds, not {window_seconds!r}.")
    if max_points < 2:
        raise ConfigError(f"A range query needs at least 2 points, not {max_points}.")
    step = max(MIN_STEP_SECONDS, math.ceil(window_seconds / (max_points - 1)))
    intervals = max(1, int(window_seconds // step))
    stop = time.time() if end is None else float(end)
    return RangeGrid(start=stop - intervals * step, end=stop, step=step)


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: its labels and its samples (Unix seconds, value; NaN where Prometheus says
    ``NaN``), in time order."""

    labels: dict[str, str]
    times: list[float]
    values: list[float]


def check_prometheus_url(url: str) -> str:
    """``url`` without a trailing slash, or a ConfigError saying what an address of Prometheus looks like."""
    text = url.strip() if isinstance(url, str) else ""
    try:
        parts = urlsplit(text)
        usable = (parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query
                  and not parts.fragment and (parts.port is None or parts.port > 0)
                  and not any(ch.isspace() or not ch.isprintable() for ch in text))
        if usable:
            httpx.URL(text)  # what httpx would refuse when sending
    except (ValueError, httpx.InvalidURL):
        usable = False
    if not usable:
        shown = strip_control_chars(repr(url), 120)
        raise ConfigError(f"{shown} is not the address of a Prometheus: give its base URL, such as "
                          "http://prometheus:9090 (http or https, no query).")
    return text.rstrip("/")


class PrometheusClient(HttpClient):
    """Prometheus's HTTP API at ``base_url`` (the address its web UI has, e.g. ``http://prometheus:9090``).

    ``auth`` is Basic auth for a Prometheus behind a proxy that asks for it; ``timeout`` bounds each whole
    exchange, ``max_body_bytes`` each answer.
    """

    server = "Prometheus"
    timeout_sentence = ("{who} did not answer the range query within {seconds:g} s; a shorter window or a narrower "
                        "selector makes the query lighter.")
    unreachable_sentence = ("Cannot reach Prometheus at {base_url} ({reason}); check prometheus_url and that "
                            "Prometheus is running.")
    #: an error status names the server, not the path (which holds the whole urlencoded query)
    status_url = "{who}"

    def __init__(self, base_url: str, *, timeout: float = 30.0, transport: httpx.BaseTransport | None = None,
                 auth: tuple[str, str] | None = None,
                 max_body_bytes: int = DEFAULT_PROMETHEUS_MAX_BODY_BYTES) -> None:
        super().__init__(check_prometheus_url(base_url), timeout=timeout, transport=transport, auth=auth,
                         max_connections=2, max_body_bytes=max_body_bytes)

    def query_range(self, expr: str, grid: RangeGrid) -> list[RangeSeries]:
        """Evaluate ``expr`` at every time of ``grid``: one :class:`RangeSeries` per series of the answer."""
        params = urlencode({"query": expr, "start": f"{grid.start:.3f}", "end": f"{grid.end:.3f}",
                            "step": str(grid.step)})
        response = self.send("GET", f"/api/v1/query_range?{params}")
        parsed, body = self.parse_json(response)
        return parse_matrix(body, who=self.who) if parsed else _not_json(self.who, response)


    def firing_alerts(self) -> set[str]:
        """The names of the alerts firing now (``GET /api/v1/alerts``; pending ones are not firing yet)."""
        response = self.send("GET", "/api/v1/alerts")
        parsed, body = self.parse_json(response)
        return parse_alerts(body, who=self.who) if parsed else _not_json(self.who, response)


def parse_alerts(body: Any, *, who: str = "Prometheus") -> set[str]:
    """The ``alertname`` of every firing alert in an ``/api/v1/alerts`` answer, or BadResponseError.

    >>> parse_alerts({"status": "success", "data": {"alerts": [
    ...     {"labels": {"alertname": "A"}, "state": "firing"}, {"labels": {"alertname": "B"}, "state": "pending"}]}})
    {'A'}
    """
    if not isinstance(body, dict) or body.get("status") != "success":
        raise BadResponseError(f"{who} answered the alerts query with JSON that is not a successful API envelope; "
                               "check that prometheus_url is Prometheus itself.")
    data = body.get("data")
    alerts = data.get("alerts") if isinstance(data, dict) else None
    if not isinstance(alerts, list):
        raise BadResponseError(f"{who} answered the alerts query without a list of alerts.")
    firing: set[str] = set()
    for alert in alerts:
        labels = alert.get("labels") if isinstance(alert, dict) else None
        if not isinstance(labels, dict) or not isinstance(labels.get("alertname"), str):
            raise BadResponseError(f"{who} answered the alerts query with an alert that has no alertname label.")
        if alert.get("state") == "firing":
            firing.add(labels["alertname"])
    return firing


def _not_json(who: str, response: httpx.Response) -> NoReturn:
    snippet = strip_control_chars(response.text[:80], 80)
    raise BadResponseError(f"{who} answered the range query with something that is not JSON: {snippet!r}. "
                           "Check that prometheus_url is Prometheus itself, not a page in front of it.")


def _sample(pair: Any) -> tuple[float, float] | None:
    """``[time, "value"]`` as two floats; None for anything else."""
    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (int, float))
            and not isinstance(pair[0], bool) and isinstance(pair[1], str)):
        return None
    try:
        return float(pair[0]), float(pair[1])  # Prometheus writes "NaN", "+Inf" and "-Inf" as float() reads them
    except ValueError:
        return None


def parse_matrix(body: Any, *, who: str = "Prometheus") -> list[RangeSeries]:
    """The series of a ``query_range`` answer (Prometheus's JSON envelope, parsed), or BadResponseError.

    >>> body = {"status": "success", "data": {"resultType": "matrix", "result": [
    ...     {"metric": {"target": "a"}, "values": [[10, "1"], [20, "3"]]}]}}
    >>> parse_matrix(body)
    [RangeSeries(labels={'target': 'a'}, times=[10.0, 20.0], values=[1.0, 3.0])]
    """
    if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
        raise BadResponseError(f"{who} answered the range query with JSON that is not Prometheus's API envelope "
                               "(no \"status\"); check that prometheus_url is Prometheus itself.")
    if body["status"] == "error":
        error = body.get("error")
        said = strip_control_chars(error, 300) if isinstance(error, str) else "no reason given"
        raise BadResponseError(f"{who} refused the range query: {said}.")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        kind = data.get("resultType") if isinstance(data, dict) else None
        raise BadResponseError(f"{who} answered the range query without a matrix (resultType "
                               f"{strip_control_chars(repr(kind), 40)}).")
    result = data["result"]
    if len(result) > MAX_SERIES:
        raise BadResponseError(f"{who} answered the range query with {len(result):,} series, more than the "
                               f"{MAX_SERIES:,} gatewayscope keeps; narrow the selector.")
    out: list[RangeSeries] = []
    for item in result:
        metric = item.get("metric") if isinstance(item, dict) else None
        values = item.get("values") if isinstance(item, dict) else None
        if not (isinstance(metric, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
                and isinstance(values, list)):
            raise BadResponseError(f"{who} answered the range query with a series that is not "
                                   "{\"metric\": {labels}, \"values\": [[time, \"value\"], ...]}.")
        samples = [_sample(pair) for pair in values]
        if any(s is None for s in samples):
            raise BadResponseError(f"{who} answered the range query with a sample that is not [time, \"value\"].")
        pairs = sorted(s for s in samples if s is not None)
        out.append(RangeSeries(labels=dict(metric), times=[t for t, _ in pairs], values=[v for _, v in pairs]))
    return out
