"""The HTML report: one self-contained page with a section per picture and the findings beside it.

`write_report(trace_path, output)` and `write_comparison(before, after, output)` are what
`tputrace plot` calls; `render_report(data)` and `render_comparison(data)` turn prepared data
(`plotly_data`) and figures (`plotly_figures`) into the page text.

Safety: every string from a trace or an analysis is escaped before it reaches the page (`esc`), and
figure JSON sits in `<script type="application/json">` blocks with `<`, `>` and `&` written as JSON
escapes, so no trace text can close a tag or start a script. The page records its own errors
(`window.onerror`, unhandled rejections, `console.error`) in `#tputrace-errors` and marks each figure
`data-rendered="true"` once plotly has drawn it, so a headless browser can check it; `<body>` gets
`data-report-done`, the figure counts and `data-render-ms` (ms from navigation until everything was drawn).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import plotly.graph_objects as go

from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.viewers import plotly_figures as figures
from tputrace.viewers.plotly_data import (
    AnalysisData,
    ComparisonData,
    ReportData,
    TraceSummary,
    prepare_comparison,
    prepare_report,
)
from tputrace.viewers.plotly_figures import esc, fmt_bytes, fmt_ns, fmt_source

PlotlyJsMode = Literal["inline", "cdn"]
PLOTLYJS_MODES: tuple[str, ...] = ("inline", "cdn")
MAX_TABLE_ROWS = 15
MAX_EVIDENCE = 5
FINDINGS_SHOWN = 3  # per section; the rest are folded

SECTION_TITLES: dict[str, str] = {
    "timeline": "1 · Timeline",
    "steps": "2 · Step times",
    "where": "3 · Where time goes",
    "recompilations": "4 · Recompilations",
    "shapes": "5 · Shapes and padding",
    "roofline": "6 · Roofline",
    "collectives": "7 · Collectives",
    "memory": "8 · Memory",
}


@dataclass
class WrittenReport:
    """What `write_report` produced."""

    path: Path
    size_bytes: int
    seconds: float
    analysis_note: str


# -- page pieces ----------------------------------------------------------------------------------------


class _Page:
    """Collects figures (as JSON blocks) while the body is written, then assembles the document."""

    def __init__(self) -> None:
        self.figure_json: list[tuple[str, str]] = []

    def figure(self, name: str, figure: go.Figure) -> str:
        element_id = f"fig-{name}"
        self.figure_json.append((element_id, _safe_json(figure.to_json())))
        return f'<div class="tp-figure" id="{element_id}" data-figure="{esc(name)}"></div>'

    def document(self, title: str, body: str, plotlyjs: PlotlyJsMode) -> str:
        data_blocks = "\n".join(
            f'<script type="application/json" id="{element_id}-data">{payload}</script>'
            for element_id, payload in self.figure_json
        )
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<meta name=\"generator\" content=\"tputrace plot\">\n<title>{esc(title)}</title>\n"
            f"<style>{_CSS}</style>\n<script>{_ERROR_CAPTURE_JS}</script>\n{_plotlyjs_tag(plotlyjs)}\n</head>\n"
            f"<body>\n<pre id=\"tputrace-errors\" hidden></pre>\n{body}\n{data_blocks}\n"
            f"<script>{_RENDER_JS}</script>\n</body>\n</html>\n"
        )


def _safe_json(text: str) -> str:
    """JSON that cannot end its `<script>` block or be read as markup (same value once parsed)."""
    return (
        text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


def _plotlyjs_tag(mode: PlotlyJsMode) -> str:
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if mode == "cdn":
        return f'<script src="https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js" charset="utf-8"></script>'
    if mode != "inline":
        raise ValueError(f"plotly.js mode must be one of {', '.join(PLOTLYJS_MODES)}, not {mode!r}")
    return f"<script>{get_plotlyjs()}</script>"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[bool] | None = None,
           caption: str | None = None, narrow: bool = False) -> str:
    """An HTML table; cells must already be escaped (headers are escaped here)."""
    numeric = numeric or [False] * len(headers)
    head = "".join(f'<th class="{"num" if is_number else ""}">{esc(header)}</th>' for header, is_number in zip(headers, numeric))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"num" if is_number else ""}">{cell}</td>' for cell, is_number in zip(row, numeric)) + "</tr>"
        for row in rows
    )
    caption_html = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<table class="tp-table{" tp-narrow" if narrow else ""}">{caption_html}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _note(text_html: str) -> str:
    return f'<p class="tp-note">{text_html}</p>'


def _section(key: str, content: str, aside: str, *, title: str | None = None) -> str:
    return (
        f'<section id="{key}" class="tp-section"><h2>{esc(title or SECTION_TITLES[key])}</h2>'
        f'<div class="tp-row"><div class="tp-main">{content}</div><aside class="tp-findings">{aside}</aside></div></section>'
    )


# -- findings -------------------------------------------------------------------------------------------


def _cost_estimate(finding: Finding) -> str:
    return f"≈ {fmt_ns(finding.cost_total_ns)} (estimate)" if finding.cost_total_ns else "no cost to this run"


def _finding_html(finding: Finding) -> str:
    where = []
    if finding.file:
        location = finding.file.replace("\\", "/").rsplit("/", 1)[-1]
        where.append(esc(f"{location}:{finding.line}" if finding.line is not None else location))
    if finding.module:
        where.append(esc(finding.module))
    cost = f"costs ≈ {fmt_ns(finding.cost_total_ns)} in total" if finding.cost_total_ns else "no cost to this run"
    if finding.cost_per_step_ns is not None:
        cost += f", {fmt_ns(finding.cost_per_step_ns)} per step"
    evidence = "".join(
        f"<li>{esc(item.text)}"
        + (f' <span class="tp-where">{esc(_evidence_location(item.file, item.line))}</span>' if item.file else "")
        + "</li>"
        for item in finding.evidence[:MAX_EVIDENCE]
    )
    more = len(finding.evidence) - MAX_EVIDENCE
    if more > 0:
        evidence += f"<li>… {more} more</li>"
    return (
        f'<div class="tp-finding tp-{esc(finding.severity)}">'
        f'<div class="tp-finding-head"><span class="tp-badge">{esc(finding.severity)}</span> <b>{esc(finding.title)}</b></div>'
        f'<div class="tp-cost">{esc(cost)} (estimate){" · " + " · ".join(where) if where else ""}</div>'
        f'<p class="tp-suggestion"><b>Change:</b> {esc(finding.suggestion)}</p>'
        f"<details><summary>why, and the evidence</summary><p>{esc(finding.explanation)}</p>"
        + (f'<ul class="tp-evidence">{evidence}</ul>' if evidence else "")
        + "</details></div>"
    )


def _evidence_location(file: str | None, line: int | None) -> str:
    name = (file or "").replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}:{line}" if line is not None else name


def _analysis_tables(results: Sequence[AnalysisResult]) -> str:
    """An analyzer's data in its plain form (tables as lists of dicts, and numbers), shown as it comes, folded."""
    blocks = []
    for result in results:
        parts = []
        scalars = []
        for key, value in result.plain_data().items():
            if isinstance(value, list) and value and all(isinstance(row, dict) for row in value):
                headers = list(dict.fromkeys(column for row in value[:MAX_TABLE_ROWS] for column in row))
                rows = [[_cell(row.get(column)) for column in headers] for row in value[:MAX_TABLE_ROWS]]
                caption = f"{key} ({len(value)} rows{', first ' + str(MAX_TABLE_ROWS) if len(value) > MAX_TABLE_ROWS else ''})"
                parts.append(_table(headers, rows, caption=caption))
            elif isinstance(value, (int, float, str, bool)) or value is None:
                scalars.append(f"<li>{esc(key)}: {_cell(value)}</li>")
        if scalars:
            parts.insert(0, f"<ul>{''.join(scalars)}</ul>")
        if parts:
            blocks.append(f"<details><summary>data from the {esc(result.analyzer)} analysis</summary>{''.join(parts)}</details>")
    return "".join(blocks)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return esc(f"{value:.4g}")
    if isinstance(value, (list, tuple)):
        return esc(", ".join(str(item) for item in value))
    if isinstance(value, dict):
        return esc(json.dumps(value, default=str)[:300])
    return esc(value)


