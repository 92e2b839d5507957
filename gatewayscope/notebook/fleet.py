"""The fleet section of triage.ipynb: :func:`~gatewayscope.analysis.fleet.read_fleet`'s frames as HTML and a chart.

:func:`fleet_report` never raises for what a user can get wrong: without a Prometheus URL its HTML says how to
give one, and a Prometheus that cannot be read gives its sentence instead of a traceback. Target names,
settings and cluster names are label values anyone who writes a config chose: every table goes through
``table.html.j2`` (autoescaped, control characters shown as escapes), every sentence through
:func:`html.escape`, and the chart shows them as plain text (never mathtext).
"""

from __future__ import annotations

import datetime as dt
import html
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from gatewayscope.analysis.fleet import DEFAULT_JOB_SELECTOR, DEFAULT_WINDOW_SECONDS, FleetView, read_fleet, window_text
from gatewayscope.errors import GatewayscopeError
from gatewayscope.notebook.controllers import render_table
from gatewayscope.render import human_bytes, terminal_safe

#: the most targets the orphan chart draws a line for (the ones growing most)
MAX_CHART_LINES = 8
#: the most rows each table shows
MAX_ROWS = 50
HOW_TO_SET = ("No Prometheus given: set the notebook parameter prometheus_url to the base URL of the Prometheus "
              "that scrapes the exporters (for example http://prometheus:9090, or papermill -p prometheus_url "
              "URL) to see every target of the fleet here.")


@dataclass(frozen=True)
class FleetReport:
    """What the fleet section shows: ``html`` always; ``chart`` (PNG) when there is a history to draw; ``view``
    when Prometheus was read; ``error`` the sentence when it could not be."""

    html: str
    chart: bytes | None = None
    view: FleetView | None = None
    error: str | None = None


def _time(value: Any) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _share(value: Any) -> str:
    return "-" if value is None else f"{value:.0%}"


def _paragraph(text: str, css: str = "muted") -> str:
    return f'<p class="{css}">{html.escape(terminal_safe(text))}</p>'


def fleet_html(view: FleetView, *, max_rows: int = MAX_ROWS) -> str:
    """The three frames of ``view`` as titled HTML tables, with a line on where they come from and a sentence
    for each metric Prometheus had nothing of."""
    Cell = Callable[[Any], str]
    bytes_cells: dict[str, Cell] = {c: human_bytes for c in ("stack_bytes_low", "stack_bytes_high",
                                                             "memory_limit_bytes")}
    times: dict[str, Cell] = {c: _time for c in ("lowest_at", "last_seen", "drifted_since")}
    shares: dict[str, Cell] = {c: _share for c in ("low_share", "high_share", "peak_high_share", "drifted_share")}
    window = window_text(view.window_seconds)
    parts = [
        '<div class="gatewayscope">',
        _paragraph(f"From Prometheus at {view.prometheus_url}, series {{{view.selector}}}, over "
                   f"{window} up to {_time(_utc(view.grid.end))} (one point every {view.grid.step} s)."),
        *(_paragraph(message, "warn") for message in view.messages),
        "</div>",
        render_table(view.orphan_growth, title="Orphan growth per target (rise above the window's lowest count)",
                     empty="No trace store target in this window.", max_rows=max_rows, formats=times),
        render_table(view.boot_memory, title="Boot memory against the limit, highest share first",
                     empty="No Bifrost target in this window.", max_rows=max_rows,
                     formats={**bytes_cells, **times, **shares}),
        render_table(view.posture_drift, title="Posture drift by target",
                     empty="No Bifrost target in this window.", max_rows=max_rows, formats={**times, **shares}),
    ]
    return "\n".join(parts)


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


def _label(text: str) -> str:
    """A label value as chart text: control characters as escapes, ``$`` never opening mathtext."""
    return terminal_safe(text).replace("$", r"\$")


def orphan_chart(view: FleetView, *, max_lines: int = MAX_CHART_LINES) -> bytes | None:
    """Orphan sessions over the window for the targets growing most (PNG); None without a history."""
    if view.orphan_history.is_empty():
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = ["cluster", "target"] if "cluster" in view.orphan_growth.columns else ["target"]
    top = view.orphan_growth.head(max_lines).select(keys).rows()
    figure = Figure(figsize=(8.0, 3.2), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for key in top:
        match = pl.all_horizontal([pl.col(k) == v for k, v in zip(keys, key, strict=True)])
        points = view.orphan_history.filter(match)
        axes.plot(points["time"].to_list(), points["orphans"].to_list(), marker=".",
                  label=_label(" / ".join(key)))
    shown = len(top)
    rest = view.orphan_growth.height - shown
    axes.set_title("Orphan sessions per target" + (f" (the {shown} growing most)" if rest > 0 else ""),
                   fontsize=11, loc="left")
    axes.set_ylabel("orphan sessions")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8, loc="upper left")
    figure.autofmt_xdate()
    FigureCanvasAgg(figure)
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def fleet_report(prometheus_url: str | None, *, window_seconds: float = DEFAULT_WINDOW_SECONDS,
                 job_selector: str = DEFAULT_JOB_SELECTOR, cluster_label: str = "", timeout: float = 30.0,
                 end: float | None = None) -> FleetReport:
    """Read the fleet from ``prometheus_url`` and render it; without a URL, say how to give one; when
    Prometheus cannot be read (or a parameter is wrong), say why. Never raises a gatewayscope error."""
    if not prometheus_url:
        return FleetReport(html=f'<div class="gatewayscope">{_paragraph(HOW_TO_SET)}</div>')
    try:
        view = read_fleet(prometheus_url, window_seconds=window_seconds, job_selector=job_selector,
                          cluster_label=cluster_label, timeout=timeout, end=end)
    except GatewayscopeError as err:
        return FleetReport(html=f'<div class="gatewayscope">{_paragraph(str(err), "bad")}</div>', error=str(err))
    return FleetReport(html=fleet_html(view), chart=orphan_chart(view), view=view)
