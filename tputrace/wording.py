"""How counts, durations and sizes are worded in every view: `3 compiles`, `24.3 µs`, `1.50 KiB`. Imports
nothing, so the CLI's live status line, the summary and the analyzers use it without loading each other."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 call`, `3 calls` (`nouns` for an irregular plural), the count with thousands separators."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


# Control characters a terminal would act on (C0 but tab and newline, DEL, C1), shown as `\x1b` instead.
_CONTROL_ESCAPES: dict[int, str] = {
    code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(code) not in "\t\n"
}


def printable(text: str) -> str:
    """`text` with its control characters written as escapes (`\\x1b`), for a terminal: a trace's names are
    another person's text, and an escape sequence in one (`\\x1b]0;title\\x07`, `\\x1b[2J`) would retitle or
    clear the reader's terminal."""
    return text.translate(_CONTROL_ESCAPES)


def format_ns(ns: float | None) -> str:
    """A duration with three significant digits: `512 ns`, `24.3 µs`, `1.17 ms`, `3.07 s`; `<1 ns` for less than a
    nanosecond that is not nothing (a tiny program's projected time)."""
    if ns is None:
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{_three_digits(ns / scale)} {unit}"
    return "<1 ns" if 0 < ns < 1 else f"{int(ns)} ns"


def format_bytes(count: float | None) -> str:
    """A byte count in binary units: `512 B`, `1.50 KiB`, `37.7 MiB`."""
    if count is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(count) >= scale:
            return f"{_three_digits(count / scale)} {unit}"
    return f"{int(count)} B"


def format_change(before: float | None, after: float | None) -> str:
    """How `after` compares with `before`: `446× less`, `2.10× more`, `same`; empty when unknown."""
    if before is None or after is None or before < 0 or after < 0:
        return ""
    if before == after:
        return "same"
    if after == 0:
        return "none after"
    if before == 0:
        return "new"
    if after < before:
        return f"{_three_digits(before / after)}× less"
    return f"{_three_digits(after / before)}× more"


def _three_digits(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"
