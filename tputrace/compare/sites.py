"""Source sites as comparisons match them: a line still matches when lines above it moved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class SiteKey:
    """A source site as comparisons match it: file, function and the line's text (its number where the
    source is not available), so that a site still matches when lines above it moved."""

    file: str
    function: str
    text: str


def site_key(trace: Trace, source: SourceLocation | None, text_cache: dict[str, list[str] | None]) -> SiteKey | None:
    """The comparison key of `source`: its file, function and stripped line text when the run's copy of the
    file is readable, else its line number."""
    if source is None:
        return None
    return SiteKey(source.file, source.function, line_text(trace, source.file, source.line, text_cache))


def unreadable_files(trace: Trace) -> set[str]:
    """The recorded source files of `trace` whose copy as the run saw it is not readable here (the file
    changed since, or is elsewhere)."""
    return {file for file in trace.source_files() if trace.source_copy(file) is None}


def site_id(key: SiteKey) -> str:
    """`key` as one string, for mappings that must be plain data (JSON)."""
    return f"{key.file}|{key.function}|{key.text}"


def line_text(trace: Trace, file: str, line: int, text_cache: dict[str, list[str] | None]) -> str:
    """The stripped text of `file`'s `line` in the run's copy of the file (`line N` where it is not readable)."""
    if file not in text_cache:
        copy = trace.source_copy(file)
        lines = None
        if copy is not None:
            try:
                with open(copy, encoding="utf-8", errors="replace") as handle:
                    lines = handle.read().splitlines()
            except OSError:
                lines = None
        text_cache[file] = lines
    lines = text_cache[file]
    if lines is not None and 0 < line <= len(lines) and lines[line - 1].strip():
        return lines[line - 1].strip()
    return f"line {line}"
