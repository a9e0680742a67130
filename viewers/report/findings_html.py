"""The findings of the report: each section's aside, and the overview of the most expensive ones.
Every string from an analysis is escaped (`esc`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tputrace.analysis.findings import AnalysisResult, Finding
from tputrace.viewers.report.analysis_data import AnalysisData, section_of
from tputrace.viewers.report.figure_style import esc, fmt_ns
from tputrace.viewers.report.page import MAX_TABLE_ROWS, SECTION_TITLES, html_table

MAX_EVIDENCE = 5
FINDINGS_SHOWN = 3  # per section; the rest are folded



def _cost_estimate(finding: Finding, basis: str) -> str:
    return f"≈ {fmt_ns(finding.cost_total_ns)} ({basis})" if finding.cost_total_ns else "no cost to this run"


def finding_html(finding: Finding, cost_basis: str | None = None) -> str:
    """One finding, folded below its title and cost; `cost_basis` says how its cost was found (None: the finding's
    own `cost_basis`; an imported capture's measured costs name its device instead of this host)."""
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
        f'<div class="tp-cost">{esc(cost)} ({esc(cost_basis or finding.cost_basis)}){" · " + " · ".join(where) if where else ""}</div>'
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
                parts.append(html_table(headers, rows, caption=caption))
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


def findings_aside(analysis: AnalysisData, section: str) -> str:
    findings = analysis.findings_for(section)
    tables = _analysis_tables(analysis.results_for(section))
    if not analysis.available:
        return f'<h3>Findings</h3><p class="tp-muted">{esc(analysis.note)}.</p>'
    if not findings and not tables:
        return '<h3>Findings</h3><p class="tp-muted">No finding for this part of the run.</p>'
    shown = "".join(finding_html(finding, analysis.cost_basis(finding)) for finding in findings[:FINDINGS_SHOWN])
    rest = findings[FINDINGS_SHOWN:]
    if rest:
        shown += (f"<details><summary>{len(rest)} more findings here</summary>"
                  + "".join(finding_html(finding, analysis.cost_basis(finding)) for finding in rest) + "</details>")
    return f"<h3>Findings ({len(findings)})</h3>" + shown + tables


def findings_overview(analysis: AnalysisData) -> str:
    if not analysis.available:
        return f'<section id="findings" class="tp-section"><h2>Findings</h2><p class="tp-muted">{esc(analysis.note)}.</p></section>'
    if not analysis.findings:
        return '<section id="findings" class="tp-section"><h2>Findings</h2><p>The diagnoses found nothing to fix.</p></section>'
    items = []
    for finding in analysis.findings[:10]:
        section = section_of(finding.analyzer)
        items.append(
            f'<li class="tp-{esc(finding.severity)}"><span class="tp-badge">{esc(finding.severity)}</span> '
            f'<a href="#{section}">{esc(finding.title)}</a> '
            f'<span class="tp-muted">{esc(_cost_estimate(finding, analysis.cost_basis(finding)))} · {esc(SECTION_TITLES[section])}</span></li>'
        )
    target = f" Target: {esc(analysis.target_text)}."
    return (
        '<section id="findings" class="tp-section"><h2>Findings, most expensive first</h2>'
        f'<ol class="tp-overview">{"".join(items)}</ol>'
        f'<p class="tp-muted">{len(analysis.findings)} findings.{target} Costs are estimates computed from the trace.</p></section>'
    )

