"""Figure builders for the HTML report: one `plot_*` function per picture, from prepared data to a Figure.

Each function takes the prepared data of its section (`tputrace.viewers.report.data`) and returns a
`plotly.graph_objects.Figure`; none of them reads a trace or computes an analysis. Every string that
came from a trace goes through `esc` before it reaches a figure; numbers are formatted here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from tputrace.derived.op_ranking import HOST_DISPATCH_LABEL
from tputrace.derived.op_time import HOST_DISPATCH
from tputrace.derived.steps import STEP_CATEGORIES
from tputrace.derived.timeline import LaneBins, LaneEvents, TimelineData
from tputrace.derived.memory_timeline import memory_place
from tputrace.viewers.report.chip_data import CollectiveData, MemoryData, RooflineData, ShapeData
from tputrace.viewers.report.compile_data import RecompileData
from tputrace.viewers.report.data import ComparisonData
from tputrace.viewers.report.figure_style import (
    base_layout,
    empty_figure,
    esc,
    fmt_bytes,
    fmt_ns,
    fmt_si,
    fmt_source,
    hover_lines,
    scatter_class,
)
from tputrace.viewers.report.time_data import StepData, WhereData

KIND_COLORS: dict[str, str] = {
    "step": "#9aa3ad",
    "annotation": "#9d755d",
    "dispatch": "#4c78a8",
    "compile": "#e45756",
    "sync": "#f58518",
    "fallback": "#b279a2",
    "program": "#54a24b",
    "transfer": "#72b7b2",
    "collective": "#d4a72c",
}
KIND_LABELS: dict[str, str] = {
    "step": "steps",
    "annotation": "ranges",
    "dispatch": "op dispatch",
    "compile": "compiles",
    "sync": "syncs",
    "fallback": "CPU fallbacks",
    "program": "programs",
    "transfer": "transfers",
    "collective": "collectives",
}
CATEGORY_COLORS: dict[str, str] = {
    "compile": "#e45756",
    "sync stall": "#f58518",
    "collective": "#d4a72c",
    "compute": "#54a24b",
    "host": "#4c78a8",
}
REASON_COLORS: dict[str, str] = {
    "first": "#9aa3ad",
    "recompile": "#e45756",
    "guard_failure": "#f58518",
}
SIDE_COLORS = {"before": "#9aa3ad", "after": "#4c78a8"}
# Draw the target's HBM size on the memory plot only when the peak comes within this share of it
# (otherwise the line would squash the curve; the section's note gives the share instead).
HBM_LINE_SHARE = 0.1
# Step times spanning more than this ratio (compile-heavy first steps) use a log axis.
LOG_SCALE_RANGE = 10
# Scatter traces with more points than this are drawn with WebGL (the timeline always is).

# -- 1 timeline -----------------------------------------------------------------------------------------


def _segments(starts_s: np.ndarray, ends_s: np.ndarray, lane: int) -> tuple[np.ndarray, np.ndarray]:
    """x and y for one line trace drawing every [start, end] as a segment (NaN separates them)."""
    count = len(starts_s)
    x = np.empty(3 * count)
    x[0::3], x[1::3], x[2::3] = starts_s, ends_s, np.nan
    y = np.empty(3 * count)
    y[0::3], y[1::3], y[2::3] = lane, lane, np.nan
    return x, y


def plot_timeline(data: TimelineData) -> go.Figure:
    """Lanes per chip and for the host; WebGL segments with a hover point in the middle of each event."""
    if not data.lanes:
        return empty_figure("no timed events in this trace")
    figure = go.Figure()
    lane_height = 26
    width = 14
    seen_kinds: set[str] = set()
    for events in data.events:
        if not events.starts_ns:
            continue
        _add_lane_bins_or_events(figure, events, width, seen_kinds)
    for bins in data.bins:
        _add_bins(figure, bins, width)
    names = [esc(lane.name) + (" ⋯" if data.decimated(index) else "") for index, lane in enumerate(data.lanes)]
    figure.update_yaxes(
        tickmode="array", tickvals=list(range(len(data.lanes))), ticktext=names, autorange="reversed",
        fixedrange=True, showgrid=False, zeroline=False, range=None,
    )
    figure.update_xaxes(title_text="time since the run started (s)", showgrid=True, zeroline=False)
    return base_layout(
        figure, height=max(80 + lane_height * len(data.lanes), 100 + 30 * len(seen_kinds), 240), hovermode="closest",
        dragmode="zoom",
        margin={"l": 190, "r": 10, "t": 30, "b": 50},
        legend={"orientation": "v", "yanchor": "top", "y": 1, "x": 1.01, "xanchor": "left"},
    )


def _add_lane_bins_or_events(figure: go.Figure, events: LaneEvents, width: int, seen_kinds: set[str]) -> None:
    color = KIND_COLORS.get(events.kind, "#666")
    starts = np.asarray(events.starts_ns, dtype=np.float64) / 1e9
    durs = np.asarray(events.durs_ns, dtype=np.float64) / 1e9
    ends = starts + durs
    legend_name = KIND_LABELS.get(events.kind, events.kind)
    show_legend = events.kind not in seen_kinds
    seen_kinds.add(events.kind)
    if events.kind == "step":
        # Alternate shades so that neighbouring steps stay apart.
        parity = np.asarray([(detail[0] or 0) % 2 for detail in events.details])
        for shade, selector in (("#9aa3ad", parity == 0), ("#c9ced3", parity == 1)):
            x, y = _segments(starts[selector], ends[selector], events.lane)
            figure.add_trace(go.Scattergl(x=x, y=y, mode="lines", line={"color": shade, "width": width},
                                          hoverinfo="skip", name=legend_name, legendgroup=events.kind,
                                          showlegend=show_legend and shade == "#9aa3ad"))
    else:
        x, y = _segments(starts, ends, events.lane)
        figure.add_trace(go.Scattergl(x=x, y=y, mode="lines", line={"color": color, "width": width},
                                      hoverinfo="skip", name=legend_name, showlegend=show_legend,
                                      legendgroup=events.kind))
    title_kind = esc(KIND_LABELS.get(events.kind, events.kind))
    hover = [
        hover_lines(f"<b>{title_kind}</b> · {fmt_ns(dur)}", events.fields, detail)
        for dur, detail in zip(events.durs_ns, events.details)
    ]
    figure.add_trace(go.Scattergl(
        x=(starts + ends) / 2, y=np.full(len(starts), events.lane, dtype=np.int32), mode="markers",
        marker={"color": color, "size": 5, "symbol": "line-ns-open", "line": {"width": 1, "color": color}},
        hovertext=hover, hoverinfo="text", name=legend_name, legendgroup=events.kind, showlegend=False,
    ))


def _add_bins(figure: go.Figure, bins: LaneBins, width: int) -> None:
    color = KIND_COLORS.get(bins.kind, "#666")
    starts = np.asarray(bins.starts_ns, dtype=np.float64) / 1e9
    ends = np.asarray(bins.ends_ns, dtype=np.float64) / 1e9
    x, y = _segments(starts, ends, bins.lane)
    figure.add_trace(go.Scattergl(x=x, y=y, mode="lines", line={"color": color, "width": width}, opacity=0.3,
                                  hoverinfo="skip", showlegend=False, legendgroup=bins.kind))
    label = esc(KIND_LABELS.get(bins.kind, bins.kind))
    hover = [
        f"<b>{count:,} {label}</b> merged in this {fmt_ns(bins.bin_ns)} bin<br>"
        f"busy {fmt_ns(busy)} ({min(100.0, 100.0 * busy / bins.bin_ns):.0f}% of the bin)<br>"
        "the longest events are drawn one by one"
        for count, busy in zip(bins.counts, bins.busy_ns)
    ]
    figure.add_trace(go.Scattergl(
        x=(starts + ends) / 2, y=np.full(len(starts), bins.lane, dtype=np.int32), mode="markers",
        marker={"color": color, "size": 3, "opacity": 0.4}, hovertext=hover, hoverinfo="text",
        showlegend=False, legendgroup=bins.kind, name=f"{label} (merged)",
    ))


# -- 2 step times ---------------------------------------------------------------------------------------


def plot_steps(data: StepData) -> go.Figure:
    """One bar per step (and rank), coloured by the category with the most time in it."""
    if not data.steps:
        return empty_figure("no steps recorded (mark them with tputrace.step() or an optimizer)")
    figure = go.Figure()
    shown: set[str] = set()
    multi_rank = len(data.ranks) > 1
    for rank in data.ranks:
        rows = [row for row in data.steps if row.rank == rank]
        for category in STEP_CATEGORIES:
            chosen = [row for row in rows if row.dominant == category]
            if not chosen:
                continue
            hover = []
            for row in chosen:
                parts = "<br>".join(f"{esc(name)}: {fmt_ns(ns)}" for name, ns in row.category_ns.items())
                hover.append(
                    f"<b>step {row.step}</b>{f' · rank {row.rank}' if multi_rank else ''} · {fmt_ns(row.dur_ns)}<br>"
                    f"dominated by {esc(category)}<br>{parts}<br>ops: {row.ops:,}"
                )
            figure.add_trace(go.Bar(
                x=[row.step for row in chosen], y=[row.dur_ns / 1e6 for row in chosen],
                name=category, legendgroup=category, showlegend=category not in shown,
                marker={"color": CATEGORY_COLORS[category], "line": {"width": 0}},
                offsetgroup=str(rank) if multi_rank else None, hovertext=hover, hoverinfo="text",
            ))
            shown.add(category)
    figure.update_xaxes(title_text="step", dtick=1 if len({row.step for row in data.steps}) <= 40 else None)
    durations = [row.dur_ns for row in data.steps if row.dur_ns > 0]
    if durations and max(durations) > LOG_SCALE_RANGE * min(durations):
        figure.update_yaxes(type="log", title_text="step time (ms, log scale)")
    else:
        figure.update_yaxes(title_text="step time (ms)")
    return base_layout(figure, height=340, barmode="group" if multi_rank else "overlay", bargap=0.15)


# -- 3 where time goes ----------------------------------------------------------------------------------


def plot_time_split(data: WhereData) -> go.Figure:
    """Total time per category against the wall time (categories overlap)."""
    labels = [label for label, _ in data.time_split]
    values = [ns / 1e9 for _, ns in data.time_split]
    hover = [f"<b>{esc(label)}</b>: {fmt_ns(ns)}" + (f" ({100 * ns / data.wall_ns:.0f}% of the wall time)" if data.wall_ns else "")
             for label, ns in data.time_split]
    figure = go.Figure(go.Bar(x=values, y=labels, orientation="h", marker={"color": "#4c78a8"},
                              hovertext=hover, hoverinfo="text", text=[fmt_ns(ns) for _, ns in data.time_split],
                              textposition="auto"))
    if data.wall_ns:
        label = f"wall {fmt_ns(data.wall_ns)}" if data.ranks == 1 else f"wall × {data.ranks} ranks {fmt_ns(data.wall_ns)}"
        figure.add_vline(x=data.wall_ns / 1e9, line={"dash": "dot", "color": "#333"},
                         annotation_text=label, annotation_position="top")
    figure.update_yaxes(autorange="reversed")
    figure.update_xaxes(title_text="seconds, summed over events")
    return base_layout(figure, height=320, margin={"l": 140, "r": 20, "t": 50, "b": 50})


def _op_time_text(data: WhereData) -> str:
    """What the ops' times are, in words: host dispatch without the flushes and compiles inside the calls, or an
    import's device op time."""
    return f"{data.op_label} excl. flushes/compiles" if data.op_label == HOST_DISPATCH else data.op_label


