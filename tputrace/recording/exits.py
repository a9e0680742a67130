"""How a recorded run's end becomes its exit status, as a shell reports it, and SIGTERM while a
recording runs and while its trace is finished. Standard library only."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_SCRIPT_RAISED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM


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