def _aside(analysis: AnalysisData, section: str) -> str:
    findings = analysis.findings_for(section)
    tables = _analysis_tables(analysis.results_for(section))
    if not analysis.available:
        return f'<h3>Findings</h3><p class="tp-muted">{esc(analysis.note)}.</p>'
    if not findings and not tables:
        return '<h3>Findings</h3><p class="tp-muted">No finding for this part of the run.</p>'
    shown = "".join(_finding_html(finding) for finding in findings[:FINDINGS_SHOWN])
    rest = findings[FINDINGS_SHOWN:]
    if rest:
        shown += (f"<details><summary>{len(rest)} more findings here</summary>"
                  + "".join(_finding_html(finding) for finding in rest) + "</details>")
    return f"<h3>Findings ({len(findings)})</h3>" + shown + tables


def _findings_overview(analysis: AnalysisData) -> str:
    if not analysis.available:
        return f'<section id="findings" class="tp-section"><h2>Findings</h2><p class="tp-muted">{esc(analysis.note)}.</p></section>'
    if not analysis.findings:
        return '<section id="findings" class="tp-section"><h2>Findings</h2><p>The diagnoses found nothing to fix.</p></section>'
    from tputrace.viewers.plotly_data import section_of

    items = []
    for finding in analysis.findings[:10]:
        section = section_of(finding.analyzer)
        items.append(
            f'<li class="tp-{esc(finding.severity)}"><span class="tp-badge">{esc(finding.severity)}</span> '
            f'<a href="#{section}">{esc(finding.title)}</a> '
            f'<span class="tp-muted">{esc(_cost_estimate(finding))} · {esc(SECTION_TITLES[section])}</span></li>'
        )
    target = f" Target: {esc(analysis.target_text)}."
    return (
        '<section id="findings" class="tp-section"><h2>Findings, most expensive first</h2>'
        f'<ol class="tp-overview">{"".join(items)}</ol>'
        f'<p class="tp-muted">{len(analysis.findings)} findings.{target} Costs are estimates computed from the trace.</p></section>'
    )