def plot_where_treemap(data: WhereData) -> go.Figure:
    """Op time by module path → op (click a box to zoom in)."""
    if not data.tree:
        return empty_figure("no ops recorded")
    hover = [
        f"<b>{esc(node.path.replace(chr(0), '.').replace(chr(1), ' → '))}</b><br>{fmt_ns(node.value_ns)}"
        f" {esc(_op_time_text(data))} ({100 * node.value_ns / data.tree_total_ns:.1f}% of ops')<br>{node.count:,} ops"
        if data.tree_total_ns else esc(node.label)
        for node in data.tree
    ]
    figure = go.Figure(go.Treemap(
        ids=[node.id for node in data.tree],
        labels=[esc(node.label) for node in data.tree],
        parents=[node.parent for node in data.tree],
        values=[node.value_ns for node in data.tree],
        branchvalues="total",
        customdata=hover,
        hovertemplate="%{customdata}<extra></extra>",
        texttemplate="%{label}<br>%{percentRoot:.1%}",
        maxdepth=3,
        marker={"line": {"width": 1, "color": "#fff"}},
        root={"color": "#f6f8fa"},
    ))
    return base_layout(figure, height=520, margin={"l": 5, "r": 5, "t": 30, "b": 5})


# -- 4 recompilations -----------------------------------------------------------------------------------


