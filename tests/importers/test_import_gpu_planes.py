"""XProf captures made on GPUs: a `/device:GPU:n` plane's stream lines (`Stream #7(Compute)`) hold its kernels and
copies. A kernel XLA launched (JAX or PyTorch/XLA on a GPU) names its HLO op and module in its stats and is an XLA op
of that GPU; another kernel or copy (TensorFlow's own, a `MemcpyH2D`) is a kernel run; the lines XProf derives from
the streams (`TensorFlow Name Scope`) are not read again. Such a capture imported as nothing: no ops, no kernels."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import tputrace
from tputrace.cli.main import main
from tputrace.xplane_proto import messages

CLASSES = messages()
START_NS = 1_700_000_000_000_000_000
US_PS = 10**6


def _gpu_capture(path: Path, *, xla_ops_line: bool = False) -> Path:
    """GPU 1 of a host: per step (3) a host-to-device copy, then `fusion.3` and `dot.1` of `jit_step`, then a
    TensorFlow kernel; a derived name-scope line over them. With `xla_ops_line`, the plane also has an `XLA Ops`
    line (a capture XProf has already processed), which holds the XLA ops."""
    space = CLASSES["XSpace"]()
    plane = space.planes.add(id=2, name="/device:GPU:1")
    for number, name in enumerate(("hlo_op", "hlo_module", "correlation_id", "memcpy_details"), start=1):
        plane.stat_metadata[number].id, plane.stat_metadata[number].name = number, name
    for number, name in enumerate(("MemcpyH2D", "loop_fusion_kernel", "gemm_kernel", "Eigen::EigenMetaKernel",
                                   "dense/kernel", "fusion.3"), start=1):
        plane.event_metadata[number].id, plane.event_metadata[number].name = number, name
    copies = plane.lines.add(id=63, name="Stream #63(MemcpyH2D)", timestamp_ns=START_NS)
    compute = plane.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=START_NS)
    scopes = plane.lines.add(id=-5, name="TensorFlow Name Scope", timestamp_ns=START_NS)
    ops_line = plane.lines.add(id=-3, name="XLA Ops", timestamp_ns=START_NS) if xla_ops_line else None
    for step in range(3):
        at = step * 1000 * US_PS
        copy = copies.events.add(metadata_id=1, offset_ps=at, duration_ps=20 * US_PS)
        copy.stats.add(metadata_id=4, str_value="size:4096 dest:1 async:1")
        for metadata_id, op, start_us, dur_us in ((2, "fusion.3", 100, 300), (3, "dot.1", 400, 200)):
            kernel = compute.events.add(metadata_id=metadata_id, offset_ps=at + start_us * US_PS,
                                        duration_ps=dur_us * US_PS)
            kernel.stats.add(metadata_id=1, str_value=op)
            kernel.stats.add(metadata_id=2, str_value="jit_step")
            kernel.stats.add(metadata_id=3, int64_value=10 * step + metadata_id)
        compute.events.add(metadata_id=4, offset_ps=at + 700 * US_PS, duration_ps=50 * US_PS)
        scopes.events.add(metadata_id=5, offset_ps=at + 100 * US_PS, duration_ps=650 * US_PS)
        if ops_line is not None:
            ops_line.events.add(metadata_id=6, offset_ps=at + 100 * US_PS, duration_ps=300 * US_PS)
    path.write_bytes(space.SerializeToString())
    return path


def test_a_gpus_stream_kernels_are_its_xla_ops_and_kernel_runs(tmp_path: Path) -> None:
    output = tmp_path / "gpu.tptrace"
    assert main(["import", str(_gpu_capture(tmp_path / "gpuhost.xplane.pb")), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        ops = Counter((op.op, op.chip, op.dur_ns) for op in trace.records("ops"))
        programs = {program.id: (program.kind, program.name) for program in trace.records("programs")}
        runs = Counter((programs[run.program_id], run.chip, run.dur_ns) for run in trace.records("executions"))
        assert json.loads(trace.meta["imported"])[0]["device"] == "gpu"
    assert ops == {("fusion.3", 1, 300_000): 3, ("dot.1", 1, 200_000): 3}
    assert runs[(("kernel", "MemcpyH2D"), 1, 20_000)] == 3 and runs[(("kernel", "Eigen::EigenMetaKernel"), 1, 50_000)] == 3
    assert not any(name == "dense/kernel" for _, name in programs.values())


def test_a_gpu_plane_with_an_xla_ops_line_has_its_ops_once(tmp_path: Path) -> None:
    output = tmp_path / "gpu.tptrace"
    assert main(["import", str(_gpu_capture(tmp_path / "gpuhost.xplane.pb", xla_ops_line=True)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        assert Counter(op.op for op in trace.records("ops")) == {"fusion.3": 3}
        kernels = {program.name for program in trace.records("programs") if program.kind == "kernel"}
    assert kernels == {"MemcpyH2D", "Eigen::EigenMetaKernel"}

