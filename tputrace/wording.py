"""How counts are worded in every view: `1 compile`, `3 compiles`. Imports nothing, so the CLI's live
status line and the summary use it without loading the analyzers."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 call`, `3 calls` (`nouns` for an irregular plural), the count with thousands separators."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"
