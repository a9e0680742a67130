"""Source: the user's files that appear in the trace, syntax highlighted, with a per-line gutter of
host time, ops, compiles and syncs (a count column that is empty for the whole file is left out, so
that the code keeps the width). `o` opens the current line in `$EDITOR`.

A recorded file is looked for at its recorded path, then under the source roots (the run's working
directory, the trace's directory, the current directory and any `--source-root`), preferring a copy
whose content is the one the run saw (the trace's `source_files` digests). A file that cannot be found
still shows its lines that have recorded activity; one that changed since the run is shown with a
warning, since its line numbers may no longer match.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.style import Style
from rich.syntax import Syntax
from rich.text import Span, Text
from textual.app import SuspendNotSupported
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.coordinate import Coordinate
from textual.widgets import DataTable

from tputrace.source_digests import SourceDigest, digest_bytes
from tputrace.tui import queries
from tputrace.tui.actions import bindings
from tputrace.tui.render import display_path, fmt_count, fmt_ns, right
from tputrace.tui.view import TraceView
from tputrace.tui.widgets import Row, StatusLine, TraceTable
from tputrace.wording import plural

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.widget import Widget

MAX_SOURCE_BYTES = 4 * 1024 * 1024

HOST_TIME_LABEL = "host time"
"""What the gutter's time is: the host's time at the line (dispatching its ops, compiling, sync stalls, copies,
fallbacks and collectives), measured on this host."""
GUTTER_COLUMNS: tuple[tuple[str, str], ...] = (
    (HOST_TIME_LABEL, "time"), ("ops", "ops"), ("compiles", "compiles"), ("caused", "caused"), ("syncs", "syncs"),
)
"""The gutter's columns before the line number: (label, key); the key names the `LineStat` count (time: `time_ns`)."""


@dataclass(frozen=True)
class SourceText:
    """A file's lines as highlighted text, or why there are none."""

    recorded: str
    path: Path | None
    lines: list[Text]
    problem: str | None = None
    changed: bool = False  # the file's content differs from what the run saw


LEXERS_BY_SUFFIX: dict[str, str] = {".py": "python", ".pyi": "python", ".pyx": "cython", ".c": "c", ".h": "cpp",
                                    ".cc": "cpp", ".cpp": "cpp", ".cu": "cuda", ".sh": "bash"}
"""Lexers of the files a trace points at, by name: guessing from the file name makes Pygments scan
every installed package's entry points for plugin lexers (a second or more in a big environment)."""


def read_source(recorded: str, path: Path | None, *, dark: bool, seen: SourceDigest | None = None) -> SourceText:
    """Read and highlight a source file (in a worker: this touches the disk); `seen` is the digest of
    the file as the run saw it, when the trace has one."""
    if path is None:
        return SourceText(recorded, None, [], "not found on this machine (use --source-root DIR to say where the code is)")
    try:
        if path.stat().st_size > MAX_SOURCE_BYTES:
            return SourceText(recorded, path, [], f"too large to show ({path.stat().st_size:,} bytes)")
        content = path.read_bytes()
    except OSError as error:
        return SourceText(recorded, path, [], f"cannot read it: {error.strerror or error}")
    code = content.decode("utf-8", errors="replace")
    changed = seen is not None and digest_bytes(content) != seen
    lexer = LEXERS_BY_SUFFIX.get(path.suffix.lower()) or Syntax.guess_lexer(str(path), code)
    syntax = Syntax(code, lexer, theme="ansi_dark" if dark else "ansi_light", background_color="default")
    highlighted = without_background(syntax.highlight(code))
    lines = highlighted.split("\n", allow_blank=True)
    if lines and not lines[-1].plain and code.endswith("\n"):
        lines.pop()
    return SourceText(recorded, path, list(lines), changed=changed)


def without_background(text: Text) -> Text:
    """`text` with its colours but no background: the syntax theme's background would paint boxes
    over the table's stripes and hide its cursor row."""

    def foreground(style: str | Style) -> Style:
        parsed = Style.parse(style) if isinstance(style, str) else style
        return Style(color=parsed.color, bold=parsed.bold, dim=parsed.dim, italic=parsed.italic,
                     underline=parsed.underline, strike=parsed.strike)

    text.style = foreground(text.style)
    text.spans = [Span(span.start, span.end, foreground(span.style)) for span in text.spans]
    return text


def editor_command(editor: str, path: str, line: int) -> list[str]:
    """The command that opens `path` at `line` in `editor` (`$EDITOR`, which may carry arguments)."""
    words = shlex.split(editor)
    name = os.path.basename(words[0]) if words else ""
    if name in ("code", "code-insiders", "codium", "cursor"):
        return [*words, "--goto", f"{path}:{line}"]
    if name in ("subl", "sublime_text", "zed"):
        return [*words, f"{path}:{line}"]
    return [*words, f"+{line}", path]


