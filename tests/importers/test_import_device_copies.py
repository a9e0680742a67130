"""Device time spent moving data (`data_movement`): a TPU capture whose chips wait in `copy-done` for host-offload
copies (arrays in memory space `S(5)`, host memory, copied to and from HBM, as a v6e's XProf capture names them in
its ops' HLO text) gets that as its first finding, with the arrays, their direction and size, the line that made
them, and the fix; a Kineto capture whose GPU waits for memcpy runs gets it too; copies that overlap compute, and a
capture without copies, get no such finding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tputrace.analysis import analyze_path
from tputrace.cli.main import main
from tputrace.xplane_proto import messages

CLASSES = messages()
START_NS = 1_700_000_000_000_000_000
MS_PS = 10**9
ARRAY = "f32[5,1024,1024,256]{3,2,1,0:T(8,128)}"
HOST_ARRAY = "f32[5,1024,1024,256]{3,2,1,0:T(8,128)S(5)}"
PAIR_IN = f"({ARRAY}, {HOST_ARRAY}, u32[]{{:S(2)}})"  # copy to HBM: (destination, source, context)
PAIR_OUT = f"({HOST_ARRAY}, {ARRAY}, u32[]{{:S(2)}})"
# name, HLO text, category, source line: a host-offloaded parameter copied in, an add, its result copied out.
OPS = (
    ("copy-start", f"%copy-start = {PAIR_IN} copy-start({HOST_ARRAY} %param)", "copy-start", None),
    ("copy-done", f"%copy-done = {ARRAY} copy-done({PAIR_IN} %copy-start)", "copy-done", None),
    ("add_fusion", f"%add_fusion = {ARRAY} fusion({ARRAY} %copy-done), kind=kLoop, calls=%fused_computation",
     "loop fusion", "offload.py:29"),
    ("copy-start.1", f"%copy-start.1 = {PAIR_OUT} copy-start({ARRAY} %add_fusion)", "copy-start", None),
    ("copy-done.1", f"%copy-done.1 = {HOST_ARRAY} copy-done({PAIR_OUT} %copy-start.1)", "copy-done", None),
)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (payloads here are under 128 bytes: a one-byte length)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def _hlo_proto() -> bytes:
    """`jit_f`'s HloProto as JAX writes it to `/host:metadata`: its parameter's `OpMetadata.op_name` is the argument's
    name (`ws[0]`), the add's its scope."""
    instructions = [_field(2, _field(1, name.encode()) + _field(7, _field(2, op_name.encode())))
                    for name, op_name in (("param", "ws[0]"), ("add_fusion", "jit(f)/jit(main)/add"))]
    return _field(1, _field(1, b"jit_f") + _field(3, b"".join(instructions)))


def _offload_capture(path: Path, *, copies: bool = True, overlapped: bool = False) -> Path:
    """Two v6e chips, 5 runs of `jit_f` each: per run (10 ms) a copy of a host parameter into HBM whose `copy-done`
    waits 6 ms, an add of 1 ms (at offload.py:29), and its result's copy out, waiting 2 ms. `overlapped`: the copies
    ran while a longer add (9 ms) computed, so that each `copy-done` finds its copy finished (1 ns, as XProf shows an
    overlapped copy on the ops line); without `copies` only the add runs (9 ms)."""
    space = CLASSES["XSpace"]()
    for chip in range(2):
        plane = space.planes.add(id=chip + 1, name=f"/device:TPU:{chip}")
        stat_ids = {}
        for number, name in enumerate(("device_type_string", "hlo_category", "program_id", "bytes_accessed", "source",
                                       "shape_with_layout", "run_id"), start=1):
            plane.stat_metadata[number].id = number
            plane.stat_metadata[number].name = name
            stat_ids[name] = number
        plane.stats.add(metadata_id=stat_ids["device_type_string"], str_value="TPU v6 Lite")
        module = plane.event_metadata[1]
        module.id, module.name = 1, "jit_f(77)"
        for number, (name, text, category, source) in enumerate(OPS, start=2):
            meta = plane.event_metadata[number]
            meta.id, meta.name, meta.display_name = number, text, name
            meta.stats.add(metadata_id=stat_ids["hlo_category"], str_value=category)
            meta.stats.add(metadata_id=stat_ids["program_id"], uint64_value=77)
            meta.stats.add(metadata_id=stat_ids["bytes_accessed"], int64_value=5 * 1024**3)
            meta.stats.add(metadata_id=stat_ids["shape_with_layout"], str_value=text.split(" = ")[1].split(" ")[0])
            if source:
                meta.stats.add(metadata_id=stat_ids["source"], str_value=source)
        modules = plane.lines.add(id=2, name="XLA Modules", timestamp_ns=START_NS)
        ops = plane.lines.add(id=3, name="XLA Ops", timestamp_ns=START_NS)
        for run in range(5):
            base = run * 10 * MS_PS
            executed = modules.events.add(metadata_id=1, offset_ps=base, duration_ps=10 * MS_PS)
            executed.stats.add(metadata_id=stat_ids["run_id"], int64_value=run + 1)
            if not copies:
                ops.events.add(metadata_id=4, offset_ps=base, duration_ps=9 * MS_PS)
                continue
            wait_in, wait_out, add_ps = (1000, 1000, 9 * MS_PS) if overlapped else (6 * MS_PS, 2 * MS_PS, MS_PS)
            offset = base
            for metadata_id, duration in ((2, 1000), (3, wait_in), (4, add_ps), (5, 1000), (6, wait_out)):
                ops.events.add(metadata_id=metadata_id, offset_ps=offset, duration_ps=duration)
                offset += duration
    metadata = space.planes.add(id=50, name="/host:metadata")
    metadata.stat_metadata[1].id, metadata.stat_metadata[1].name = 1, "Hlo Proto"
    metadata.event_metadata[1].id, metadata.event_metadata[1].name = 1, "jit_f(77)"
    metadata.event_metadata[1].stats.add(metadata_id=1, bytes_value=_hlo_proto())
    path.write_bytes(space.SerializeToString())
    return path


