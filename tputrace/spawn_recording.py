"""Recording the fresh interpreters a recorded script starts: multiprocessing's spawn and forkserver
children (`mp.get_context("spawn").Process`, `DataLoader(multiprocessing_context="spawn")`,
`torch.multiprocessing.spawn`) and Python commands it runs (`subprocess.run([sys.executable, ...])`).

Each recording process says who it is in the environment (`PARENT_ENV`: its trace, ranks, pid,
mode, script), so that every process started below it knows its nearest recorded ancestor. Such a
process records once it has the backend: the backend's import calls
`record_if_started_by_a_recording`, which sets the parent's eager mode and starts the child's
recording; its file is created at its first compile.

- A spawn or forkserver child has the backend loaded as its parent has under `tputrace run`, so the
  script may use the tpu there without importing `tputrace.backend`: its preparation data (what
  multiprocessing sends before the script is re-imported as `__mp_main__`) carries a `_ChildStart`,
  whose unpickling loads the backend and marks the process as a spawn or forkserver child. Its
  recording ends when the process's `run` ends, with its exit status, as a forked multiprocessing
  child's does. Loading the backend is most of what such a child costs to start (see the README).
- A command is recorded only if it imports `tputrace.backend` itself: nothing of the parent's runs
  in it before its own code, and nothing could without changing how every Python program the script
  runs starts (a `sitecustomize` on its path). It records with its own command line as the run's
  script and argv; its exit status is written by the process that waits on it
  (`tputrace.command_exits`), as Python's exit hooks cannot see it.

Either records like a forked child (`tputrace.fork_recording`): `<trace>.forks/rank<N>.tptrace`,
merged into the root's trace when the root's recording ends. A nested `tputrace run` starts a
recording of its own instead (`forget_parent`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tputrace.recorder import Recorder

PARENT_ENV = "TPUTRACE_PARENT_RECORDING"
_PREPARATION_KEY = "tputrace_child_start"

_multiprocessing_start: str | None = None
_original_preparation_data: Callable[[str], dict[str, Any]] | None = None


@dataclass(frozen=True)
class ParentRecording:
    """The recorded process a child descends from, as the environment carries it."""

    trace: str | None  # the root's trace, where children's traces are merged (None: --no-trace)
    root_rank: int
    world_size: int
    rank: int
    pid: int
    mode: str
    script: str
    argv: list[str]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ParentRecording:
        return cls(**json.loads(text))


def describe(recorder: Recorder) -> ParentRecording:
    """`recorder` as the processes it starts see it."""
    return ParentRecording(
        trace=recorder.fork_root,
        root_rank=recorder.root_rank,
        world_size=recorder.world_size,
        rank=recorder.rank,
        pid=recorder.pid,
        mode=recorder.mode,
        script=recorder.script,
        argv=recorder.argv,
    )


def export(recorder: Recorder) -> None:
    """Tell the processes started from now on that `recorder` is their nearest recorded ancestor."""
    os.environ[PARENT_ENV] = describe(recorder).to_json()


def forget_parent() -> str | None:
    """Drop the inherited description (a root recording starts); returns it, for `restore`."""
    return os.environ.pop(PARENT_ENV, None)


def restore(previous: str | None) -> None:
    """Put back what `forget_parent` returned, once a root recording has stopped."""
    if previous is None:
        os.environ.pop(PARENT_ENV, None)
    else:
        os.environ[PARENT_ENV] = previous


def install() -> None:
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
            "    from tputrace import spawn_recording\n"
            "except ImportError:\n"
            "    pass\n"
            "else:\n"
            f"    spawn_recording.start_multiprocessing_child({self.parent_json!r})\n"
        )
        return exec, (source, {})


def start_multiprocessing_child(parent_json: str) -> None:
    """In a spawn or forkserver child, before the script is re-imported: load the backend (the script
    may use the tpu at its top, as in the parent) and record this process until its `run` ends."""
    global _multiprocessing_start
    from multiprocessing import spawn

    from tputrace import fork_recording

    _multiprocessing_start = "spawn" if spawn.is_forking(sys.argv) else "forkserver"
    os.environ[PARENT_ENV] = parent_json  # a forkserver child inherits the server's environment, not the parent's
    fork_recording.stop_when_bootstrapped_run_ends()
    import tputrace.backend  # noqa: F401 - registers the tpu device; a first import starts the recording

    record_if_started_by_a_recording()  # the backend was imported before (by a forkserver preloading the script)


def record_if_started_by_a_recording() -> None:
    """Called when the backend is imported: start this process's recording if a recorded process
    started it (it has `PARENT_ENV`) and it records nothing yet."""
    parent_json = os.environ.get(PARENT_ENV)
    if parent_json is None:
        return
    from tputrace import recorder as recorder_module

    if recorder_module.active() is not None:
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
    recorder_module.start_child(parent, start_method, script=script, argv=argv)


def _command_line() -> tuple[str, list[str]]:
    """A command's script (an absolute path where it is a file) and arguments."""
    if not sys.argv or not sys.argv[0]:
        return "python", []
    script = sys.argv[0]
    if os.path.isfile(script):
        script = os.path.abspath(script)
    return script, sys.argv[1:]
