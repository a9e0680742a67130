"""The HTML report: one self-contained page with a section per picture and the findings beside it.

`write_report(trace_path, output)` and `write_comparison(before, after, output)` are what
`tputrace plot` calls; `render_report(data)` and `render_comparison(data)` turn prepared data
(`data`) and figures (`figures`) into the page text (`page`).

Safety: every string from a trace or an analysis is escaped before it reaches the page (`esc`), and
figure JSON is written so that no trace text can close a tag or start a script (see `page`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tputrace.derived.op_time import HOST_DISPATCH
from tputrace.derived.projection import PROJECTION_NOTE
from tputrace.summary import raised_line
from tputrace.viewers.report import figures
from tputrace.derived.memory_timeline import memory_place
from tputrace.viewers.report.diff_section import diff_content
from tputrace.viewers.report.data import ComparisonData, ReportData, TraceSummary, prepare_comparison, prepare_report
from tputrace.viewers.report.figure_style import esc, fmt_bytes, fmt_ns, fmt_source
from tputrace.viewers.report.compile_data import VaryingDim
from tputrace.viewers.report.findings_html import findings_aside, findings_overview
from tputrace.viewers.report.page import (
    MAX_TABLE_ROWS,
    SECTION_TITLES,
    Page,
    PlotlyJsMode,
    html_table,
    note_html,
    section_html,
)
from tputrace.viewers.report.memory_section import memory_breakdown_content
from tputrace.viewers.report.sharding_section import sharding_content
from tputrace.wording import format_change


@dataclass
class WrittenReport:
    """What `write_report` produced."""

    path: Path
    size_bytes: int
    seconds: float
    analysis_note: str



# -- the report -----------------------------------------------------------------------------------------


def _header(data: ReportData) -> str:
    run = data.run
    argv = " ".join(run.argv)
    if not run.finished:
        status = "running or killed (no end record)"
    else:
        status = "ended (exit status not seen)" if run.exit_status is None else f"exit status {run.exit_status}"
        if run.error:
            status += f", raised {raised_line(run.error)}"
    counts = data.run.counts
    facts = [
        ("script", f"{run.script or '?'} {argv}".strip()),
        ("platform", f"{run.platform or '?'} · {run.eager_modes or '?'}"),
        ("ranks · chips", f"{len(run.ranks)} · {run.chips if run.chips is not None else '?'}"),
        ("wall time", fmt_ns(run.wall_ns)),
        ("steps", _steps_text(data)),
        *((("window", run.recording_window.text),) if run.recording_window is not None else ()),
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


def _steps_text(data: ReportData) -> str:
    """The step count, the median step measured on this host (an import: on its device) and the one projected for
    the target."""
    run, projected = data.run, data.projected
    if run.median_step_ns is None:
        return str(run.steps)
    text = f"{run.steps} · median {fmt_ns(run.median_step_ns)} measured on {run.measured_on}"
    if projected.median_ns is not None:
        text += f" · {fmt_ns(projected.median_ns)} projected for {projected.target} from {PROJECTION_NOTE}"
    if run.chip_pace is not None:
        text += f" · {run.chip_pace.text}"
    return text


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _timeline_section(page: Page, data: ReportData) -> str:
    timeline = data.timeline
    if timeline.drawn_events < timeline.total_events:
        lod = (
            f"{timeline.drawn_events:,} of {timeline.total_events:,} events are drawn one by one: the longest of each "
            "busy lane (marked ⋯). All events of those lanes are also drawn merged into time bins (pale), whose hover "
            "gives the count and busy time."
        )
    else:
        lod = f"All {timeline.total_events:,} events are drawn."
    note = note_html(
        f"{esc(lod)} Drag to zoom into a time range, double-click to zoom out; hover for the op, shapes and source line. "
        "Click a legend entry to hide a kind."
    )
    return section_html("timeline", page.figure("timeline", figures.plot_timeline(timeline)) + note, findings_aside(data.analysis, "timeline"))


def _steps_section(page: Page, data: ReportData) -> str:
    note = note_html(
        "Each bar is a step, coloured by the category with the most time in it. Categories overlap: a sync stall "
        "includes the compiles and program runs the host waited for; <i>compute</i> is program execution on the "
        "chips; <i>host</i> is op dispatch plus CPU fallbacks."
    )
    return section_html("steps", page.figure("steps", figures.plot_steps(data.steps)) + note, findings_aside(data.analysis, "steps"))


def _where_section(page: Page, data: ReportData) -> str:
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
    table = html_table(
        ["source line", "function", "total", "op dispatch", "sync stall", "fallback", "compile", "transfer", "collective"],
        lines, numeric=[False, False] + [True] * 7,
        caption="Top source lines by recorded time (categories overlap; the total adds them up)",
    ) if lines else note_html("No event has a source line.")
    merged = (f" {where.leaves_merged:,} smaller (module, op) pairs are merged into “(other ops)”."
              if where.leaves_merged else "")
    content = (
        '<div class="tp-grid2">'
        + page.figure("time-split", figures.plot_time_split(where))
        + page.figure("where", figures.plot_where_treemap(where))
        + "</div>"
        + note_html(esc("Left: total time per kind of event against the wall time. Right: ops' "
                        + (f"{where.op_label} without the flushes and compiles that ran inside the calls" if where.op_label == HOST_DISPATCH
                           else where.op_label)
                        + f", measured on {where.measured_on}, by module path and op; click a box to zoom in, the top bar to zoom out." + merged))
        + table
    )
    return section_html("where", content, findings_aside(data.analysis, "where"))


def _recompile_section(page: Page, data: ReportData) -> str:
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
                      + (f", for the batches {_batches(item)}" if item.copied_at else ""))
        elif item.size_from:
            advice = f"– (none: the size is {item.size_from}, which no padding fixes)"
        elif item.copied_at:
            advice = f"one fixed size for the batches {_batches(item)}"
        elif recompilations.advisor_ran:
            advice = "– (not a recompilation storm)"
        else:
            advice = "– (diagnoses unavailable)"
        rows.append([esc(item.site), esc(item.name), esc(item.label), esc(_values_text(item.values)), f"{item.compiles:,}",
                     esc(advice)])
    if rows:
        table = html_table(["call site", "program", "varying dim", "observed values", "compiles", "bucket advisor's proposal"],
                       rows, numeric=[False, False, False, False, True, False],
                       caption="Input dims that took several values across the compiles of one call site and program")
    else:
        table = note_html("No input dim varied between the compiles of one call site and program.")
    shown = (f" The {len(recompilations.points):,} longest of {recompilations.total:,} compiles are drawn."
             if len(recompilations.points) < recompilations.total else "")
    note = note_html(esc("Each compile is a point on its call site's row: size is compile time, colour is the reason. "
                     "Row labels: compiles · recompiles · total compile time." + shown))
    content = page.figure("recompilations", figures.plot_recompilations(recompilations)) + note + table
    return section_html("recompilations", content, findings_aside(data.analysis, "recompilations"))


def _values_text(values: Sequence[int], limit: int = 16) -> str:
    shown = ", ".join(str(value) for value in values[:limit])
    return shown + (f", … ({len(values)} values)" if len(values) > limit else "")


def _shapes_section(page: Page, data: ReportData) -> str:
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
    table = html_table(["op", "M×K×N", f"padded on {target.name}", "wasted", "calls", "recorded time", "module", "source"], rows,
                   numeric=[False, False, False, True, True, True, False, False],
                   caption="Matmul shapes by padded FLOPs × recorded time") if rows else ""
    tile_f32, tile_bf16 = target.tile("f32"), target.tile("bf16")
    note = note_html(esc(
        f"Matrix products of matmul, linear, convolution and attention ops (diamonds: ops that ran as CPU fallbacks), "
        f"by contracted dim K and output features N; size is recorded time, colour is the share of the padded FLOPs "
        f"that is padding on the target, {data.analysis.target_text}: M pads to the sublane tile "
        f"({tile_f32[0]} rows for 32-bit, {tile_bf16[0]} for 16-bit types), K and N to the {target.mxu}-wide MXU. "
        "The same rule as the padding diagnosis."
    ))
    content = page.figure("shapes", figures.plot_shapes(shapes)) + note + table
    return section_html("shapes", content, findings_aside(data.analysis, "shapes"))


def _roofline_section(page: Page, data: ReportData) -> str:
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
    note = note_html(esc(measured + estimated + skipped + " Size is total execution time."))
    return section_html("roofline", page.figure("roofline", figures.plot_roofline(roofline)) + note, findings_aside(data.analysis, "roofline"))


def fmt_si_text(value: float) -> str:
    return figures.fmt_si(value).strip()


def _collectives_section(page: Page, data: ReportData) -> str:
    collectives = data.collectives
    if not collectives.present:
        return section_html("collectives", note_html("This trace has no collectives (a single-process run)."),
                        findings_aside(data.analysis, "collectives"))
    shown = (f" The {len(collectives.points):,} longest of {collectives.total:,} collectives are drawn."
             if len(collectives.points) < collectives.total else "")
    ici = f" The dashed red line is the ICI bandwidth of {data.analysis.target_text}."
    content = (
        page.figure("collective-sizes", figures.plot_collective_sizes(collectives))
        + note_html(esc("Message size against time; dotted grey lines are constant bandwidths for reference." + ici + shown))
        + page.figure("collective-waits", figures.plot_collective_waits(collectives))
        + note_html("Time each rank waited for the last rank to arrive, per step: a bright row is a rank the others wait for.")
    )
    return section_html("collectives", content, findings_aside(data.analysis, "collectives"))


def _memory_section(page: Page, data: ReportData) -> str:
    memory = data.memory
    decimated = any(len(series.t_ns) < series.samples for series in memory.series)
    highest = max((peak.peak_bytes for peak in memory.peaks if memory_place(peak.chip) != "host"), default=0)
    share = (f" The highest peak, {fmt_bytes(highest)}, is {100 * highest / memory.target.hbm_bytes:.2g}% of the HBM "
             f"of {data.analysis.target_text} ({fmt_bytes(memory.target.hbm_bytes)})." if highest else "")
    host = (" The host's series are an imported capture's host memory, not a chip's HBM."
            if any(memory_place(series.chip) == "host" for series in memory.series) else "")
    note = note_html(esc(
        "Live bytes of tpu tensors per chip (solid) and the running peak (dashed); the star marks each chip's peak "
        "at the first sample that saw it (the peak itself may fall between samples)." + share + host
        + (" Long series keep the lowest and highest sample of each time bin." if decimated else "")
    ))
    content = page.figure("memory", figures.plot_memory(memory)) + note + memory_breakdown_content(page, data.memory_breakdown)
    return section_html("memory", content, findings_aside(data.analysis, "memory"))


def _sharding_section(page: Page, data: ReportData) -> str:
    if not data.sharding.present:
        return ""
    return section_html("sharding", sharding_content(page, data.sharding, data.analysis), findings_aside(data.analysis, "sharding"))


def render_report(data: ReportData, *, plotlyjs: PlotlyJsMode = "inline") -> str:
    """The report page for prepared data."""
    page = Page()
    body = "".join((
        _header(data),
        "<main>",
        findings_overview(data.analysis),
        _timeline_section(page, data),
        _steps_section(page, data),
        _where_section(page, data),
        _recompile_section(page, data),
        _shapes_section(page, data),
        _roofline_section(page, data),
        _collectives_section(page, data),
        _memory_section(page, data),
        _sharding_section(page, data),
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
        cells.append([esc(label), esc(show(old)), esc(show(new)), esc(format_change(old, new))])
    return html_table(["", "before", "after", "change"], cells, numeric=[False, True, True, True], narrow=True)


def render_comparison(data: ComparisonData, *, plotlyjs: PlotlyJsMode = "inline") -> str:
    """The before/after page for two prepared traces."""
    page = Page()
    sides = "".join(
        f"<tr><th>{esc(side.label)}</th><td>{esc(side.path)}</td><td>{esc(side.script or '?')}</td></tr>"
        for side in (data.before, data.after)
    )
    header = (
        '<header><h1>tputrace comparison</h1>'
        f'<table class="tp-facts">{sides}</table>'
        '<nav><a href="#changed">What changed</a><a href="#summary">Summary</a><a href="#steps">Step times</a><a href="#ops">Op time by op</a>'
        '<a href="#compiles">Compiles</a></nav></header>'
    )
    rank_note = note_html("Rank 0 of each trace. The change says how many times less or more the after run spent.")
    body = "".join((
        header,
        "<main>",
        f'<section id="changed" class="tp-section"><h2>What changed</h2>{diff_content(data.difference)}</section>',
        f'<section id="summary" class="tp-section"><h2>Summary</h2>{_compare_table(data)}{rank_note}</section>',
        f'<section id="steps" class="tp-section"><h2>Step times</h2>{page.figure("compare-steps", figures.plot_compare_steps(data))}</section>',
        f'<section id="ops" class="tp-section"><h2>Op time by op</h2>{page.figure("compare-ops", figures.plot_compare_ops(data))}'
        + note_html("The union of each run's most expensive ops, as recorded per op.") + "</section>",
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


def _batches(item: VaryingDim) -> str:
    """'made at data.py:12 (copied at train.py:30)', or 'copied at train.py:30' when the making line is unknown."""
    return f"made at {item.made_at} (copied at {item.copied_at})" if item.made_at else f"copied at {item.copied_at}"
