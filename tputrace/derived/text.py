"""TEXT columns read in SQL, shown as the reader shows its own (`Trace.records`)."""

from __future__ import annotations

from typing import Any

from tputrace.wording import printable


def shown(value: Any) -> str | None:
    """A TEXT column read in SQL, with control characters written as escapes (so that a trace's escape
    sequences cannot act on a terminal); a damaged file's number as its digits."""
    if value is None:
        return None
    return printable(value) if isinstance(value, str) else str(value)
