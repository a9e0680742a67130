"""XProf captures made on real TPUs (`/device:TPU:n` planes with `XLA Modules` and `XLA Ops` lines, as libtpu writes
them): the device type the planes name (`TPU v6 Lite`) is the capture's chip, which the run line names and the report
and summary are drawn for, and each chip's program and op time is a share of the time of all its chips. Older JAX's compiles (`backend_compile`,
with libtpu's `TfrtTpuCompiler::Compile` inside) are compiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main
from tputrace.xplane_proto import messages

CLASSES = messages()
START_NS = 1_700_000_000_000_000_000
MS_PS = 10**9


def _tpu_capture(path: Path, device_type: str, chips: int = 4) -> Path:
    """One host of `chips` chips of `device_type`: per chip 10 runs of `jit_step` (a fusion of 0.8 ms in each 1 ms
    run, with its costs and line), a step each on the `Steps` line."""
    space = CLASSES["XSpace"]()
    for chip in range(chips):
        plane = space.planes.add(id=chip + 1, name=f"/device:TPU:{chip}")
        stat_ids = {}
        for number, name in enumerate(("device_type_string", "peak_teraflops_per_second", "hlo_category", "flops",
                                       "bytes_accessed", "source", "program_id", "step_num", "run_id"), start=1):
            plane.stat_metadata[number].id = number
            plane.stat_metadata[number].name = name
            stat_ids[name] = number
        plane.stats.add(metadata_id=stat_ids["device_type_string"], str_value=device_type)
        plane.stats.add(metadata_id=stat_ids["peak_teraflops_per_second"], double_value=918.0)
        module = plane.event_metadata[1]
        module.id, module.name = 1, "jit_step(123)"
        fusion = plane.event_metadata[2]
        fusion.id, fusion.name, fusion.display_name = 2, "%fusion.1 = f32[1024,1024] fusion(...)", "fusion.1"
        fusion.stats.add(metadata_id=stat_ids["hlo_category"], str_value="convolution fusion")
        fusion.stats.add(metadata_id=stat_ids["flops"], int64_value=2 * 1024**3)
        fusion.stats.add(metadata_id=stat_ids["bytes_accessed"], int64_value=12 * 1024**2)
        fusion.stats.add(metadata_id=stat_ids["source"], str_value="train.py:21")
        fusion.stats.add(metadata_id=stat_ids["program_id"], uint64_value=123)
        step = plane.event_metadata[3]
        step.id, step.name = 3, "train"
        steps = plane.lines.add(id=1, name="Steps", timestamp_ns=START_NS)
        modules = plane.lines.add(id=2, name="XLA Modules", timestamp_ns=START_NS)
        ops = plane.lines.add(id=3, name="XLA Ops", timestamp_ns=START_NS)
        for run in range(10):
            marker = steps.events.add(metadata_id=3, offset_ps=run * MS_PS, duration_ps=MS_PS)
            marker.stats.add(metadata_id=stat_ids["step_num"], int64_value=run)
            executed = modules.events.add(metadata_id=1, offset_ps=run * MS_PS, duration_ps=MS_PS)
            executed.stats.add(metadata_id=stat_ids["run_id"], int64_value=run + 1)
            ops.events.add(metadata_id=2, offset_ps=run * MS_PS + MS_PS // 10, duration_ps=8 * MS_PS // 10)
    host = space.planes.add(id=100, name="/host:CPU")
    for number, name in enumerate(("PjitFunction(step)", "backend_compile", "TfrtTpuCompiler::Compile"), start=1):
        host.event_metadata[number].id = number
        host.event_metadata[number].name = name
    main_thread = host.lines.add(id=7, name="main/7", timestamp_ns=START_NS)
    for start_ms in (0, 4):  # two compiles of 3 ms, each in its jitted call
        main_thread.events.add(metadata_id=1, offset_ps=start_ms * MS_PS, duration_ps=MS_PS * 35 // 10)
        main_thread.events.add(metadata_id=2, offset_ps=start_ms * MS_PS + MS_PS // 10, duration_ps=3 * MS_PS)
        main_thread.events.add(metadata_id=3, offset_ps=start_ms * MS_PS + MS_PS // 5, duration_ps=MS_PS * 28 // 10)
    path.write_bytes(space.SerializeToString())
    return path


@pytest.mark.parametrize(("device_type", "chip"), [("TPU v6 Lite", "TPU v6e (Trillium)"), ("TPU v5 lite", "TPU v5e")])
def test_a_tpu_capture_is_read_for_its_own_chip(tmp_path: Path, device_type: str, chip: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "tpu.tptrace"
    assert main(["import", str(_tpu_capture(tmp_path / "t1v-n-0.xplane.pb", device_type)), "-o", str(output)]) == 0
    capsys.readouterr()
    assert main(["summary", str(output)]) == 0
    summary = capsys.readouterr().out
    assert summary.splitlines()[0].startswith(f"run    t1v-n-0.xplane.pb · tpu, 4 chips · {device_type} ·")
    assert "· 2 compiles (1 recompile)" in summary.splitlines()[1]
    with tputrace.open(output) as trace:  # named for the jitted call around them, as JAX names its XLA module
        assert [(row.name, row.reason, row.dur_ns) for row in trace.records("compiles")] == [
            ("jit_step", "first", 3_000_000), ("jit_step", "recompile", 3_000_000)]
    split = summary[summary.index("time split ("):].split("\n\n")[0]
    assert split.splitlines()[0] == "time split (% of wall; categories overlap; the chips' as % of wall × 4 chips)"
    shares = {line.split()[0]: line.split()[-1] for line in split.splitlines()[2:]}
    assert (shares["program"], shares["device"]) == ("100.0%", "80.0%"), split
    ops = summary[summary.index("top ops by device op time"):].split("\n\n")[0]
    assert ops.splitlines()[1].split() == ["op", "calls", "device", "op", "time", "share"], ops  # nothing projected
    assert main(["report", str(output)]) == 0
    report = capsys.readouterr().out
    assert f"target: {chip} (the capture's chip, {device_type}; choose another with --target" in report
    assert main(["report", str(output), "--json"]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert (target["is_default"], target["from_capture"]) == (False, device_type)
    assert main(["report", str(output), "--target", "v7"]) == 0
    assert "target: TPU7x (Ironwood)\n" in capsys.readouterr().out
