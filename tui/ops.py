"""Ops: op time aggregated by op, op + input shapes, source line or module path; sort, filter, drill down.

Groups are aggregated in SQL once per grouping (the session keeps them; the next grouping is
aggregated ahead in the background), filtered and sorted here; the table adds them a page at a time. Instances of a group are fetched a page at a time, longest first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.reactive import reactive
from textual.widgets import DataTable, Input

from tputrace.analysis.target import DEFAULT_TARGET
from tputrace.derived.op_ranking import CHIP_SHARE_LABEL, HOST_DISPATCH_LABEL, NOT_PROJECTED
from tputrace.derived.op_time import DEVICE_OP_TIME, OpTimeKind
from tputrace.tui import queries
from tputrace.tui.actions import bindings
from tputrace.tui.render import START_LABEL, fmt_count, fmt_ns, fmt_share, right, share_bar, source_text
from tputrace.tui.view import GoToSource, TraceView, palette_for
from tputrace.tui.widgets import Row, StatusLine, TraceTable
from tputrace.wording import plural

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.timer import Timer
    from textual.widget import Widget

INSTANCE_PAGE = 100
BAR_WIDTH = 8
FILTER_DELAY_S = 0.3
GROUP_COLUMNS = (("count", "count"), ("host dispatch", "total"), ("mean dispatch", "mean"), ("share", "share"), ("", "bar"))
RANKED_COLUMNS = (("calls", "count"), ("host dispatch", "total"), ("mean dispatch", "mean"), ("share", "share"),
                  (CHIP_SHARE_LABEL, "chip"), ("", "bar"))
"""Grouped by op: the status line gives the columns' full labels (`HOST_DISPATCH_LABEL`, `CHIP_SHARE_LABEL`)."""
INSTANCE_COLUMNS = (("#", "seq"), ("step", "step"), (START_LABEL, "start"), ("host dispatch", "dur"), ("inputs", "inputs"),
                    ("outputs", "outputs"), ("module", "module"), ("source", "source"))
DEVICE_TIME_HEADERS = {"host dispatch": DEVICE_OP_TIME, "mean dispatch": "mean time"}
"""An XProf import's ops: their times are the device's, not host dispatch."""


def columns_for(columns: tuple[tuple[str, str], ...], op_time: OpTimeKind) -> tuple[tuple[str, str], ...]:
    """`columns` headed for `op_time`'s kind of op time, without the chip time share where none is told."""
    return tuple((DEVICE_TIME_HEADERS.get(header, header) if op_time.device_ops else header, key)
                 for header, key in columns if key != "chip" or op_time.chip_share)


