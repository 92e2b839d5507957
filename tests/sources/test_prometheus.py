"""The Prometheus reader (gatewayscope.sources.prometheus): the grid a range query asks for, the parsing of
query_range answers written the way Prometheus's HTTP API writes them, and every way reading one can fail,
each a gatewayscope error with a sentence (scripted transports for the answers; real loopback sockets for the
unreachable, dripping, endless and redirecting servers)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gatewayscope.errors import (
    BadResponseError,
    BodyTooLargeError,
    ConfigError,
    GatewayTimeoutError,
    HTTPStatusError,
    RedirectError,
    UnreachableError,
)
from gatewayscope.sandbox.processes import free_port
from gatewayscope.sources.prometheus import (
    MAX_SERIES,
    PrometheusClient,
    RangeGrid,
    check_prometheus_url,
    parse_matrix,
    range_grid,
)
from tests.hostile import drip_body, hostile, huge_length, redirect

URL = "http://prometheus.test:9090"
GRID = RangeGrid(start=1_700_000_000.0, end=1_700_000_600.0, step=60)

#: a query_range answer as Prometheus 2.x writes it: samples as [unix seconds, "value"], NaN and infinities
#: as strings, label values of any text (a relabeling can put anything there)
MATRIX = {
    "status": "success",
    "data": {"resultType": "matrix", "result": [
        {"metric": {"target": "rllm-a"}, "values": [[1_700_000_060, "4"], [1_700_000_000, "3"]]},
        {"metric": {"target": "<script>alert(1)</script>\u202e"},
         "values": [[1_700_000_000.5, "NaN"], [1_700_000_060.5, "+Inf"], [1_700_000_120.5, "2.5"]]},
    ]},
    "warnings": ["this is a warning Prometheus may add"],
}


def answering(status: int, body: bytes | str | dict[str, Any], seen: list[httpx.Request] | None = None,
              content_type: str = "application/json") -> httpx.MockTransport:
    content = json.dumps(body).encode() if isinstance(body, dict) else body.encode() if isinstance(body, str) else body

    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=content, headers={"content-type": content_type})

    return httpx.MockTransport(handle)


def query(transport: httpx.BaseTransport, **kwargs: Any) -> Any:
    with PrometheusClient(URL, transport=transport, **kwargs) as client:
        return client.query_range("up", GRID)


# -- the grid ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("window", [1, 59, 60, 61, 3600, 86_400, 7 * 86_400, 30 * 86_400, 0.5])
@pytest.mark.parametrize("max_points", [2, 11, 300, 11_000])
def test_the_grid_never_asks_for_more_points_than_allowed_and_ends_now(window: float, max_points: int) -> None:
    grid = range_grid(window, end=2_000_000.0, max_points=max_points)
    assert grid.end == 2_000_000.0
    assert 2 <= grid.points <= max_points
    assert grid.step >= 1 and float(grid.step).is_integer()
    assert grid.end - grid.start <= max(window, grid.step)  # never before the window (but one step at least)
    assert grid.end - grid.start > window - grid.step  # and covering it to within a step
    assert ((grid.end - grid.start) / grid.step).is_integer()  # the last point is ``end`` itself


@pytest.mark.parametrize("window", [0, -5, math.nan, math.inf, "1d", None])
def test_a_window_that_is_not_a_positive_number_is_a_config_error(window: Any) -> None:
    with pytest.raises(ConfigError, match="positive number of seconds"):
        range_grid(window)


def test_too_few_points_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least 2 points"):
        range_grid(60, max_points=1)


# -- parsing -------------------------------------------------------------------------------------------------

def test_query_range_sends_the_grid_and_parses_the_matrix_in_time_order() -> None:
    seen: list[httpx.Request] = []
    series = query(answering(200, MATRIX, seen))
    (request,) = seen
    assert request.method == "GET" and request.url.path == "/api/v1/query_range"
    params = {k: v[0] for k, v in parse_qs(urlsplit(str(request.url)).query).items()}
    assert params == {"query": "up", "start": "1700000000.000", "end": "1700000600.000", "step": "60"}
    assert series[0].labels == {"target": "rllm-a"}
    assert (series[0].times, series[0].values) == ([1_700_000_000.0, 1_700_000_060.0], [3.0, 4.0])
    hostile_series = series[1]
    assert hostile_series.labels["target"] == "<script>alert(1)</script>\u202e"  # kept as written; views escape
    assert math.isnan(hostile_series.values[0]) and hostile_series.values[1] == math.inf
    assert hostile_series.values[2] == 2.5


def test_an_empty_result_is_no_series() -> None:
    assert query(answering(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})) == []


def test_a_query_with_a_special_character_reaches_prometheus_intact() -> None:
    seen: list[httpx.Request] = []
    expr = 'max by (target) (x{job=~"a|b&c=d#e"})'
    with PrometheusClient(URL, transport=answering(200, MATRIX, seen)) as client:
        client.query_range(expr, GRID)
    assert parse_qs(urlsplit(str(seen[0].url)).query)["query"] == [expr]


# -- failures ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "body", "said"), [
    (400, {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected <EOF>"},
     "parse error: unexpected <EOF>"),
    (422, {"status": "error", "errorType": "execution", "error": "query processing would load too many samples"},
     "too many samples"),
    (503, {"status": "error", "errorType": "unavailable", "error": "Service Unavailable"}, "Service Unavailable"),
    (502, "<html>Bad Gateway</html>", "Bad Gateway"),
])
def test_an_error_status_says_what_prometheus_said(status: int, body: Any, said: str) -> None:
    with pytest.raises(HTTPStatusError) as failure:
        query(answering(status, body))
    assert failure.value.status == status
    assert str(failure.value).startswith(f"HTTP {status} from Prometheus at {URL}: ")
    assert said in str(failure.value)


@pytest.mark.parametrize(("body", "said"), [
    ("<html><body>Grafana login</body></html>", "not JSON"),
    ("{\"status\": \"succ", "not JSON"),
    ({"hello": "world"}, "not Prometheus's API envelope"),
    ({"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation\x1b[2J"},
     "refused the range query: query timed out"),
    ({"status": "success", "data": {"resultType": "vector", "result": []}}, "without a matrix"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"target": 1}, "values": []}]}},
     "a series that is not"),
    ({"status": "success", "data": {"resultType": "matrix", "result": [["not", "a", "series"]]}},
     "a series that is not"),
    ({"status": "success", "data": {"resultType": "matrix",
                                    "result": [{"metric": {}, "values": [["1700000000", "1"]]}]}},
     "a sample that is not"),
    ({"status": "success", "data": {"resultType": "matrix",
                                    "result": [{"metric": {}, "values": [[1700000000, "one"]]}]}},
     "a sample that is not"),
    ({"status": "success", "data": {"resultType": "matrix",
                                    "result": [{"metric": {}, "values": [[1700000000, 1]]}]}},
     "a sample that is not"),
])
def test_an_answer_that_is_not_a_matrix_is_a_bad_response(body: Any, said: str) -> None:
    with pytest.raises(BadResponseError) as failure:
        query(answering(200, body, content_type="text/html"))
    assert said in str(failure.value)
    assert "\x1b" not in str(failure.value)


def test_more_series_than_kept_is_a_bad_response() -> None:
    body = {"status": "success", "data": {"resultType": "matrix",
                                          "result": [{"metric": {}, "values": []}] * (MAX_SERIES + 1)}}
    with pytest.raises(BadResponseError, match="narrow the selector"):
        parse_matrix(body)


def test_nothing_listening_is_unreachable_with_a_sentence() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with PrometheusClient(url, timeout=5) as client, pytest.raises(UnreachableError) as failure:
        client.query_range("up", GRID)
    assert str(failure.value).startswith(f"Cannot reach Prometheus at {url} (")
    assert "check prometheus_url" in str(failure.value)


@pytest.mark.parametrize(("behaviour", "error"), [
    (drip_body(0.3), GatewayTimeoutError),
    (huge_length(), BodyTooLargeError),
    (redirect("http://elsewhere.test/graph"), RedirectError),
])
def test_a_misbehaving_server_ends_within_the_bounds(behaviour: Callable[..., Any], error: type[Exception]) -> None:
    with (hostile(behaviour) as server, PrometheusClient(server.url, timeout=1.5, max_body_bytes=1 << 20) as client,
          pytest.raises(error) as failure):
        client.query_range("up", GRID)
    assert "Prometheus" in str(failure.value)


@pytest.mark.parametrize("url", ["", "prometheus:9090", "ftp://prometheus:9090", "http://", "http://h:9090/?x=1",
                                 "http://h:abc", "http://a\x1bb:9090", "http://[::1:9090", None, 9090])
def test_an_address_that_is_not_a_prometheus_base_url_is_a_config_error(url: Any) -> None:
    with pytest.raises(ConfigError) as failure:
        PrometheusClient(url)
    assert "is not the address of a Prometheus" in str(failure.value)
    assert "\x1b" not in str(failure.value)


def test_a_base_url_loses_its_trailing_slash_and_keeps_its_path() -> None:
    assert check_prometheus_url(" http://proxy.test/prometheus/ ") == "http://proxy.test/prometheus"