# -- the report -----------------------------------------------------------------------------------------


def _header(data: ReportData) -> str:
    run = data.run
    argv = " ".join(run.argv)
    if not run.finished:
        status = "running or killed (no end record)"
    else:
        status = "ended (exit status not seen)" if run.exit_status is None else f"exit status {run.exit_status}"
    counts = data.run.counts
    facts = [
        ("script", f"{run.script or '?'} {argv}".strip()),
        ("platform", f"{run.platform or '?'} · {run.eager_mode or '?'}"),
        ("ranks · chips", f"{len(run.ranks)} · {run.chips if run.chips is not None else '?'}"),
        ("wall time", fmt_ns(run.wall_ns)),
        ("steps", str(run.steps)),
        ("ended", status),
        ("recorded", f"{counts.get('ops', 0):,} ops · {counts.get('executions', 0):,} program runs · "
                     f"{counts.get('compiles', 0):,} compiles · {counts.get('syncs', 0):,} syncs · "
                     f"{counts.get('fallbacks', 0):,} fallbacks · {counts.get('collectives', 0):,} collectives"),
        ("trace", f"{run.path}" + (f" (created {run.created})" if run.created else "")),
    ]
    rows = "".join(f"<tr><th>{esc(label)}</th><td>{esc(value)}</td></tr>" for label, value in facts)
    error = f"<details><summary>the script raised</summary><pre>{esc(run.error)}</pre></details>" if run.error else ""
    nav = "".join(f'<a href="#{key}">{esc(title)}</a>' for key, title in SECTION_TITLES.items())
    return (
        f'<header><h1>tputrace report <span class="tp-muted">{esc(_basename(run.script or run.path))}</span></h1>'
        f'<table class="tp-facts">{rows}</table>{error}<nav><a href="#findings">Findings</a>{nav}</nav></header>'
    )


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _timeline_section(page: _Page, data: ReportData) -> str:
    timeline = data.timeline
    if timeline.drawn_events < timeline.total_events:
        lod = (
            f"{timeline.drawn_events:,} of {timeline.total_events:,} events are drawn one by one: the longest of each "
            "busy lane (marked ⋯). All events of those lanes are also drawn merged into time bins (pale), whose hover "
            "gives the count and busy time."
        )
    else:
        lod = f"All {timeline.total_events:,} events are drawn."
    note = _note(
        f"{esc(lod)} Drag to zoom into a time range, double-click to zoom out; hover for the op, shapes and source line. "
        "Click a legend entry to hide a kind."
    )
    return _section("timeline", page.figure("timeline", figures.plot_timeline(timeline)) + note, _aside(data.analysis, "timeline"))


