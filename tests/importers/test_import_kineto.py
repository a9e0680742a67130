"""Kineto traces as torch.profiler writes them on GPUs and other devices (`on_trace_ready`, `tensorboard_trace_handler`):
a header before `traceEvents` (`schemaVersion`, `deviceProperties`, `distributedInfo` listing a process group's every
rank) and some fields after it, gzip'd, timestamps with nanosecond digits, older Kineto's category names, and the
kernels, runtime calls and collectives of CUDA, ROCm and MTIA."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tputrace
from tputrace.cli.main import main

BASE_NS = 1_711_964_646_000_000_000
T0 = 4_458_676_520_000.0  # us since BASE_NS: Kineto's ts on a monotonic clock
KERNEL_US = 40.0
NCCL_US = 500.0
RANKS = "[0, 1, 2, 3, 4, 5, 6, 7]"
COMMS = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "Float",
         "Group size": 8, "Process Group Name": "0", "Process Group Description": "default_pg",
         "Process Group Ranks": RANKS}


def _x(cat: str, name: str, ts: float, dur: float, *, pid: int = 100, tid: int = 100, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _gpu_events(first_step: int = 5, steps: int = 2, *, runtime: str = "cuda") -> list[dict[str, Any]]:
    """Kineto's events of `steps` training steps on one GPU, in its file order (CPU ops, then the runtime's calls and
    the device's activities): per step a matmul launching a kernel, a DDP all-reduce (`record_param_comms`, NCCL's
    `nccl:all_reduce` enqueue range and its kernel, whose args name the collective), a `.item()` whose copy waits on
    the stream, a blocking copy's memcpy, and a device synchronize outside any op."""
    launch, stream_sync, device_sync = {"cuda": ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize"),
                                        "hip": ("hipLaunchKernel", "hipStreamSynchronize", "hipDeviceSynchronize")}[runtime]
    metadata = [{"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "ts": 0, "args": {"name": "python"}}]
    cpu: list[dict[str, Any]] = []
    device: list[dict[str, Any]] = []
    for index in range(steps):
        s = T0 + index * 2000.0
        correlation = 1000 + 10 * index
        cpu += [
            _x("user_annotation", f"ProfilerStep#{first_step + index}", s, 2000.0),
            _x("python_function", "train.py(10): step", s + 1, 1990.0),
            _x("cpu_op", "aten::mm", s + 10, 50.0, **{"External id": correlation, "Input type": ["float", "float"],
                                                      "Input Dims": [[64, 64], [64, 64]]}),
            _x("cpu_op", "record_param_comms", s + 100, 10.0, **{"External id": correlation + 1, **COMMS}),
            _x("user_annotation", "nccl:all_reduce", s + 101, 4.0),
            _x("cpu_op", "aten::item", s + 800, 100.0, **{"External id": correlation + 2}),
            _x("cpu_op", "aten::_local_scalar_dense", s + 805, 90.0, **{"External id": correlation + 3}),
        ]
        device += [
            _x("cuda_runtime", launch, s + 20, 5.0, correlation=correlation),
            _x("kernel", "ampere_sgemm_64x32_sliced1x4_nn", s + 30, KERNEL_US, pid=0, tid=7, device=0, stream=7,
               correlation=correlation),
            {"ph": "s", "id": correlation, "pid": 100, "tid": 100, "ts": s + 20, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": correlation, "pid": 0, "tid": 7, "ts": s + 30, "cat": "ac2g", "name": "ac2g", "bp": "e"},
            _x("cuda_runtime", launch, s + 103, 5.0, correlation=correlation + 1),
            _x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", s + 200,
               NCCL_US, pid=0, tid=20, device=0, stream=20, correlation=correlation + 1, **COMMS),
            _x("gpu_user_annotation", "nccl:all_reduce", s + 199, NCCL_US + 2, pid=0, tid=20),
            _x("cuda_runtime", "cudaMemcpyAsync", s + 810, 5.0, correlation=correlation + 3),
            _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", s + 820, 5.0, pid=0, tid=7, device=0,
               correlation=correlation + 3),
            _x("cuda_runtime", stream_sync, s + 816, 74.0, correlation=correlation + 4),
            _x("cuda_runtime", device_sync, s + 950, 40.0, correlation=correlation + 5),
        ]
        if index == 0:  # launched at the end of the step, run during the next: CUDA's Kineto writes the kernel first
            late = [_x("cuda_runtime", launch, s + 1990, 5.0, correlation=999),
                    _x("kernel", "late_kernel", s + 2010, 30.0, pid=0, tid=7, device=0, stream=7, correlation=999)]
            device += late[::-1] if runtime == "cuda" else late
    cpu.append(_x("cpu_op", "aten::zeros", T0 + steps * 2000.0 + 100, 100.0))  # after the last step: the capture ends later
    return metadata + cpu + device


def _kineto_document(events: list[dict[str, Any]], *, rank: int = 3, world_size: int = 8,
                     device_name: str = "NVIDIA A100-SXM4-80GB") -> dict[str, Any]:
    """Kineto's file: its header first (a process group's every rank in `pg_config`), `baseTimeNanoseconds` after
    the events."""
    ranks = list(range(world_size))
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": device_name, "totalGlobalMem": 85_899_345_920, "computeMajor": 8,
                              "computeMinor": 0, "warpSize": 32, "numSms": 108}] if device_name else [],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                           "pg_size": world_size, "ranks": ranks}]},
        "traceEvents": events,
        "traceName": "/tmp/libkineto_activities_100.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }


