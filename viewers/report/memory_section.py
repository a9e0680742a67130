"""The report's memory breakdown, from buffer lifetimes: live bytes over time stacked by kind, the peak as a
treemap of kind, module and line, the largest parts and what would fit the target, and an out-of-memory
failure's live set. Shown only for a trace with a `buffers` table (format 3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from tputrace.analysis.memory import NAME as MEMORY_ANALYZER, MemoryData as MemoryAnalysis, OutOfMemoryData
from tputrace.analysis.memory_fit import MemoryFit
from tputrace.analysis.memory_peak import PeakBreakdown
from tputrace.derived.memory_timeline import buffer_lifetimes, stacked_by_kind
from tputrace.derived.memory_timeline import memory_place
from tputrace.viewers.report.figure_style import base_layout, esc, fmt_bytes
from tputrace.viewers.report.page import MAX_TABLE_ROWS, Page, html_table, note_html

if TYPE_CHECKING:
    from tputrace.store.reader import Trace
    from tputrace.viewers.report.analysis_data import AnalysisData

KIND_COLORS = {"parameter": "#4c78a8", "gradient": "#f58518", "optimizer_state": "#54a24b", "activation": "#e45756",
               "temporary": "#72b7b2", "program_temporary": "#b279a2", "other": "#9d755d"}


@dataclass(frozen=True)
class MemoryBreakdownData:
    """What the breakdown shows for the chip with the highest peak; `present` False without buffer lifetimes."""

    present: bool
    chip: int = 0
    times_ns: tuple[int, ...] = ()
    live_by_kind: tuple[tuple[str, tuple[int, ...]], ...] = ()
    peak: PeakBreakdown | None = None
    fit: MemoryFit | None = None
    out_of_memory: OutOfMemoryData | None = None


def prepare_memory_breakdown(trace: Trace, analysis: AnalysisData) -> MemoryBreakdownData:
    result = analysis.results.get(MEMORY_ANALYZER)
    data = result.data if result is not None and isinstance(result.data, MemoryAnalysis) else None
    if data is None or not data.peaks:
        return MemoryBreakdownData(present=False)
    index = max(range(len(data.peaks)), key=lambda position: data.peaks[position].bytes)
    peak = data.peaks[index]
    times, by_kind = stacked_by_kind(buffer_lifetimes(trace, trace.run.rank), peak.chip)
    return MemoryBreakdownData(
        present=True, chip=peak.chip, times_ns=tuple(times),
        live_by_kind=tuple((kind, tuple(values)) for kind, values in by_kind.items()),
        peak=peak, fit=data.fits[index] if index < len(data.fits) else None, out_of_memory=data.out_of_memory,
    )


def plot_live_by_kind(data: MemoryBreakdownData) -> go.Figure:
    """Live bytes over time on the chip, stacked by what the buffers are."""
    figure = go.Figure()
    seconds = [t_ns / 1e9 for t_ns in data.times_ns]
    for kind, values in data.live_by_kind:
        figure.add_trace(go.Scatter(
            x=seconds, y=list(values), name=esc(kind.replace("_", " ")), stackgroup="live", mode="lines",
            line={"width": 0.5, "color": KIND_COLORS.get(kind, "#bab0ac")},
            hovertemplate=f"{esc(kind.replace('_', ' '))}: %{{y:,}} bytes at %{{x:.3f}} s<extra></extra>",
        ))
    if data.fit is not None:
        figure.add_hline(y=data.fit.hbm_bytes, line_dash="dot", line_color="#d62728",
                         annotation_text=esc(f"HBM of {data.fit.target}"), annotation_position="top left")
    figure.update_xaxes(title_text="time since the run's start (s)")
    figure.update_yaxes(title_text=f"live bytes on {memory_place(data.chip)}")
    return base_layout(figure, height=340)


def plot_peak_treemap(peak: PeakBreakdown) -> go.Figure:
    """The peak's bytes as kind → module → line."""
    ids, labels, parents, values = [], [], [], []
    seen: set[str] = set()

    def node(node_id: str, label: str, parent: str) -> None:
        if node_id not in seen:
            seen.add(node_id)
            ids.append(node_id)
            labels.append(esc(label))
            parents.append(parent)
            values.append(0)

    for part in peak.parts:
        kind_id = f"k:{part.kind}"
        module_id = f"{kind_id}/m:{part.module or '(no module)'}"
        node(kind_id, part.kind.replace("_", " "), "")
        node(module_id, part.module or "(no module)", kind_id)
        line_id = f"{module_id}/l:{part.file}:{part.line}"
        node(line_id, part.where + (" (estimated)" if part.estimated else ""), module_id)
        for position, node_id in enumerate(ids):
            if node_id in (kind_id, module_id, line_id):
                values[position] += part.bytes
    figure = go.Figure(go.Treemap(ids=ids, labels=labels, parents=parents, values=values, branchvalues="total",
                                  hovertemplate="%{label}<br>%{value:,} bytes<extra></extra>"))
    return base_layout(figure, height=420, margin={"l": 10, "r": 10, "t": 10, "b": 10})


