"""Charts for the notebooks, where a picture says more than a table: PNG bytes from plain frames.

Each function takes the frames a :class:`~gatewayscope.notebook.controllers.ScanController` exposes and
returns a PNG (``bytes``), drawn with matplotlib's object API on the Agg canvas (no pyplot, no global
state, safe from any thread, no display needed). A widget shows the bytes in an ``ipywidgets.Image``; a
notebook cell shows them with ``IPython.display.Image``. Nothing here reads a gateway.
"""

from __future__ import annotations

import io
from typing import Any

import polars as pl

from gatewayscope.errors import GatewayscopeError
from gatewayscope.render import terminal_safe

#: colours per record kind and per orphan confidence, the same in every chart
KIND_COLOURS = {"standard": "#4c72b0", "custom": "#dd8452"}
CONFIDENCE_COLOURS = {"confirmed": "#c44e52", "suspected": "#ccb974"}
_MIB = 1024 * 1024


def _label(text: str) -> str:
    r"""A name from a target (or anything a gateway chose) as chart text: shown as written, never mathtext.

    matplotlib reads ``$...$`` as math (a bad formula raises, a good one renders something else), so
    every ``$`` is escaped; control and bidi characters show as escapes.

    >>> _label("gw$\\frac$\n")
    'gw\\$\\frac\\$\\n'
    """
    return terminal_safe(text).replace("$", r"\$")


def _figure(width: float = 8.0, height: float = 3.2) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib comes with the notebook extra
        raise GatewayscopeError("The notebook charts need matplotlib, which is not installed: "
                                "pip install 'gatewayscope[notebook]'") from None
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _png(figure: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def _message(title: str, text: str) -> bytes:
    figure = _figure(height=1.4)
    axes = figure.add_subplot()
    axes.set_axis_off()
    axes.set_title(title, fontsize=11, loc="left")
    axes.text(0.0, 0.4, text, fontsize=10, transform=axes.transAxes, color="#555555")
    return _png(figure)


def boot_memory_chart(pools: pl.DataFrame, boot: pl.DataFrame, memory: pl.DataFrame | None = None) -> bytes:
    """Parked workers by kind, and boot stack memory (2 and 8 KiB per worker) by kind against the limit, with
    the measured prediction beside the band where the gateway's metrics were trusted.

    ``pools``: one row per Bifrost target and kind (``target``, ``kind``, ``parked_workers``,
    ``stack_bytes_low``, ``stack_bytes_high``); ``boot``: one row per Bifrost target (``target``,
    ``memory_limit_bytes``); ``memory``: the findings' ``memory`` frame (``model``, ``predicted_bytes``,
    ``baseline_bytes``). One pair of panels per target.
    """
    targets = boot["target"].to_list()
    if not targets:
        return _message("Boot memory", "No Bifrost target answered.")
    figure = _figure(height=2.9 * len(targets))
    grid = figure.subplots(len(targets), 2, squeeze=False)
    for row, name in enumerate(targets):
        frame = pools.filter(pl.col("target") == name)
        limit = int(boot.filter(pl.col("target") == name)["memory_limit_bytes"][0])
        kinds = frame["kind"].to_list()
        colours = [KIND_COLOURS.get(k, "#888888") for k in kinds]
        workers_axes, memory_axes = grid[row]
        workers = frame["parked_workers"].to_list()
        workers_axes.bar(kinds, workers, color=colours)
        workers_axes.set_title(f"{_label(name)}: parked workers by kind", fontsize=10, loc="left")
        workers_axes.set_ylabel("workers")
        for index, value in enumerate(workers):
            workers_axes.annotate(f"{value:,}", (index, value), ha="center", va="bottom", fontsize=8)
        # stacked: each kind's share of the stacks, at the low and the high bound
        bounds = ("2 KiB/worker", "8 KiB/worker")
        bottoms = [0.0, 0.0]
        for kind, colour, low, high in zip(kinds, colours, frame["stack_bytes_low"].to_list(),
                                           frame["stack_bytes_high"].to_list(), strict=True):
            values = [low / _MIB, high / _MIB]
            memory_axes.bar(bounds, values, bottom=bottoms, color=colour, label=kind)
            bottoms = [bottoms[0] + values[0], bottoms[1] + values[1]]
        measured = memory.filter((pl.col("target") == name) & (pl.col("model") == "measured")) \
            if memory is not None else None
        if measured is not None and measured.height:
            baseline = int(measured["baseline_bytes"][0]) / _MIB
            stacks = int(measured["predicted_bytes"][0]) / _MIB - baseline
            memory_axes.bar(["measured"], [baseline], color="#8c8c8c", label="besides the stacks")
            memory_axes.bar(["measured"], [stacks], bottom=[baseline], color="#4c72b0", label="workers (measured)")
        memory_axes.axhline(limit / _MIB, color="#c44e52", linestyle="--", linewidth=1.5,
                            label=f"limit {limit / _MIB:,.0f} MiB")
        memory_axes.set_title(f"{_label(name)}: boot stacks vs limit", fontsize=10, loc="left")
        memory_axes.set_ylabel("MiB")
        memory_axes.legend(fontsize=8, loc="upper left")
    return _png(figure)


def orphan_age_chart(orphans: pl.DataFrame) -> bytes:
    """How long the orphan sessions have been idle, by confidence (a histogram per confidence)."""
    if orphans.height == 0:
        return _message("Orphan ages", "No orphan sessions.")
    ages = orphans["idle_seconds"].drop_nulls()
    if not ages.len():
        return _message("Orphan ages", f"{orphans.height} orphan session(s); the scan read no trace times for them.")
    figure = _figure()
    axes = figure.add_subplot()
    oldest = float(ages.max())  # type: ignore[arg-type]
    unit, scale = ("hours", 3600.0) if oldest >= 7200 else (("minutes", 60.0) if oldest >= 120 else ("seconds", 1.0))
    for confidence, colour in CONFIDENCE_COLOURS.items():
        values = orphans.filter(pl.col("confidence") == confidence)["idle_seconds"].drop_nulls()
        if values.len():
            axes.hist([float(v) / scale for v in values.to_list()], bins=20, color=colour, alpha=0.8,
                      label=f"{confidence} ({values.len()})")
    axes.set_title("Orphan sessions: idle time of their last trace", fontsize=10, loc="left")
    axes.set_xlabel(f"idle {unit}")
    axes.set_ylabel("sessions")
    axes.legend(fontsize=8)
    return _png(figure)


def weight_lag_chart(orphans: pl.DataFrame) -> bytes:
    """How many weight versions the orphans lag behind the current one (where the gateway reports them)."""
    lags = orphans["weight_lag"].drop_nulls() if orphans.height else pl.Series([], dtype=pl.Int64)
    if not lags.len():
        return _message("Weight-version lag",
                        "No weight versions reported (the gateway or its traces do not record them).")
    figure = _figure()
    axes = figure.add_subplot()
    counts = lags.value_counts().sort(lags.name)
    axes.bar([str(v) for v in counts[lags.name].to_list()], counts["count"].to_list(), color="#8172b3")
    axes.set_title("Orphan sessions: weight versions behind the current one", fontsize=10, loc="left")
    axes.set_xlabel("versions behind")
    axes.set_ylabel("sessions")
    return _png(figure)


CHARTS = ("boot_memory", "orphan_ages", "weight_lag")
