"""Starting and stopping a run's recording: what `tputrace run`, benchmarks and tests call.

`start` loads the backend, chooses the eager mode (until `stop`), and makes a new `Recorder` this
process's recording; the processes the script forks or starts from then on record as its children
(`tputrace.recording.forking`, `spawning`, `command_exits`). `stop` ends it however the script ended
(and, in a launched rank, notes that end for the launcher: `tputrace.recording.exits.note_script_end`).
"""

from __future__ import annotations

import os

from tputrace.recording import lineage, session, spawning
from tputrace.recording.exits import note_script_end
from tputrace.recording.fork_merge import clear_stale
from tputrace.recording.readings import BackendReadings
from tputrace.recording.recorder import Recorder
from tputrace.recording.recording_window import WindowSpec
from tputrace.recording.session import live_compiles, live_counts

__all__ = ["live_compiles", "live_counts", "map_cuda_to_tpu", "start", "stop"]


def start(path: str | None, *, script: str, argv: list[str], mode: str = "defer", rank: int | None = None, world_size: int | None = None,
          window: WindowSpec | None = None) -> Recorder:
    """Load the backend, choose the eager mode (until `stop`), and start recording into `path` (None:
    record nothing), only the steps `window` keeps (None: all).

    A recording of its own even in a process a recorded one started (a nested `tputrace run`)."""
    if session.current() is not None:
        raise RuntimeError("a tputrace recording is already running in this process")
    inherited_parent = lineage.forget_parent()
    import tputrace.backend  # noqa: F401 - registers the tpu device

    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    previous_mode = session.eager_mode_name()
    eager_mode_before = previous_mode if session.switch_eager_mode(mode) else None
    if path is not None:
        clear_stale(path)
    try:
        recorder = Recorder(path, script=script, argv=argv, mode=mode, rank=rank, world_size=world_size, device=BackendReadings(),
                            window=window)
    except BaseException:
        session.restore_eager_mode(eager_mode_before)
        raise
    session.begin(recorder, inherited_parent=inherited_parent, eager_mode_before=eager_mode_before)
    spawning.install()
    lineage.export(recorder)
    return recorder


def stop(exit_status: int | None, error: str | None = None) -> None:
    """End the recording however the script ended (`tputrace.recording.session.stop`); in a rank of
    `tputrace run --nproc`, first note that end for the launcher, which reads it even with `--no-trace`."""
    note_script_end(exit_status, error)
    session.stop(exit_status, error)


def map_cuda_to_tpu() -> None:
    """Make a script written for CUDA run on tpu (`tputrace run --as-cuda`; see `tputrace.backend.compat.as_cuda`)."""
    from tputrace.backend.compat import as_cuda

    as_cuda.install()
