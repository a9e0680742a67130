"""torch.profiler with CUPTI's range profiler (`experimental_config=_ExperimentalConfig(profiler_metrics=[...])`):
Kineto writes a `cuda_profiler_range` event per kernel, its args the kernel's counters, in place of the kernels'
activities; the profiler replays each kernel to read them, so the ranges' times, and the CPU ops around the launches,
hold the replays."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import tputrace
from tputrace.cli.main import main

T0 = 1_679_055_451_547_906.0
GEMM = "ampere_sgemm_32x32_sliced1x4_tn"
ADD = "void at::native::elementwise_kernel<128, 2, CUDAFunctor_add<float> >(int)"


def _counters(fadd: int, fmul: int, ffma: int, hfma: int = 0) -> dict[str, int]:
    counters = {f"smsp__sass_thread_inst_executed_op_{kind}_pred_on.sum": 0
                for kind in ("dadd", "dfma", "dmul", "hadd", "hfma", "hmul", "fadd", "ffma", "fmul")}
    counters.update({"smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": fadd,
                     "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": fmul,
                     "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": ffma,
                     "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum": hfma})
    return counters


def _capture(folder: Path) -> Path:
    """Two matmuls and an add launched from CPU ops (a `cudaLaunchKernel` each), and a range per kernel (121 ms each:
    the replays), one of them unnamed (`__missing__`)."""
    events: list[dict[str, Any]] = []
    ranges = [(GEMM, _counters(0, 0, 1000)), (GEMM, _counters(0, 0, 3000, hfma=500)), (ADD, _counters(64, 0, 0)),
              ("__missing__", _counters(1, 1, 1))]
    for index, (name, counters) in enumerate(ranges):
        ts = T0 + index * 130_000.0
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm" if name == GEMM else "aten::add",
                       "pid": 9, "tid": 9, "ts": ts, "dur": 125_000.0, "args": {"External id": index}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9,
                       "ts": ts + 10.0, "dur": 124_000.0, "args": {"correlation": 100 + index, "cbid": 211}})
        events.append({"ph": "X", "cat": "cuda_profiler_range", "name": name, "pid": 0, "tid": 0,
                       "ts": ts + 20.0, "dur": 121_431.0, "args": counters})
    document = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-PG509-200"}],
                "traceEvents": events, "traceName": "benchmark_trace.json"}
    path = folder / "benchmark_trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return path


def test_profiler_ranges_give_their_kernels_flops_and_a_warning(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(_capture(tmp_path)), "-o", str(output)]) == 0
    assert "4 CUPTI range-profiler ranges" in capsys.readouterr().err
    with tputrace.open(output) as trace:
        programs = {name: (kind, flops) for kind, name, flops in trace.sql(
            "SELECT p.kind, s.text, p.flops FROM programs p JOIN strings s ON s.id = p.name_sid")}
        # A run's mean FLOPs: adds and multiplies, and twice the fused multiply-adds, of every precision.
        assert programs == {GEMM: ("kernel", (2 * 1000 + 2 * 3000 + 2 * 500) / 2), ADD: ("kernel", 64.0)}
        assert trace.count("executions") == 0  # the ranges' times are the replays', not the kernels'
        (source,) = json.loads(trace.meta["imported"])
    assert source["device"] == "gpu"
    assert source["profiler_ranges"]["ranges"] == 4 and source["profiler_ranges"]["kernels"] == 2
    assert "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum" in source["profiler_ranges"]["metrics"]
