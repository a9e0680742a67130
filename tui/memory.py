"""Memory: live bytes over time on the chip with the highest peak, and at the peak what holds it by kind, module
and line, with the lines whose buffers survive steps (from the trace's buffer lifetimes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import Static

from tputrace.derived.memory_timeline import memory_place
from tputrace.tui import queries
from tputrace.tui.render import fmt_bytes, fmt_count, right
from tputrace.tui.view import TraceView
from tputrace.tui.widgets import StatusLine, TraceTable

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

SPARK = " ▁▂▃▄▅▆▇█"


class MemoryView(TraceView):
    VIEW_ID = "memory"
    _payload: Any = None

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="memory-status", classes="status")
        yield Static(Text(""), id="memory-timeline")
        yield Static(Text("At the peak, by kind, module and line", style="bold"), classes="heading")
        yield TraceTable(("bytes", "bytes"), ("kind", "kind"), ("module", "module"), ("line", "line"), ("buffers", "buffers"),
                         id="memory-parts")
        yield Static(Text("Lines whose buffers outlive their step", style="bold"), classes="heading")
        yield TraceTable(("per step", "per_step"), ("steps", "steps"), ("kind", "kind"), ("module", "module"), ("line", "line"),
                         id="memory-surviving")

    def primary(self) -> Widget | None:
        return self.query_one("#memory-parts")

    def load(self) -> None:
        rank = self.session.rank
        self.request("main", lambda trace: queries.memory_tables(trace, rank))

    def restyle(self) -> None:
        if self._payload is not None:
            self.apply("main", self._payload)

    def apply(self, slot: str, payload: Any) -> None:
        self._payload = payload
        tables: queries.MemoryTables = payload
        peak = tables.peak
        self.query_one("#memory-timeline", Static).update(_sparkline(tables.live_columns))
        self.query_one("#memory-parts", TraceTable).show([
            (str(index), (right(fmt_bytes(part.bytes)), Text(part.kind.replace("_", " ") + (" (estimated)" if part.estimated else "")),
                          Text(part.module or ""), Text(part.where.split(" in ")[0]), right(fmt_count(part.buffers))))
            for index, part in enumerate(peak.parts if peak is not None else ())
        ])
        self.query_one("#memory-surviving", TraceTable).show([
            (str(index), (right(fmt_bytes(line.bytes_per_step)), right(fmt_count(line.steps)), Text(line.kind.replace("_", " ")),
                          Text(line.module or ""), Text(f"{(line.file or '?').rsplit('/', 1)[-1]}:{line.line}")))
            for index, line in enumerate(tables.surviving)
        ])
        if peak is None:
            self.say("memory-status", tables.missing)
            return
        kinds = ", ".join(f"{kind.replace('_', ' ')} {fmt_bytes(nbytes)}" for kind, nbytes in peak.by_kind)
        self.say("memory-status", f"{memory_place(peak.chip)} peaked at {fmt_bytes(peak.bytes)} in step {peak.step} "
                                  f"({peak.coverage:.0%} of the measured {fmt_bytes(peak.measured_peak_bytes)}): {kinds}")


def _sparkline(columns: tuple[int, ...]) -> Text:
    if not columns:
        return Text("")
    highest = max(columns) or 1
    cells = "".join(SPARK[min(len(SPARK) - 1, round(value / highest * (len(SPARK) - 1)))] for value in columns)
    return Text.assemble(("live bytes ", "bold"), cells, f" (0 – {fmt_bytes(highest)})")
