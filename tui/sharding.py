"""Sharding: the rank's device meshes, its parameters' placements and bytes per rank, and its collectives
grouped by what caused them (cause -> module -> line)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import DataTable, Static

from tputrace.tui import queries
from tputrace.tui.render import fmt_bytes, fmt_count, fmt_ns, right
from tputrace.tui.view import TraceView
from tputrace.tui.widgets import StatusLine, TraceTable
from tputrace.wording import plural

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget


MAX_DETAIL_LINES = 8


class ShardingView(TraceView):
    VIEW_ID = "sharding"
    _payload: Any = None

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="sharding-status", classes="status")
        yield Static(Text("Meshes", style="bold"), classes="heading")
        yield TraceTable(("mesh", "mesh"), ("shape", "shape"), ("dims", "dims"), ("ranks", "ranks"), id="sharding-meshes")
        yield Static(Text("Parameters", style="bold"), classes="heading")
        yield TraceTable(("parameter", "name"), ("wrapper", "wrapper"), ("placements", "placements"), ("shape", "shape"),
                         ("local shape", "local"), ("bytes", "bytes"), ("per rank", "per_rank"), id="sharding-parameters")
        yield Static(Text("Collectives by cause", style="bold"), classes="heading")
        yield TraceTable(("cause", "cause"), ("phase", "phase"), ("module", "module"), ("line", "line"), ("count", "count"),
                         ("bytes", "bytes"), ("collective time", "total"), id="sharding-causes")
        yield Static(Text(""), id="sharding-cause-detail", classes="detail")

    def _show_detail(self, index: int) -> None:
        """The highlighted cause group's buckets, placements and tensors, one line each."""
        tables: queries.ShardingTables | None = self._payload
        groups = tables.causes if tables is not None else ()
        details = groups[index].details if index < len(groups) else ()
        shown = list(details[:MAX_DETAIL_LINES]) + ([f"… and {len(details) - MAX_DETAIL_LINES} more"] if len(details) > MAX_DETAIL_LINES else [])
        self.query_one("#sharding-cause-detail", Static).update(Text("\n".join(shown)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "sharding-causes" and event.row_key.value is not None:
            self._show_detail(int(event.row_key.value))

    def primary(self) -> Widget | None:
        return self.query_one("#sharding-causes")

    def load(self) -> None:
        rank = self.session.rank
        self.request("main", lambda trace: queries.sharding_tables(trace, rank))

    def restyle(self) -> None:
        if self._payload is not None:
            self.apply("main", self._payload)

    def apply(self, slot: str, payload: Any) -> None:
        self._payload = payload
        tables: queries.ShardingTables = payload
        self.query_one("#sharding-meshes", TraceTable).show([
            (str(mesh.id), (right(str(mesh.id)), Text(mesh.shape), Text(mesh.dim_names), Text(mesh.ranks)))
            for mesh in tables.meshes
        ])
        self.query_one("#sharding-parameters", TraceTable).show([
            (str(index), (Text(row.name), Text(row.wrapper), Text(row.placements), Text(row.global_shape), Text(row.local_shape),
                          right(fmt_bytes(row.bytes)), right(fmt_bytes(row.bytes_per_rank))))
            for index, row in enumerate(tables.parameters)
        ])
        self.query_one("#sharding-causes", TraceTable).show([
            (str(index), (Text(group.cause), Text(group.phase), Text(group.module), Text(group.line), right(fmt_count(group.count)),
                          right(fmt_bytes(group.bytes)), right(fmt_ns(group.total_ns))))
            for index, group in enumerate(tables.causes)
        ])
        self._show_detail(0)
        if tables.empty:
            self.say("sharding-status", "no sharding records in this trace (no DDP, FSDP or DTensor, or a trace from before they were recorded)")
            return
        per_rank = sum(row.bytes_per_rank for row in tables.parameters)
        caused = [group for group in tables.causes if group.cause != queries.USER_CALL]
        self.say("sharding-status",
                 f"rank {self.session.rank}: {plural(len(tables.meshes), 'mesh', 'meshes')}, {plural(len(tables.parameters), 'parameter')} "
                 f"holding {fmt_bytes(per_rank)} per rank, {plural(sum(group.count for group in caused), 'caused collective')} "
                 f"in {fmt_ns(sum(group.total_ns for group in caused))}")