def _steps_section(page: _Page, data: ReportData) -> str:
    note = _note(
        "Each bar is a step, coloured by the category with the most time in it. Categories overlap: a sync stall "
        "includes the compiles and program runs the host waited for; <i>compute</i> is program execution on the "
        "chips; <i>host</i> is op dispatch plus CPU fallbacks."
    )
    return _section("steps", page.figure("steps", figures.plot_steps(data.steps)) + note, _aside(data.analysis, "steps"))


def _where_section(page: _Page, data: ReportData) -> str:
    where = data.where
    lines = []
    for row in where.source_lines:
        source = row.source
        cells = [
            esc(fmt_source(source).split(" in ")[0] if source else "?"),
            esc(source.function if source else "?"),
            esc(fmt_ns(row.total_ns)),
        ]
        for label in ("op dispatch", "sync stall", "fallback", "compile", "transfer", "collective"):
            ns, count = row.parts_ns.get(label), row.counts.get(label)
            cells.append(f'<span title="{count:,} events">{esc(fmt_ns(ns))}</span>' if ns else "")
        lines.append(cells)
    table = _table(
        ["source line", "function", "total", "op dispatch", "sync stall", "fallback", "compile", "transfer", "collective"],
        lines, numeric=[False, False] + [True] * 7,
        caption="Top source lines by recorded time (categories overlap; the total adds them up)",
    ) if lines else _note("No event has a source line.")
    merged = (f" {where.leaves_merged:,} smaller (module, op) pairs are merged into “(other ops)”."
              if where.leaves_merged else "")
    content = (
        '<div class="tp-grid2">'
        + page.figure("time-split", figures.plot_time_split(where))
        + page.figure("where", figures.plot_where_treemap(where))
        + "</div>"
        + _note(esc("Left: total time per kind of event against the wall time. Right: op time (as recorded per op) by "
                    "module path and op; click a box to zoom in, the top bar to zoom out." + merged))
        + table
    )
    return _section("where", content, _aside(data.analysis, "where"))


def _recompile_section(page: _Page, data: ReportData) -> str:
    recompilations = data.recompilations
    rows = []
    for item in recompilations.varying[:MAX_TABLE_ROWS]:
        proposal = item.proposal
        if proposal:
            buckets = ", ".join(str(value) for value in proposal.get("buckets") or [])
            share = proposal.get("padding_share_estimate")
            advice = (f"{proposal.get('rule', '?')}: {buckets} → {proposal.get('compiles', '?')} compiles "
                      f"({proposal.get('compiles_saved', '?')} saved"
                      + (f", ≈{100 * share:.1f}% padding FLOPs, estimate" if isinstance(share, (int, float)) else "") + ")"
                      + (f", for the batches copied at {item.copied_at}" if item.copied_at else ""))
        elif item.size_from:
            advice = f"– (none: the size is {item.size_from}, which no padding fixes)"
        elif item.copied_at:
            advice = f"one fixed size for the batches copied at {item.copied_at}"
        elif recompilations.advisor_ran:
            advice = "– (not a recompilation storm)"
        else:
            advice = "– (diagnoses unavailable)"
        rows.append([esc(item.site), esc(item.name), esc(item.label), esc(_values_text(item.values)), f"{item.compiles:,}",
                     esc(advice)])
    if rows:
        table = _table(["call site", "program", "varying dim", "observed values", "compiles", "bucket advisor's proposal"],
                       rows, numeric=[False, False, False, False, True, False],
                       caption="Input dims that took several values across the compiles of one call site and program")
    else:
        table = _note("No input dim varied between the compiles of one call site and program.")
    shown = (f" The {len(recompilations.points):,} longest of {recompilations.total:,} compiles are drawn."
             if len(recompilations.points) < recompilations.total else "")
    note = _note(esc("Each compile is a point on its call site's row: size is compile time, colour is the reason. "
                     "Row labels: compiles · recompiles · total compile time." + shown))
    content = page.figure("recompilations", figures.plot_recompilations(recompilations)) + note + table
    return _section("recompilations", content, _aside(data.analysis, "recompilations"))