def _import(tmp_path: Path, capture: Path) -> Path:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    return output


def test_chips_waiting_for_host_offload_copies_are_the_first_finding(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    trace = _import(tmp_path, _offload_capture(tmp_path / "t1v-n-0.xplane.pb"))
    report = analyze_path(trace)
    finding = report.findings[0]
    assert finding.analyzer == "data_movement"
    # Per chip 5 runs × (6 + 2) ms of waits in 5 × 9 ms of device op time (the 1 ms add is the only compute).
    assert finding.title == ("The chips wait for copies between host memory and HBM: 89% of their device op time "
                             "(40.0 ms per chip)")
    assert finding.cost_total_ns == pytest.approx(40e6)
    assert finding.severity == "critical"  # 40 ms of each chip's 50 ms capture
    texts = [evidence.text for evidence in finding.evidence]
    assert texts[0].startswith("copy-done in jit_f(77): async copy host to device f32[5,1024,1024,256] (5.00 GiB), "
                               "parameter param (ws[0]); 10 runs on 2 chips, waited 60.0 ms"), texts
    assert texts[1].startswith("copy-done.1 in jit_f(77): async copy device to host f32[5,1024,1024,256] (5.00 GiB), "
                               "the result of add_fusion (jit(f)/jit(main)/add); 10 runs on 2 chips, waited 20.0 ms"), texts
    assert (finding.evidence[1].file, finding.evidence[1].line) == ("offload.py", 29)
    assert (finding.file, finding.line) == ("offload.py", 29)
    assert 'memory_kind="device"' in finding.suggestion and "overlaps compute" in finding.suggestion
    assert "bf16" in finding.suggestion
    data = report.results["data_movement"].plain_data()
    assert data["devices"] == 2  # the copy-starts (1 ns each) wait too
    assert (data["waiting_ns"], data["busy_ns"]) == (80_000_020, 90_000_020)
    assert main(["report", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "1. [critical] The chips wait for copies between host memory and HBM" in out
    assert "(measured on the capture's tpu)" in out


@pytest.mark.parametrize("capture", ["overlapped", "no copies"])
def test_copies_overlapped_with_compute_or_no_copies_get_no_finding(tmp_path: Path, capture: str) -> None:
    path = _offload_capture(tmp_path / "t1v-n-0.xplane.pb", copies=capture != "no copies",
                            overlapped=capture == "overlapped")
    report = analyze_path(_import(tmp_path, path))
    assert not [finding for finding in report.findings if finding.analyzer == "data_movement"], report.findings
    assert "data_movement" in report.results


def _x(cat: str, name: str, ts: float, dur: float, *, pid: int = 100, tid: int = 100, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _kineto(path: Path, memcpy_us: float, *, on_copy_stream: bool = False, steps: bool = True) -> Path:
    """One GPU, 4 profiler steps of 1 ms (no step markers without `steps`): a 100 us kernel and a pageable
    host-to-device memcpy of `memcpy_us` (none for 0; 1, 2, 3 and 4 MB) after it (or, `on_copy_stream`, beside it on another stream)."""
    t0 = 1_000_000.0
    events: list[dict[str, Any]] = []
    for step in range(4):
        s = t0 + step * 1000.0
        events += [
            *([_x("user_annotation", f"ProfilerStep#{step}", s, 1000.0)] if steps else []),
            _x("cpu_op", "aten::mm", s + 10, 50.0),
            _x("kernel", "ampere_sgemm_128x64_nn", s + 100, 100.0, pid=0, tid=7, device=0, stream=7),
            *([_x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", s + (100 if on_copy_stream else 210), memcpy_us,
                  pid=0, tid=9 if on_copy_stream else 7, device=0, stream=9 if on_copy_stream else 7,
                  bytes=(step + 1) * 1_000_000)]
              if memcpy_us else []),
        ]
    document = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
                "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    path.write_text(json.dumps(document))
    return path


def test_a_gpu_waiting_for_memcpy_runs(tmp_path: Path) -> None:
    report = analyze_path(_import(tmp_path, _kineto(tmp_path / "trace.json", 300.0)))
    (finding,) = [finding for finding in report.findings if finding.analyzer == "data_movement"]
    assert finding.title == "The GPU waits for copies between host memory and device memory: 75% of its busy time"
    # Kineto gives each copy its bytes (1, 2, 3, 4 MB here): the finding says what the copies moved.
    assert finding.evidence[0].text.startswith("Memcpy HtoD (Pageable -> Device): memcpy host to device, 2.38 MiB a run "
                                               "on average; 4 runs on 1 GPU, waited 1.20 ms"), finding.evidence[0].text
    assert "1 op moved data (host to device), 9.54 MiB in 4 copies." in finding.explanation, finding.explanation
    assert "pin_memory()" in finding.suggestion and "non_blocking=True" in finding.suggestion
    assert finding.cost_per_step_ns == pytest.approx(300_000)


def test_a_memcpy_beside_kernels_is_no_wait(tmp_path: Path) -> None:
    report = analyze_path(_import(tmp_path, _kineto(tmp_path / "trace.json", 80.0, on_copy_stream=True)))
    assert not [finding for finding in report.findings if finding.analyzer == "data_movement"], report.findings
    assert report.results["data_movement"].plain_data()["waiting_ns"] == 0


def test_a_gpu_idle_most_of_a_capture_without_steps(tmp_path: Path) -> None:
    """Without steps (no `host_bound` judgement) and without copies, a GPU busy 100 us of each ms is idle."""
    report = analyze_path(_import(tmp_path, _kineto(tmp_path / "trace.json", 0.0, steps=False)))
    (finding,) = [finding for finding in report.findings if finding.analyzer == "data_movement"]
    assert finding.severity == "info"
    assert finding.title.startswith("The GPU sat idle for 8"), finding.title
    assert "(400 µs busy per GPU in " in finding.title
    (tmp_path / "steps").mkdir()
    with_steps = analyze_path(_import(tmp_path / "steps", _kineto(tmp_path / "steps.json", 0.0)))
    assert not [finding for finding in with_steps.findings if finding.analyzer == "data_movement"]


def test_a_tensorflow_gpu_capture_waiting_for_its_memcpy_stream(tmp_path: Path) -> None:
    """An XProf GPU plane (as TensorFlow writes one): a compute stream's kernel of 100 us in each ms, and a
    `MemcpyH2D` on the copy stream of 300 us after it; a copy started with the kernel waits only for the part of its
    time no kernel ran."""
    def capture(path: Path, copy_offset_us: int) -> Path:
        space = CLASSES["XSpace"]()
        plane = space.planes.add(id=1, name="/device:GPU:0")
        for number, name in enumerate(("volta_sgemm_128x64_nn", "MemcpyH2D"), start=1):
            plane.event_metadata[number].id = number
            plane.event_metadata[number].name = name
        compute = plane.lines.add(id=1, name="Stream #13(Compute)", timestamp_ns=START_NS)
        copies = plane.lines.add(id=2, name="Stream #63(MemcpyH2D)", timestamp_ns=START_NS)
        for step in range(4):
            compute.events.add(metadata_id=1, offset_ps=step * MS_PS, duration_ps=MS_PS // 10)
            copies.events.add(metadata_id=2, offset_ps=step * MS_PS + copy_offset_us * 10**6,
                              duration_ps=3 * MS_PS // 10)
        path.write_bytes(space.SerializeToString())
        return path

    report = analyze_path(_import(tmp_path, capture(tmp_path / "gpu.xplane.pb", 100)))
    (finding,) = [finding for finding in report.findings if finding.analyzer == "data_movement"]
    assert finding.title == "The GPU waits for copies between host memory and device memory: 75% of its busy time"
    assert finding.evidence[0].text.startswith("MemcpyH2D: memcpy host to device; 4 runs on 1 GPU, waited 1.20 ms")
    (tmp_path / "beside").mkdir()
    beside = analyze_path(_import(tmp_path / "beside", capture(tmp_path / "beside.xplane.pb", 0)))
    assert beside.results["data_movement"].plain_data()["waiting_ns"] == 800_000  # 200 us of each copy's 300