def plot_recompilations(data: RecompileData) -> go.Figure:
    """Each compile as a point: when (x), where (y, per call site), how long (size), why (colour)."""
    if not data.points:
        return empty_figure("no compiles recorded")
    site_index = {site: index for index, site in enumerate(data.sites)}
    figure = go.Figure()
    longest = max(point.dur_ns for point in data.points) or 1
    reasons = sorted({point.reason or "?" for point in data.points}, key=lambda reason: (reason != "first", reason))
    for reason in reasons:
        chosen = [point for point in data.points if (point.reason or "?") == reason]
        hover = [
            hover_lines(
                f"<b>{esc(reason)}</b> · {fmt_ns(point.dur_ns)}",
                ("compiled", "kind", "changed", "inputs", "step", "rank", "source"),
                (point.name, point.kind, point.diff, point.signature, point.step, point.rank, point.source),
            )
            for point in chosen
        ]
        figure.add_trace(scatter_class(len(chosen))(
            x=[point.start_ns / 1e9 for point in chosen], y=[site_index[point.site] for point in chosen],
            mode="markers", name=esc(reason),
            marker={"color": REASON_COLORS.get(reason, "#b279a2"), "opacity": 0.8,
                    "size": [6 + 22 * math.sqrt(point.dur_ns / longest) for point in chosen],
                    "line": {"width": 1, "color": "#333"}},
            hovertext=hover, hoverinfo="text",
        ))
    ticktext = []
    for site in data.sites:
        count, recompiles, total_ns = data.site_counts[site]
        ticktext.append(f"{esc(site)} ({count} · {recompiles} re · {fmt_ns(total_ns)})")
    figure.update_yaxes(tickmode="array", tickvals=list(range(len(data.sites))), ticktext=ticktext,
                        autorange="reversed", fixedrange=True)
    figure.update_xaxes(title_text="time since the run started (s)")
    return base_layout(figure, height=110 + 28 * len(data.sites), hovermode="closest",
                        margin={"l": 260, "r": 20, "t": 30, "b": 50})