def _values_text(values: Sequence[int], limit: int = 16) -> str:
    shown = ", ".join(str(value) for value in values[:limit])
    return shown + (f", … ({len(values)} values)" if len(values) > limit else "")


def _shapes_section(page: _Page, data: ReportData) -> str:
    shapes = data.shapes
    target = shapes.target
    worst = sorted(shapes.shapes, key=lambda shape: -(shape.wasted_share * shape.total_ns))[:MAX_TABLE_ROWS]
    rows = []
    for shape in worst:
        product = shape.product
        batch = f"{product.batch}×(" if product.batch > 1 else ""
        rows.append([
            esc(shape.op) + (" <i>(CPU fallback)</i>" if shape.fallback else ""),
            esc(f"{batch}{product.m}×{product.k}×{product.n}{')' if batch else ''} {product.dtype}"),
            esc(f"{shape.padded[0]}×{shape.padded[1]}×{shape.padded[2]}"), f"{100 * shape.wasted_share:.1f}%",
            f"{shape.count:,}", esc(fmt_ns(shape.total_ns)), esc(shape.module or "–"), esc(fmt_source(shape.source)),
        ])
    table = _table(["op", "M×K×N", f"padded on {target.name}", "wasted", "calls", "recorded time", "module", "source"], rows,
                   numeric=[False, False, False, True, True, True, False, False],
                   caption="Matmul shapes by padded FLOPs × recorded time") if rows else ""
    tile_f32, tile_bf16 = target.tile("f32"), target.tile("bf16")
    note = _note(esc(
        f"Matrix products of matmul, linear, convolution and attention ops (diamonds: ops that ran as CPU fallbacks), "
        f"by contracted dim K and output features N; size is recorded time, colour is the share of the padded FLOPs "
        f"that is padding on the target, {data.analysis.target_text}: M pads to the sublane tile "
        f"({tile_f32[0]} rows for 32-bit, {tile_bf16[0]} for 16-bit types), K and N to the {target.mxu}-wide MXU. "
        "The same rule as the padding diagnosis."
    ))
    content = page.figure("shapes", figures.plot_shapes(shapes)) + note + table
    return _section("shapes", content, _aside(data.analysis, "shapes"))


def _roofline_section(page: _Page, data: ReportData) -> str:
    roofline = data.roofline
    target = roofline.target
    platform = roofline.platform or "?"
    measured = (f"Measured (filled circles): XLA's FLOPs per execution divided by the mean execution time recorded "
                f"on platform {platform}" + (" (the host CPU, not a TPU)" if platform == "cpu" else "") + ".")
    estimated = (f" Estimated (open diamonds, and the ceilings): {data.analysis.target_text}, min(peak FLOP/s, "
                 f"intensity × HBM bandwidth of {fmt_si_text(target.hbm_bandwidth)}B/s); the float32 peak is itself "
                 "an estimate (bf16 peak / 6, see tputrace.analysis.chips).")
    skipped = (f" {roofline.skipped:,} programs without FLOP or byte figures (or never executed) are left out."
               if roofline.skipped else "")
    note = _note(esc(measured + estimated + skipped + " Size is total execution time."))
    return _section("roofline", page.figure("roofline", figures.plot_roofline(roofline)) + note, _aside(data.analysis, "roofline"))


def fmt_si_text(value: float) -> str:
    return figures.fmt_si(value).strip()


def _collectives_section(page: _Page, data: ReportData) -> str:
    collectives = data.collectives
    if not collectives.present:
        return _section("collectives", _note("This trace has no collectives (a single-process run)."),
                        _aside(data.analysis, "collectives"))
    shown = (f" The {len(collectives.points):,} longest of {collectives.total:,} collectives are drawn."
             if len(collectives.points) < collectives.total else "")
    ici = f" The dashed red line is the ICI bandwidth of {data.analysis.target_text}."
    content = (
        page.figure("collective-sizes", figures.plot_collective_sizes(collectives))
        + _note(esc("Message size against time; dotted grey lines are constant bandwidths for reference." + ici + shown))
        + page.figure("collective-waits", figures.plot_collective_waits(collectives))
        + _note("Time each rank waited for the last rank to arrive, per step: a bright row is a rank the others wait for.")
    )
    return _section("collectives", content, _aside(data.analysis, "collectives"))


