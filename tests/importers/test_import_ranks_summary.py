"""A trace of several ranks (captures imported together) summarised: besides the shown rank's tables, a line per rank
says how the ranks compare, so that the slow rank shows without a summary per `--rank`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tputrace.cli.main import main

T0 = 4_458_676_520_000.0


def _x(cat: str, name: str, ts: float, dur: float, *, tid: int = 100, pid: int = 100, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _rank_capture(path: Path, rank: int, step_us: float, kernel_us: float, allreduce_us: float) -> Path:
    """Four steps of `step_us` of one rank of 4: a GEMM kernel of `kernel_us` and an NCCL all-reduce kernel of
    `allreduce_us` a step."""
    comms = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "Float",
             "Group size": 4}
    cpu: list[dict[str, Any]] = []
    device: list[dict[str, Any]] = []
    for index in range(4):
        s = T0 + index * step_us
        cpu += [_x("user_annotation", f"ProfilerStep#{index}", s, step_us), _x("cpu_op", "aten::mm", s + 10, 25.0)]
        device += [_x("cuda_runtime", "cudaLaunchKernel", s + 20, 5.0, correlation=10 * index),
                   _x("kernel", "sm80_gemm", s + 30, kernel_us, pid=0, tid=7, device=0, correlation=10 * index),
                   _x("cuda_runtime", "cudaLaunchKernel", s + 40, 5.0, correlation=10 * index + 1),
                   _x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", s + 50 + kernel_us, allreduce_us, pid=0,
                      tid=20, device=0, correlation=10 * index + 1, **comms)]
    document = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4},
                "traceEvents": cpu + device, "baseTimeNanoseconds": 1_711_964_646_000_000_000}
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def test_a_summary_of_several_ranks_has_a_line_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ranks 0 and 1 of a 4-rank job: rank 1's steps take 25% longer (its GEMM runs 600 us, not 300) and rank 0 waits
    for it in the all-reduce (500 us, not 250). Each rank's line has its distributed rank, steps, median step and how
    much slower than the fastest it is, the devices' busy share and its longest collective; the shown rank is marked."""
    folder = tmp_path / "job"
    folder.mkdir()
    _rank_capture(folder / "rank0.pt.trace.json.gz", 0, 1000.0, 300.0, 500.0)
    _rank_capture(folder / "rank1.pt.trace.json.gz", 1, 1250.0, 600.0, 250.0)
    output = tmp_path / "job.tptrace"
    assert main(["import", str(folder), "-o", str(output)]) == 0
    capsys.readouterr()
    assert main(["summary", str(output), "--rank", "1"]) == 0
    summary = capsys.readouterr().out
    table = summary[summary.index("ranks: 2 (* the rank the other tables show; `tputrace summary --rank N` for another)"):]
    rows = [line.split() for line in table.split("\n\n")[0].splitlines()[2:]]
    assert "(programs without recorded ops)" not in summary
    assert rows == [
        ["0", "distributed", "rank", "0", "4.00", "ms", "4", "1.00", "ms", "+0.0%", "80.0%", "2.00", "ms", "all_reduce",
         "2.00", "ms"],
        ["1", "*", "distributed", "rank", "1", "5.00", "ms", "4", "1.25", "ms", "+25.0%", "68.0%", "1.00", "ms",
         "all_reduce", "1.00", "ms"],
    ], table
    single = tmp_path / "one.tptrace"
    assert main(["import", str(folder / "rank0.pt.trace.json.gz"), "-o", str(single)]) == 0
    capsys.readouterr()
    assert main(["summary", str(single)]) == 0
    assert "ranks:" not in capsys.readouterr().out
