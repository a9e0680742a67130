"""Merging the traces of a recording's child processes (`<trace>.forks/rank<N>.tptrace`) into the
root's trace when the root's recording ends."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tputrace.forks import forks_dir
from tputrace.store.errors import TputraceError


def clear_stale(trace_path: str) -> None:
    """Remove child processes' traces left next to `trace_path` by an earlier run."""
    shutil.rmtree(forks_dir(trace_path), ignore_errors=True)


def merge_forked(trace_path: str, rank: int) -> None:
    """Merge the traces of the processes forked or started during the recording into `trace_path`,
    then remove them.

    Waits first for the multiprocessing children that Python would wait for at exit. Traces without
    ops or compiles (processes that used only host data) are left out. On failure the parent's trace
    stays as it was and one line says where the others are."""
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
