"""The summary's figures on runs that read them easily wrong: asynchronous all-reduces waited for together (the
collectives table's time per kind is the time that kind's calls were in flight, as the time split's), and the run
line's chips of a merged trace whose ranks had different chip counts, and of a CPU-only torch.profiler capture."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.store.aggregates import merged_ns
from tputrace.summary import header_lines, summarize

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

# Several tensors all-reduced with `async_op=True`, all waited for after the last: the calls overlap.
ASYNC_ALL_REDUCES = '''
    import torch
    import torch.distributed as dist
    import tputrace.backend  # noqa: F401
    dist.init_process_group("tpu")
    tensors = [torch.full((128, 128), float(i), device="tpu") for i in range(6)]
    for step in range(3):
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for work in works:
            work.wait()
    dist.destroy_process_group()
'''

# A run on the tpu device that also profiles some CPU-only work with torch.profiler.
ONE_RANK_AND_A_CPU_CAPTURE = '''
    import sys
    import torch
    import tputrace.backend  # noqa: F401
    from torch.profiler import ProfilerActivity, profile
    print((torch.ones(8, device="tpu") * 2).sum().item())
    if "--capture" in sys.argv:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            x = torch.randn(32, 32)
            for _ in range(3):
                x = (x @ x).relu()
        prof.export_chrome_trace("cpu_capture.json")
'''


def _tputrace(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
    process = subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], capture_output=True, text=True,
                             cwd=tmp_path, env=dict(os.environ, PYTHONWARNINGS="ignore", **(env or {})), timeout=300)
    assert process.returncode == 0, process.stderr[-4000:]


def _run_line(trace: Path, rank: int | None = None) -> str:
    with tputrace.open(trace) as opened:
        return dict(header_lines(summarize(opened, rank=rank)))["run"]


def test_async_all_reduces_waited_for_together_show_their_time_in_flight_not_their_summed_durations(
        tmp_path: Path) -> None:
    (tmp_path / "async_all_reduces.py").write_text(textwrap.dedent(ASYNC_ALL_REDUCES))
    _tputrace(tmp_path, "run", "--nproc", "2", "-o", "async.tptrace", "async_all_reduces.py")
    with tputrace.open(tmp_path / "async.tptrace") as opened:
        summary = summarize(opened)
        calls = opened.sql("SELECT start_ns, start_ns + dur_ns, dur_ns FROM collectives WHERE rank = 0 "
                           "AND kind = 'all_reduce' ORDER BY start_ns")
    (stat,) = [stat for stat in summary.collectives if stat.kind == "all_reduce"]
    assert stat.count == 18
    in_flight = merged_ns((start, end) for start, end, _ in calls)
    assert in_flight < sum(dur for _, _, dur in calls)  # the calls did overlap
    assert stat.total_ns == in_flight == summary.rank_lines[0].top_collective_ns
    assert sum(other.total_ns for other in summary.collectives) >= summary.time_split.collective_ns >= stat.total_ns


def test_the_run_line_counts_each_ranks_own_chips_and_none_for_a_cpu_only_capture(tmp_path: Path) -> None:
    (tmp_path / "rank.py").write_text(textwrap.dedent(ONE_RANK_AND_A_CPU_CAPTURE))
    ranks = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    _tputrace(tmp_path, "run", "--chips", "2", "-o", "rank0.tptrace", "rank.py", "--capture", env={"RANK": "0", **ranks})
    _tputrace(tmp_path, "run", "-o", "rank1.tptrace", "rank.py", env={"RANK": "1", **ranks})
    _tputrace(tmp_path, "merge", "rank0.tptrace", "rank1.tptrace", "-o", "merged.tptrace")
    assert "2 chips on this rank (3 in all)" in _run_line(tmp_path / "merged.tptrace")
    assert "1 chip on this rank (3 in all)" in _run_line(tmp_path / "merged.tptrace", rank=1)
    _tputrace(tmp_path, "import", "cpu_capture.json", "-o", "cpu_capture.tptrace")
    run_line = _run_line(tmp_path / "cpu_capture.tptrace")
    assert "chip" not in run_line and "cpu" in run_line, run_line