def same_file(recorded: str, wanted: str) -> bool:
    """Whether two recorded paths name the same file (equal, or one ends with the other)."""
    if recorded == wanted:
        return True
    recorded_parts, wanted_parts = Path(recorded).parts, Path(wanted).parts
    shorter, longer = sorted((recorded_parts, wanted_parts), key=len)
    return bool(shorter) and longer[-len(shorter):] == shorter


class SourceView(TraceView):
    VIEW_ID = "source"
    BINDINGS: ClassVar[list[BindingType]] = bindings("source")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.files: list[queries.FileStat] = []
        self.file: queries.FileStat | None = None
        self.source: SourceText | None = None
        self.row_lines: list[int] = []
        self._plain_row: tuple[int, Text] | None = None  # the cursor row and its highlighted code, while it shows plain code
        self._target: tuple[str, int] | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="source-body"):
            yield TraceTable(("file", "file"), (HOST_TIME_LABEL, "time"), id="source-files")
            with Vertical(id="source-main"):
                yield StatusLine(Text("loading…"), id="source-status", classes="status")
                yield TraceTable(*GUTTER_COLUMNS, ("line", "line"), ("", "code"), page_size=300, max_column_width=240,
                                 fit_width=False, id="source-code")

    def primary(self) -> Widget | None:
        return self.query_one("#source-code")

    def load(self) -> None:
        session = self.session
        self.request("main", lambda trace: session.source_stats())

    def apply(self, slot: str, payload: Any) -> None:
        if slot == "main":
            self.files = payload
            self.query_one("#source-files", TraceTable).show([
                (str(index), (Text(os.path.basename(stat.file) or stat.file), right(fmt_ns(stat.time_ns) if stat.time_ns else "")))
                for index, stat in enumerate(self.files)
            ])
            if not self.files:
                self.say("source-status", "no source locations in this trace")
                return
            if self._target is not None:
                self.show_location(*self._target)
            else:
                self._open_file(self.files[0])
        else:
            self._show_source(payload)

    # -- showing a file ---------------------------------------------------------------------------

    def show_location(self, file: str, line: int) -> None:
        """Show `file:line` (a recorded path); remembered until the view has loaded its files."""
        self._target = (file, line)
        if not self.files:
            self.ensure_loaded()
            return
        match = next((stat for stat in self.files if stat.file == file), None) or next(
            (stat for stat in self.files if same_file(stat.file, file)), None
        )
        if match is None:
            match = queries.FileStat(file)
            self.files.append(match)
            self.query_one("#source-files", TraceTable).extend([(str(len(self.files) - 1), (Text(os.path.basename(file)), right("")))], more=False)
        files_table = self.query_one("#source-files", TraceTable)
        files_table.move_cursor(row=self.files.index(match), animate=False)
        if self.file is match and self.source is not None:
            self._move_to_line(line)
            self._target = None
        else:
            self._open_file(match)

    def _open_file(self, stat: queries.FileStat) -> None:
        self.file = stat
        self.source = None
        session, dark = self.session, self.app.current_theme.dark
        recorded = stat.file
        self.request("detail", lambda trace: read_source(recorded, session.resolve_source(recorded), dark=dark,
                                                         seen=session.source_digest(recorded)))
        self.say("source-status", ("loading ", "dim"), recorded)

    def _show_source(self, source: SourceText) -> None:
        if self.file is None or source.recorded != self.file.file:
            return
        self.source = source
        self._plain_row = None  # the rows are replaced
        stats = self.file.lines
        if source.lines:
            self.row_lines = list(range(1, len(source.lines) + 1))
            code = {number: text for number, text in enumerate(source.lines, start=1)}
        else:
            self.row_lines = sorted(stats)
            code = {}
        columns = gutter_columns(stats.values())
        rows: list[Row] = []
        for index, number in enumerate(self.row_lines):
            stat = stats.get(number)
            rows.append((str(index), (*gutter_cells(stat, columns), right(str(number), "dim"), code.get(number, Text("")))))
        self.query_one("#source-code", TraceTable).show(rows, columns=(*columns, ("line", "line"), ("", "code")))
        status: list[str | tuple[str, str]] = [(display_path(source.path) if source.path else source.recorded, "bold")]
        if source.problem:
            status += [(f" · {source.problem}", "bold red")]
        if source.changed:
            status += [(" · changed since the run was recorded: lines may not match", "bold yellow")]
        ops = sum(stat.ops for stat in stats.values())
        status += [(f" · {plural(len(stats), 'line')} with activity, {plural(ops, 'op')} · n/N next/previous · o open in $EDITOR", "dim")]
        self.say("source-status", *status)
        target_line = None
        if self._target is not None and same_file(source.recorded, self._target[0]):
            target_line = self._target[1]
            self._target = None
        elif stats:
            target_line = max(stats, key=lambda number: stats[number].time_ns)
        if target_line is not None:
            # After a refresh, so that the table's height (how many rows to load around the line) is known.
            self.call_after_refresh(self._move_to_line, target_line)

    def _move_to_line(self, line: int) -> None:
        table = self.query_one("#source-code", TraceTable)
        if not self.row_lines:
            return
        row = min(range(len(self.row_lines)), key=lambda index: abs(self.row_lines[index] - line))
        # Rows are added a page at a time: add those up to a screen past the line (centre_on waits
        # for the table to size itself for them).
        table.ensure_rows(row + table.scrollable_content_region.height)
        table.centre_on(row)

    def current_line(self) -> int | None:
        key = self.query_one("#source-code", TraceTable).current_key()
        return None if key is None else self.row_lines[int(key)]

    # -- events and actions -----------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "source-files" and event.row_key.value is not None and self.files:
            stat = self.files[int(event.row_key.value)]
            if stat is not self.file:
                self._open_file(stat)
        elif event.data_table.id == "source-code":
            self._plain_cursor_line(event.cursor_row)

    def _plain_cursor_line(self, row: int) -> None:
        """Draw the cursor row's code in the cursor's own colours: a token coloured like the highlight (the
        terminal theme's magenta `not` on its magenta cursor) would vanish into it. The row left gets its
        syntax colours back."""
        table = self.query_one("#source-code", TraceTable)
        column = table.get_column_index("code")
        if self._plain_row is not None:
            index, highlighted = self._plain_row
            self._plain_row = None
            if index < table.row_count:
                table.update_cell_at(Coordinate(index, column), highlighted)
        if not 0 <= row < table.row_count:
            return
        code = table.get_cell_at(Coordinate(row, column))
        if isinstance(code, Text) and (code.spans or code.style):
            self._plain_row = (row, code)
            table.update_cell_at(Coordinate(row, column), Text(code.plain, no_wrap=True, overflow="ellipsis"))

    def action_focus_files(self) -> None:
        self.query_one("#source-files").focus()

    def action_hot_line(self, direction: int) -> None:
        if self.file is None or not self.file.lines:
            return
        current = self.current_line() or 0
        hot = sorted(self.file.lines)
        candidates = [line for line in hot if (line > current if direction > 0 else line < current)]
        target = (candidates[0] if direction > 0 else candidates[-1]) if candidates else (hot[0] if direction > 0 else hot[-1])
        self._move_to_line(target)
        self.query_one("#source-code").focus()  # from the file list too: the line it moved to is in sight

    def action_open_in_editor(self) -> None:
        line = self.current_line()
        if self.source is None or self.source.path is None or line is None:
            self.notify("this file is not on this machine", markup=False, severity="warning")
            return
        editor = os.environ.get("EDITOR") or os.environ.get("VISUAL")
        if not editor:
            self.notify("set $EDITOR to open files", markup=False, severity="warning")
            return
        command = editor_command(editor, str(self.source.path), line)
        try:
            with self.app.suspend():
                subprocess.run(command, check=False)
        except SuspendNotSupported:
            subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as error:
            self.notify(f"cannot run {command[0]}: {error.strerror or error}", markup=False, severity="error")


def gutter_columns(stats: Iterable[queries.LineStat]) -> tuple[tuple[str, str], ...]:
    """The gutter's columns for a file's line stats: host time, and each count that some line has."""
    counted = list(stats)
    return tuple((label, key) for label, key in GUTTER_COLUMNS if key == "time" or any(getattr(stat, key) for stat in counted))


def gutter_cells(stat: queries.LineStat | None, columns: Sequence[tuple[str, str]] = GUTTER_COLUMNS) -> tuple[Text, ...]:
    """A line's cells for `columns`: host time, ops, compiles triggered at the line, compiles it caused (a recompile
    storm's line that made the changing shape), syncs."""
    if stat is None:
        return tuple(Text("") for _ in columns)
    cells = []
    for _, key in columns:
        if key == "time":
            cells.append(right(fmt_ns(stat.time_ns) if stat.time_ns else "", "bold"))
        else:
            count = getattr(stat, key)
            cells.append(right(fmt_count(count) if count else "", "" if key == "ops" else "bold"))
    return tuple(cells)
