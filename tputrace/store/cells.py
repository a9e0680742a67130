"""How the reader turns a stored value into what every view gets: text with its control characters
escaped, a run's argv decoded, a frame's line as a whole number, whatever a damaged file holds."""

from __future__ import annotations

import json
from typing import Any

from tputrace.wording import printable


def identity(value: Any) -> Any:
    return value


def text(value: Any) -> Any:
    """A TEXT column's value with its control characters written as escapes (`\\x1b`): a trace is another
    person's text, and an escape sequence in a name would act on the terminal of whoever views it."""
    return printable(value) if isinstance(value, str) else value


def text_column(row: tuple[Any, ...]) -> str | None:
    """A string's text (`text`); None for a value that is not text (a damaged file's NULL, number or blob), read
    as an unknown id is, so that every view gets text or None from `Trace.string`."""
    return printable(row[0]) if isinstance(row[0], str) else None


def line_number(line: Any) -> int:
    """A frame's line; 0 for a value that is not a whole number (a damaged file's NULL or text)."""
    return line if isinstance(line, int) else 0


def decode_argv(value: str | None) -> tuple[str, ...]:
    """`runs.argv` (a JSON list) as a tuple of printable strings; a value that is not JSON is one argument."""
    if value is None:
        return ()
    try:
        decoded = json.loads(value)
    except ValueError:
        return (printable(value),)
    if isinstance(decoded, list):
        return tuple(printable(str(item)) for item in decoded)
    return (printable(str(decoded)),)