def memory_breakdown_content(page: Page, data: MemoryBreakdownData) -> str:
    """The breakdown's figures and tables; every trace string escaped."""
    if not data.present or data.peak is None:
        return ""
    peak = data.peak
    parts: list[str] = []
    if data.out_of_memory is not None and data.out_of_memory.cause == "error":
        live = data.out_of_memory.live
        parts.append(note_html(esc(f"The run ran out of memory ({data.out_of_memory.message}); "
                                   f"{fmt_bytes(live.bytes)} was live on {memory_place(live.chip)} when it failed.")))
        parts.append(_parts_table(live, "Live when it failed"))
    parts.append(page.figure("memory-kinds", plot_live_by_kind(data)))
    parts.append(note_html(esc(
        f"Live bytes on {memory_place(peak.chip)} from buffer lifetimes, stacked by kind; a program's working memory shows at its launch. "
        f"The peak, {fmt_bytes(peak.bytes)} in step {peak.step}, is {peak.coverage:.1%} of the measured peak "
        f"({fmt_bytes(peak.measured_peak_bytes)})"
        + (f"; {fmt_bytes(peak.unattributed_bytes)} of it was made outside the script's lines." if peak.unattributed_bytes else ".")
    )))
    parts.append(page.figure("memory-peak", plot_peak_treemap(peak)))
    parts.append(_parts_table(peak, "At the peak, by kind, module and line"))
    if data.fit is not None:
        fit = data.fit
        verdict = ("fits" if fit.fits else f"does not fit: {fmt_bytes(fit.over_bytes)} over")
        parts.append(note_html(esc(f"Padded to the native tiles of {fit.target}, the peak is {fmt_bytes(fit.padded_peak_bytes)} "
                                   f"of its {fmt_bytes(fit.hbm_bytes)} HBM: it {verdict}.")))
        if not fit.fits and fit.changes:
            parts.append(html_table(
                ("change (estimated)", "peak after", "saves", "fits"),
                [(esc(change.description), esc(fmt_bytes(change.peak_bytes)), esc(fmt_bytes(change.saves_bytes)), "yes" if change.fits else "no")
                 for change in fit.changes],
                numeric=(False, True, True, False), caption="Changes that would fit it",
            ))
    return "".join(parts)


def _parts_table(peak: PeakBreakdown, caption: str) -> str:
    shown = peak.parts[:MAX_TABLE_ROWS]
    return html_table(
        ("bytes", "kind", "module", "line", "buffers"),
        [(esc(fmt_bytes(part.bytes)), esc(part.kind.replace("_", " ") + (" (estimated share)" if part.estimated else "")),
          esc(part.module or ""), esc(part.where.split(" in ")[0]), esc(part.buffers)) for part in shown],
        numeric=(True, False, False, False, True), caption=caption + (f" (the {len(shown)} largest of {len(peak.parts)})" if len(shown) < len(peak.parts) else ""),
    )
