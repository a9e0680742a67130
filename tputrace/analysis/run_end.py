"""What the report's header says of a run that did not end well: the exception its script raised and the user's line
it came out of, an exit status other than 0, or no end record."""

from __future__ import annotations

import os
import re

from tputrace.derived.run_endings import exit_text, raised_line, signal_note
from tputrace.store.records import RunInfo

_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$', re.MULTILINE)
# Frames of installed packages and the standard library (`tputrace run` leaves the backend's out of the traceback).
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3")


def bad_ending(run: RunInfo) -> str | None:
    """What the report's header says of a run that did not end well (None where it exited 0): the exception the
    script raised and the user's line it came out of, an exit status other than 0, or no end record."""
    if not run.finished:
        return "no end record (still running, or killed): findings cover what was recorded"
    if run.error:
        where = _last_user_frame(run.error)
        at = "" if where is None else f" at {os.path.basename(where[0])}:{where[1]}" + (
            "" if where[2].startswith("<") else f" in {where[2]}()")
        status = f" (exit {run.exit_status})" if run.exit_status is not None else ""
        return f"the script raised {raised_line(run.error)}{at}{status}: findings cover the run up to there"
    if run.exit_status:
        return f"{exit_text(run.exit_status)}{signal_note(run.exit_status)}"
    return None


def _last_user_frame(error: str) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame of the traceback's last exception outside libraries, or None."""
    frames = list(_FRAME.finditer(error[error.rfind("Traceback (most recent call last)"):]))
    for frame in reversed(frames):
        if not frame["file"].startswith("<") and not any(part in frame["file"] for part in _LIBRARY_PARTS):
            return frame["file"], int(frame["line"]), frame["function"]
    return None