def _memory_section(page: _Page, data: ReportData) -> str:
    memory = data.memory
    decimated = any(len(series.t_ns) < series.samples for series in memory.series)
    highest = max((peak.peak_bytes for peak in memory.peaks), default=0)
    share = (f" The highest peak, {fmt_bytes(highest)}, is {100 * highest / memory.target.hbm_bytes:.2g}% of the HBM "
             f"of {data.analysis.target_text} ({fmt_bytes(memory.target.hbm_bytes)})." if highest else "")
    note = _note(esc(
        "Live bytes of tpu tensors per chip (solid) and the running peak (dashed); the star marks each chip's peak "
        "at the first sample that saw it (the peak itself may fall between samples)." + share
        + (" Long series keep the lowest and highest sample of each time bin." if decimated else "")
    ))
    return _section("memory", page.figure("memory", figures.plot_memory(memory)) + note, _aside(data.analysis, "memory"))


def render_report(data: ReportData, *, plotlyjs: PlotlyJsMode = "inline") -> str:
    """The report page for prepared data."""
    page = _Page()
    body = "".join((
        _header(data),
        "<main>",
        _findings_overview(data.analysis),
        _timeline_section(page, data),
        _steps_section(page, data),
        _where_section(page, data),
        _recompile_section(page, data),
        _shapes_section(page, data),
        _roofline_section(page, data),
        _collectives_section(page, data),
        _memory_section(page, data),
        "</main>",
        '<footer class="tp-muted">Written by tputrace plot. Times are as recorded; estimates are labelled.</footer>',
    ))
    title = f"tputrace report: {_basename(data.run.script or data.run.path)}"
    return page.document(title, body, plotlyjs)


def write_report(
    trace_path: str | Path, output: str | Path, *, target: str | None = None, plotlyjs: PlotlyJsMode = "inline"
) -> WrittenReport:
    """Read a trace, prepare every section, and write the page to `output`."""
    from tputrace.store.reader import open_trace

    started = time.perf_counter()
    with open_trace(trace_path) as trace:
        data = prepare_report(trace, target=target)
    text = render_report(data, plotlyjs=plotlyjs)
    output_path = Path(output)
    output_path.write_text(text, encoding="utf-8")
    return WrittenReport(output_path, output_path.stat().st_size, time.perf_counter() - started, data.analysis.note)


# -- the comparison -------------------------------------------------------------------------------------


def _compare_table(data: ComparisonData) -> str:
    before, after = data.before, data.after

    def change(old: float | None, new: float | None) -> str:
        if not old or new is None:
            return ""
        ratio = new / old
        return f"{ratio:.2f}×"

    rows: list[tuple[str, float | None, float | None, str]] = [
        ("wall time", before.wall_ns, after.wall_ns, "ns"),
        ("steps", len(before.step_durations_ns), len(after.step_durations_ns), "count"),
        ("median step", before.median_step_ns, after.median_step_ns, "ns"),
        ("compiles", before.compiles, after.compiles, "count"),
        ("recompiles", before.recompiles, after.recompiles, "count"),
        ("compile time", before.compile_ns, after.compile_ns, "ns"),
    ]
    split_after = dict(after.time_split)
    rows.extend((label, ns, split_after.get(label), "ns") for label, ns in before.time_split if label != "compile")
    cells = []
    for label, old, new, unit in rows:
        show = (lambda value: fmt_ns(value) if value is not None else "–") if unit == "ns" else (
            lambda value: f"{int(value):,}" if value is not None else "–")
        cells.append([esc(label), esc(show(old)), esc(show(new)), esc(change(old, new))])
    return _table(["", "before", "after", "after / before"], cells, numeric=[False, True, True, True], narrow=True)


