"""Compare: how the trace on show differs from a baseline run (`tputrace tui AFTER --compare BEFORE`), as
`tputrace diff` says it: the headline, each figure before and after, recompiles, findings and programs new,
fixed or changed, and the lines and modules whose op time changed most. Enter on a row with a line shows it
in the Source view."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import DataTable, Static

from tputrace.compare.diff import RunDiff, improvements
from tputrace.tui import queries
from tputrace.tui.render import fmt_ns, right
from tputrace.tui.view import GoToSource, TraceView
from tputrace.tui.widgets import StatusLine, TraceTable

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

NO_BASELINE = "no run to compare with: open the trace with `tputrace tui TRACE --compare BASELINE`"


class CompareView(TraceView):
    VIEW_ID = "compare"
    _difference: RunDiff | None = None
    _sites: list[str | None]

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="compare-status", classes="status")
        yield Static(Text(""), id="compare-improved")
        yield TraceTable(("figure", "figure"), ("before -> after", "change"), ("", "worse"), id="compare-figures")
        yield Static(Text("New, fixed and changed", style="bold"), classes="heading")
        yield TraceTable(("status", "status"), ("what", "what"), ("where", "where"), ("detail", "detail"), id="compare-events")
        yield Static(Text("Op time that changed most (host dispatch, excl. flushes/compiles)", style="bold"), classes="heading")
        yield TraceTable(("by", "by"), ("line or module", "label"), ("before", "before"), ("after", "after"), id="compare-ops")

    def primary(self) -> Widget | None:
        return self.query_one("#compare-events")

    def load(self) -> None:
        baseline = self.session.baseline_path
        if baseline is None:
            self.say("compare-status", NO_BASELINE)
            return
        rank = self.session.rank
        self.request("main", lambda trace: queries.comparison(trace, baseline, rank))

    def apply(self, slot: str, payload: Any) -> None:
        difference: RunDiff = payload
        self._difference = difference
        self.query_one("#compare-figures", TraceTable).show([
            (str(index), (Text(change.name), Text(change.text, style="dim" if change.not_recorded else ""),
                           Text("worse", style="bold") if change.worse else Text("")))
            for index, change in enumerate(difference.figures)
        ])
        rows = difference.events()
        self._sites = [site for _, _, site, _ in rows]
        self.query_one("#compare-events", TraceTable).show([
            (str(index), (Text(status), Text(what), Text(site or "–"), Text(detail)))
            for index, (status, what, site, detail) in enumerate(rows)
        ])
        self.query_one("#compare-ops", TraceTable).show([
            (str(index), (Text(change.by), Text(change.label), right(fmt_ns(change.before_ns)), right(fmt_ns(change.after_ns))))
            for index, change in enumerate(difference.op_time)
        ])
        style = "bold red" if difference.regressed else "bold green"
        self.say("compare-status", (difference.headline, style), f" · before: {difference.before.path}")
        said = [text for text in (improvements(difference), difference.note and f"note: {difference.note}") if text]
        self.query_one("#compare-improved", Static).update(Text("\n".join(said)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "compare-events" or event.row_key.value is None:
            return
        site = self._sites[int(event.row_key.value)]
        file, _, line = (site or "").rpartition(":")
        if not file or not line.isdigit():
            self.notify("no line for this row", markup=False)
            return
        self.post_message(GoToSource(file, int(line)))