class OpsView(TraceView):
    VIEW_ID = "ops"
    BINDINGS: ClassVar[list[BindingType]] = bindings("ops")

    grouping: reactive[queries.OpGrouping] = reactive("op", init=False)
    order: reactive[queries.GroupOrder] = reactive("total", init=False)
    drilled: reactive[bool] = reactive(False, init=False)
    filtering: reactive[bool] = reactive(False, init=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text_filter = ""
        self._filter_timer: Timer | None = None
        self.groups: list[queries.OpGroup] = []
        self.sorted_groups: list[queries.OpGroup] = []
        self.group: queries.OpGroup | None = None
        self.instances: list[queries.OpInstance] = []
        self.op_time = OpTimeKind(device_ops=False, chip_share=True)

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="ops-status", classes="status")
        yield Input(placeholder="filter (literal text; Enter keeps it, Escape clears it)", id="ops-filter")
        yield TraceTable(("op", "label"), *GROUP_COLUMNS, optional=("bar", "mean"), id="ops-groups")
        yield TraceTable(*INSTANCE_COLUMNS, page_size=INSTANCE_PAGE, optional=("outputs", "module", "start"), id="ops-instances")

    def primary(self) -> Widget | None:
        return self.query_one("#ops-instances" if self.drilled else "#ops-groups")

    # -- loading ----------------------------------------------------------------------------------

    def load(self) -> None:
        self.drilled = False
        grouping, rank, text, session = self.grouping, self.session.rank, self.text_filter, self.session
        self.request("main", lambda trace: (session.op_groups(rank, grouping, text), session.op_time(rank)))
        self._status("loading…")

    def apply(self, slot: str, payload: Any) -> None:
        if slot == "main":
            groups, self.op_time = payload
            # Programs without recorded ops have a row only for their chip time share.
            self.groups = [group for group in groups if group.count or self.op_time.chip_share]
            self._show_groups()
            self._prefetch_next_grouping()
        else:
            offset, instances = payload
            self._show_instances(offset, instances)

    def _prefetch_next_grouping(self) -> None:
        """Aggregate the grouping `g` shows next in the background, so that the key press finds it ready
        (a press before it is done waits for this same aggregation instead of starting another)."""
        groupings = queries.OP_GROUPINGS
        following = groupings[(groupings.index(self.grouping) + 1) % len(groupings)]
        session, rank = self.session, self.session.rank
        self.prefetch(following, lambda: session.op_groups(rank, following))

    def _show_groups(self) -> None:
        palette = palette_for(self.app)
        self.sorted_groups = queries.sort_groups(self.groups, self.order)
        ranked = self.grouping == "op"
        rows: list[Row] = [
            (str(index), (Text(group.label), right(fmt_count(group.count)), right(fmt_ns(group.total_ns)),
                          right(fmt_ns(group.mean_ns)), right(fmt_share(group.share)),
                          *((right(fmt_share(group.chip_share) if group.chip_share is not None else NOT_PROJECTED),) if ranked and self.op_time.chip_share else ()),
                          share_bar(group.share, BAR_WIDTH, palette.bar)))
            for index, group in enumerate(self.sorted_groups)
        ]
        label = queries.OP_GROUPING_LABELS[self.grouping]
        columns = columns_for(RANKED_COLUMNS if ranked else GROUP_COLUMNS, self.op_time)
        self.query_one("#ops-groups", TraceTable).show(rows, columns=((label, "label"), *columns))
        self._status()

    def restyle(self) -> None:
        if self.groups:
            self._show_groups()

    def _show_instances(self, offset: int, instances: list[queries.OpInstance]) -> None:
        table = self.query_one("#ops-instances", TraceTable)
        rows: list[Row] = [
            (str(offset + index), (right(str(op.seq)), right(str(op.step)), right(fmt_ns(op.start_ns)), right(fmt_ns(op.dur_ns)),
                                   Text(op.inputs), Text(op.outputs), Text(op.module or ""), Text(source_text(op.source) if op.source else "")))
            for index, op in enumerate(instances)
        ]
        more = len(instances) == INSTANCE_PAGE
        if offset == 0:
            self.instances = list(instances)
            table.show(rows, more=more, columns=columns_for(INSTANCE_COLUMNS, self.op_time))
        else:
            self.instances.extend(instances)
            table.extend(rows, more=more)
        self._status()

    def _status(self, note: str = "") -> None:
        parts: list[str | tuple[str, str]] = []
        if self.drilled and self.group is not None:
            parts += [("instances of ", "dim"), (self.group.label, "bold"),
                      (f" · {plural(self.group.count, 'op')}, {fmt_ns(self.group.total_ns)} {self.op_time.label} · longest first · "
                       "Enter: source line · Escape: back", "dim")]
        else:
            parts += [(f"by {queries.OP_GROUPING_LABELS[self.grouping]} · sorted by {self.order}", "")]
            ranked = self.grouping == "op"
            label = self.op_time.label if self.op_time.device_ops else HOST_DISPATCH_LABEL
            chip_share = f" · {CHIP_SHARE_LABEL}, projected for {DEFAULT_TARGET}" if ranked and self.op_time.chip_share else ""
            parts += [(f" · {label}, measured on {self.session.measured_on}{chip_share}", "dim")]
            if self.text_filter:
                parts += [(" · filter ", ""), (self.text_filter, "bold")]
            parts += [(f" · {plural(len(self.groups), 'group')}", "")]
            if len(self.groups) >= queries.MAX_GROUPS:
                parts += [(" (capped; filter to narrow)", "bold")]
            parts += [("  g group · s sort · / filter · Enter instances", "dim")]
        if note:
            parts = [(note, "italic"), ("  ", ""), *parts]
        self.query_one("#ops-status", StatusLine).say(*parts)

    # -- reactives --------------------------------------------------------------------------------

    def watch_grouping(self) -> None:
        self.load()

    def watch_order(self) -> None:
        if self.groups:
            self._show_groups()

    def watch_drilled(self, drilled: bool) -> None:
        self.set_class(drilled, "-drilled")
        primary = self.primary()
        if primary is not None:
            primary.focus()

    def watch_filtering(self, filtering: bool) -> None:
        self.set_class(filtering or bool(self.text_filter), "-filtering")
        if filtering:
            self.query_one("#ops-filter", Input).focus()

    # -- actions ----------------------------------------------------------------------------------

    def action_next_grouping(self) -> None:
        self.grouping = queries.OP_GROUPINGS[(queries.OP_GROUPINGS.index(self.grouping) + 1) % len(queries.OP_GROUPINGS)]

    def action_next_order(self) -> None:
        if not self.drilled:
            self.order = queries.GROUP_ORDERS[(queries.GROUP_ORDERS.index(self.order) + 1) % len(queries.GROUP_ORDERS)]

    def action_filter(self) -> None:
        if self.drilled:
            self.drilled = False
        self.filtering = True

    def action_back(self) -> None:
        if self.filtering or (self.text_filter and not self.drilled):
            self.query_one("#ops-filter", Input).value = ""
            self._set_filter("")
            self.filtering = False
            self.set_class(False, "-filtering")  # the watcher does not run when filtering was already False
            self.query_one("#ops-groups").focus()
        elif self.drilled:
            self.drilled = False

    def action_open_row(self) -> None:
        if self.drilled:
            self._go_to_instance_source()
            return
        key = self.query_one("#ops-groups", TraceTable).current_key()
        if key is None:
            return
        self.group = self.sorted_groups[int(key)]
        self.instances = []
        self.query_one("#ops-instances", TraceTable).show([])
        self.drilled = True
        self._request_instances(0)

    def _request_instances(self, offset: int) -> None:
        if self.group is None:
            return
        grouping, key, rank = self.grouping, self.group.key, self.session.rank
        self.request("detail", lambda trace: (offset, queries.op_instances(trace, grouping, key, rank, offset=offset, limit=INSTANCE_PAGE)))
        self._status("loading…")

    def _go_to_instance_source(self) -> None:
        key = self.query_one("#ops-instances", TraceTable).current_key()
        if key is None:
            return
        instance = self.instances[int(key)]
        if instance.source is None:
            self.notify("this op has no recorded source line", markup=False)
            return
        self.post_message(GoToSource(instance.source.file, instance.source.line))

    # -- events -----------------------------------------------------------------------------------

    def _set_filter(self, text: str) -> None:
        if text != self.text_filter:
            self.text_filter = text
            self.load()

    def on_input_changed(self, event: Input.Changed) -> None:
        # Filter as the user types, once typing pauses (capped groupings filter with a scan of all ops).
        event.stop()
        if self._filter_timer is not None:
            self._filter_timer.stop()
        value = event.value
        self._filter_timer = self.set_timer(FILTER_DELAY_S, lambda: self._set_filter(value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._set_filter(event.value)
        self.filtering = False
        self.set_class(bool(self.text_filter), "-filtering")
        self.query_one("#ops-groups").focus()

    def on_trace_table_need_more(self, event: TraceTable.NeedMore) -> None:
        if event.table.id == "ops-instances":
            self._request_instances(len(self.instances))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_row()
