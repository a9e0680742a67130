"""Out-of-memory forensics: the live set when a run failed with an out-of-memory error (XLA's RESOURCE_EXHAUSTED),
or the first moment its live bytes went over the target chip's HBM."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis.memory_peak import PeakBreakdown
from tputrace.derived.memory_timeline import BufferLifetime, MemoryPeak, chips_of, first_over, moment
from tputrace.frame_files import is_user_file

# XLA's allocator, torch's wording, and numpy's when a tensor's host copy cannot be made.
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory", "OutOfMemory", "MemoryError")
_TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>.+))?$', re.MULTILINE)


@dataclass(frozen=True)
class OutOfMemory:
    """Where a run ran out of memory: `cause` is `error` (the run raised one; `live` is what was live at the last
    allocation before it, when the failing op asked for more) or `target` (live bytes first went over the target's
    HBM then); `message` is the error's last line, or the limit; `file` and `line` the user's line that raised it
    (the innermost frame of the traceback in the user's code), when the error's traceback names one."""

    cause: str
    message: str
    live: MemoryPeak
    file: str | None = None
    line: int | None = None


def is_out_of_memory(error: str | None) -> bool:
    return error is not None and any(marker in error for marker in OOM_MARKERS)


def failing_line(error: str, script: str | None) -> tuple[str, int] | None:
    """The user's line an error's traceback ends in (`failing_frame`'s file and line)."""
    frame = failing_frame(error, script)
    return None if frame is None else (frame[0], frame[1])


def traceback_frames(error: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of each frame of a formatted traceback, outermost first."""
    return [(match["file"], int(match["line"]), match["function"] or "") for match in _TRACEBACK_FRAME.finditer(error)]


def failing_frame(error: str, script: str | None) -> tuple[str, int, str] | None:
    """(file, line, function) of the user's frame an error's traceback ends in: its innermost frame outside library
    code, else its innermost frame in the run's script; None when the traceback names neither."""
    frames = traceback_frames(error)
    users = [frame for frame in frames if is_user_file(frame[0])]
    if users:
        return users[-1]
    in_script = [frame for frame in frames if script is not None and frame[0] == script]
    return in_script[-1] if in_script else None


def out_of_memory(buffers: Sequence[BufferLifetime], error: str | None, hbm_bytes: int,
                  script: str | None = None) -> OutOfMemory | None:
    """The out-of-memory moment of a run: its error's, else the first overrun of `hbm_bytes`; None when neither.
    `script` is the run's script, whose frames name the line that failed."""
    if not buffers:
        return None
    if is_out_of_memory(error):
        assert error is not None
        # Buffers freed after the last allocation were freed by the failure unwinding the script.
        last_alloc_ns = max(buffer.alloc_ns for buffer in buffers)
        moments = [moment(buffers, chip, last_alloc_ns) for chip in chips_of(buffers)]
        fullest = max(moments, key=lambda live: live.bytes)
        last_line = next((line.strip() for line in reversed(error.strip().splitlines()) if line.strip()), error)
        failed_at = failing_line(error, script)
        return OutOfMemory("error", last_line, fullest, failed_at[0] if failed_at else None, failed_at[1] if failed_at else None)
    # Host memory (chip -1, an imported capture's) is not weighed against the chips' HBM.
    overruns = [over for over in (first_over(buffers, chip, hbm_bytes) for chip in chips_of(buffers) if chip >= 0)
                if over is not None]
    if not overruns:
        return None
    return OutOfMemory("target", f"live bytes went over {hbm_bytes} bytes", min(overruns, key=lambda over: over.t_ns))


@dataclass(frozen=True)
class OutOfMemoryData:
    """The live set where the run ran out of memory: `cause` error (the run raised it) or target (first over its HBM)."""

    cause: str
    message: str
    live: PeakBreakdown
    file: str | None = None
    line: int | None = None
