"""Outputs that cannot be written and inputs that cannot be read are one line and exit status 2, never a
traceback or a hang: `plot -o /proc/x.html`, `plot` of a trace in a read-only folder, `merge -o` a
folder, `info` on a FIFO."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def _tputrace(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`tputrace ARGS` in a process of its own: a hang fails the test instead of stopping the suite."""
    try:
        return subprocess.run([sys.executable, "-m", "tputrace.cli.main", *arguments], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tputrace {' '.join(arguments)} did not finish in {timeout:.0f} s")


def _one_line(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr
    error = result.stderr.strip()
    assert error.startswith("tputrace: error:") and message in error and "\n" not in error, error


def test_plot_into_proc_is_one_line(sample_trace_path: Path) -> None:
    _one_line(_tputrace("plot", str(sample_trace_path), "-o", "/proc/x.html"), "cannot write -o /proc/x.html")


def test_merge_into_a_folder_is_one_line(sample_trace_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    _one_line(_tputrace("merge", str(sample_trace_path), "-o", str(folder)), "is a directory")
    assert list(tmp_path.iterdir()) == [folder] and not any(folder.iterdir())


def test_info_on_a_fifo_is_one_line_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.tptrace"
    os.mkfifo(fifo)
    _one_line(_tputrace("info", str(fifo), timeout=60), "is not a regular file")


@pytest.fixture()
def read_only_copy(sample_trace_path: Path, tmp_path: Path) -> Iterator[Path]:
    """The sample trace in a folder mounted read-only (a bind mount: root writes through file modes)."""
    source, mounted = tmp_path / "source", tmp_path / "read-only"
    source.mkdir()
    mounted.mkdir()
    shutil.copyfile(sample_trace_path, source / "sample.tptrace")
    bind = subprocess.run(["mount", "--bind", str(source), str(mounted)], capture_output=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bind.stderr.decode().strip()}")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield mounted / "sample.tptrace"
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


def test_plot_of_a_trace_in_a_read_only_folder_is_one_line(read_only_copy: Path) -> None:
    _one_line(_tputrace("plot", str(read_only_copy)), "cannot write the report")
    assert sorted(path.name for path in read_only_copy.parent.iterdir()) == ["sample.tptrace"]