def _write(path: Path, document: dict[str, Any] | str) -> Path:
    text = document if isinstance(document, str) else json.dumps(document, indent=2)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def _import(tmp_path: Path, capture: Path, name: str = "imported.tptrace") -> Path:
    output = tmp_path / name
    assert main(["import", str(capture), "-o", str(output)]) == 0
    return output


def test_a_kineto_header_before_the_events_of_a_real_capture_is_read(captures: dict[str, Path], tmp_path: Path) -> None:
    """The real CPU capture rewritten as Kineto's own files are: a header of 300 ranks' process groups before
    `traceEvents` (16 KiB), `baseTimeNanoseconds` after it, gzip'd. It was rejected as no known format (the
    header pushed `traceEvents` out of the bytes read to detect it); it imports as the plain file does, on the same
    clock, with the rank and world size of its `distributedInfo`."""
    document = json.loads(captures["profiler"].read_text())
    plain = _import(tmp_path, captures["profiler"], "plain.tptrace")
    kineto = _kineto_document(document["traceEvents"], rank=34, world_size=300, device_name="")
    kineto["baseTimeNanoseconds"] = document["baseTimeNanoseconds"]
    kineto["distributedInfo"]["pg_config"] *= 10
    capture = _write(tmp_path / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", kineto)
    with gzip.open(capture, "rb") as stream:
        assert stream.read().index(b'"traceEvents"') > 16_000
    output = _import(tmp_path, capture)
    with tputrace.open(plain) as before, tputrace.open(output) as after:
        assert after.count("ops") == before.count("ops") > 0
        assert after.run.start_unix_ns == before.run.start_unix_ns
        source = json.loads(after.meta["imported"])[0]
    assert (source["distributed_rank"], source["distributed_world_size"], source["device"]) == (34, 300, "cpu")


def test_foreign_json_and_an_execution_trace_are_one_line_errors(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """JSON that is no torch.profiler trace stays an error; PyTorch's execution trace (`ExecutionTraceObserver`,
    recorded beside a Kineto trace) says what it is and what to import instead."""
    foreign = _write(tmp_path / "config.json", {"model": "gpt", "layers": [1, 2, 3]})
    listed = _write(tmp_path / "events.json", '[{"ph": "X", "ts": 1}]')
    execution = _write(tmp_path / "benchmark_simple_add_et.json.gz",
                       {"schema": "1.0.1", "pid": 563677, "time": "2023-07-14 11:53:07", "start_ts": 6278907328,
                        "nodes": [{"name": "[pytorch|profiler|execution_trace|thread]", "id": 2}], "finish_ts": 1})
    for bad, words in ((foreign, "not an xplane.pb"), (listed, "not an xplane.pb"), (execution, "execution trace")):
        assert main(["import", str(bad), "-o", str(tmp_path / "out.tptrace")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not (tmp_path / "out.tptrace").exists()


def test_a_gpu_captures_kernels_collectives_and_syncs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kernels and copies are executions on the GPU with their measured times, in the step that launched them (the
    capture's end is its last event's, not its last step's); the all-reduce is one
    collective per call, timed by its NCCL kernel, with its bytes from the element count and dtype (not a second
    row from NCCL's `nccl:all_reduce` enqueue range); the stream sync inside `.item()` and the device synchronize are
    host syncs at the user's line (as is the collective, at its kernel's launch); the rank is `distributedInfo`'s."""
    output = _import(tmp_path, _write(tmp_path / "rank3.pt.trace.json.gz", _kineto_document(_gpu_events())))
    with tputrace.open(output) as trace:
        executions = list(trace.records("executions"))
        programs = {program.id: program.name for program in trace.records("programs")}
        collectives = list(trace.records("collectives"))
        syncs = list(trace.records("syncs"))
        source = json.loads(trace.meta["imported"])[0]
        start_unix_ns = trace.run.start_unix_ns
        ops = Counter(op.op for op in trace.records("ops"))
        steps = [(step.step, step.source) for step in trace.step_times(rank=0)]
        end_ns = trace.run.end_ns
        zeros_step = [op.step for op in trace.records("ops") if op.op == "aten::zeros"]
    # The op after the last step is in no step of the loop: an `end` step holds it.
    assert steps == [(5, "imported"), (6, "imported"), (7, "end")] and zeros_step == [7]
    assert ops == {"aten::mm": 2, "record_param_comms": 2, "aten::item": 2,
                                       "aten::_local_scalar_dense": 2, "aten::zeros": 1}
    assert end_ns == 4_200_000
    assert start_unix_ns == BASE_NS + int(T0 * 1000)  # the events' clock, not the metadata's ts 0
    sgemm = [row for row in executions if programs[row.program_id].startswith("ampere_sgemm")]
    assert [(row.step, row.dur_ns, row.chip) for row in sgemm] == [(5, 40_000, 0), (6, 40_000, 0)]
    assert Counter(programs[row.program_id].split("(ncclDev")[0] for row in executions) == {
        "ampere_sgemm_64x32_sliced1x4_nn": 2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL": 2,
        "Memcpy DtoH (Device -> Pageable)": 2, "late_kernel": 1}
    assert [(row.step, row.start_ns) for row in executions if programs[row.program_id] == "late_kernel"] == [
        (5, 2_010_000)]
    assert [(row.kind, row.bytes, row.dtype, row.dur_ns, row.step) for row in collectives] == [
        ("all_reduce", 4 << 20, "float", 500_000, 5), ("all_reduce", 4 << 20, "float", 500_000, 6)]
    assert collectives[0].bus_bandwidth == pytest.approx((4 << 20) * 2 * 7 / 8 / 500e-6)
    assert {(Path(row.source.file).name, row.source.line) for row in collectives if row.source} == {("train.py", 10)}
    assert Counter((sync.kind, sync.dur_ns, sync.step) for sync in syncs) == {
        ("item", 74_000, 5): 1, ("synchronize", 40_000, 5): 1, ("item", 74_000, 6): 1, ("synchronize", 40_000, 6): 1}
    assert {(Path(sync.source.file).name, sync.source.line) for sync in syncs if sync.source} == {("train.py", 10)}
    assert (source["device"], source["device_name"], source["distributed_rank"], source["distributed_world_size"]) == (
        "gpu", "NVIDIA A100-SXM4-80GB", 3, 8)
    capsys.readouterr()
    assert main(["summary", str(output)]) == 0
    summary = capsys.readouterr().out
    assert "measured on its host (ops) and its gpu (kernels), not a TPU's" in summary and "projected for" not in summary
    assert "top ops by host dispatch (excl. flushes/compiles), measured on the capture's host" in summary
    assert "gpu, 1 chip · NVIDIA A100-SXM4-80GB, distributed rank 3 of 8 ·" in summary.splitlines()[0]
    kernels = summary[summary.index("top kernels by device time, measured on the capture's gpu\n"):].split("\n\n")[0]
    sgemm = next(line for line in kernels.splitlines() if line.strip().startswith("ampere_sgemm_64x32_sliced1x4_nn"))
    assert sgemm.split()[1:4] == ["2", "80.0", "µs"], kernels
    assert main(["report", str(output)]) == 0
    report = capsys.readouterr().out
    assert "measured on the capture's gpu" in report and "measured on this host" not in report
    assert "roofline" not in report and 'backend="tpu"' not in report and "torch.tpu" not in report
    assert "Host sync" in report and "pending op" not in report
    assert "target: none (the capture has no XLA costs to estimate a TPU's time from)" in report.splitlines()
    assert main(["export", str(output), "--perfetto", str(tmp_path / "gpu.json.gz")]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == "tputrace: the times are the capture's, measured on its gpu"
    assert main(["report", str(output), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["median_step_basis"] == "measured on the capture's gpu"
    assert "measured on the capture's gpu" in {finding["cost_basis"] for finding in data["findings"]}
    assert "measured on this host" not in json.dumps(data)


def test_amd_and_mtia_captures_use_their_own_names(tmp_path: Path) -> None:
    """ROCm's runtime calls are HIP's (`hipStreamSynchronize`); MTIA's device ops are `mtia_ccp_events` and its
    runtime's calls `mtia_runtime` (a `synchronizeStream` waits for the device): the rank's device is an mtia."""
    amd = _import(tmp_path, _write(tmp_path / "amd.json.gz", _kineto_document(_gpu_events(runtime="hip"),
                                                                              device_name="AMD Radeon Graphics")),
                  "amd.tptrace")
    with tputrace.open(amd) as trace:
        assert Counter(sync.kind for sync in trace.records("syncs")) == {"item": 2, "synchronize": 2}
        assert json.loads(trace.meta["imported"])[0]["device"] == "gpu" and trace.count("executions") == 7
        assert [row.step for row in trace.records("executions") if row.start_ns == 2_010_000] == [5]
    events = [
        _x("cpu_op", "aten::linear", T0, 100.0),
        _x("mtia_runtime", "runFunction - job_prep_and_submit_for_execution", T0 + 10, 20.0, correlation=1),
        _x("mtia_ccp_events", "pe_exe", T0 + 40, 300.0, pid=17, tid=3910, stream=112),
        _x("mtia_runtime", "synchronizeStream", T0 + 120, 250.0, correlation=2),
    ]
    mtia = _import(tmp_path, _write(tmp_path / "mtia.json.gz", _kineto_document(events, device_name="ARTEMIS")),
                   "mtia.tptrace")
    with tputrace.open(mtia) as trace:
        assert [(row.dur_ns, row.start_ns) for row in trace.records("executions")] == [(300_000, 40_000)]
        assert [(sync.kind, sync.dur_ns) for sync in trace.records("syncs")] == [("synchronize", 250_000)]
        assert trace.run.platform == "mtia"


def test_nanosecond_timestamps_keep_their_nanoseconds(tmp_path: Path) -> None:
    """`ts` written with nanosecond digits (`1712195495519689.047` µs): a float keeps only quarter microseconds at
    that size, so ops 1 ns apart landed on one time; they keep their nanoseconds."""
    base = 1_712_195_495_519_000
    stamps = [(0, 3000), (1, 999), (47, 250), (2001, 3)]  # (ns after `base` µs, duration ns)
    events = [_x("cpu_op", f"aten::op{index}", f"@{base + ns // 1000}.{ns % 1000:03d}@", f"@{dur / 1000:.3f}@",  # type: ignore[arg-type]
                 tid=100 + index) for index, (ns, dur) in enumerate(stamps)]
    events.append(_x("kernel", "elementwise_kernel", f"@{base + 2}.048@", "@0.731@", pid=0, tid=7, device=0))  # type: ignore[arg-type]
    document = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events, "displayTimeUnit": "ns"}
    text = json.dumps(document, indent=2).replace('"@', "").replace('@"', "")
    assert "1712195495519000.047" in text
    with tputrace.open(_import(tmp_path, _write(tmp_path / "rank-0.pt.trace.json.gz", text))) as trace:
        ops = sorted((op.start_ns, op.dur_ns) for op in trace.records("ops"))
        (kernel,) = trace.records("executions")
    assert ops == sorted(stamps)
    assert (kernel.start_ns, kernel.dur_ns) == (2048, 731)


def test_older_kinetos_category_names(tmp_path: Path) -> None:
    """Kineto of 2021 named its categories `Kernel`, `Runtime`, `Memcpy` and put `distributedInfo` after the events:
    such a file held 'no torch.profiler events'; its kernels import on the GPU, with the rank after the events."""
    events = [
        _x("Kernel", "void at::native::elementwise_kernel<128, 4>", T0 + 30, 4.0, pid=0, tid=7, device=0, stream=7,
           correlation=538860),
        _x("Runtime", "cudaLaunchKernel", T0, 20.0, correlation=538860),
        _x("Memcpy", "Memcpy HtoD (Pageable -> Device)", T0 + 50, 6.0, pid=0, tid=7, device=0),
        _x("Runtime", "cudaStreamSynchronize", T0 + 40, 30.0, correlation=538861),
    ]
    capture = _write(tmp_path / "inference_rank_1.json.gz", {"traceEvents": events, "distributedInfo": {"rank": 1}})
    with tputrace.open(_import(tmp_path, capture)) as trace:
        assert sorted(row.dur_ns for row in trace.records("executions")) == [4000, 6000]
        assert [sync.kind for sync in trace.records("syncs")] == ["synchronize"]
        source = json.loads(trace.meta["imported"])[0]
    assert (source["device"], source["distributed_rank"]) == ("gpu", 1)


def test_the_raw_text_scan_reads_a_kineto_file_as_decoding_does(tmp_path: Path) -> None:
    """The first pass's scan of raw text and its fallback that decodes every event agree on a GPU capture: its start
    (not the metadata's ts 0), steps, user frames, the header fields after the events and where its collectives
    are described."""
    from tputrace.importers.chrome_json import ChromeJsonImporter
    from tputrace.importers.sink import ImportSink
    from tputrace.store.writer import TraceWriter

    path = _write(tmp_path / "rank3.json", _kineto_document(_gpu_events()))
    importer = ChromeJsonImporter(ImportSink(TraceWriter(tmp_path / "unused.tptrace", create_file=False)), [path])
    scanned: tuple[dict[str, Any], set[str]] = ({}, set())
    decoded: tuple[dict[str, Any], set[str]] = ({}, set())
    text_pass = importer._scan_text(*scanned)
    event_pass = importer._scan_events(*decoded)
    assert text_pass == event_pass and text_pass[0] == T0 and len(text_pass[1]) == 2 and text_pass[2]
    assert scanned == decoded
    assert scanned[0]["baseTimeNanoseconds"] == BASE_NS and scanned[1] == {"kernel", "param"}