# -- 5 shapes and padding -------------------------------------------------------------------------------


def plot_shapes(data: ShapeData) -> go.Figure:
    """Matmul K × N against the target's MXU grid; colour is the share of padded FLOPs that is padding."""
    if not data.shapes:
        return empty_figure("no matmul-like ops with known shapes in this trace")
    shapes = data.shapes
    longest = max(shape.total_ns for shape in shapes) or 1
    hover = []
    for shape in shapes:
        product = shape.product
        batch = f"{product.batch} × " if product.batch > 1 else ""
        hover.append(
            f"<b>{esc(shape.op)}</b>{' (CPU fallback)' if shape.fallback else ''} × {shape.count:,} · {fmt_ns(shape.total_ns)}<br>"
            f"inputs: {esc(shape.inputs)}<br>"
            f"{batch}M {product.m} · K {product.k} · N {product.n} ({esc(product.dtype)})<br>"
            f"on {esc(data.target.label)}: M {shape.padded[0]} · K {shape.padded[1]} · N {shape.padded[2]}<br>"
            f"<b>wasted: {100 * shape.wasted_share:.1f}%</b> of the padded FLOPs<br>"
            f"module: {esc(shape.module or '–')}<br>source: {esc(fmt_source(shape.source))}"
        )
    figure = go.Figure(go.Scatter(
        x=[shape.product.k for shape in shapes], y=[shape.product.n for shape in shapes], mode="markers",
        marker={
            "size": [8 + 26 * math.sqrt(shape.total_ns / longest) for shape in shapes],
            "color": [shape.wasted_share for shape in shapes], "cmin": 0, "cmax": 1,
            "colorscale": [[0, "#54a24b"], [0.25, "#eeca3b"], [1, "#e45756"]],
            "colorbar": {"title": {"text": "wasted"}, "tickformat": ".0%"},
            "symbol": ["diamond" if shape.fallback else "circle" for shape in shapes],
            "line": {"width": 1, "color": "#333"}, "opacity": 0.85,
        },
        hovertext=hover, hoverinfo="text", showlegend=False,
    ))
    grid = data.target.mxu
    for axis, values in (("x", [shape.product.k for shape in shapes]), ("y", [shape.product.n for shape in shapes])):
        top = max(values)
        if top // grid <= 40:
            for multiple in range(grid, _ceil_to(top, grid) + 1, grid):
                line = {"color": "#bbb", "width": 1, "dash": "dot"}
                if axis == "x":
                    figure.add_vline(x=multiple, line=line, layer="below")
                else:
                    figure.add_hline(y=multiple, line=line, layer="below")
    figure.update_xaxes(title_text=f"K (contracted dim); dotted lines: multiples of the {grid}-wide MXU of {esc(data.target.label)}",
                        rangemode="tozero")
    figure.update_yaxes(title_text="N (output features)", rangemode="tozero")
    return base_layout(figure, height=420, hovermode="closest")


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# -- 6 roofline -----------------------------------------------------------------------------------------


