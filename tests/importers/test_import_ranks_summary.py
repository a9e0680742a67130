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


def _log(path: Path, rank: int, compiles: list[tuple[float, float, str | None]]) -> Path:
    """A `TORCH_TRACE` log of one rank, as torch writes it: a `compilation_metrics` record per compile of `step` in
    `train.py` (start, seconds, recompile reason)."""
    lines = []
    for index, (start, seconds, reason) in enumerate(compiles):
        metrics = {"compile_id": f"0/{index}", "co_name": "step", "co_filename": "/job/train.py", "co_firstlineno": 7,
                   "cache_size": index, "guard_count": 10, "graph_op_count": 4, "start_time": start,
                   "entire_frame_compile_time_s": seconds, "recompile_reason": reason}
        record = {"compilation_metrics": metrics, "rank": rank, "frame_id": 0, "frame_compile_id": index, "attempt": 0}
        lines.append(f"V0815 08:48:{38 + index:02d}.452000 4242 torch/_dynamo/utils.py:1938] {json.dumps(record)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_ranks_of_torch_trace_logs_show_their_compiles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Logs have no steps, ops or collectives: their ranks' lines show what they have, compiles (rank 1 recompiled
    `step` twice, for 3 s of compiling), and leave the empty columns out."""
    folder = tmp_path / "logs"
    folder.mkdir()
    _log(folder / "dedicated_log_torch_trace_rank_0_ab12.log", 0, [(1_755_272_918.0, 1.0, None)])
    _log(folder / "dedicated_log_torch_trace_rank_1_cd34.log", 1,
         [(1_755_272_918.0, 1.0, None), (1_755_272_920.0, 1.0, "x.size()[0] == 8"),
          (1_755_272_922.0, 1.0, "x.size()[0] == 9")])
    output = tmp_path / "logs.tptrace"
    assert main(["import", str(folder), "-o", str(output)]) == 0
    capsys.readouterr()
    assert main(["summary", str(output)]) == 0
    table = capsys.readouterr().out.split("ranks: 2 ")[1].split("\n\n")[0].splitlines()
    assert table[1].split() == ["rank", "wall", "compiles", "compiling"], table
    assert table[3].split()[1:] == ["distributed", "rank", "1", "5.00", "s", "3", "(2", "recompiles)", "3.00", "s"], table
