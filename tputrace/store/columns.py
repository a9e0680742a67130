"""Columns on a source line: the UTF-8 byte offsets Python's code positions give, as character offsets.

`code.co_positions()` (and so a trace written before frames had `end_line`) counts bytes of the line's
UTF-8 text; editors, tracebacks and `str` slicing count characters. The two differ after any non-ASCII
character ("é", a CJK comment, an identifier like `résumé`)."""

from __future__ import annotations

import linecache


def character_offset(line_text: str, byte_offset: int) -> int:
    """The character offset in `line_text` of UTF-8 byte offset `byte_offset` (a split character counts
    as the one it starts in)."""
    return len(line_text.encode()[:byte_offset].decode(errors="ignore"))


def line_character_offset(file: str, line: int, byte_offset: int) -> int:
    """`character_offset` on line `line` of `file`; `byte_offset` unchanged when the line cannot be read
    (the same on an ASCII line)."""
    line_text = linecache.getline(file, line)
    return character_offset(line_text, byte_offset) if line_text else byte_offset