def plot_roofline(data: RooflineData) -> go.Figure:
    """Programs by arithmetic intensity: FLOP/s measured here, the target's roofline estimate, its ceilings."""
    if not data.programs:
        return empty_figure("no executed program has XLA cost figures (FLOPs and bytes)")
    points = data.programs
    target = data.target
    longest = max(point.total_ns for point in points) or 1
    platform = esc(data.platform or "this machine")
    estimates = [data.estimated_flops(point) for point in points]
    hover = [
        f"<b>{esc(point.name)}</b> ({esc(point.kind)}, {point.n_ops or '?'} ops, {esc(point.dtype)})<br>"
        f"{fmt_si(point.flops, 'FLOP')} · {fmt_bytes(point.bytes_accessed)} per run<br>"
        f"intensity {point.intensity:.3g} FLOP/byte<br>"
        f"measured on {platform}: {fmt_si(point.achieved_flops, 'FLOP/s')} (mean {fmt_ns(point.mean_ns)} × {point.executions:,})<br>"
        f"estimate on {esc(target.label)}: {fmt_si(estimate, 'FLOP/s')}"
        for point, estimate in zip(points, estimates)
    ]
    figure = go.Figure()
    figure.add_trace(go.Scatter(
        x=[point.intensity for point in points], y=[point.achieved_flops for point in points], mode="markers",
        name=f"measured on {platform}",
        marker={"size": [7 + 24 * math.sqrt(point.total_ns / longest) for point in points], "color": "#4c78a8",
                "opacity": 0.75, "line": {"width": 1, "color": "#333"}},
        hovertext=hover, hoverinfo="text",
    ))
    figure.add_trace(go.Scatter(
        x=[point.intensity for point in points], y=estimates, mode="markers",
        name=f"estimate on {esc(target.label)} (roofline)",
        marker={"symbol": "diamond-open", "size": 9, "color": "#e45756", "line": {"width": 2}},
        hovertext=[f"<b>{esc(point.name)}</b><br>estimate on {esc(target.label)}: {fmt_si(value, 'FLOP/s')}"
                   for point, value in zip(points, estimates)],
        hoverinfo="text",
    ))
    peaks = (("bf16", target.peak_bf16_flops, "solid"), ("f32 (estimated peak)", target.peak_fp32_flops, "dash"))
    low = min(point.intensity for point in points) / 4
    high = max(max(point.intensity for point in points), target.peak_bf16_flops / target.hbm_bandwidth) * 4
    for dtype, peak, dash in peaks:
        ridge = peak / target.hbm_bandwidth
        xs = [low, ridge, high] if low < ridge < high else [low, high]
        figure.add_trace(go.Scatter(
            x=xs, y=[min(peak, x * target.hbm_bandwidth) for x in xs], mode="lines",
            line={"dash": dash, "width": 2, "color": "#e45756" if dtype == "bf16" else "#f58518"},
            name=f"{esc(target.label)} {esc(dtype)} ceiling: {fmt_si(peak, 'FLOP/s')}, HBM {fmt_si(target.hbm_bandwidth, 'B/s')}",
            hoverinfo="name",
        ))
    figure.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte accessed, XLA cost analysis)")
    figure.update_yaxes(type="log", title_text="FLOP/s", tickformat="~s")
    return base_layout(figure, height=460, hovermode="closest")


