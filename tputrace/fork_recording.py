"""Recording processes forked during a recording (`os.fork`, multiprocessing's fork start method,
DataLoader workers), as the ranks of `tputrace run --nproc` are recorded: each in a trace of its own,
merged into the parent's trace when the parent's recording ends.

In the child, right after the fork, the parent's recording is dropped (its writer was closed across
the fork, see `tputrace.store.writer`) and, when the child can use the tpu (the parent had not
started JAX's runtime), a recording of its own starts in `<trace>.forks/rank<N>.tptrace`. N is the
first free `rank + world_size * k` (k = 1, 2, ...), so the forked processes of different ranks of an
`--nproc` run never share a rank number. The child's recording ends as the parent's does when the
child runs on through the script (`sys.exit`, the script's end) or when a multiprocessing process's
`run` returns or raises; a child that ends through `os._exit` keeps what its writer committed,
without an end record (a forked recording creates its file and commits at its first compile, so
such a child is listed if it used the tpu at all). A child that never used the tpu (a DataLoader
worker that touched only host data, a fork followed by exec) creates no file. When the root recording ends it waits for its
multiprocessing children, merges the forked processes' traces into its own and removes the folder.
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tputrace.forks import ForkOrigin, forks_dir
from tputrace.store.errors import TputraceError

if TYPE_CHECKING:
    from tputrace.recorder import Recorder

_CLAIM_SUFFIX = ".claim"
_installed = False


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


def clear_stale(trace_path: str) -> None:
    """Remove forked processes' traces left next to `trace_path` by an earlier run."""
    shutil.rmtree(forks_dir(trace_path), ignore_errors=True)


def claim_rank(directory: Path, root_rank: int, world_size: int) -> int:
    """The first rank `root_rank + world_size * k` (k >= 1) no other forked process has claimed."""
    directory.mkdir(exist_ok=True)
    multiple = 1
    while True:
        rank = root_rank + world_size * multiple
        try:
            os.close(os.open(directory / f"rank{rank}{_CLAIM_SUFFIX}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            multiple += 1
            continue
        return rank


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
            child = _forked_recorder(parent)
    finally:  # if starting failed (Python prints why), the child records nothing rather than into the parent's trace
        recorder_module.continue_in_forked_child(child)


def _forked_recorder(parent: Recorder) -> Recorder:
    """A recording for this forked process, under the first free rank, next to the root's trace."""
    from tputrace.recorder import Recorder

    directory = forks_dir(parent.fork_root)
    rank = claim_rank(directory, parent.root_rank, parent.world_size)
    return Recorder(
        str(directory / f"rank{rank}.tptrace"),
        script=parent.script,
        argv=parent.argv,
        mode=parent.mode,
        rank=rank,
        world_size=parent.world_size,
        fork_root=parent.fork_root,
        root_rank=parent.root_rank,
        forked_from=ForkOrigin(rank=rank, pid=os.getpid(), parent_rank=parent.rank, parent_pid=parent.pid),
    )


def _stop_when_process_run_ends(token: _AfterForkToken) -> None:
    """In a multiprocessing child (which ends through `os._exit`): end its recording when `run` ends."""
    import multiprocessing

    process = multiprocessing.current_process()
    process.run = _recorded_run(process.run)  # type: ignore[method-assign]


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
