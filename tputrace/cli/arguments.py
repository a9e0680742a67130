"""Argument types shared by the subcommands' parsers."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