# -- 7 collectives --------------------------------------------------------------------------------------


def plot_collective_sizes(data: CollectiveData) -> go.Figure:
    """Message size against time per collective, with lines of constant bandwidth."""
    if not data.points:
        return empty_figure("no collectives in this trace")
    figure = go.Figure()
    kinds = sorted({point.kind or "?" for point in data.points})
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#d4a72c", "#9d755d"]
    for index, kind in enumerate(kinds):
        chosen = [point for point in data.points if (point.kind or "?") == kind and point.bytes > 0 and point.dur_ns > 0]
        if not chosen:
            continue
        hover = [
            f"<b>{esc(kind)}</b> · {fmt_bytes(point.bytes)} in {fmt_ns(point.dur_ns)}<br>"
            f"rank {point.rank} · step {point.step} · waited {fmt_ns(point.wait_ns)}<br>"
            f"bus bandwidth: {fmt_si(point.bus_bandwidth, 'B/s') if point.bus_bandwidth else '–'}<br>"
            f"source: {esc(fmt_source(point.source))}"
            for point in chosen
        ]
        figure.add_trace(scatter_class(len(chosen))(
            x=[point.bytes for point in chosen], y=[point.dur_ns / 1e9 for point in chosen], mode="markers",
            name=esc(kind), marker={"color": palette[index % len(palette)], "size": 8, "opacity": 0.8},
            hovertext=hover, hoverinfo="text",
        ))
    sizes = [point.bytes for point in data.points if point.bytes > 0]
    if sizes:
        low, high = min(sizes) / 2, max(sizes) * 2
        bandwidths: list[tuple[str, float, dict[str, Any]]] = [
            (f"{fmt_si(bandwidth, 'B/s')}", bandwidth, {"color": "#ccc", "dash": "dot", "width": 1})
            for bandwidth in (1e8, 1e9, 1e10, 1e11)
        ]
        if data.target.ici_bandwidth:
            bandwidths.append((f"{esc(data.target.label)} ICI: {fmt_si(data.target.ici_bandwidth, 'B/s')}",
                               data.target.ici_bandwidth, {"color": "#e45756", "dash": "dash", "width": 2}))
        for label, bandwidth, line in bandwidths:
            figure.add_trace(go.Scatter(x=[low, high], y=[low / bandwidth, high / bandwidth], mode="lines",
                                        line=line, name=label, hoverinfo="name"))
    figure.update_xaxes(type="log", title_text="message size (bytes)")
    figure.update_yaxes(type="log", title_text="time (s)")
    return base_layout(figure, height=400, hovermode="closest")


