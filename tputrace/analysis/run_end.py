"""What the report's header says of a run that did not end well: the exception its script raised and the user's line
it came out of, an exit status other than 0, or no end record."""

from __future__ import annotations

import os

from tputrace.analysis.memory_oom import failing_frame
from tputrace.derived.run_endings import exit_text, raised_line, signal_note
from tputrace.store.records import RunInfo


def bad_ending(run: RunInfo) -> str | None:
    """What the report's header says of a run that did not end well (None where it exited 0): the exception the
    script raised and the user's line it came out of, an exit status other than 0, or no end record."""
    if not run.finished:
        return "no end record (still running, or killed): findings cover what was recorded"
    if run.error:
        where = failing_frame(run.error, run.script)
        at = "" if where is None else f" at {os.path.basename(where[0])}:{where[1]}" + (
            "" if not where[2] or where[2].startswith("<") else f" in {where[2]}()")
        status = f" (exit {run.exit_status})" if run.exit_status is not None else ""
        return f"the script raised {raised_line(run.error)}{at}{status}: findings cover the run up to there"
    if run.exit_status:
        return f"{exit_text(run.exit_status)}{signal_note(run.exit_status)}"
    return None

