"""Timeline: host lanes (dispatch, compile, syncs, transfers, fallbacks, collectives) and one lane per
chip for a step or window; zoom and pan with keys. Below, the longest events in the window.

Lanes are bucketed to the lanes' width; the ops' times are read once and kept (`queries.op_times`), so
a window over millions of ops costs passes over arrays, not a scan of the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import events
from textual.binding import BindingType
from textual.widgets import DataTable, Static

from tputrace.derived.op_time import OpTimeKind
from tputrace.derived.steps import StepRow
from tputrace.tui import queries
from tputrace.tui.actions import bindings
from tputrace.tui.render import START_LABEL, Palette, fmt_ns, right, shade_row, source_text
from tputrace.tui.view import GoToSource, TraceView, palette_for
from tputrace.tui.widgets import StatusLine, TraceTable

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

    from tputrace.store.reader import Trace

LABEL_WIDTH = 22
"""Columns for a lane's label and event count: "dispatch (1,000,000)", "tpu:0 exec (19,200)"."""
MIN_SPAN_NS = 1_000
EVENT_KINDS = {"dispatch": "host dispatch", "compile": "compile", "syncs": "sync stall", "transfers": "transfer",
               "fallbacks": "fallback", "collectives": "collective", "exec": "program execution"}
"""Which time a longest event's duration is, by its lane, in the summary's words for the time split."""
DEVICE_OPS_LANE = "device ops"
"""The ops' lane of an XProf import, whose op times are the device's (`OpTimeKind.device_ops`)."""


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int
    step: int | None = None

    @property
    def span_ns(self) -> int:
        return self.end_ns - self.start_ns


class Lanes(Static, can_focus=True):
    """The lanes drawing; focusable so that the timeline's keys reach the view."""


def lanes_text(lanes: list[queries.LaneBusy], window: Window, palette: Palette, op_time: OpTimeKind | None = None) -> Text:
    """The lanes with their labels, under a time axis for the window (the ops' lane named for what their times
    are: host dispatch, or an XProf import's device ops)."""
    width = max((len(lane_busy.busy) for lane_busy in lanes), default=0)
    text = Text(no_wrap=True, overflow="crop")
    ticks = [(0, "+0")]
    for fraction in (0.25, 0.5, 0.75):
        ticks.append((int(width * fraction), f"+{fmt_ns(window.span_ns * fraction)}"))
    end_label = f"+{fmt_ns(window.span_ns)}"
    ticks.append((max(width - len(end_label), 0), end_label))
    axis = list(" " * width)
    for position, label in ticks:
        if all(cell == " " for cell in axis[max(position - 1, 0): position + len(label) + 1]):
            axis[position: position + len(label)] = label
    text.append(f"{fmt_ns(window.start_ns)}"[: LABEL_WIDTH - 1].ljust(LABEL_WIDTH), style=palette.muted)
    text.append("".join(axis)[:width], style=palette.muted)
    for lane_busy in lanes:
        lane = lane_busy.lane
        text.append("\n")
        name = DEVICE_OPS_LANE if op_time is not None and op_time.device_ops and lane.name == "dispatch" else lane.name
        label = f"{name} ({lane.events:,})" if lane.events else name
        text.append(label[: LABEL_WIDTH - 1].ljust(LABEL_WIDTH), style="bold" if lane.events else palette.muted)
        style = palette.compile if lane.name == "compile" else (palette.accent if lane.name.startswith("tpu:") else palette.bar)
        text.append_text(shade_row(lane_busy.busy, style))
    return text


