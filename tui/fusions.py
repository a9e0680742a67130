"""Fusions: DeferAndFuse flushes (trigger, size, cache hit), the ops inside the highlighted one and
the XLA fusions of its program."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.table import Table
from rich.text import Text
from textual import events
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import DataTable, Static

from tputrace.tui import queries
from tputrace.tui.actions import bindings
from tputrace.tui.render import START_LABEL, fmt_bytes, fmt_count, fmt_ns, fmt_share, right
from tputrace.tui.view import GoToSource, TraceView
from tputrace.tui.widgets import Row, StatusLine, TraceTable
from tputrace.wording import plural

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

PAGE = 100
FLUSH_TIME_LABEL = "host time"
"""A flush's time: the host's, from the flush's start to its program's launch (tracing, and compiling on a cache miss)."""
SIDE_BY_SIDE_WIDTH = 140
"""From this width on, the flush's ops and its program's fusions are side by side; narrower, one above the other
(side by side, each would be too narrow, and the left one's scrollbar would sit mid-view)."""


class FusionsView(TraceView):
    VIEW_ID = "fusions"
    BINDINGS: ClassVar[list[BindingType]] = bindings("fusions")

    order: reactive[queries.FlushOrder] = reactive("time", init=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flushes: list[queries.FlushRow] = []
        self._shown_flush: int | None = None

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="fusions-status", classes="status")
        yield Static(Text(""), id="fusions-triggers")
        yield TraceTable(("#", "id"), ("step", "step"), (START_LABEL, "start"), (FLUSH_TIME_LABEL, "dur"), ("trigger", "trigger"),
                         ("ops", "ops"), ("cache", "cache"), ("in", "in"), ("out", "out"), ("program", "program"),
                         ("line", "source"), page_size=PAGE, optional=("out", "in", "start"), id="fusions-flushes")
        with Horizontal(id="fusions-inside"):
            with Vertical(id="fusions-ops-pane"):
                yield Static(Text("Ops in the flush", style="bold"), id="fusions-ops-title", classes="heading")
                yield TraceTable(("#", "seq"), ("op", "op"), ("inputs", "inputs"), ("source", "source"), id="fusions-ops")
            with Vertical():
                yield Static(Text("XLA fusions in its program", style="bold"), classes="heading")
                yield TraceTable(("fusion", "name"), ("kind", "kind"), ("from ATen ops", "aten"), ("HLO ops", "hlo"), id="fusions-xla")

    def primary(self) -> Widget | None:
        return self.query_one("#fusions-flushes")

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < SIDE_BY_SIDE_WIDTH, "-stacked")

    def load(self) -> None:
        rank, order = self.session.rank, self.order
        self.request("main", lambda trace: (queries.flush_triggers(trace, rank), queries.flush_rows(trace, rank, order=order, limit=PAGE)))

    def watch_order(self) -> None:
        self.load()

    def action_next_order(self) -> None:
        self.order = "duration" if self.order == "time" else "time"

    def apply(self, slot: str, payload: Any) -> None:
        flushes_table = self.query_one("#fusions-flushes", TraceTable)
        if slot == "main":
            triggers, flushes = payload
            self.flushes = list(flushes)
            self._shown_flush = None
            self._show_triggers(triggers)
            flushes_table.show(self._rows(0, flushes), more=len(flushes) == PAGE)
            if flushes:
                self._request_contents(flushes[0])
            else:
                self.query_one("#fusions-ops", TraceTable).show([])
                self.query_one("#fusions-xla", TraceTable).show([])
        elif slot == "more":
            offset, flushes = payload
            self.flushes.extend(flushes)
            flushes_table.extend(self._rows(offset, flushes), more=len(flushes) == PAGE)
        else:
            self._show_contents(payload)

    def _rows(self, offset: int, flushes: list[queries.FlushRow]) -> list[Row]:
        return [
            (str(offset + index), (right(str(row.id)), right(str(row.step)), right(fmt_ns(row.start_ns)), right(fmt_ns(row.dur_ns)),
                                   Text(row.trigger), right(fmt_count(row.n_ops)), Text("hit" if row.cache_hit else "miss", style="" if row.cache_hit else "bold"),
                                   right(fmt_bytes(row.input_bytes)), right(fmt_bytes(row.output_bytes)), Text(row.program or ""),
                                   Text(row.source.short if row.source else "")))
            for index, row in enumerate(flushes)
        ]

    def _show_triggers(self, triggers: list[queries.TriggerStat]) -> None:
        total = sum(stat.count for stat in triggers)
        hits = sum(stat.cache_hits for stat in triggers)
        if not total:
            capture = self.session.imported_format
            self.say("fusions-status", f"no flushes: they are the tpu backend's DeferAndFuse programs, which a {capture} capture"
                                       " does not have" if capture else "no flushes recorded (a strict-mode or compile-mode run has none)")
            self.query_one("#fusions-triggers", Static).update(Text(""))
            return
        self.say("fusions-status", f"{plural(total, 'flush', 'flushes')} · program cache hits {fmt_count(hits)} of {fmt_count(total)} "
                                   f"({fmt_share(hits / total)}) · {FLUSH_TIME_LABEL}: from a flush's start to its program's launch · sorted by {self.order}",
                 ("  s sort · Enter: the trigger's line in Source", "dim"))
        table = Table(box=None, padding=(0, 2), show_edge=False, header_style="bold")
        for column, justify in (("trigger", "left"), ("flushes", "right"), (FLUSH_TIME_LABEL, "right"), ("ops", "right"), ("mean ops", "right"), ("cache hits", "right")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for stat in triggers:
            table.add_row(Text(stat.trigger), Text(fmt_count(stat.count)), Text(fmt_ns(stat.total_ns)), Text(fmt_count(stat.ops)),
                          Text(f"{stat.ops / stat.count:.1f}" if stat.count else "-"), Text(fmt_share(stat.cache_hits / stat.count) if stat.count else "-"))
        self.query_one("#fusions-triggers", Static).update(table)

    def _request_contents(self, flush: queries.FlushRow) -> None:
        if self._shown_flush == flush.id:
            return
        self._shown_flush = flush.id
        rank = self.session.rank
        self.request("detail", lambda trace: queries.flush_contents(trace, flush.id, flush.program_id, rank))

    def _show_contents(self, contents: queries.FlushContents) -> None:
        ops_rows: list[Row] = [
            (str(index), (right(str(seq)), Text(op), Text(inputs), Text(source.short if source else "")))
            for index, (seq, op, inputs, source) in enumerate(contents.ops)
        ]
        title = f"Ops in flush {contents.flush_id}" + (f" (first {len(contents.ops)}; {fmt_count(contents.more_ops)} more)" if contents.more_ops else "")
        self.query_one("#fusions-ops-title", Static).update(Text(title, style="bold"))
        self.query_one("#fusions-ops", TraceTable).show(ops_rows)
        self.query_one("#fusions-xla", TraceTable).show([
            (str(index), (Text(fusion.name), Text(fusion.kind), Text(fusion.aten_ops), Text(fusion.hlo_ops)))
            for index, fusion in enumerate(contents.fusions)
        ])

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "fusions-flushes" and event.row_key.value is not None:
            index = int(event.row_key.value)
            if index < len(self.flushes):
                self._request_contents(self.flushes[index])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "fusions-flushes":
            self.action_go_to_source()

    def on_trace_table_need_more(self, event: TraceTable.NeedMore) -> None:
        if event.table.id != "fusions-flushes":
            return
        offset, rank, order = len(self.flushes), self.session.rank, self.order
        self.request("more", lambda trace: (offset, queries.flush_rows(trace, rank, order=order, offset=offset, limit=PAGE)))

    def action_go_to_source(self) -> None:
        key = self.query_one("#fusions-flushes", TraceTable).current_key()
        flush = None if key is None else self.flushes[int(key)]
        if flush is None or flush.source is None:
            self.notify("no recorded trigger line", markup=False)
            return
        self.post_message(GoToSource(flush.source.file, flush.source.line))
