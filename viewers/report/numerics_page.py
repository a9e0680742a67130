"""`tputrace plot X.tpnum`: a numerics recording as one page: its findings, each module call's divergence from its
CPU replay along the forward and the backward (as a share of its tolerance), the first divergent call's ops, and
the calls that could not be compared. Every string from the recording is escaped."""

from __future__ import annotations

import math
import time
from pathlib import Path

import plotly.graph_objects as go

from tputrace.numerics.findings import NumericsReport, replay_report
from tputrace.numerics.report_findings import numerics_findings
from tputrace.numerics.store import COMPARED, ModuleCall, NumericsRecording, read_recording
from tputrace.viewers.report.figure_style import base_layout, empty_figure, esc
from tputrace.viewers.report.findings_html import finding_html
from tputrace.viewers.report.page import Page, PlotlyJsMode, html_table, note_html
from tputrace.viewers.report.report_html import WrittenReport

PHASE_COLORS = {"forward": "#1f77b4", "backward": "#d62728", "parameters": "#2ca02c"}
# Calls listed in the table of divergent calls, in execution order.
MAX_DIVERGENT_ROWS = 30


def write_numerics_page(recording_path: str | Path, output: str | Path, *,
                        plotlyjs: PlotlyJsMode = "inline") -> WrittenReport:
    """Read a numerics recording and write its page to `output`."""
    started = time.perf_counter()
    recording = read_recording(Path(recording_path))
    text = render_numerics_page(recording, replay_report(recording), plotlyjs=plotlyjs)
    output_path = Path(output)
    output_path.write_text(text, encoding="utf-8")
    return WrittenReport(output_path, output_path.stat().st_size, time.perf_counter() - started, "")


def render_numerics_page(recording: NumericsRecording, report: NumericsReport, *,
                         plotlyjs: PlotlyJsMode = "inline") -> str:
    page = Page()
    findings = numerics_findings(report)
    facts = "".join(f"<tr><th>{esc(key)}</th><td>{esc(value)}</td></tr>" for key, value in (
        ("recording", recording.path), ("script", recording.info.get("script", "?")),
        ("mode", recording.info.get("mode", "?")),
        ("module calls", f"{report.calls:,} in {report.steps} steps, {report.compared:,} compared with the CPU")))
    header = ('<header><h1>tputrace numerics</h1>'
              f'<table class="tp-facts">{facts}</table>'
              '<nav><a href="#findings">Findings</a><a href="#divergence">Divergence</a>'
              '<a href="#calls">Divergent calls</a><a href="#ops">Ops</a></nav></header>')
    findings_html = "".join(finding_html(finding) for finding in findings) or (
        "<p>Every compared call stays within its tolerance, and no NaN or Inf.</p>")
    body = "".join((
        header, "<main>",
        f'<section id="findings" class="tp-section"><h2>Findings</h2>{findings_html}</section>',
        f'<section id="divergence" class="tp-section"><h2>Divergence from the CPU, call by call</h2>'
        f'{page.figure("numerics-divergence", divergence_figure(recording.calls))}'
        + note_html("Each compared module call's relative difference from its CPU replay from the same inputs, as a "
                    "share of its dtype's tolerance (log scale; above 1 is beyond it), in execution order; "
                    "forward, backward and parameter gradients apart.") + "</section>",
        f'<section id="calls" class="tp-section"><h2>Calls beyond their tolerance</h2>{_divergent_table(recording.calls)}</section>',
        f'<section id="ops" class="tp-section"><h2>Ops of the first divergent call</h2>{_ops_table(recording, report)}</section>',
        "</main>",
    ))
    return page.document("tputrace numerics", body, plotlyjs)


def divergence_figure(calls: list[ModuleCall]) -> go.Figure:
    """Divergence over tolerance per compared call, by execution order, one trace per phase."""
    compared = [(index, call) for index, call in enumerate(calls) if call.outcome == COMPARED and call.tolerance]
    if not compared:
        return empty_figure("no call was compared with the CPU (record with --steps 1 or more)")
    figure = go.Figure()
    for phase, color in PHASE_COLORS.items():
        points = [(index, call) for index, call in compared if call.phase == phase]
        if not points:
            continue
        figure.add_trace(go.Scatter(
            x=[index for index, _ in points], y=[_ratio(call) for _, call in points], mode="markers", name=phase,
            marker={"color": color, "size": 7},
            hovertext=[esc(f"{call.module} ({call.module_type}) {call.phase}, step {call.step}: relative difference "
                           f"{call.divergence:.3g}, tolerance {call.tolerance:.0e}") for _, call in points],
            hoverinfo="text"))
    figure.add_hline(y=1.0, line_dash="dash", line_color="#888", annotation_text="tolerance")
    figure.update_xaxes(title_text="module call, in execution order")
    figure.update_yaxes(type="log", title_text="difference / tolerance")
    return base_layout(figure, height=360)


def _ratio(call: ModuleCall) -> float:
    """The call's divergence over its tolerance, with a floor so an exact match shows on a log axis."""
    if call.divergence is None or not call.tolerance:
        return 1e-6
    if math.isinf(call.divergence) or math.isnan(call.divergence):
        return 1e6
    return max(call.divergence / call.tolerance, 1e-6)


def _divergent_table(calls: list[ModuleCall]) -> str:
    divergent = [call for call in calls if call.diverged]
    if not divergent:
        return note_html("No call leaves its tolerance.")
    rows = [[esc(call.step), esc(call.phase), esc(call.module), esc(call.module_type),
             esc(f"{call.path}:{call.line}" if call.path else "–"), esc(f"{call.divergence:.3g}"),
             esc(f"{call.tolerance:.0e}")] for call in divergent[:MAX_DIVERGENT_ROWS]]
    more = len(divergent) - MAX_DIVERGENT_ROWS
    return html_table(["step", "phase", "module", "type", "called from", "difference", "tolerance"], rows,
                      numeric=[True, False, False, False, False, True, True]) + (
        note_html(f"{more} more calls beyond their tolerance.") if more > 0 else "")


def _ops_table(recording: NumericsRecording, report: NumericsReport) -> str:
    found = report.first_divergence
    ops = recording.ops.get(found.call.event_id, []) if found is not None else []
    if not ops:
        return note_html("Record with --ops to run the first divergent call again op by op on the tpu and the CPU.")
    rows = [[esc(op.op_index), esc(f"aten.{op.op_name}"), esc(op.tpu_dtype), esc(op.cpu_dtype or "(not on the CPU)"),
             esc("–" if op.divergence is None else f"{op.divergence:.3g}"), "beyond" if op.diverged else ""]
            for op in ops]
    return html_table(["#", "op", "tpu dtype", "CPU dtype", "difference", ""], rows,
                      numeric=[True, False, False, False, True, False])