class TimelineView(TraceView):
    VIEW_ID = "timeline"
    BINDINGS: ClassVar[list[BindingType]] = bindings("timeline")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[StepRow] = []
        self.wall_ns = 0
        self.window: Window | None = None
        self.lanes: list[queries.LaneBusy] = []
        self.events: list[queries.WindowEvent] = []
        self._columns = 0
        self.op_time = OpTimeKind(device_ops=False, chip_share=True)

    def compose(self) -> ComposeResult:
        yield StatusLine(Text("loading…"), id="timeline-status", classes="status")
        yield Lanes(Text(""), id="timeline-lanes")
        yield Static(Text("Longest in the window", style="bold"), classes="heading")
        yield TraceTable(("kind", "lane"), (START_LABEL, "start"), ("duration", "dur"), ("what", "label"), ("source", "source"), id="timeline-events")

    def primary(self) -> Widget | None:
        return self.query_one("#timeline-lanes")

    def load(self) -> None:
        session = self.session
        rank = session.rank
        self.request("main", lambda trace: (session.steps(), trace.wall_ns(rank=rank), session.op_time(rank)))

    def apply(self, slot: str, payload: Any) -> None:
        if slot == "main":
            self.steps, self.wall_ns, self.op_time = payload
            self.window = None
            self.show_window(self._initial_window())
        else:
            window, lanes, events_in_window = payload
            if window != self.window:
                return
            self.lanes = lanes
            self.events = list(events_in_window)
            self._render_lanes()
            self.query_one("#timeline-events", TraceTable).show([
                (str(index), (Text(self.op_time.label if event.lane == "dispatch" else EVENT_KINDS.get(event.lane, event.lane)), right(fmt_ns(event.start_ns)), right(fmt_ns(event.dur_ns)), Text(event.label),
                              Text(source_text(event.source) if event.source else "")))
                for index, event in enumerate(events_in_window)
            ])

    def _initial_window(self) -> Window:
        """The slowest step that did not compile (what a steady step costs), else the first step, else the run."""
        steady = [step for step in self.steps if not step.compiles and step.end_ns is not None]
        candidates = steady or [step for step in self.steps if step.end_ns is not None]
        if not candidates:
            return Window(0, max(self.wall_ns, MIN_SPAN_NS))
        chosen = max(candidates, key=lambda step: step.dur_ns) if steady else candidates[0]
        return self._step_window(self.steps.index(chosen))

    def _step_window(self, index: int) -> Window:
        step = self.steps[index]
        end_ns = step.end_ns if step.end_ns is not None else self.wall_ns
        return Window(step.start_ns, max(end_ns, step.start_ns + MIN_SPAN_NS), index)

    def show_window(self, window: Window) -> None:
        self.window = window
        self._columns = self._lane_columns()
        session, rank, columns = self.session, self.session.rank, self._columns

        def fetch(trace: Trace) -> tuple[Window, list[queries.LaneBusy], list[queries.WindowEvent]]:
            times = session.op_times(rank)  # read once, for every window
            return (window, queries.timeline_lanes(trace, rank, window.start_ns, window.end_ns, columns, times),
                    queries.window_events(trace, rank, window.start_ns, window.end_ns, times=times))

        self.request("window", fetch)
        self._show_status()

    def _lane_columns(self) -> int:
        width = self.query_one("#timeline-lanes").content_region.width or (self.app.size.width - 4)
        return max(width - LABEL_WIDTH, 10)

    def restyle(self) -> None:
        self._render_lanes()

    def _render_lanes(self) -> None:
        if self.window is not None:
            self.query_one("#timeline-lanes", Lanes).update(lanes_text(self.lanes, self.window, palette_for(self.app), self.op_time))

    def _show_status(self) -> None:
        window = self.window
        if window is None:
            return
        where = f"step {self.steps[window.step].step}" if window.step is not None else "window"
        self.say("timeline-status", (where, "bold"),
                 f" · {fmt_ns(window.start_ns)} – {fmt_ns(window.end_ns)} ({fmt_ns(window.span_ns)}) of {fmt_ns(self.wall_ns)} wall · rank {self.session.rank}",
                 ("  [ ] step · + - zoom · ← → pan · w whole run", "dim"))

    def on_resize(self, event: events.Resize) -> None:
        if self.window is not None and self._lane_columns() != self._columns:
            self.show_window(self.window)

    # -- actions ----------------------------------------------------------------------------------

    def _bounded(self, start_ns: float, span_ns: float) -> Window:
        span = int(max(MIN_SPAN_NS, min(span_ns, max(self.wall_ns, MIN_SPAN_NS))))
        start = int(min(max(start_ns, 0), max(self.wall_ns - span, 0)))
        return Window(start, start + span)

    def action_zoom(self, factor: float) -> None:
        if self.window is None:
            return
        centre = self.window.start_ns + self.window.span_ns / 2
        span = self.window.span_ns * factor
        self.show_window(self._bounded(centre - span / 2, span))

    def action_pan(self, fraction: float) -> None:
        if self.window is None:
            return
        self.show_window(self._bounded(self.window.start_ns + self.window.span_ns * fraction, self.window.span_ns))

    def action_step(self, delta: int) -> None:
        if not self.steps or self.window is None:
            return
        if self.window.step is not None:
            index = self.window.step + delta
        else:
            centre = self.window.start_ns + self.window.span_ns / 2
            index = next((i for i, step in enumerate(self.steps) if step.start_ns >= centre), len(self.steps))
            index = index if delta > 0 else index - 1
        self.show_window(self._step_window(min(max(index, 0), len(self.steps) - 1)))

    def action_whole_run(self) -> None:
        self.show_window(Window(0, max(self.wall_ns, MIN_SPAN_NS)))

    def action_open_event(self) -> None:
        """Zoom to the highlighted event (three times its length, centred); if already there, show its source."""
        key = self.query_one("#timeline-events", TraceTable).current_key()
        if key is None or self.window is None:
            return
        event = self.events[int(key)]
        span = max(event.dur_ns * 3, MIN_SPAN_NS)
        target = self._bounded(event.start_ns + event.dur_ns / 2 - span / 2, span)
        if target != self.window:
            self.show_window(target)
        elif event.source is not None:
            self.post_message(GoToSource(event.source.file, event.source.line))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_event()
