"""The report's sharding section: communication per step exposed or overlapped with compute (from the
sharding analysis), bytes moved by each collective cause, the device meshes and the parameter placements.
Shown only for a trace with sharding records (meshes, parameter placements or caused collectives)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from tputrace.analysis.sharding import NAME as SHARDING_ANALYZER, ShardingData
from tputrace.store.sharding import read_sharding
from tputrace.viewers.report.figure_style import base_layout, esc, fmt_bytes, fmt_ns
from tputrace.viewers.report.page import MAX_TABLE_ROWS, Page, html_table, note_html

if TYPE_CHECKING:
    from tputrace.store.reader import Trace
    from tputrace.store.records import DeviceMeshRecord, ParameterPlacementRecord
    from tputrace.viewers.report.analysis_data import AnalysisData



@dataclass(frozen=True)
class CauseBytes:
    """The collectives of one cause kind and module: calls and bytes moved."""

    label: str
    count: int
    bytes: int


@dataclass(frozen=True)
class ShardingSectionData:
    """What the section shows for the trace's rank; `present` False for a trace without sharding records."""

    present: bool
    meshes: tuple[DeviceMeshRecord, ...] = ()
    parameters: tuple[ParameterPlacementRecord, ...] = ()
    bytes_by_cause: tuple[CauseBytes, ...] = ()
    per_step: ShardingData | None = None


def prepare_sharding(trace: Trace, analysis: AnalysisData) -> ShardingSectionData:
    records = read_sharding(trace, trace.run.rank)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for collective in records.collectives:
        cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
        if cause is None:
            continue
        label = " · ".join(part for part in (cause.kind or "?", cause.module) if part)
        totals[label][0] += 1
        totals[label][1] += collective.bytes
    if not (records.meshes or records.parameters or totals):
        return ShardingSectionData(present=False)
    result = analysis.results.get(SHARDING_ANALYZER)
    per_step = result.data if result is not None and isinstance(result.data, ShardingData) else None
    return ShardingSectionData(
        present=True,
        meshes=tuple(sorted(records.meshes.values(), key=lambda mesh: mesh.id)),
        parameters=tuple(sorted(records.parameters, key=lambda parameter: -(parameter.bytes_per_rank or 0))),
        bytes_by_cause=tuple(sorted((CauseBytes(label, count, nbytes) for label, (count, nbytes) in totals.items()),
                                    key=lambda cause: -cause.bytes)),
        per_step=per_step,
    )


def plot_bytes_by_cause(data: ShardingSectionData) -> go.Figure:
    """Bytes moved by the collectives of each cause, largest first."""
    causes = list(reversed(data.bytes_by_cause))
    figure = go.Figure(go.Bar(
        x=[cause.bytes for cause in causes], y=[esc(cause.label) for cause in causes], orientation="h", marker_color="#4c78a8",
        hovertext=[f"{esc(cause.label)}<br>{cause.count:,} calls · {esc(fmt_bytes(cause.bytes))}" for cause in causes], hoverinfo="text",
    ))
    figure.update_xaxes(title_text="bytes moved")
    return base_layout(figure, height=120 + 30 * max(len(causes), 1), margin={"l": 260, "r": 20, "t": 20, "b": 50})


def sharding_content(page: Page, data: ShardingSectionData, analysis: AnalysisData) -> str:
    """The section's content (figure, notes, tables); every trace string escaped."""
    parts: list[str] = []
    per_step = data.per_step
    if per_step is not None:
        parts.append(html_table(
            ("communication per step", "exposed", "overlapped with compute", "compute"),
            [(esc(fmt_ns(per_step.communication_per_step_ns)), esc(fmt_ns(per_step.exposed_per_step_ns)),
              esc(fmt_ns(per_step.overlapped_per_step_ns)), esc(fmt_ns(per_step.compute_per_step_ns)))],
            numeric=(True, True, True, True), narrow=True,
        ))
        parts.append(note_html("Collective time per steady step: exposed while no program ran on the chip, overlapped while one did."))
    else:
        parts.append(note_html(esc(f"No communication per step: {analysis.note or 'the sharding analysis has no result'}.")))
    if data.bytes_by_cause:
        parts.append(page.figure("sharding-causes", plot_bytes_by_cause(data)))
        parts.append(note_html("Bytes moved by the collectives of each recorded cause (DDP bucket, FSDP gather, DTensor redistribution, ...)."))
    if data.meshes:
        parts.append(html_table(
            ("mesh", "shape", "dims", "ranks"),
            [(esc(mesh.id), esc(mesh.shape), esc(mesh.dim_names), esc(mesh.ranks)) for mesh in data.meshes],
            numeric=(True, False, False, False), narrow=True, caption="Device meshes",
        ))
    if data.parameters:
        shown = data.parameters[:MAX_TABLE_ROWS]
        caption = "Parameters" + (f" (the {len(shown)} largest per rank of {len(data.parameters):,})" if len(shown) < len(data.parameters) else "")
        parts.append(html_table(
            ("parameter", "wrapper", "placements", "shape", "local shape", "bytes", "per rank"),
            [(esc(parameter.name), esc(parameter.wrapper), esc(parameter.placements), esc(parameter.global_shape),
              esc(parameter.local_shape), esc(fmt_bytes(parameter.bytes)), esc(fmt_bytes(parameter.bytes_per_rank)))
             for parameter in shown],
            numeric=(False, False, False, False, False, True, True), caption=caption,
        ))
    return "".join(parts)
