"""`tputrace tui X.tpnum`: a numerics recording in the terminal. The findings on top, then every module call in
execution order (forward and backward) with its difference from the CPU replay as a share of its tolerance, and,
for the call under the cursor, its tensors' digests on the tpu and on the CPU and, for the first divergent call,
its ops. `d` jumps to the first divergent call, `q` quits. Text from the recording is never read as markup."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.app import App
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Static

from tputrace.numerics.findings import NumericsReport
from tputrace.numerics.report_findings import numerics_findings
from tputrace.numerics.store import ModuleCall, NumericsRecording
from tputrace.tui.widgets import StatusLine, TraceTable

if TYPE_CHECKING:
    from textual.app import ComposeResult


class NumericsApp(App[None]):
    """The views of one numerics recording."""

    CSS_PATH = str(Path(__file__).with_name("theme.tcss"))
    TITLE = "tputrace numerics"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "first_divergent", "First divergent", id="numerics.first_divergent"),
        Binding("q", "quit", "Quit", id="numerics.quit"),
    ]

    def __init__(self, recording: NumericsRecording, report: NumericsReport) -> None:
        super().__init__()
        self.recording = recording
        self.report = report

    def compose(self) -> ComposeResult:
        yield Static(Text(f"tputrace numerics · {self.recording.path}", style="bold"), id="topbar")
        with Vertical(classes="trace-view"):
            yield StatusLine(Text(""), id="numerics-status", classes="status")
            yield TraceTable(("#", "index"), ("step", "step"), ("phase", "phase"), ("module", "module"), ("type", "type"),
                             ("line", "line"), ("outcome", "outcome"), ("difference / tolerance", "ratio"),
                             id="numerics-calls")
            yield Static(Text(""), id="numerics-detail")
        yield Footer()

    def on_mount(self) -> None:
        findings = numerics_findings(self.report)
        status = self.query_one("#numerics-status", StatusLine)
        if findings:
            top = findings[0]
            status.say((top.title, "bold red" if top.severity != "info" else "bold"),
                       f" · {len(findings)} finding{'s' if len(findings) > 1 else ''}")
        else:
            status.say(("no divergence beyond the tolerance, and no NaN or Inf", "bold green"))
        self.query_one("#numerics-calls", TraceTable).show([
            (str(index), (Text(str(index)), Text(str(call.step)), Text(call.phase), Text(call.module), Text(call.module_type),
                          Text(_line(call)), Text(call.reason if call.reason and call.outcome != "compared" else call.outcome),
                          _ratio_text(call)))
            for index, call in enumerate(self.recording.calls)
        ])
        self.query_one("#numerics-calls", TraceTable).focus()
        if self.recording.calls:
            self._show_detail(0)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self._show_detail(int(event.row_key.value))

    def action_first_divergent(self) -> None:
        found = self.report.first_divergence or None
        call = found.call if found is not None else self.report.first_nonfinite
        if call is None:
            self.notify("no call diverges", markup=False)
            return
        index = next(index for index, candidate in enumerate(self.recording.calls) if candidate.event_id == call.event_id)
        table = self.query_one("#numerics-calls", TraceTable)
        table.ensure_rows(index + 1)
        table.move_cursor(row=index)

    def _show_detail(self, index: int) -> None:
        call = self.recording.calls[index]
        text = Text()
        text.append(f"{call.module} ({call.module_type}) {call.phase}, step {call.step}", style="bold")
        if call.path:
            text.append(f" · {call.path}:{call.line}")
        for tensor_index in sorted(set(call.tpu) | set(call.cpu)):
            for side, digests in (("tpu", call.tpu), ("cpu", call.cpu)):
                digest = digests.get(tensor_index)
                if digest is not None:
                    text.append(f"\n  tensor {tensor_index} {side}: {digest.dtype} {list(digest.shape)}, L2 {digest.l2_norm:.6g}, "
                                f"max |x| {digest.max_abs:.6g}, {digest.nonfinite} non-finite")
        ops = self.recording.ops.get(call.event_id, [])
        for op in ops:
            where = "(not on the CPU)" if op.cpu_dtype is None else f"{op.tpu_dtype} vs {op.cpu_dtype}"
            difference = "" if op.divergence is None else f", difference {op.divergence:.3g}"
            text.append(f"\n  op #{op.op_index} aten.{op.op_name}: {where}{difference}", style="bold" if op.diverged else "")
        self.query_one("#numerics-detail", Static).update(text)


def _line(call: ModuleCall) -> str:
    return f"{call.path.rsplit('/', 1)[-1]}:{call.line}" if call.path else "–"


def _ratio_text(call: ModuleCall) -> Text:
    if call.divergence is None or not call.tolerance:
        return Text("–")
    ratio = call.divergence / call.tolerance
    return Text(f"{ratio:.3g}", style="bold red" if call.diverged else "")


def open_numerics_ui(path: Any) -> int:
    """Run the app on the recording at `path` until the user quits."""
    from pathlib import Path

    from tputrace.numerics.findings import replay_report
    from tputrace.numerics.store import read_recording

    recording = read_recording(Path(path))
    app = NumericsApp(recording, replay_report(recording))
    app.run()
    return app.return_code or 0
