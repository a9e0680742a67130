"""Findings: the analysis's ranked diagnoses; the highlighted one's explanation, evidence and suggestion.

Highlighting a finding also moves the Source view to its line; Enter shows that line.
When this build has no analysis, the view says so instead of showing anything made up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from tputrace.tui import queries
from tputrace.tui.actions import bindings
from tputrace.tui.render import fmt_ns, right
from tputrace.tui.view import GoToSource, TraceView
from tputrace.tui.overview import severity_style
from tputrace.tui.widgets import StatusLine, TraceTable

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

    from tputrace.analysis.findings import Finding


class FindingsView(TraceView):
    VIEW_ID = "findings"
    BINDINGS: ClassVar[list[BindingType]] = bindings("findings")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.findings: tuple[Finding, ...] = ()

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("analysing…"), id="findings-status", classes="status")
        with Horizontal(id="findings-body"):
            yield TraceTable(("#", "rank"), ("severity", "severity"), ("cost", "cost"), ("per step", "per_step"),
                             ("finding", "title"), id="findings-table")
            with VerticalScroll(id="findings-detail-scroll"):
                yield Static(Text(""), id="findings-detail")

    def primary(self) -> Widget | None:
        return self.query_one("#findings-table")

    def load(self) -> None:
        session, rank = self.session, self.session.rank
        self.request("main", lambda trace: session.findings(rank))

    def apply(self, slot: str, payload: queries.FindingsResult) -> None:
        table = self.query_one("#findings-table", TraceTable)
        if payload.unavailable:
            self.findings = ()
            table.show([])
            self.say("findings-status", (payload.unavailable, "bold"))
            self.query_one("#findings-detail", Static).update(
                Text("Nothing is diagnosed in this view until the analysis is available; the other views show the trace itself.")
            )
            return
        self.findings = payload.findings
        self.say("findings-status", f"{len(self.findings)} findings, most costly first · Enter shows the line in Source")
        table.show([
            (str(index), (right(str(index + 1)), Text(finding.severity, style=severity_style(finding.severity)),
                          right(fmt_ns(finding.cost_total_ns)), right(fmt_ns(finding.cost_per_step_ns)), Text(finding.title)))
            for index, finding in enumerate(self.findings)
        ])
        if not self.findings:
            self.query_one("#findings-detail", Static).update(Text("The analysis found nothing to fix."))
        else:
            self._show_detail(0)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None and self.findings:
            self._show_detail(int(event.row_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_go_to_source()

    def _current(self) -> Finding | None:
        key = self.query_one("#findings-table", TraceTable).current_key()
        return None if key is None or not self.findings else self.findings[int(key)]

    def _show_detail(self, index: int) -> None:
        finding = self.findings[index]
        self.query_one("#findings-detail", Static).update(finding_detail(finding))
        location = queries.finding_location(finding)
        if location is not None:
            self.post_message(GoToSource(location[0], location[1], switch=False))

    def action_go_to_source(self) -> None:
        finding = self._current()
        location = None if finding is None else queries.finding_location(finding)
        if location is None:
            self.notify("this finding has no source line", markup=False)
            return
        self.post_message(GoToSource(location[0], location[1], switch=True))


def finding_detail(finding: Finding) -> Text:
    """A finding's title, cost, where, explanation, evidence and suggestion, as plain text."""
    text = Text()
    text.append(finding.title, style="bold")
    text.append(f"\n{finding.severity} · {finding.analyzer} · costs ~{fmt_ns(finding.cost_total_ns)}", style=severity_style(finding.severity))
    if finding.cost_per_step_ns is not None:
        text.append(f" (~{fmt_ns(finding.cost_per_step_ns)} per step)", style=severity_style(finding.severity))
    location = queries.finding_location(finding)
    if location is not None or finding.module:
        text.append("\nwhere: ", style="bold")
        text.append(" · ".join(part for part in (f"{location[0]}:{location[1]}" if location else None, finding.module) if part))
    text.append("\n\nWhy\n", style="bold")
    text.append(finding.explanation)
    if finding.evidence:
        text.append("\n\nEvidence\n", style="bold")
        for evidence in finding.evidence:
            text.append("• ")
            text.append(evidence.text)
            where = f"{evidence.file}:{evidence.line}" if evidence.file and evidence.line else evidence.module
            if where:
                text.append(f"  ({where})", style="dim")
            text.append("\n")
        text.rstrip()
    text.append("\n\nSuggestion\n", style="bold")
    text.append(finding.suggestion)
    return text
