"""How a recorded run's end becomes its exit status, as a shell reports it, SIGTERM while a
recording runs and while its trace is finished, and the note a launched rank leaves of how its script
ended (`note_script_end`), which its launcher reads even when nothing is recorded. Standard library only."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

EXIT_SCRIPT_RAISED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
LAUNCHER_PID_VARIABLE = "TPUTRACE_LAUNCHER_PID"  # tells a rank which process launched it
SCRIPT_ENDS_VARIABLE = "TPUTRACE_SCRIPT_ENDS"  # the folder where a launcher's ranks note how their script ended
_ERROR_LIMIT = 64_000  # characters of a traceback kept in a note: its end, where the exception is


@dataclass(frozen=True)
class ScriptEnd:
    """How a launched rank's script ended, in the rank's own words: its exit status, the traceback it
    raised (None: none), and when (nanoseconds since the epoch)."""

    exit_status: int
    error: str | None
    unix_ns: int


def note_script_end(exit_status: int | None, error: str | None) -> None:
    """In a rank the launcher started itself (not a process the rank forked or started): write how its
    script ended into the launcher's folder, `rank<RANK>.json`, before the trace is finished and the
    process exits. Does nothing elsewhere, for an unknown status, or when the note cannot be written."""
    folder, rank = os.environ.get(SCRIPT_ENDS_VARIABLE), os.environ.get("RANK", "")
    if exit_status is None or not folder or not rank.isdigit() or os.environ.get(LAUNCHER_PID_VARIABLE) != str(os.getppid()):
        return
    note = {"exit_status": exit_status, "error": None if error is None else error[-_ERROR_LIMIT:], "unix_ns": time.time_ns()}
    path = Path(folder) / f"rank{rank}.json"
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        partial.write_text(json.dumps(note))
        os.replace(partial, path)  # the launcher reads a whole note or none
    except OSError:
        return


def read_script_end(folder: Path, rank: int) -> ScriptEnd | None:
    """The note rank `rank` left in `folder` (None: it left none, as a killed rank does, or it is unreadable)."""
    try:
        note = json.loads((folder / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict):
        return None
    exit_status, error, unix_ns = note.get("exit_status"), note.get("error"), note.get("unix_ns")
    if not isinstance(exit_status, int) or not isinstance(unix_ns, int) or not (error is None or isinstance(error, str)):
        return None
    return ScriptEnd(exit_status, error, unix_ns)


def system_exit_status(code: object) -> tuple[int, str | None]:
    """The exit status for `SystemExit(code)` and the message Python would print, as Python does it."""
    if code is None:
        return 0, None
    if isinstance(code, int):
        return int(code), None
    return EXIT_SCRIPT_RAISED, str(code)


def uncaught_status(kind: type[BaseException]) -> int:
    """The exit status of a process ended by an uncaught exception of `kind`: 130 for a KeyboardInterrupt."""
    return EXIT_INTERRUPTED if issubclass(kind, KeyboardInterrupt) else EXIT_SCRIPT_RAISED


def returncode_status(returncode: int) -> int:
    """A `Popen.returncode` as a shell's exit status: -N (killed by signal N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@contextmanager
def sigterm_raises_system_exit() -> Iterator[None]:
    """Turn SIGTERM into `SystemExit(143)` so that finally-blocks (and the recording's `stop`) run."""

    def raise_system_exit(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_system_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold SIGTERM while the trace is finished (a half-closed trace would need a writable file to
    open); a SIGTERM that came meanwhile then ends the process with `SystemExit(143)`. A launcher
    stopping ranks after one failed sends it exactly then; it sends SIGKILL if this takes too long."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if received:
        raise SystemExit(128 + received[0])
