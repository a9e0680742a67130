"""How a recorded run ended, in words: the exception's own line of its traceback, its exit status (with the signal
that killed it)."""

from __future__ import annotations

def raised_line(error: str) -> str:
    """The exception's own line (`ValueError: ...`) of a formatted traceback: the first unindented line
    after its last traceback's frames, not the text some exceptions add after it (Dynamo's `from user
    code:` frames and its `TORCHDYNAMO_VERBOSE` hint); the last line of a text that is no traceback."""
    lines = error.strip().splitlines()
    starts = [index for index, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        for line in lines[starts[-1] + 1:]:
            if line.strip() and not line[0].isspace():
                return line
    return lines[-1] if lines else ""


def exit_text(exit_status: int | None) -> str:
    """How a run that has its end record ended: `exit N`, or that its status was not seen (a Python
    command nothing waited on through `subprocess`, see `tputrace.recording.command_exits`)."""
    return "ended (exit status not seen)" if exit_status is None else f"exit {exit_status}"


def signal_note(exit_status: int) -> str:
    """' (killed by SIGKILL)' for a shell's exit status 128 + N of a known signal N, else ''."""
    import signal

    try:
        return f" (killed by {signal.Signals(exit_status - 128).name})" if exit_status > 128 else ""
    except ValueError:
        return ""