def plot_collective_waits(data: CollectiveData) -> go.Figure:
    """Time each rank waited for the last arrival, per step."""
    if not data.ranks:
        return empty_figure("no collectives in this trace")
    z = [[wait / 1e6 for wait in row] for row in data.wait_ns]
    hover = [[f"rank {rank} · step {step}<br>waited {fmt_ns(wait)}" for step, wait in zip(data.steps, row)]
             for rank, row in zip(data.ranks, data.wait_ns)]
    figure = go.Figure(go.Heatmap(
        z=z, x=[str(step) for step in data.steps], y=[f"rank {rank}" for rank in data.ranks],
        colorscale="OrRd", colorbar={"title": {"text": "wait (ms)"}}, hovertext=hover, hoverinfo="text",
    ))
    figure.update_xaxes(title_text="step", type="category")
    return base_layout(figure, height=120 + 30 * len(data.ranks))


# -- 8 memory -------------------------------------------------------------------------------------------


def plot_memory(data: MemoryData) -> go.Figure:
    """Live bytes per chip over time, the running peak dashed, and each chip's peak marked."""
    if not data.series:
        return empty_figure("no memory samples in this trace")
    figure = go.Figure()
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#d4a72c", "#9d755d"]
    multi_rank = len({series.rank for series in data.series}) > 1
    for index, series in enumerate(data.series):
        color = palette[index % len(palette)]
        name = (f"rank {series.rank} · " if multi_rank else "") + memory_place(series.chip)
        times = [t / 1e9 for t in series.t_ns]
        figure.add_trace(scatter_class(len(times))(
            x=times, y=series.live_bytes, mode="lines+markers" if len(times) < 200 else "lines",
            name=f"{name} live", line={"color": color, "width": 2, "shape": "hv"},
            hovertext=[f"{esc(name)} · {fmt_ns(t)}<br>live {fmt_bytes(live)}<br>peak so far {fmt_bytes(peak)}"
                       for t, live, peak in zip(series.t_ns, series.live_bytes, series.peak_bytes)],
            hoverinfo="text",
        ))
        figure.add_trace(scatter_class(len(times))(
            x=times, y=series.peak_bytes, mode="lines", name=f"{name} peak so far",
            line={"color": color, "width": 1, "dash": "dash", "shape": "hv"}, hoverinfo="skip",
        ))
    for peak in data.peaks:
        name = (f"rank {peak.rank} · " if multi_rank else "") + memory_place(peak.chip)
        figure.add_trace(go.Scatter(
            x=[peak.t_ns / 1e9], y=[peak.peak_bytes], mode="markers+text", showlegend=False,
            marker={"symbol": "star", "size": 14, "color": "#e45756", "line": {"width": 1, "color": "#333"}},
            text=[f"peak {fmt_bytes(peak.peak_bytes)}"], textposition="top center",
            hovertext=[f"<b>{esc(name)} peak</b>: {fmt_bytes(peak.peak_bytes)}<br>first seen at {fmt_ns(peak.t_ns)}"],
            hoverinfo="text",
        ))
    highest = max((peak.peak_bytes for peak in data.peaks if memory_place(peak.chip) != "host"), default=0)
    if highest >= HBM_LINE_SHARE * data.target.hbm_bytes:
        figure.add_hline(y=data.target.hbm_bytes, line={"color": "#e45756", "dash": "dash"},
                         annotation_text=f"{esc(data.target.label)} HBM {fmt_bytes(data.target.hbm_bytes)}")
    figure.update_xaxes(title_text="time since the run started (s)")
    figure.update_yaxes(title_text="bytes", tickformat="~s", ticksuffix="B", rangemode="tozero")
    return base_layout(figure, height=380, hovermode="closest")


