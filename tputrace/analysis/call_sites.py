"""Naming one call among several on a source line: its column and, when the file is readable, its text."""

from __future__ import annotations

import linecache

from tputrace.store.records import SourceLocation

MAX_CALL_TEXT = 60  # characters of a call's source text shown in a finding


def call_text(location: SourceLocation) -> str | None:
    """The source text of the call `location` points at (its column span on its line), or None when the
    column is unknown or the file cannot be read. A call that goes on past its line ends in '…'."""
    if location.col is None:
        return None
    encoded = linecache.getline(location.file, location.line).rstrip("\n").encode()
    if not encoded:
        return None
    end = location.end_col if location.end_col is not None else len(encoded)
    text = encoded[location.col:end].decode(errors="replace").strip()
    if not text:
        return None
    if location.end_col is None or len(text) > MAX_CALL_TEXT:
        text = text[:MAX_CALL_TEXT].rstrip() + "…"
    return text


def call_label(location: SourceLocation) -> str:
    """`train.py:42:col 15 (q @ k.transpose(-1, -2))`; without a readable file `train.py:42:col 15`,
    without a column `train.py:42`."""
    text = call_text(location)
    return location.short_call if text is None else f"{location.short_call} ({text})"
