"""tputrace: a profiler for PyTorch on TPUs.

`tputrace.open(path)` reads a trace; `tputrace run script.py` records one. Importing this package is
cheap and never imports torch or jax; everything below is imported on first use.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from tputrace.performance_warnings import (
    CpuFallbackWarning,
    HostSyncWarning,
    PerformanceWarning,
    RecompileWarning,
    TransferWarning,
)
from tputrace.version import __version__

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tputrace.store.reader import Trace

__all__ = [
    "CpuFallbackWarning",
    "HostSyncWarning",
    "PerformanceWarning",
    "RecompileWarning",
    "TraceError",
    "TputraceError",
    "TransferWarning",
    "__version__",
    "annotate",
    "open",
    "record",
    "start",
    "step",
    "stop",
]


def open(path: str | os.PathLike[str], *, source_roots: Sequence[str | os.PathLike[str]] = ()) -> Trace:  # noqa: A001 - `tputrace.open` is the public name
    """Open a trace file for reading; raises `TraceError` with a one-sentence message if it cannot.
    `source_roots` are searched for the copy of a source file the run saw (see `open_trace`)."""
    from tputrace.store.reader import open_trace

    return open_trace(path, source_roots=source_roots)


def step() -> None:
    """Mark a training-step boundary in the running recording."""
    from tputrace.recording import session

    session.step()


def start() -> None:
    """Start recording, under `tputrace run --from-code` (elsewhere: nothing happens)."""
    _window_from_code(True)


def stop() -> None:
    """Stop recording, under `tputrace run --from-code` (elsewhere: nothing happens); the script runs on."""
    _window_from_code(False)


class record(contextlib.ContextDecorator):  # noqa: N801 - used like a function: `with tputrace.record():`
    """Record what runs inside (`start()` on entry, `stop()` on exit), under `tputrace run --from-code`."""

    def __enter__(self) -> record:
        start()
        return self

    def __exit__(self, *exc: object) -> None:
        stop()


def _window_from_code(start: bool) -> None:
    """Outside a recording this reads one attribute: the recording modules are imported only by a recording."""
    from tputrace.recording import interface

    if interface.active() is not None:
        from tputrace.recording import session

        session.window_from_code(start)


def annotate(name: str) -> Any:
    """A context manager (and decorator) that records a named range in the running recording."""
    from tputrace.recording import session

    return session.annotate(name)


def __getattr__(name: str) -> Any:
    if name in ("TputraceError", "TraceError"):
        from tputrace.store import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'tputrace' has no attribute {name!r}")
