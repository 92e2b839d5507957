"""triage.ipynb's fleet section (gatewayscope.notebook.fleet): hostile label values come out escaped in the
HTML and as plain text in the chart, and nothing a user can get wrong (no URL, a wrong one, a Prometheus that
is not there, one that has no data) ends in a traceback. Prometheus's answers are written the way its HTTP API
writes them (a scripted transport); tests/e2e/test_fleet_prometheus.py runs the section against a real one."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gatewayscope.analysis.fleet import MEMORY_LIMIT, ORPHANS, POSTURE_DRIFT, STACK_BYTES, FleetView, read_fleet
from gatewayscope.notebook.fleet import HOW_TO_SET, fleet_html, fleet_report, orphan_chart
from gatewayscope.sandbox.processes import free_port
from gatewayscope.sources.prometheus import PrometheusClient

pytest.importorskip("matplotlib", reason="the chart needs the notebook extra")

T0 = 1_700_000_000.0
SCRIPT = "<script>alert(1)</script>"
#: label values a relabeling (or a hostile config upstream of Prometheus) can put into a series
HOSTILE = {
    "orphans": f"rllm{SCRIPT}",
    "ansi": "gw\x1b[2J\nALL CLEAR\u202e",
    "math": r"bf$\frac{1}{0}$",
    "attr": '"><img src=x onerror=alert(2)>',
}


def answering(answers: dict[str, list[dict[str, Any]]]) -> PrometheusClient:
    def handle(request: httpx.Request) -> httpx.Response:
        expr = parse_qs(urlsplit(str(request.url)).query)["query"][0]
        metric = next(name for name in (ORPHANS, STACK_BYTES, MEMORY_LIMIT, POSTURE_DRIFT) if name in expr)
        body = {"status": "success", "data": {"resultType": "matrix", "result": answers.get(metric, [])}}
        return httpx.Response(200, content=json.dumps(body).encode())

    return PrometheusClient("http://prometheus.test:9090", transport=httpx.MockTransport(handle))


def values(*numbers: float) -> list[list[Any]]:
    return [[T0 + i * 300, str(n)] for i, n in enumerate(numbers)]


def hostile_view() -> FleetView:
    return read_fleet(answering({
        ORPHANS: [{"metric": {"target": HOSTILE["orphans"]}, "values": values(3, 1, 4)},
                  {"metric": {"target": HOSTILE["math"]}, "values": values(0, 0, 1)}],
        STACK_BYTES: [{"metric": {"target": HOSTILE["ansi"], "bound": "low"}, "values": values(2048)},
                      {"metric": {"target": HOSTILE["ansi"], "bound": "high"}, "values": values(8192)}],
        MEMORY_LIMIT: [{"metric": {"target": HOSTILE["ansi"]}, "values": values(4096)}],
        POSTURE_DRIFT: [{"metric": {"target": HOSTILE["attr"], "setting": f"drop_excess_requests{SCRIPT}"},
                         "values": values(0, 1, 1)}],
    }), window_seconds=3600, end=T0 + 600)


def test_hostile_label_values_are_escaped_in_every_table() -> None:
    view = hostile_view()
    page = fleet_html(view)
    assert "<script>" not in page and "<img" not in page and "\x1b" not in page and "\u202e" not in page
    assert "rllm&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "gw\\x1b[2J\\nALL CLEAR\\u202e" in page  # control characters shown as escapes
    assert "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    for title in ("Orphan growth per target", "Boot memory against the limit", "Posture drift by target"):
        assert title in page
    assert "at risk" in page and "50%" in page and "200%" in page  # low and high bound against 4 KiB
    assert "From Prometheus at http://prometheus.test:9090" in page


def test_the_chart_draws_hostile_names_as_plain_text() -> None:
    chart = orphan_chart(hostile_view())
    assert chart is not None and chart.startswith(b"\x89PNG")


def test_no_data_says_so_in_plain_sentences_and_draws_no_chart() -> None:
    view = read_fleet(answering({}), window_seconds=86_400, end=T0)
    page = fleet_html(view)
    assert orphan_chart(view) is None
    assert page.count("Prometheus has no ") == 4 and "in the last 1 day" in page
    assert "No trace store target in this window." in page and "No Bifrost target in this window." in page


@pytest.mark.parametrize("url", [None, ""])
def test_without_a_url_the_section_says_how_to_set_it(url: Any) -> None:
    report = fleet_report(url)
    assert report.view is None and report.chart is None and report.error is None
    assert HOW_TO_SET in report.html and "prometheus_url" in report.html


def test_a_prometheus_that_is_not_there_is_a_sentence_not_a_traceback() -> None:
    report = fleet_report(f"http://127.0.0.1:{free_port()}", timeout=5)
    assert report.view is None and report.error is not None
    assert report.error.startswith("Cannot reach Prometheus at http://127.0.0.1:")
    assert 'class="bad"' in report.html


@pytest.mark.parametrize(("url", "kwargs", "said"), [
    (f"javascript:{SCRIPT}", {}, "is not the address of a Prometheus"),
    ("http://prometheus.test:9090", {"window_seconds": "1d"}, "positive number of seconds, not &#x27;1d&#x27;"),
    ("http://prometheus.test:9090", {"job_selector": f"{{{SCRIPT}}}"}, "without braces"),
])
def test_a_wrong_parameter_is_an_escaped_sentence(url: str, kwargs: dict[str, Any], said: str) -> None:
    report = fleet_report(url, **kwargs)
    assert report.error and report.view is None
    assert said in report.html and 'class="bad"' in report.html
    assert "<script>" not in report.html