def render_comparison(data: ComparisonData, *, plotlyjs: PlotlyJsMode = "inline") -> str:
    """The before/after page for two prepared traces."""
    page = _Page()
    sides = "".join(
        f"<tr><th>{esc(side.label)}</th><td>{esc(side.path)}</td><td>{esc(side.script or '?')}</td></tr>"
        for side in (data.before, data.after)
    )
    header = (
        '<header><h1>tputrace comparison</h1>'
        f'<table class="tp-facts">{sides}</table>'
        '<nav><a href="#summary">Summary</a><a href="#steps">Step times</a><a href="#ops">Op time by op</a>'
        '<a href="#compiles">Compiles</a></nav></header>'
    )
    rank_note = _note("Rank 0 of each trace. Ratios below 1 mean the after run spent less.")
    body = "".join((
        header,
        "<main>",
        f'<section id="summary" class="tp-section"><h2>Summary</h2>{_compare_table(data)}{rank_note}</section>',
        f'<section id="steps" class="tp-section"><h2>Step times</h2>{page.figure("compare-steps", figures.plot_compare_steps(data))}</section>',
        f'<section id="ops" class="tp-section"><h2>Op time by op</h2>{page.figure("compare-ops", figures.plot_compare_ops(data))}'
        + _note("The union of each run's most expensive ops, as recorded per op.") + "</section>",
        f'<section id="compiles" class="tp-section"><h2>Compiles</h2>{page.figure("compare-compiles", figures.plot_compare_compiles(data))}</section>',
        "</main>",
    ))
    return page.document("tputrace comparison", body, plotlyjs)


def write_comparison(
    before_path: str | Path, after_path: str | Path, output: str | Path, *, plotlyjs: PlotlyJsMode = "inline"
) -> WrittenReport:
    """Read two traces and write the before/after page to `output`."""
    from tputrace.store.reader import open_trace

    started = time.perf_counter()
    with open_trace(before_path) as before, open_trace(after_path) as after:
        data = prepare_comparison(before, after)
    text = render_comparison(data, plotlyjs=plotlyjs)
    output_path = Path(output)
    output_path.write_text(text, encoding="utf-8")
    return WrittenReport(output_path, output_path.stat().st_size, time.perf_counter() - started, "")


def summary_line(side: TraceSummary) -> str:
    """One line about one side of a comparison, for the terminal."""
    median = fmt_ns(side.median_step_ns) if side.median_step_ns is not None else "–"
    return f"{side.label}: {side.path}: wall {fmt_ns(side.wall_ns)}, median step {median}, {side.compiles} compiles"


# -- page assets ----------------------------------------------------------------------------------------

_CSS = """
:root { --fg: #1f2328; --muted: #667085; --line: #e4e7ec; --bg: #fff; --soft: #f6f8fa;
        --critical: #c0392b; --warning: #d98c00; --info: #2f6fb0; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
header { padding: 16px 24px 8px; border-bottom: 1px solid var(--line); background: var(--soft); }
h1 { font-size: 20px; margin: 0 0 8px; } h2 { font-size: 17px; margin: 0 0 10px; } h3 { font-size: 14px; margin: 0 0 8px; }
nav { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 10px; }
nav a { color: var(--info); text-decoration: none; } nav a:hover { text-decoration: underline; }
main { padding: 0 24px 24px; }
footer { padding: 12px 24px; font-size: 12px; }
.tp-muted { color: var(--muted); font-weight: normal; }
.tp-facts { border-collapse: collapse; font-size: 13px; }
.tp-facts th { text-align: left; padding: 1px 14px 1px 0; color: var(--muted); font-weight: 500; white-space: nowrap; vertical-align: top; }
.tp-facts td { padding: 1px 16px 1px 0; word-break: break-all; }
.tp-narrow { max-width: 760px; }
.tp-section { padding: 18px 0 8px; border-bottom: 1px solid var(--line); }
.tp-row { display: flex; gap: 20px; align-items: flex-start; }
.tp-main { flex: 3 1 0; min-width: 0; }
.tp-findings { flex: 1 1 0; min-width: 260px; max-width: 420px; font-size: 13px; background: var(--soft); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; }
@media (max-width: 1000px) { .tp-row { flex-direction: column; } .tp-findings { max-width: none; width: 100%; } }
.tp-grid2 { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); gap: 12px; }
@media (max-width: 1000px) { .tp-grid2 { grid-template-columns: minmax(0, 1fr); } }
.tp-figure { width: 100%; min-height: 120px; }
.tp-note { color: var(--muted); font-size: 12.5px; margin: 4px 0 10px; max-width: 110ch; }
.tp-table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0 4px; width: 100%; }
.tp-table caption { text-align: left; color: var(--muted); padding-bottom: 4px; }
.tp-table th, .tp-table td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
.tp-table th { background: var(--soft); font-weight: 600; }
.tp-table .num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.tp-finding { border-left: 4px solid var(--info); background: var(--bg); padding: 6px 10px; margin-bottom: 10px; border-radius: 0 4px 4px 0; }
.tp-finding p { margin: 4px 0; }
.tp-critical { border-color: var(--critical); } .tp-warning { border-color: var(--warning); } .tp-info { border-color: var(--info); }
.tp-badge { display: inline-block; font-size: 11px; text-transform: uppercase; letter-spacing: .03em; padding: 0 5px; border-radius: 3px; color: #fff; background: var(--info); }
.tp-critical .tp-badge { background: var(--critical); } .tp-warning .tp-badge { background: var(--warning); }
.tp-cost { color: var(--muted); font-size: 12px; }
.tp-evidence { margin: 4px 0 0; padding-left: 18px; font-size: 12px; }
.tp-where { color: var(--muted); font-family: ui-monospace, monospace; }
.tp-overview { margin: 0; padding-left: 20px; } .tp-overview li { margin: 3px 0; list-style-position: outside; }
.tp-overview a { color: var(--fg); }
details { margin: 6px 0; } summary { cursor: pointer; color: var(--info); }
pre { white-space: pre-wrap; font-size: 12px; }
#tputrace-errors { margin: 0; padding: 8px 24px; background: #fde8e8; color: #8a1c1c; }
"""

