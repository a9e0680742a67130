"""A trace's interned values: the strings and source locations its records refer to by id, read whole
at first use, and the copies of source files the run saw (which older traces' byte columns need)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tputrace.source_digests import SourceDigest
from tputrace.store import cells
from tputrace.store.columns import line_character_offset
from tputrace.store.connection import TraceConnection
from tputrace.store.records import SourceLocation
from tputrace.store.sources import copy_as_run_saw
from tputrace.wording import printable

_Value = TypeVar("_Value")


class InternedValues:
    """Strings and frames by id, and source copies by recorded path, of one trace."""

    def __init__(self, connection: TraceConnection, source_roots: tuple[str, ...]) -> None:
        self._connection = connection
        self._source_roots = source_roots
        self._strings: dict[int, str] | None = None
        self._frames: dict[int, SourceLocation] | None = None
        self._seen_digests: dict[str, frozenset[SourceDigest]] | None = None
        self._column_texts: dict[str, str | None] = {}
        self._source_copies: dict[str, str | None] = {}

    def string(self, sid: int | None) -> str | None:
        """The text of string id `sid` (None for None or an unknown id)."""
        return self._interned(self.string_table, sid, "SELECT text FROM strings WHERE id = ?", cells.text_column)

    def frame(self, frame_id: int | None) -> SourceLocation | None:
        """The source location of frame id `frame_id` (None for None or an unknown id), columns in characters."""
        return self._interned(self.frame_table, frame_id,
                              f"SELECT file_sid, line, function_sid, {self._frame_columns()} FROM frames WHERE id = ?",
                              self._location)

    def string_table(self) -> dict[int, str]:
        if self._strings is None:
            rows = self._connection.sql("SELECT id, text FROM strings")
            self._strings = {sid: printable(text) for sid, text in rows if isinstance(text, str)}
        return self._strings

    def frame_table(self) -> dict[int, SourceLocation]:
        if self._frames is None:
            strings = self.string_table()
            self._frames = {
                frame_id: self._source_location(strings.get(file_sid) or "?", cells.line_number(line), strings.get(function_sid) or "?",
                                                *columns)
                for frame_id, file_sid, line, function_sid, *columns in self._connection.sql(
                    f"SELECT id, file_sid, line, function_sid, {self._frame_columns()} FROM frames"
                )
            }
        return self._frames

    def unchecked_column_files(self) -> list[str]:
        """The recorded files whose calls' columns could not be checked (see `Trace.unchecked_column_files`)."""
        return sorted({location.file for location in self.frame_table().values() if location.columns_unchecked})

    def source_copy(self, file: str) -> str | None:
        """The copy of recorded source `file` whose content is the one the run saw (see `Trace.source_copy`)."""
        if file not in self._source_copies:
            seen = self._source_digests().get(file)
            copy = None if seen is None else copy_as_run_saw(file, self._source_roots, seen)
            self._source_copies[file] = None if copy is None else str(copy)
        return self._source_copies[file]

    def _interned(self, table: Callable[[], dict[int, _Value]], key: int | None, query: str,
                  build: Callable[[tuple[Any, ...]], _Value | None]) -> _Value | None:
        """The value of an interned id: from its table (read whole at first use), else (written since
        then by a live writer) its row read by `query` and kept; None for None, an unknown id or a row
        that `build` reads as no value."""
        if key is None:
            return None
        values = table()
        value = values.get(key)
        if value is None:
            rows = self._connection.sql(query, (key,))
            if rows:
                value = build(rows[0])
                if value is not None:
                    values[key] = value
        return value

    def _location(self, row: tuple[Any, ...]) -> SourceLocation:
        file_sid, line, function_sid, *columns = row
        return self._source_location(self.string(file_sid) or "?", cells.line_number(line), self.string(function_sid) or "?",
                                     *columns)

    def _frame_columns(self) -> str:
        """`col, end_col, end_line` of `frames`, NULL for those a file from an older writer lacks."""
        stored = self._connection.stored_columns("frames")
        return ", ".join(name if name in stored else "NULL" for name in ("col", "end_col", "end_line"))

    def _source_location(self, file: str, line: int, function: str, col: int | None, end_col: int | None,
                         end_line: int | None) -> SourceLocation:
        """A frame's location with character columns: a file whose frames have `col` but no `end_line` stored
        UTF-8 byte offsets on `line` (a call going on past it without an end), converted here from the line's
        text: of the copy the run saw where the trace has the file's digest (no columns when there is none),
        else of the file at its recorded path where it can be read."""
        if col is not None and "end_line" not in self._connection.stored_columns("frames"):
            text_file = self._column_text_file(file)
            if text_file is None:
                return SourceLocation(file, line, function, columns_unchecked=True)
            col = line_character_offset(text_file, line, col)
            if end_col is not None:
                end_col, end_line = line_character_offset(text_file, line, end_col), line
        return SourceLocation(file, line, function, col, end_col, end_line)

    def _column_text_file(self, file: str) -> str | None:
        """The file whose text turns `file`'s byte columns into characters: `file` itself when the trace has no
        digest of it (as before digests were recorded), else the copy with a recorded digest, or None."""
        if file not in self._column_texts:
            self._column_texts[file] = self.source_copy(file) if file in self._source_digests() else file
        return self._column_texts[file]

    def _source_digests(self) -> dict[str, frozenset[SourceDigest]]:
        """Every rank's recorded digests of each source file, by recorded path."""
        if self._seen_digests is None:
            digests: dict[str, set[SourceDigest]] = {}
            if self._connection.has_table("source_files"):
                for file_sid, sha256, size in self._connection.sql("SELECT file_sid, sha256, size FROM source_files ORDER BY rowid"):
                    file = self.string(file_sid)
                    if file is not None:
                        digests.setdefault(file, set()).add(SourceDigest(cells.text(sha256), size))
            self._seen_digests = {file: frozenset(seen) for file, seen in digests.items()}
        return self._seen_digests
