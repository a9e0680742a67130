"""Recording the fresh interpreters a recorded script starts: multiprocessing's spawn and forkserver
children (`mp.get_context("spawn").Process`, `DataLoader(multiprocessing_context="spawn")`,
`torch.multiprocessing.spawn`) and Python commands it runs (`subprocess.run([sys.executable, ...])`).

Each recording process says who it is in the environment (`tputrace.recording.lineage`), so that
every process started below it knows its nearest recorded ancestor. Such a process records once it
has the backend: the backend's import calls `record_if_started_by_a_recording` (through
`tputrace.recording.interface.backend_loaded`), which sets the parent's eager mode and starts the
child's recording; its file is created at its first compile.

- A spawn or forkserver child has the backend loaded as its parent has under `tputrace run`, so the
  script may use the tpu there without importing `tputrace.backend`: its preparation data (what
  multiprocessing sends before the script is re-imported as `__mp_main__`) carries a `_ChildStart`,
  whose unpickling loads the backend and marks the process as a spawn or forkserver child. Its
  recording ends when the process's `run` ends, with its exit status, as a forked multiprocessing
  child's does. Loading the backend is most of what such a child costs to start.
- A command is recorded only if it imports `tputrace.backend` itself: nothing of the parent's runs
  in it before its own code, and nothing could without changing how every Python program the script
  runs starts (a `sitecustomize` on its path). It records with its own command line as the run's
  script and argv; its exit status is written by the process that waits on it
  (`tputrace.recording.command_exits`), as Python's exit hooks cannot see it.

Either records like a forked child (`tputrace.recording.forking`): `<trace>.forks/rank<N>.tptrace`,
merged into the root's trace when the root's recording ends. A nested `tputrace run` starts a
recording of its own instead (`lineage.forget_parent`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from tputrace.recording import command_exits, forking, lineage, session
from tputrace.recording.interface import PARENT_ENV
from tputrace.recording.lineage import ParentRecording

_PREPARATION_KEY = "tputrace_child_start"

_multiprocessing_start: str | None = None
_original_preparation_data: Callable[[str], dict[str, Any]] | None = None


def install() -> None:
    """Start a recording in each process forked, spawned, started through a forkserver or run as a
    Python command from now on (idempotent)."""
    _install_child_start()
    command_exits.install()
    forking.install()


def _install_child_start() -> None:
    """Load the backend into every spawn and forkserver child started from now on, and record it
    (idempotent)."""
    global _original_preparation_data
    if _original_preparation_data is not None:
        return
    from multiprocessing import spawn

    _original_preparation_data = spawn.get_preparation_data
    spawn.get_preparation_data = _preparation_data_with_child_start


def _preparation_data_with_child_start(name: str) -> dict[str, Any]:
    assert _original_preparation_data is not None
    data = _original_preparation_data(name)
    parent = os.environ.get(PARENT_ENV)
    if parent is not None:
        data[_PREPARATION_KEY] = _ChildStart(parent)  # multiprocessing's prepare() ignores keys it does not know
    return data


class _ChildStart:
    """Unpickled in a spawn or forkserver child before anything else of the parent's: loads the
    backend and marks the process as a multiprocessing child, recorded as such.

    It pickles as a call of `exec` on a few lines that do nothing when the child cannot import
    tputrace (it was importable in the parent only through a `sys.path` change), so the child starts
    either way."""

    def __init__(self, parent_json: str) -> None:
        self.parent_json = parent_json

    def __reduce__(self) -> tuple[Any, tuple[str, dict[str, Any]]]:
        source = (
            "try:\n"
            "    from tputrace.recording import spawning\n"
            "except ImportError:\n"
            "    pass\n"
            "else:\n"
            f"    spawning.start_multiprocessing_child({self.parent_json!r})\n"
        )
        return exec, (source, {})


def start_multiprocessing_child(parent_json: str) -> None:
    """In a spawn or forkserver child, before the script is re-imported: load the backend (the script
    may use the tpu at its top, as in the parent) and record this process until its `run` ends."""
    global _multiprocessing_start
    from multiprocessing import spawn

    _multiprocessing_start = "spawn" if spawn.is_forking(sys.argv) else "forkserver"
    os.environ[PARENT_ENV] = parent_json  # a forkserver child inherits the server's environment, not the parent's
    forking.stop_when_bootstrapped_run_ends()
    import tputrace.backend  # noqa: F401 - registers the tpu device; a first import starts the recording

    record_if_started_by_a_recording()  # the backend was imported before (by a forkserver preloading the script)


def record_if_started_by_a_recording() -> None:
    """Called when the backend is imported: start this process's recording if a recorded process
    started it (it has `PARENT_ENV`) and it records nothing yet."""
    parent_json = os.environ.get(PARENT_ENV)
    if parent_json is None:
        return
    if session.current() is not None:
        return
    start_method = _multiprocessing_start
    if start_method is None:
        import multiprocessing.process

        if getattr(multiprocessing.process.current_process(), "_inheriting", False):
            return  # a forkserver importing the script to fork children from: not a child itself
        start_method = "command"
    parent = ParentRecording.from_json(parent_json)
    if start_method == "command":
        script, argv = _command_line()
    else:
        script, argv = parent.script, parent.argv
    start_child(parent, start_method, script=script, argv=argv)


def start_child(parent: ParentRecording, start_method: str, *, script: str, argv: list[str]) -> None:
    """In a process a recorded one started as a fresh interpreter (the backend is loaded): run in the
    parent's eager mode and record as its child, unless the parent records nothing."""
    session.switch_eager_mode(parent.mode)
    if parent.trace is None:
        install()  # its own spawn children still get the tpu
        return
    recorder = forking.child_recorder(parent, start_method, script=script, argv=argv)
    session.begin(recorder)
    install()
    lineage.export(recorder)
    forking.save_rows_at_os_exit()
    if start_method == "command":  # no multiprocessing `run` to wrap: its interpreter's exit ends it
        session.stop_at_interpreter_exit()


def _command_line() -> tuple[str, list[str]]:
    """A command's script (an absolute path where it is a file) and arguments."""
    if not sys.argv or not sys.argv[0]:
        return "python", []
    script = sys.argv[0]
    if os.path.isfile(script):
        script = os.path.abspath(script)
    return script, sys.argv[1:]
