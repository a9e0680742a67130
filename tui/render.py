"""Formatting and small Rich renderables shared by the views (Rich only: no Textual, no trace access).

Every string that comes from a trace goes into a `rich.text.Text` as plain text, never through
markup parsing: `Text(value)` and `Text.assemble(...)` do not interpret `[...]`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

if TYPE_CHECKING:
    from tputrace.store.records import SourceLocation

START_LABEL = "start (wall)"
"""Every table's column of when an event began: wall time since the run started."""

SHADES = " ░▒▓█"
BLOCKS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Palette:
    """Styles for charts, taken from the app's theme so they read on light and dark terminals."""

    bar: str = "blue"
    compile: str = "magenta"
    muted: str = "dim"
    warning: str = "red"
    accent: str = "cyan"


def display_path(path: str | os.PathLike[str]) -> str:
    """A local path as people type it: relative to the current directory when inside it."""
    try:
        resolved = Path(path).resolve()
        return str(resolved.relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def source_text(location: SourceLocation) -> str:
    """`file:line (function)` with the file as `display_path` shows it (relative to the current directory
    when inside it), so that a table's narrowed column keeps the file's name rather than its root."""
    return f"{display_path(location.file)}:{location.line} ({location.function})"


def fmt_ns(ns: float | None) -> str:
    """A duration with three significant digits and a unit: `812 ns`, `12.3 µs`, `4.56 ms`, `1.20 s`; `<1 ns` for
    less than a nanosecond that is not nothing."""
    if ns is None:
        return "-"
    value = float(ns)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if value >= scale:
            scaled = value / scale
            if unit == "s" and scaled >= 100:
                return f"{sign}{scaled:.0f} s"
            return f"{sign}{_three_digits(scaled)} {unit}"
    return f"{sign}<1 ns" if 0 < value < 1 else f"{sign}{value:.0f} ns"


def _three_digits(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_bytes(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{_three_digits(value)} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def fmt_rate(bytes_per_s: float | None) -> str:
    if not bytes_per_s:
        return "-"
    value = float(bytes_per_s)
    for unit in ("B/s", "KB/s", "MB/s", "GB/s", "TB/s"):
        if value < 1000 or unit == "TB/s":
            return f"{_three_digits(value)} {unit}"
        value /= 1000
    return "-"


def fmt_count(count: int | None) -> str:
    return "-" if count is None else f"{count:,}"


def fmt_share(share: float) -> str:
    return f"{share * 100:.1f}%"


def right(value: str, style: str = "") -> Text:
    """A right-aligned table cell."""
    return Text(value, style=style, justify="right")


def share_bar(share: float, width: int, style: str = "") -> Text:
    """A horizontal bar `width` cells wide, filled to `share` (0..1) in eighths of a cell."""
    eighths = round(max(0.0, min(share, 1.0)) * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + ("▏▎▍▌▋▊▉"[part - 1] if part else "")
    return Text(bar.ljust(width), style=style)


def shade_row(busy: Sequence[float], style: str = "") -> Text:
    """A timeline lane: one cell per column, darker the busier (any activity shows at least ░)."""
    cells = []
    for fraction in busy:
        if fraction <= 0:
            cells.append(" ")
        else:
            cells.append(SHADES[min(len(SHADES) - 1, 1 + int(fraction * (len(SHADES) - 1) - 1e-9))])
    return Text("".join(cells), style=style)


@dataclass(frozen=True)
class ChartBar:
    """One bar of the step chart: a value, whether it is marked (a step that compiled) and what it is
    (`step 3`, for the legend of clipped bars)."""

    value: float
    marked: bool
    label: str = ""


AXIS_WIDTH = 10
CLIPPED = "▲"
MAX_LISTED_CLIPPED = 3  # the legend names this many clipped bars, the tallest first
MAX_CLIPPED_SHARE = 0.75  # a step chart clips compiling steps only if this share of the bars or fewer is clipped


class StepChart:
    """A bar chart of step times that fits the width it is given: one column per step, or the
    maximum of several steps per column when there are more steps than columns.

    Marked bars (steps that compiled) are drawn in the palette's compile style with a `c` below;
    when they dwarf the other steps they are clipped (`▲`) so that steady steps stay readable, unless
    that would clip nearly every bar (a recompilation storm: the compiling steps are the ones to read).
    The legend names the clipped steps and their values.
    """

    def __init__(self, bars: Sequence[ChartBar], *, height: int = 6, palette: Palette = Palette()) -> None:
        self.bars = list(bars)
        self.height = max(height, 1)
        self.palette = palette

    def columns(self, width: int) -> list[ChartBar]:
        """The bars folded into at most `width` columns (max value; marked if any step was)."""
        if len(self.bars) <= width or width <= 0:
            return list(self.bars)
        folded = []
        per_column = len(self.bars) / width
        for column in range(width):
            chunk = self.bars[int(column * per_column): max(int((column + 1) * per_column), int(column * per_column) + 1)]
            folded.append(ChartBar(max(bar.value for bar in chunk), any(bar.marked for bar in chunk)))
        return folded

    @staticmethod
    def scale(columns: Sequence[ChartBar]) -> float:
        """The value at the top of the chart: the tallest bar, unless marked (compiling) bars dwarf the
        rest; then the tallest unmarked bar, and taller bars are clipped and drawn with `▲`, as long as
        more than `MAX_CLIPPED_SHARE` of the bars would not be."""
        tallest = max((bar.value for bar in columns), default=0.0)
        unmarked = max((bar.value for bar in columns if not bar.marked), default=0.0)
        clipped = sum(bar.value > unmarked * 1.001 for bar in columns)
        if unmarked and tallest > 3 * unmarked and clipped <= MAX_CLIPPED_SHARE * len(columns):
            return unmarked
        return tallest or 1.0

    def lines(self, width: int) -> list[Text]:
        if not self.bars:
            return [Text("no steps recorded", style=self.palette.muted)]
        axis_width = AXIS_WIDTH
        plot_width = max(width - axis_width, 1)
        columns = self.columns(plot_width)
        bar_width = max(1, min(plot_width // max(len(columns), 1), 6))
        gap = 1 if bar_width >= 3 else 0
        top = self.scale(columns)
        rows = []
        for level in range(self.height, 0, -1):
            label = fmt_ns(top) if level == self.height else ("0" if level == 1 else "")
            row = Text()
            row.append(label.rjust(axis_width - 2) + " │", style=self.palette.muted)
            for bar in columns:
                eighths = round(bar.value / top * self.height * 8)
                char = BLOCKS[max(0, min(eighths - (level - 1) * 8, 8))]
                if level == self.height and bar.value > top * 1.001:
                    char = CLIPPED
                row.append(char * (bar_width - gap) + " " * gap, style=self.palette.compile if bar.marked else self.palette.bar)
            rows.append(row)
        marks = Text()
        marks.append(" " * (axis_width - 2) + " └", style=self.palette.muted)
        for bar in columns:
            mark = ("c" if bar.marked else "─") + "─" * (bar_width - 1)
            marks.append(mark, style=self.palette.compile if bar.marked else self.palette.muted)
        rows.append(marks)
        return rows

    def legend(self, width: int) -> Text | None:
        """What `c` and `▲` mean: which steps compiled, and which bars are clipped at the chart's top (the
        tallest few by name, with their values)."""
        columns = self.columns(max(width - AXIS_WIDTH, 1))
        top = self.scale(columns)
        clipped = sorted((bar for bar in self.bars if bar.value > top * 1.001), key=lambda bar: -bar.value)
        parts = ["c: the step compiled"] if any(bar.marked for bar in self.bars) else []
        if clipped:
            named = [f"{bar.label or 'a step'} took {fmt_ns(bar.value)}{' (compiled)' if bar.marked else ''}"
                     for bar in clipped[:MAX_LISTED_CLIPPED]]
            more = f" and {len(clipped) - MAX_LISTED_CLIPPED} more" if len(clipped) > MAX_LISTED_CLIPPED else ""
            parts.insert(0, f"{CLIPPED} clipped at {fmt_ns(top)}, the slowest step without a compile: {', '.join(named)}{more}")
        return Text(" · ".join(parts), style=self.palette.muted) if parts else None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines(options.max_width):
            line.no_wrap = True
            line.overflow = "crop"
            yield line
        legend = self.legend(options.max_width)
        if legend is not None:
            yield legend
