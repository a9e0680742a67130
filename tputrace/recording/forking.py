"""Recording processes forked during a recording (`os.fork`, multiprocessing's fork start method,
DataLoader workers), as the ranks of `tputrace run --nproc` are recorded: each in a trace of its
own, merged into the parent's trace when the parent's recording ends.

In the child, right after the fork, the parent's recording is dropped (its writer was closed across
the fork, see `tputrace.store.writer`) and, when the child can use the tpu (the parent had not
started JAX's runtime), a recording of its own starts in `<trace>.forks/rank<N>.tptrace`, under the
first free rank (`tputrace.recording.lineage.claim_rank`). The child's recording ends as the
parent's does when the child runs on through the script (`sys.exit`, the script's end), when a
multiprocessing process's `run` returns or raises, or when the child calls `os._exit`
(`save_rows_at_os_exit`). A child killed by a signal keeps what its writer committed, without an end
record (a forked recording creates its file and commits at its first compile, so such a child is
listed if it used the tpu at all). A child that never used the tpu (a DataLoader worker that touched
only host data, a fork followed by exec) creates no file. When the root recording ends it waits for
its multiprocessing children, merges the child processes' traces into its own and removes the folder
(`tputrace.recording.fork_merge`). Children started as fresh interpreters (spawn, forkserver, Python
commands) are `tputrace.recording.spawning`'s.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from tputrace.forks import ForkOrigin, forks_dir
from tputrace.recording import lineage, session
from tputrace.recording.exits import EXIT_SCRIPT_RAISED, system_exit_status
from tputrace.recording.lineage import ParentRecording
from tputrace.recording.readings import BackendReadings
from tputrace.recording.recorder import Recorder

_installed = False
_os_exit: Callable[[int], Any] | None = None  # the real os._exit, once save_rows_at_os_exit replaced it


class _AfterForkToken:
    """What multiprocessing's after-fork registry holds (it keeps only weak references)."""


_after_fork_token = _AfterForkToken()


def install() -> None:
    """Start a recording in each process forked from now on (idempotent)."""
    global _installed
    if _installed:
        return
    import multiprocessing.util

    os.register_at_fork(after_in_child=_start_in_child)
    multiprocessing.util.register_after_fork(_after_fork_token, _stop_when_process_run_ends)
    _installed = True


def _start_in_child() -> None:
    """After `os.fork()` in the child: drop the parent's recording and start this process's own."""
    from tputrace.backend.compat import process_sharing

    parent = session.current()
    if parent is None or parent.fork_root is None:
        return
    child: Recorder | None = None
    try:
        if not process_sharing.runtime_started():
            child = child_recorder(lineage.describe(parent), "fork", script=parent.script, argv=parent.argv)
            child.explicit_steps_seen = parent.explicit_steps_seen  # the script goes on as it began
    finally:  # if starting failed (Python prints why), the child records nothing rather than into the parent's trace
        session.continue_in_forked_child(child)
    if child is not None:
        lineage.export(child)
        save_rows_at_os_exit()


def child_recorder(parent: ParentRecording, start_method: str, *, script: str, argv: list[str]) -> Recorder:
    """A recording for this child process, under the first free rank, next to the root's trace.

    A command's recording is stopped by an atexit handler (its writer must not close before it)."""
    assert parent.trace is not None
    directory = forks_dir(parent.trace)
    rank = lineage.claim_rank(directory, parent.root_rank, parent.world_size)
    return Recorder(
        str(directory / f"rank{rank}.tptrace"),
        script=script,
        argv=argv,
        mode=parent.mode,
        rank=rank,
        world_size=parent.world_size,
        fork_root=parent.trace,
        root_rank=parent.root_rank,
        device=BackendReadings(),
        forked_from=ForkOrigin(rank=rank, pid=os.getpid(), parent_rank=parent.rank, parent_pid=parent.pid, start_method=start_method),
        stopped_at_exit=start_method == "command",
    )


def save_rows_at_os_exit() -> None:
    """In a child process with a recording: make `os._exit` (which runs no atexit handler and no
    `finally`) end the recording first, so the rows written before it land (idempotent).

    Called on the main thread, it stops the recording as a normal end does (pending deferred ops
    run, the run gets its end and the exit status); on another thread, whose call may interrupt the
    main thread inside an op, it only commits the rows queued so far. Not saved: what a process
    killed by a signal had queued, and an `_exit` reached without `os._exit` (C code, or an
    `os._exit` looked up before the recording started, as `from os import _exit`)."""
    global _os_exit
    if _os_exit is not None:
        return
    _os_exit = os._exit
    os._exit = _exit_after_saving_rows


def _exit_after_saving_rows(status: int) -> None:
    import threading

    real_exit = _os_exit
    assert real_exit is not None
    try:
        recorder = session.current()
        if recorder is not None and recorder.forked_from is not None and recorder.pid == os.getpid():
            if threading.current_thread() is threading.main_thread():
                session.stop(status)
            elif recorder.writer is not None and (recorder.ops or recorder.compiles):
                recorder.writer.create_file()
                recorder.writer.commit()
    except BaseException as error:  # noqa: BLE001 - os._exit must exit whatever saving the rows did
        print(f"tputrace: the recording of process {os.getpid()} was not finished at os._exit: {error}", file=sys.stderr)
    real_exit(status)


def _stop_when_process_run_ends(token: _AfterForkToken) -> None:
    """In a multiprocessing child (which ends through `os._exit`): end its recording when `run` ends."""
    import multiprocessing

    process = multiprocessing.current_process()
    process.run = _recorded_run(process.run)  # type: ignore[method-assign]


def stop_when_bootstrapped_run_ends() -> None:
    """In a spawn or forkserver child, before its process object arrives: end its recording when
    that process's `run` ends (multiprocessing runs no after-fork hooks in such a child)."""
    from multiprocessing import process

    bootstrap = process.BaseProcess._bootstrap

    def bootstrap_recorded_run(self: Any, *args: Any, **kwargs: Any) -> int:
        self.run = _recorded_run(self.run)
        return bootstrap(self, *args, **kwargs)

    process.BaseProcess._bootstrap = bootstrap_recorded_run  # type: ignore[method-assign]


def _recorded_run(run: Callable[[], Any]) -> Callable[[], None]:
    def run_then_stop() -> None:
        exit_status, error = 0, None
        try:
            run()
        except SystemExit as exit_request:
            exit_status = system_exit_status(exit_request.code)[0]
            raise
        except BaseException:
            exit_status, error = EXIT_SCRIPT_RAISED, traceback.format_exc()
            raise
        finally:
            session.stop(exit_status, error)

    return run_then_stop
