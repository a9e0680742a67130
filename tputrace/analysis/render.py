"""Rendering a `Report`: rich text on a terminal, plain text elsewhere, or JSON.

Both text renderers draw the same lines from `report_lines`, so they always show the same facts; rich
only adds colour. `brief=True` is the short form `tputrace run` prints at its end.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.derived.imported_sources import measured_on
from tputrace.wording import format_ns, plural, printable

if TYPE_CHECKING:
    from tputrace.analysis.report import Report

SEVERITY_STYLES = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


@dataclass(frozen=True)
class Line:
    """One line of output: its text, the indent, and a style name for rich (None: plain)."""

    text: str
    indent: int = 0
    style: str | None = None


def header_lines(report: Report, *, brief: bool = False) -> list[Line]:
    target = report.target
    choose = f"choose another with --target {'|'.join(_target_names())}"
    default = (
        f" (the default; {choose})" if report.target_is_default
        else f" (the capture's chip, {printable(report.target_from_capture)}; {choose})" if report.target_from_capture
        else ""
    )
    lines = []
    if not brief:
        lines.append(Line(f"tputrace report: {report.trace_path}", style="bold"))
    steps = (
        f"{plural(report.step_count, 'step')}, median step {format_ns(report.median_step_ns)} measured on "
        f"{measured_on(report.imported.device if report.imported else None)}"
        + (f" ({format_ns(report.projected_median_step_ns)} projected for {target.name})"
           if report.projected_median_step_ns is not None else "")
        if report.step_count else "no steps"
    )
    if report.rank not in report.ranks:
        rank = f"rank {report.rank} (a forked process), "
    else:
        rank = f"rank {report.rank} of {len(report.ranks)}, " if len(report.ranks) > 1 else ""
    if report.imported and report.imported.device != "tpu" and not report.programs_costed:
        lines.append(Line("target: none (the capture has no XLA costs to estimate a TPU's time from)"))
    else:
        lines.append(Line(f"target: {target.label}{default}"))
    if report.imported:
        lines += imported_lines(report)
    if not brief:
        lines.append(Line(f"run: {rank}{steps}, wall {format_ns(report.wall_ns)}"))
        if report.ending is not None:
            lines.append(Line(f"ended: {printable(report.ending)}"))
        if report.chip_pace is not None:
            lines.append(Line(f"pace: {report.chip_pace.text}"))
        if report.recording_window is not None:
            lines.append(Line(f"window: {report.recording_window.text}"))
        counts = report.counts()
        lines.append(Line(
            f"{plural(len(report.findings), 'finding')}: {counts['critical']} critical, "
            f"{plural(counts['warning'], 'warning')}, "
            f"{counts['info']} info. Costs are estimates computed from the trace, ranked highest first."
        ))
    return lines


def imported_lines(report: Report) -> list[Line]:
    """What the header says of an imported rank: its capture, where its times were measured, and the
    analyzers that could not run on it."""
    facts = report.imported
    assert facts is not None
    lines = [Line(f"imported: {facts.format} capture {facts.path}; times are measured on the capture's device "
                  f"({facts.device}), not estimated")]
    by_reason: dict[str, list[str]] = {}
    for name, why in facts.skipped.items():
        by_reason.setdefault(why, []).append(name)
    if by_reason:
        lines.append(Line("not run on this import: " + "; ".join(f"{', '.join(names)} ({why})"
                                                                 for why, names in by_reason.items()), style="dim"))
    return lines


def finding_lines(number: int, finding: Finding, *, brief: bool = False, device: str | None = None) -> list[Line]:
    """A finding's lines; `device` is where an imported capture's times were measured (None: this host)."""
    lines = [Line(f"{number}. [{finding.severity}] {finding.title}", style=SEVERITY_STYLES[finding.severity])]
    per_step = f", {format_ns(finding.cost_per_step_ns)} per step" if finding.cost_per_step_ns is not None else ""
    where = ""
    if finding.file:
        where = f" · at {finding.file}:{finding.line}"
    if finding.module:
        where += f" · module {finding.module}"
    basis = f"measured on {measured_on(device)}" if finding.cost_basis == MEASURED_ON_HOST else finding.cost_basis
    cost = f"cost ≈ {format_ns(finding.cost_total_ns)} in all{per_step} ({basis})" if finding.cost_total_ns else "no cost to this run"
    lines.append(Line(f"{cost}{where}", 3, "dim"))
    if not brief:
        lines.append(Line(finding.explanation, 3))
        for evidence in finding.evidence:
            location = f" ({os.path.basename(evidence.file)}:{evidence.line})" if evidence.file else ""
            lines.append(Line(f"- {evidence.text}{location}", 5, "dim"))
    lines.append(Line(f"→ {finding.suggestion}", 3, "green"))
    return lines


def report_lines(report: Report, *, top: int | None = None, brief: bool = False) -> list[Line]:
    lines = header_lines(report, brief=brief)
    findings = report.findings if top is None else report.findings[:top]
    if brief:
        lines.insert(0, Line(f"top findings ({len(findings)} of {len(report.findings)}; "
                             f"`tputrace report {report.trace_path}` shows all):", style="bold"))
    if not findings:
        lines.append(Line("no findings: nothing in this trace looks costly", style="green"))
    for number, finding in enumerate(findings, 1):
        if not brief:
            lines.append(Line(""))
        lines.extend(finding_lines(number, finding, brief=brief, device=report.imported.device if report.imported else None))
    if top is not None and len(report.findings) > top and not brief:
        lines.append(Line(""))
        lines.append(Line(f"... {len(report.findings) - top} more findings (use --top to show more)", style="dim"))
    return lines


def render_text(report: Report, *, top: int | None = None, brief: bool = False) -> str:
    """The report as plain text."""
    return "\n".join(" " * line.indent + line.text for line in report_lines(report, top=top, brief=brief)) + "\n"


def render_json(report: Report) -> str:
    """The report as JSON; a number that is not finite (from a damaged trace's `inf`) is null, as JSON has no
    infinity."""
    return json.dumps(_finite(report.to_dict()), indent=2, default=str, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite, at any depth of dicts and lists, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def print_report(report: Report, file: TextIO | None = None, *, top: int | None = None, brief: bool = False,
                 color: bool | None = None) -> None:
    """Print the report: rich on a terminal (or with `color=True`), plain text otherwise."""
    stream = file if file is not None else sys.stdout
    use_rich = color if color is not None else _is_terminal(stream)
    if not use_rich:
        stream.write(printable(render_text(report, top=top, brief=brief)))
        return
    from rich.console import Console
    from rich.padding import Padding
    from rich.text import Text

    console = Console(file=stream, highlight=False, force_terminal=True if color else None, soft_wrap=False)
    for line in report_lines(report, top=top, brief=brief):
        text = Text(printable(line.text), style=line.style or "")
        console.print(Padding(text, (0, 0, 0, line.indent)) if line.indent else text)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _target_names() -> list[str]:
    from tputrace.analysis.chips import CHIPS

    return list(CHIPS)
