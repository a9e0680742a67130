"""Argument types shared by the subcommands' parsers."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def whole_number_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` for a whole number of at least `minimum`; any other value is a usage error
    (`argument --top: must be at least 1, not 0`), before the trace is opened."""

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {number}")
        return number

    return parse


def require_rank(trace: Any, rank: int | None, shown_path: object) -> None:
    """Raise a one-line `TputraceError` when `rank` (None: the trace's first) is not one of `trace`'s ranks."""
    from tputrace.store.errors import TputraceError

    if rank is not None and rank not in trace.ranks:
        ranks = ", ".join(str(candidate) for candidate in trace.ranks)
        raise TputraceError(f"{shown_path} has no rank {rank} (ranks: {ranks})")