# -- comparison -----------------------------------------------------------------------------------------


def plot_compare_steps(data: ComparisonData) -> go.Figure:
    """Step times of both traces on one axis."""
    if not any(side.step_durations_ns for side in (data.before, data.after)):
        return empty_figure("neither trace has steps")
    figure = go.Figure()
    for side in (data.before, data.after):
        figure.add_trace(go.Bar(
            x=[step for step, _ in side.step_durations_ns], y=[dur / 1e6 for _, dur in side.step_durations_ns],
            name=f"{side.label}: {esc(_basename(side.path))}", marker={"color": SIDE_COLORS[side.label]},
            hovertext=[f"<b>{side.label}</b> step {step}: {fmt_ns(dur)}" for step, dur in side.step_durations_ns],
            hoverinfo="text",
        ))
    figure.update_xaxes(title_text="step", dtick=1)
    durations = [dur for side in (data.before, data.after) for _, dur in side.step_durations_ns if dur > 0]
    if durations and max(durations) > LOG_SCALE_RANGE * min(durations):
        figure.update_yaxes(type="log", title_text="step time (ms, log scale)")
    else:
        figure.update_yaxes(title_text="step time (ms)")
    return base_layout(figure, height=340, barmode="group")


def plot_compare_ops(data: ComparisonData) -> go.Figure:
    """Host dispatch (without nested flushes and compiles) by op, the union of each side's most expensive ops."""
    if not data.ops:
        return empty_figure("neither trace has ops")
    figure = go.Figure()
    for side in (data.before, data.after):
        values = [side.op_total_ns.get(op, 0) for op in data.ops]
        figure.add_trace(go.Bar(
            y=[esc(op) for op in data.ops], x=[value / 1e6 for value in values], orientation="h",
            name=side.label, marker={"color": SIDE_COLORS[side.label]},
            hovertext=[f"<b>{esc(op)}</b> ({side.label})<br>{fmt_ns(value)} {HOST_DISPATCH_LABEL} over "
                       f"{side.op_counts.get(op, 0):,} calls"
                       for op, value in zip(data.ops, values)],
            hoverinfo="text",
        ))
    figure.update_yaxes(autorange="reversed")
    figure.update_xaxes(title_text=f"{HOST_DISPATCH_LABEL}, measured on this host (ms)")
    return base_layout(figure, height=120 + 22 * len(data.ops) * 2, barmode="group",
                        margin={"l": 300, "r": 20, "t": 30, "b": 50})


def plot_compare_compiles(data: ComparisonData) -> go.Figure:
    """Compiles per step for both traces."""
    steps = sorted(set(data.before.compiles_per_step) | set(data.after.compiles_per_step))
    if not steps:
        return empty_figure("neither trace compiled anything")
    figure = go.Figure()
    for side in (data.before, data.after):
        figure.add_trace(go.Bar(
            x=steps, y=[side.compiles_per_step.get(step, 0) for step in steps],
            name=f"{side.label}: {side.compiles} compiles ({side.recompiles} recompiles, {fmt_ns(side.compile_ns)})",
            marker={"color": SIDE_COLORS[side.label]}, hoverinfo="x+y+name",
        ))
    figure.update_xaxes(title_text="step", dtick=1)
    figure.update_yaxes(title_text="compiles")
    return base_layout(figure, height=320, barmode="group")


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]
