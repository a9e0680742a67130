"""An imported GPU capture's kernels tied to the CPU op that launched them: a kernel's runtime call (same
`correlation`) runs inside CPU ops on its thread, and the innermost of them is the kernel's op, so that ops and the
user's lines carry the device time of their kernels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import tputrace
from tputrace.cli.main import main

T0 = 4_458_676_520_000.0


def _x(cat: str, name: str, ts: float, dur: float, *, tid: int = 100, pid: int = 100, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _capture(path: Path, launch: str, kernel_first: bool) -> Path:
    """Two steps of `train.py`'s loop (with_stack frames, each a function's `def` line): `forward` (line 12) runs
    `aten::linear`, which holds `aten::addmm` (its GEMM kernel, 300 us) and, after it, a view; `act` (line 30) runs
    `torch.relu`, which launches a 20 us kernel;
    an optimizer's fill is launched outside any op (no op to tie it to). Kineto's order: the CPU ops, then the runtime
    calls and kernels (CUDA writes a kernel before its launch, ROCm after)."""
    cpu: list[dict[str, Any]] = []
    device: list[dict[str, Any]] = []
    for index in range(2):
        s = T0 + index * 1000.0
        correlation = 10 * index
        cpu += [
            _x("user_annotation", f"ProfilerStep#{index}", s, 1000.0),
            _x("python_function", "train.py(9): <module>", s, 1000.0),
            _x("python_function", "train.py(12): forward", s + 1, 400.0),
            _x("cpu_op", "aten::linear", s + 10, 100.0),
            _x("cpu_op", "aten::t", s + 12, 5.0),
            _x("cpu_op", "aten::addmm", s + 20, 60.0),
            _x("cpu_op", "aten::view", s + 85, 5.0),
            _x("python_function", "train.py(30): act", s + 500, 100.0),
            _x("cpu_op", "aten::relu", s + 510, 40.0),
        ]
        pairs = [
            (_x("cuda_runtime", launch, s + 30, 8.0, correlation=correlation + 1),
             _x("kernel", "sm80_gemm", s + 100, 300.0, pid=0, tid=7, device=0, correlation=correlation + 1)),
            (_x("cuda_runtime", launch, s + 520, 8.0, correlation=correlation + 2),
             _x("kernel", "relu_kernel", s + 560, 20.0, pid=0, tid=7, device=0, correlation=correlation + 2)),
            (_x("cuda_runtime", launch, s + 700, 8.0, correlation=correlation + 3),
             _x("kernel", "fill_kernel", s + 720, 10.0, pid=0, tid=7, device=0, correlation=correlation + 3)),
        ]
        for launched, kernel in pairs:
            device += [kernel, launched] if kernel_first else [launched, kernel]
    document = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
                "traceEvents": cpu + device, "baseTimeNanoseconds": 1_711_964_646_000_000_000}
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


@pytest.mark.parametrize(("launch", "kernel_first"), [("cudaLaunchKernel", True), ("hipLaunchKernel", False)])
def test_kernels_are_tied_to_the_innermost_op_around_their_launch(tmp_path: Path, launch: str, kernel_first: bool,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "gpu.tptrace"
    assert main(["import", str(_capture(tmp_path / "rank0.pt.trace.json.gz", launch, kernel_first)),
                 "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        ops = {op.seq: op for op in trace.records("ops")}
        programs = {program.id: program.name for program in trace.records("programs")}
        launched = sorted((ops[row.op_seq].op, programs[row.program_id], row.dur_ns, ops[row.op_seq].step)
                          for row in trace.records("kernel_launches"))
        assert trace.count("executions") == 6  # the fill's too, without an op
    assert launched == [("aten::addmm", "sm80_gemm", 300_000, 0), ("aten::addmm", "sm80_gemm", 300_000, 1),
                        ("aten::relu", "relu_kernel", 20_000, 0), ("aten::relu", "relu_kernel", 20_000, 1)]
    capsys.readouterr()
    assert main(["summary", str(output)]) == 0
    summary = capsys.readouterr().out
    by_op = summary[summary.index("top ops by the gpu time of the kernels they launched"):].split("\n\n")[0]
    assert [line.split()[:3] for line in by_op.splitlines()[2:]] == [["aten::addmm", "600", "µs"],
                                                                     ["aten::relu", "40.0", "µs"]]
    table = summary[summary.index("top ops by host dispatch"):].split("\n\n")[0]
    addmm = next(line for line in table.splitlines() if line.strip().startswith("aten::addmm"))
    assert addmm.split()[-2:] == ["600", "µs"], table
    assert next(line for line in table.splitlines() if line.strip().startswith("aten::linear")).split()[-1] == "-"
    lines = summary[summary.index("top user functions by the kernel time their ops launched"):].split("\n\n")[0]
    assert [line.split()[:4] for line in lines.splitlines()[2:]] == [["forward", "(train.py:12)", "600", "µs"],
                                                                     ["act", "(train.py:30)", "40.0", "µs"]]


def test_a_host_bound_gpu_capture_says_its_gpu_runs_kernels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four steps of 1 ms in which the host dispatches 20 small ops (45 us each) whose kernels run 5 us each: the
    host-bound finding says the gpu ran kernels for 100 us and is idle, not that a chip ran programs."""
    events: list[dict[str, Any]] = []
    device: list[dict[str, Any]] = []
    for step in range(4):
        s = T0 + step * 1000.0
        events.append(_x("user_annotation", f"ProfilerStep#{step}", s, 1000.0))
        for index in range(20):
            at, correlation = s + 10 + 48 * index, 100 * step + index
            events.append(_x("cpu_op", "aten::add", at, 45.0))
            device += [_x("kernel", "add_kernel", at + 20, 5.0, pid=0, tid=7, device=0, correlation=correlation),
                       _x("cuda_runtime", "cudaLaunchKernel", at + 5, 4.0, correlation=correlation)]
    capture = tmp_path / "small_ops.pt.trace.json.gz"
    capture.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": events + device,
                                                  "baseTimeNanoseconds": 1_711_964_646_000_000_000}).encode()))
    output = tmp_path / "small.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    capsys.readouterr()
    assert main(["report", str(output)]) == 0
    report = capsys.readouterr().out
    title = next(line for line in report.splitlines() if "Host-bound steps" in line)
    assert title.endswith("dispatching 20 ops takes 900 µs per step, the gpu ran 100 µs"), title
    assert "while the gpu ran kernels for 100 µs: the gpu is idle" in report and "chip" not in report.split("Host-bound")[1]
