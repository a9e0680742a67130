"""Recording processes forked during a recording (`os.fork`, multiprocessing's fork start method,
DataLoader workers), as the ranks of `tputrace run --nproc` are recorded: each in a trace of its own,
merged into the parent's trace when the parent's recording ends.

In the child, right after the fork, the parent's recording is dropped (its writer was closed across
the fork, see `tputrace.store.writer`) and, when the child can use the tpu (the parent had not
started JAX's runtime), a recording of its own starts in `<trace>.forks/rank<N>.tptrace`. N is the
first free `rank + world_size * k` (k = 1, 2, ...), so the forked processes of different ranks of an
`--nproc` run never share a rank number. The child's recording ends as the parent's does when the
child runs on through the script (`sys.exit`, the script's end), when a multiprocessing process's
`run` returns or raises, or when the child calls `os._exit` (`save_rows_at_os_exit`). A child
killed by a signal keeps what its writer committed, without an end record (a forked recording
creates its file and commits at its first compile, so such a child is listed if it used the tpu at
all). A child that never used the tpu (a DataLoader worker that touched only host data, a fork
followed by exec) creates no file. When the root recording ends it waits for its multiprocessing
children, merges the child processes' traces into its own and removes the folder. Children started
as fresh interpreters (spawn, forkserver, Python commands) are `tputrace.spawn_recording`'s.
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tputrace import command_exits, spawn_recording
from tputrace.forks import ForkOrigin, forks_dir
from tputrace.store.errors import TputraceError

if TYPE_CHECKING:
    from tputrace.recorder import Recorder
    from tputrace.spawn_recording import ParentRecording

_CLAIM_SUFFIX = ".claim"
_installed = False
_os_exit: Callable[[int], Any] | None = None  # the real os._exit, once save_rows_at_os_exit replaced it


class _AfterForkToken:
    """What multiprocessing's after-fork registry holds (it keeps only weak references)."""


_after_fork_token = _AfterForkToken()


def install() -> None:
    """Start a recording in each process forked, spawned or started through a forkserver from now on (idempotent)."""
    global _installed
    spawn_recording.install()
    command_exits.install()
    if _installed:
        return
    import multiprocessing.util

    os.register_at_fork(after_in_child=_start_in_child)
    multiprocessing.util.register_after_fork(_after_fork_token, _stop_when_process_run_ends)
    _installed = True


def clear_stale(trace_path: str) -> None:
    """Remove forked processes' traces left next to `trace_path` by an earlier run."""
    shutil.rmtree(forks_dir(trace_path), ignore_errors=True)


def claim_rank(directory: Path, root_rank: int, world_size: int) -> int:
    """The first rank `root_rank + world_size * k` (k >= 1) no other forked process has claimed.

    The claim file holds this process's pid (`claimed_rank` reads it)."""
    directory.mkdir(exist_ok=True)
    multiple = 1
    while True:
        rank = root_rank + world_size * multiple
        try:
            claim = os.open(directory / f"rank{rank}{_CLAIM_SUFFIX}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            multiple += 1
            continue
        try:
            os.write(claim, str(os.getpid()).encode())
        finally:
            os.close(claim)
        return rank


def claimed_rank(directory: Path, pid: int) -> int | None:
    """The rank process `pid` claimed in `directory` (the latest, if its pid was reused), or None."""
    ranks = []
    for claim in directory.glob(f"rank*{_CLAIM_SUFFIX}"):
        try:
            claimed_by = claim.read_text()
        except OSError:
            continue
        if claimed_by == str(pid):
            ranks.append(int(claim.name.removeprefix("rank").removesuffix(_CLAIM_SUFFIX)))
    return max(ranks, default=None)


def _start_in_child() -> None:
    """After `os.fork()` in the child: drop the parent's recording and start this process's own."""
    from tputrace import recorder as recorder_module
    from tputrace.backend import process_sharing

    parent = recorder_module.active()
    if parent is None or parent.fork_root is None:
        return
    child: Recorder | None = None
    try:
        if not process_sharing.runtime_started():
            child = child_recorder(spawn_recording.describe(parent), "fork", script=parent.script, argv=parent.argv)
    finally:  # if starting failed (Python prints why), the child records nothing rather than into the parent's trace
        recorder_module.continue_in_forked_child(child)
    if child is not None:
        spawn_recording.export(child)
        save_rows_at_os_exit()


def child_recorder(parent: ParentRecording, start_method: str, *, script: str, argv: list[str]) -> Recorder:
    """A recording for this child process, under the first free rank, next to the root's trace.

    A command's recording is stopped by an atexit handler (its writer must not close before it)."""
    from tputrace.recorder import Recorder

    assert parent.trace is not None
    directory = forks_dir(parent.trace)
    rank = claim_rank(directory, parent.root_rank, parent.world_size)
    return Recorder(
        str(directory / f"rank{rank}.tptrace"),
        script=script,
        argv=argv,
        mode=parent.mode,
        rank=rank,
        world_size=parent.world_size,
        fork_root=parent.trace,
        root_rank=parent.root_rank,
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

    from tputrace import recorder as recorder_module

    real_exit = _os_exit
    assert real_exit is not None
    try:
        recorder = recorder_module.active()
        if recorder is not None and recorder.forked_from is not None and recorder.pid == os.getpid():
            if threading.current_thread() is threading.main_thread():
                recorder_module.stop(status)
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
        from tputrace import recorder as recorder_module

        exit_status, error = 0, None
        try:
            run()
        except SystemExit as exit_request:
            exit_status = exit_request.code if isinstance(exit_request.code, int) else (0 if exit_request.code is None else 1)
            raise
        except BaseException:
            exit_status, error = 1, traceback.format_exc()
            raise
        finally:
            recorder_module.stop(exit_status, error)

    return run_then_stop


def merge_forked(trace_path: str, rank: int) -> None:
    """Merge the traces of the processes forked during the recording into `trace_path`, then remove them.

    Waits first for the multiprocessing children that Python would wait for at exit. Traces without
    ops or compiles (processes that used only host data) are left out. On failure the parent's trace stays as it was and one line says where the others are."""
    directory = forks_dir(trace_path)
    if not directory.is_dir():
        return
    _join_multiprocessing_children()
    from tputrace.merge import merge_traces

    forked_paths = [path for path in sorted(directory.glob("rank*.tptrace")) if _worth_merging(path)]
    if not forked_paths:
        shutil.rmtree(directory, ignore_errors=True)
        return
    merged_path = directory / "merged.tptrace"
    try:
        merge_traces([trace_path, *forked_paths], merged_path, expected_ranks=[rank])
    except TputraceError as error:
        print(f"tputrace: error: the forked processes' traces were not merged into {trace_path}: {error}; they are in {directory}", file=sys.stderr)
        return
    os.replace(merged_path, trace_path)
    shutil.rmtree(directory, ignore_errors=True)


def _worth_merging(path: Path) -> bool:
    """Whether a forked process's trace holds tpu work (a child that ended through `os._exit` or
    `exec` without it, such as a subprocess, leaves an empty trace)."""
    from tputrace.store.reader import open_trace

    try:
        with open_trace(path) as trace:
            return trace.count("ops") > 0 or trace.count("compiles") > 0
    except TputraceError:
        return False


def _join_multiprocessing_children() -> None:
    """Wait for the non-daemon multiprocessing children, as Python does at exit (after this, otherwise)."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return
    for child in multiprocessing.active_children():
        if not child.daemon:
            child.join()
