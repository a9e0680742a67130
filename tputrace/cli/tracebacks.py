"""A script's traceback as `tputrace run` prints and records it: Python's own format, without the launcher's frames
above the script and without the tpu backend's frames below the user's call, as an error on torch's CPU device
would read (`TPUTRACE_BACKEND_FRAMES=1` keeps them, for a report of a backend bug)."""

from __future__ import annotations

import os
import runpy
import traceback
from collections.abc import Callable
from types import FrameType, TracebackType

from tputrace import settings, sourceloc

_LAUNCHER_FILES = (runpy.__file__, "<frozen runpy>")


def user_traceback(error: BaseException, launcher_file: str) -> str:
    """`error` formatted as Python would, less the frames of `launcher_file` and runpy above the script and, unless
    `TPUTRACE_BACKEND_FRAMES=1`, the backend's frames where the error came out of it (each chained exception too)."""
    trace: TracebackType | None = error.__traceback__
    while trace is not None and _is_launcher_frame(trace.tb_frame, launcher_file):
        trace = trace.tb_next
    formatted = traceback.TracebackException(type(error), error, trace)
    if not settings.backend_frames_shown():
        _hide_backend_frames(formatted, _is_backend_file(), _is_library_file(), set())
    return "".join(formatted.format())


def _is_launcher_frame(frame: FrameType, launcher_file: str) -> bool:
    return frame.f_code.co_filename in (launcher_file, *_LAUNCHER_FILES)


def _hide_backend_frames(formatted: traceback.TracebackException, is_backend: Callable[[str], bool],
                         is_library: Callable[[str], bool], seen: set[int]) -> None:
    """Cut each traceback at its first frame of the backend, when the frames from there on are the backend's or
    libraries' (a user's hook that the backend called keeps the whole stack), saying how many were hidden."""
    if id(formatted) in seen:
        return
    seen.add(id(formatted))
    frames = list(formatted.stack)
    first = next((index for index, frame in enumerate(frames) if is_backend(frame.filename)), None)
    if first is not None and first > 0 and all(is_library(frame.filename) for frame in frames[first:]):
        hidden = len(frames) - first
        formatted.stack = traceback.StackSummary.from_list(frames[:first])
        note = (f"({hidden} frame{'s' if hidden != 1 else ''} inside tputrace's tpu backend hidden; "
                f"{settings.BACKEND_FRAMES}=1 shows them)")
        formatted.__notes__ = [*(formatted.__notes__ or []), note]
    for chained in (formatted.__cause__, formatted.__context__):
        if chained is not None:
            _hide_backend_frames(chained, is_backend, is_library, seen)


def _is_backend_file() -> Callable[[str], bool]:
    directories = tuple(directory + os.sep for directory in (sourceloc.backend_dir(), sourceloc.TPUTRACE_DIR) if directory)
    return lambda filename: os.path.abspath(filename).startswith(directories)


def _is_library_file() -> Callable[[str], bool]:
    roots = sourceloc.library_roots()
    return lambda filename: not sourceloc.is_user_file(filename, roots)
