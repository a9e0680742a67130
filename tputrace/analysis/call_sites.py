"""Naming one call among several on a source line: its column and, when the run's copy of the file is
here, its text. The text is read only from a copy whose content is the one the run saw
(`Trace.source_copy`), so a trace from elsewhere cannot quote a local file that shares a path with its own."""

from __future__ import annotations

import ast
import functools
import io
import linecache
import tokenize

from typing import Protocol

from tputrace.store.records import SourceLocation


class SourceCopies(Protocol):
    """Where the run's copy of a recorded file is (a `Trace`)."""

    def source_copy(self, file: str) -> str | None: ...

MAX_CALL_TEXT = 60  # characters of a call's source text shown in a finding
_OPENING = "([{"
_CLOSING = ")]}"


def call_text(location: SourceLocation, copies: SourceCopies) -> str | None:
    """The source text of the call `location` points at, or None when the column is unknown or the run's
    copy of the file is not here. A call over several lines (`torch.matmul(\\n    a,\\n    b,\\n)`) reads as written on
    one (`torch.matmul(a, b)`), without its comments; one whose end the trace does not know (a file from
    before `end_line`) is its first line, ending in '…'."""
    if location.col is None:
        return None
    copy = copies.source_copy(location.file)
    if copy is None:
        return None
    end_line = location.line if location.end_line is None else location.end_line
    lines = [linecache.getline(copy, number).rstrip("\r\n") for number in range(location.line, end_line + 1)]
    if not lines[0]:
        return None
    if location.end_col is not None:
        lines[-1] = lines[-1][:location.end_col]
    lines[0] = lines[0][location.col:]
    text = _joined(_without_comments(lines))
    if not text:
        return None
    if location.end_col is None or len(text) > MAX_CALL_TEXT:
        text = text[:MAX_CALL_TEXT].rstrip() + "…"
    return text


def line_text(location: SourceLocation | None, copies: SourceCopies) -> str | None:
    """The source line `location` is on, without its comment, from the run's copy of the file; None without one."""
    copy = None if location is None else copies.source_copy(location.file)
    if location is None or copy is None:
        return None
    text = linecache.getline(copy, location.line).rstrip("\r\n")
    return _without_comments([text])[0].strip() or None


def call_label(location: SourceLocation, copies: SourceCopies) -> str:
    """`train.py:42:col 15 (q @ k.transpose(-1, -2))`; without the run's copy of the file `train.py:42:col 15`,
    without a column `train.py:42`."""
    return location.short if location.col is None else f"{location.short}:{call_name(location, copies)}"


def call_name(location: SourceLocation, copies: SourceCopies) -> str:
    """Which call on its line `location` is: `col 15 (q @ w)`, `col 15` without the run's copy of the file
    (1-based, as editors count); `whole line` without a column."""
    if location.col is None:
        return "whole line"
    text = call_text(location, copies)
    return f"col {location.col + 1}" if text is None else f"col {location.col + 1} ({text})"


def _without_comments(lines: list[str]) -> list[str]:
    """`lines` (a call's source) with each comment cut off; as they are where the tokenizer fails on them."""
    cut = list(lines)
    try:
        for token in tokenize.generate_tokens(io.StringIO("\n".join(lines)).readline):
            if token.type == tokenize.COMMENT:
                row, column = token.start
                cut[row - 1] = cut[row - 1][:column]
    except (tokenize.TokenError, SyntaxError):
        pass  # a call without its end (an unclosed bracket): the comments found before that are cut
    return cut


def _joined(lines: list[str]) -> str:
    """Source lines of one expression as one line: no space inside brackets or before a chained `.method`,
    no trailing comma before a closing bracket (black's magic comma), no line-continuation backslash."""
    text = ""
    for piece in (line.strip() for line in lines):
        if not piece:
            continue
        text = text.removesuffix("\\").rstrip()
        if text.endswith(",") and piece[0] in _CLOSING:
            text = text[:-1]
        glue = "" if not text or text[-1] in _OPENING or piece[0] in _CLOSING + "." else " "
        text += glue + piece
    return text


@functools.lru_cache(maxsize=16)
def parsed_source(path: str) -> tuple[ast.Module, str] | None:
    """The syntax tree and text of a run's copy of a source file (`Trace.source_copy`); None where it cannot be read
    or parsed."""
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        return ast.parse(source, path), source
    except (OSError, SyntaxError, ValueError):
        return None
