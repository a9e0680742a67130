"""How counts are worded in every view: `1 compile`, `3 compiles`. Imports nothing, so the CLI's live
status line and the summary use it without loading the analyzers."""

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
