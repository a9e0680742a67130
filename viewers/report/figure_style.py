"""What every figure of the report shares: escaping and number formats, hover text, and the layout.

Plotly renders hover text, tick labels and treemap labels as a small subset of HTML, so every string
that came from a trace goes through `esc` before it reaches a figure or the page.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from tputrace.store.records import SourceLocation
from tputrace.wording import format_bytes, format_ns

TEMPLATE = "plotly_white"
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}
# Scatter traces with more points than this are drawn with WebGL (the timeline always is).
WEBGL_FROM_POINTS = 2_000


# -- formatting -----------------------------------------------------------------------------------------


def esc(value: Any) -> str:
    """Text from a trace made inert for plotly's HTML-like labels and for the page."""
    return html.escape("" if value is None else str(value), quote=True)


def fmt_ns(ns: float | None) -> str:
    """A duration for people, worded as in every view (`tputrace.wording.format_ns`); `?` when unknown."""
    return "?" if ns is None else format_ns(ns)


def fmt_bytes(size: float | None) -> str:
    """A byte count in binary units, worded as in every view (`tputrace.wording.format_bytes`)."""
    return "?" if size is None else format_bytes(size)


def fmt_si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "?"
    for limit, divisor, prefix in ((1e3, 1, ""), (1e6, 1e3, "k"), (1e9, 1e6, "M"), (1e12, 1e9, "G"), (1e15, 1e12, "T")):
        if abs(value) < limit:
            return f"{value / divisor:.3g} {prefix}{unit}"
    return f"{value / 1e15:.3g} P{unit}"


def fmt_source(source: SourceLocation | None) -> str:
    return "?" if source is None else f"{source.short} in {source.function}"


@functools.lru_cache(maxsize=65_536)
def _fmt_field(name: str, value: Any) -> str:
    """One hover field's value, formatted and escaped (cached: traces repeat ops, shapes and lines)."""
    if value is None:
        return "–"
    if isinstance(value, SourceLocation):
        return esc(fmt_source(value))
    if name.endswith("_ns"):
        return fmt_ns(value)
    if name in ("bytes", "bytes_accessed"):
        return fmt_bytes(value)
    if name == "flops":
        return fmt_si(value, "FLOP")
    if name == "bus_bandwidth":
        return fmt_si(value, "B/s")
    if name in ("from_chip", "to_chip"):
        return "host" if value == -1 else f"tpu:{value}"
    return esc(value)


def hover_lines(title: str, fields: Sequence[str], values: Sequence[Any]) -> str:
    """Hover text: a title, then one `field: value` line per known value."""
    parts = [title]
    for name, value in zip(fields, values):
        if value is not None:
            parts.append(f"{_field_label(name)}: {_fmt_field(name, value)}")
    return "<br>".join(parts)


@functools.lru_cache(maxsize=256)
def _field_label(name: str) -> str:
    return esc(name.replace("_", " "))


def scatter_class(points: int) -> type[go.Scatter] | type[go.Scattergl]:
    """SVG for small traces, WebGL for big ones: each WebGL figure costs a GL context (slow without a GPU)."""
    return go.Scattergl if points > WEBGL_FROM_POINTS else go.Scatter


def base_layout(figure: go.Figure, *, height: int, title: str | None = None, **layout: Any) -> go.Figure:
    settings: dict[str, Any] = {
        "template": TEMPLATE,
        "font": FONT,
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40 if title else 20, "b": 50},
        "hoverlabel": {"align": "left"},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0},
    }
    if title:
        settings["title"] = {"text": title, "x": 0, "xanchor": "left", "font": {"size": 14}}
    settings.update(layout)
    figure.update_layout(**settings)
    return figure


def empty_figure(message: str, *, height: int = 160) -> go.Figure:
    """A placeholder figure that says why there is nothing to draw."""
    figure = go.Figure()
    figure.add_annotation(text=esc(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                          font={"size": 13, "color": "#666"})
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False)
    return base_layout(figure, height=height)


