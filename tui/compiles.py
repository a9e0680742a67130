"""Compiles: every compile in time order with its reason and what changed (old -> new signature),
and compiles per call site."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from tputrace.tui import queries
from tputrace.tui.actions import bindings
from tputrace.tui.render import START_LABEL, fmt_count, fmt_ns, right, source_text
from tputrace.tui.view import GoToSource, TraceView
from tputrace.tui.widgets import Row, StatusLine, TraceTable
from tputrace.wording import plural

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

    from tputrace.store.aggregates import CompileStats
    from tputrace.store.records import SourceLocation

PAGE = 100
UNCHECKED_COLUMNS = "call column not checked: the trace stored it in bytes and the file is not the one the run saw"


class CompilesView(TraceView):
    VIEW_ID = "compiles"
    BINDINGS: ClassVar[list[BindingType]] = bindings("compiles")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compiles: list[queries.CompileRow] = []
        self.sites: list[queries.CompileSite] = []

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="compiles-status", classes="status")
        yield TraceTable(("#", "id"), ("step", "step"), (START_LABEL, "start"), ("compile time", "dur"), ("kind", "kind"),
                         ("reason", "reason"), ("what", "name"), ("what changed", "diff"), page_size=PAGE,
                         optional=("start", "kind"), id="compiles-table")
        with VerticalScroll(id="compiles-detail-scroll"):
            yield Static(Text(""), id="compiles-detail")
        yield Static(Text("Per call site", style="bold"), classes="heading")
        yield TraceTable(("call site", "source"), ("compiles", "count"), ("recompiles", "recompiles"), ("compile time", "total"),
                         ("reasons", "reasons"), id="compiles-sites")

    def primary(self) -> Widget | None:
        return self.query_one("#compiles-table")

    def load(self) -> None:
        rank = self.session.rank
        self.request("main", lambda trace: (trace.compile_stats(rank=rank), queries.compile_rows(trace, rank, limit=PAGE),
                                            queries.compile_sites(trace, rank)))

    def apply(self, slot: str, payload: Any) -> None:
        table = self.query_one("#compiles-table", TraceTable)
        if slot == "main":
            stats, compiles, sites = payload
            self.compiles, self.sites = list(compiles), sites
            table.show(self._rows(0, compiles), more=len(compiles) == PAGE)
            self._show_status(stats)
            self.query_one("#compiles-sites", TraceTable).show([
                (str(index), (Text(site_text(site)), right(fmt_count(site.count)),
                              right(fmt_count(site.recompiles)), right(fmt_ns(site.total_ns)), Text(site.reasons)))
                for index, site in enumerate(sites)
            ])
            if compiles:
                self._show_detail(compiles[0])
            else:
                self.query_one("#compiles-detail", Static).update(Text("no compiles recorded"))
        else:
            offset, compiles = payload
            self.compiles.extend(compiles)
            table.extend(self._rows(offset, compiles), more=len(compiles) == PAGE)

    def _rows(self, offset: int, compiles: list[queries.CompileRow]) -> list[Row]:
        return [
            (str(offset + index), (right(str(row.id)), right(str(row.step)), right(fmt_ns(row.start_ns)), right(fmt_ns(row.dur_ns)),
                                   Text(row.kind), Text(row.reason, style="" if row.reason == "first" else "bold"),
                                   Text(row.name), Text(change_text(row))))
            for index, row in enumerate(compiles)
        ]

    def _show_status(self, stats: CompileStats) -> None:
        self.say("compiles-status",
                 f"{plural(stats.count, 'compile')}, {fmt_ns(stats.total_ns)} compile time · {plural(stats.recompiles, 'recompile')}, "
                 f"{fmt_ns(stats.recompile_ns)} · {plural(stats.programs, 'program')}",
                 ("  Enter: call site in Source · Tab: per call site", "dim"))

    def _show_detail(self, row: queries.CompileRow) -> None:
        self.query_one("#compiles-detail", Static).update(compile_detail(row))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "compiles-table" and event.row_key.value is not None:
            index = int(event.row_key.value)
            if index < len(self.compiles):
                self._show_detail(self.compiles[index])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_go_to_source()

    def on_trace_table_need_more(self, event: TraceTable.NeedMore) -> None:
        offset, rank = len(self.compiles), self.session.rank
        self.request("detail", lambda trace: (offset, queries.compile_rows(trace, rank, offset=offset, limit=PAGE)))

    def action_go_to_source(self) -> None:
        source: SourceLocation | None = None
        focused = self.app.focused
        if focused is not None and focused.id == "compiles-sites":
            key = self.query_one("#compiles-sites", TraceTable).current_key()
            source = None if key is None else self.sites[int(key)].source
        else:
            key = self.query_one("#compiles-table", TraceTable).current_key()
            source = None if key is None else self.compiles[int(key)].source
        if source is None:
            self.notify("no recorded call site", markup=False)
            return
        self.post_message(GoToSource(source.file, source.line))


def site_text(site: queries.CompileSite) -> str:
    """`train.py:42 (step)`, and the call on the line (`· col 15 (q @ w)`) when several calls on it compiled."""
    if site.source is None:
        return "(no source)"
    return source_text(site.source) if site.call is None else f"{source_text(site.source)} · {site.call}"


def change_text(row: queries.CompileRow) -> str:
    """What changed for a recompile: the recorded difference, or old -> new signature."""
    if row.diff:
        return row.diff
    if row.old_signature and row.old_signature != row.signature:
        return f"{row.old_signature} -> {row.signature}"
    return "" if row.reason == "first" else "(no difference recorded)"


def compile_detail(row: queries.CompileRow) -> Text:
    text = Text()
    text.append(f"compile {row.id}: ", style="bold")
    text.append(row.name)
    text.append(f"  {row.kind} · {row.reason} · {fmt_ns(row.dur_ns)} · step {row.step}", style="dim")
    if row.source is not None:
        text.append("\ncall site: ", style="bold")
        text.append(str(row.source))
        if row.call is not None:  # which call on the line, named as the compile sites name it
            text.append(f" · {row.call}")
        elif row.source.columns_unchecked:
            text.append(f" · {UNCHECKED_COLUMNS}", style="dim")
    text.append("\nold: ", style="bold")
    if row.old_id is None:
        text.append("(none: the first compile of this structure and call site)")
    else:
        relation = "same structure" if row.old_relation == "structure" else "previous compile at this call site; the structure changed"
        text.append(f"compile {row.old_id} ", style="dim")
        text.append(row.old_name or "?", style="dim")
        text.append(f" ({relation}): ", style="dim")
        text.append(row.old_signature or "?")
    text.append("\nnew: ", style="bold")
    text.append(row.signature or "?")
    if row.diff:
        text.append("\nchanged: ", style="bold")
        text.append(row.diff)
    if row.detail:
        text.append("\ndetail: ", style="bold")
        text.append(", ".join(f"{key} {fmt_ns(value) if key.endswith('_ns') and isinstance(value, (int, float)) else json.dumps(value)}"
                              for key, value in row.detail.items()))
    return text
