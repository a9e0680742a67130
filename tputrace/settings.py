"""Settings the backend reads from environment variables, checked with the standard library only (the
CLI checks them before it imports the backend, so that a bad value is a one-line error)."""

from __future__ import annotations

import os

CHIPS = ("TPUTRACE_CHIPS", 1, "the number of chips")
MAX_PROGRAMS = ("TPUTRACE_MAX_PROGRAMS", 4096, "how many compiled programs to keep")
COUNTS = (CHIPS, MAX_PROGRAMS)


class SettingError(ValueError):
    """An environment variable's value that the backend cannot use."""


def positive_int(setting: tuple[str, int, str], error: type[Exception] = SettingError) -> int:
    """The whole number of at least 1 that `setting`'s (name, default, meaning) variable holds, or its
    default when unset; `error` says what to set otherwise."""
    name, default, meaning = setting
    raw = os.environ.get(name, str(default))
    try:
        count = int(raw)
    except ValueError:
        raise error(f"{name}={raw!r} is not a number; set it to {meaning}, e.g. {default if default > 1 else 4}") from None
    if count < 1:
        raise error(f"{name}={count} must be at least 1")
    return count


def check() -> None:
    """Raise `SettingError` for the first count setting whose value is not usable."""
    for setting in COUNTS:
        positive_int(setting)