_ERROR_CAPTURE_JS = """
(function () {
  var errors = [];
  function show() {
    var box = document.getElementById('tputrace-errors');
    if (box && errors.length) { box.textContent = 'This page hit errors:\\n' + errors.join('\\n'); box.hidden = false; }
    document.documentElement.setAttribute('data-errors', String(errors.length));
  }
  function record(message) { errors.push(String(message)); show(); }
  window.__tputraceErrors = errors;
  window.__tputraceRecord = record;
  window.__tputraceShowErrors = show;
  window.addEventListener('error', function (event) {
    var where = event.filename ? ' (' + event.filename.split('/').pop() + ':' + event.lineno + ')' : '';
    record('error: ' + (event.message || (event.target && event.target.tagName ? 'failed to load ' + event.target.tagName : event.type)) + where);
  }, true);
  window.addEventListener('unhandledrejection', function (event) {
    var reason = event.reason;
    record('unhandled rejection: ' + (reason && reason.message ? reason.message : reason));
  });
  var consoleError = console.error;
  console.error = function () {
    record('console.error: ' + Array.prototype.map.call(arguments, String).join(' '));
    return consoleError.apply(console, arguments);
  };
})();
"""

_RENDER_JS = """
(function () {
  var record = window.__tputraceRecord;
  var divs = Array.prototype.slice.call(document.querySelectorAll('div.tp-figure'));
  var config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ['lasso2d', 'select2d'],
                 toImageButtonOptions: { format: 'png', scale: 2 } };
  var jobs = [];
  function finish() {
    var rendered = document.querySelectorAll('div.tp-figure[data-rendered="true"]').length;
    document.body.setAttribute('data-figures-expected', String(divs.length));
    document.body.setAttribute('data-figures-rendered', String(rendered));
    document.body.setAttribute('data-render-ms', String(Math.round(performance.now())));
    document.body.setAttribute('data-report-done', 'true');
    window.__tputraceShowErrors();
  }
  if (typeof Plotly === 'undefined') {
    record('plotly.js did not load (a report written with --plotlyjs cdn needs the network)');
    finish();
    return;
  }
  divs.forEach(function (div) {
    try {
      var spec = JSON.parse(document.getElementById(div.id + '-data').textContent);
      jobs.push(Plotly.newPlot(div, spec.data, spec.layout || {}, config).then(function () {
        div.setAttribute('data-rendered', 'true');
      }, function (error) { record('figure ' + div.id + ': ' + error); }));
    } catch (error) {
      record('figure ' + div.id + ': ' + error);
    }
  });
  Promise.all(jobs).then(finish, finish);
})();
"""
