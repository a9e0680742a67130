"""`tputrace import` on real captures made here: XProf (jax.profiler), TORCH_TRACE (torch.compile) and
torch.profiler JSON, with hand-checked counts, and the views run on the imported traces."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tputrace
from tputrace.cli.main import main
from tputrace.importers.compile_ranges import COMPILED_CALL


def _import(tmp_path: Path, *paths: Path) -> tputrace.Trace:
    output = tmp_path / "imported.tptrace"
    assert main(["import", *map(str, paths), "-o", str(output)]) == 0
    return tputrace.open(output)


def test_a_jax_profile_imports_its_xla_ops_programs_and_steps(captures: dict[str, Path], tmp_path: Path) -> None:
    trace = _import(tmp_path, captures["jax"])
    (source,) = json.loads(trace.meta["imported"])
    assert source["format"] == "xplane" and source["path"].endswith(".xplane.pb") and source["device"] == "cpu"
    # XLA:CPU runs the step as four ops (a dot and three fusions), once per step.
    ops = Counter(op.op for op in trace.records("ops"))
    assert sum(ops.values()) == 12 and all(count == 3 for count in ops.values()), ops
    assert sum("fusion" in name for name in ops) == 3
    (program,) = trace.records("programs")
    assert program.name == "jit_step" and program.kind == "xla"
    executions = list(trace.records("executions"))
    assert len(executions) == 3 and all(row.program_id == program.id for row in executions)
    assert {row.name for row in trace.records("fusions")} == {name for name in ops if "fusion" in name}
    steps = list(trace.records("steps"))
    # The capture's own step numbers (`StepTraceAnnotation(step_num=i)`, 0..2).
    assert [step.step for step in steps] == [0, 1, 2, 3] and all(step.end_ns > step.start_ns for step in steps)
    # After the last marker's end: the profiler's stop, in an `end` step that is no step of the loop.
    assert [step.source for step in steps] == ["imported"] * 3 + ["end"]
    origins = Counter(row.origin for row in trace.records("annotations"))
    assert origins["python"] > 0 and origins["traceme"] > 0


def test_torch_trace_imports_compiles_recompile_reasons_and_graph_breaks(captures: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    trace = _import(tmp_path, captures["torch_trace"])
    compiles = list(trace.records("compiles"))
    # f and its resume function, each compiled for the 1-d input and again for the 2-d one.
    assert sorted((row.name, row.reason) for row in compiles) == [
        ("f", "first"), ("f", "recompile"),
        ("torch_dynamo_resume_in_f_at_5", "first"), ("torch_dynamo_resume_in_f_at_5", "recompile"),
    ]
    diffs = sorted(row.diff for row in compiles if row.diff)
    assert diffs == ["0/0: tensor 'x' rank mismatch. expected 1, actual 2",
                     "1/0: tensor 'y' rank mismatch. expected 1, actual 2"]
    breaks = list(trace.records("graph_breaks"))
    assert len(breaks) == 2
    for row in breaks:
        assert row.reason == "Failed to trace builtin operator"
        assert (row.source.file, row.source.line, row.source.function) == (str(captures["script"]), 5, "f")


def test_a_torch_profiler_json_imports_ops_with_shapes_and_memory(captures: dict[str, Path], tmp_path: Path) -> None:
    trace = _import(tmp_path, captures["profiler"])
    ops = list(trace.records("ops"))
    linears = [op for op in ops if op.op == "aten::linear"]
    assert len(linears) == 4  # two layers, two steps
    assert linears[0].inputs == "float[8,16], float[32,16], float[32]"
    assert sum(op.op == "aten::relu" for op in ops) == 2
    memory = list(trace.records("memory"))
    assert memory and max(row.peak_bytes for row in memory) > 0
    frames = [row.source for row in trace.records("annotations") if row.origin == "python" and row.source]
    assert any(frame.file == "profiled.py" for frame in frames)
    # The model is an nn.Sequential: every op ran in the script's own code, the `<module>` frame.
    assert {(op.source.file, op.source.function) for op in ops} == {("profiled.py", "<module>")}


def test_captures_of_one_run_combine_into_one_trace(captures: dict[str, Path], tmp_path: Path) -> None:
    trace = _import(tmp_path, captures["jax"], captures["torch_trace"], captures["profiler"])
    sources = json.loads(trace.meta["imported"])
    assert [source["format"] for source in sources] == ["xplane", "torch_trace", "torch_profiler_json"]
    assert [source["rank"] for source in sources] == [0, 1, 2]
    assert {row.rank for row in trace.records("compiles")} == {1}
    assert {row.rank for row in trace.records("executions")} == {0}


@pytest.mark.parametrize("command", ["summary", "report", "plot", "export"])
def test_the_views_run_on_an_imported_trace(captures: dict[str, Path], tmp_path: Path, command: str) -> None:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(captures["jax"]), str(captures["torch_trace"]), "-o", str(output)]) == 0
    extra = {"plot": ["-o", str(tmp_path / "report.html")],
             "export": ["--perfetto", str(tmp_path / "out.json.gz")]}.get(command, [])
    assert main([command, str(output), *extra]) == 0


def test_truncated_and_foreign_captures_are_one_line_errors(captures: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    xplane = next(captures["jax"].rglob("*.xplane.pb"))
    truncated = tmp_path / "cut.xplane.pb"
    truncated.write_bytes(xplane.read_bytes()[: xplane.stat().st_size // 2])
    cut_json = tmp_path / "cut.json"
    cut_json.write_text(captures["profiler"].read_text()[:5000])
    log = next(captures["torch_trace"].glob("*.log")).read_text()
    cut_log = tmp_path / "cut.log"
    cut_log.write_text(log[: log.index("\nV", len(log) // 2) + 40])  # ends inside a record's line
    xprof_json = next(captures["jax"].rglob("*.trace.json.gz"))  # XProf's Chrome JSON beside its xplane.pb
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello\n")
    for bad, words in ((truncated, "truncated"), (cut_json, "truncated"), (cut_log, "truncated"), (xprof_json, "no torch.profiler events"), (foreign, "not an xplane.pb")):
        assert main(["import", str(bad), "-o", str(tmp_path / "out.tptrace")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not (tmp_path / "out.tptrace").exists()


def test_the_report_says_what_an_import_could_not_analyse(captures: dict[str, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "imported.tptrace"
    assert main(["import", str(captures["torch_trace"]), "-o", str(output)]) == 0
    capsys.readouterr()
    assert main(["report", str(output)]) == 0
    text = capsys.readouterr().out
    assert "imported: torch_trace capture" in text and "measured on the capture's device (host)" in text
    assert "index_errors, remade_optimizers, compile_cache (needs a tputrace recording)" in text
    assert "Graph break at compiled.py:5" in text
    assert main(["report", str(output), "--json"]) == 0
    skipped = json.loads(capsys.readouterr().out)["imported"]["skipped"]
    assert "recompiles" not in skipped and "graph_breaks" not in skipped and "syncs" in skipped


def test_xprof_device_planes_of_two_hosts_import_with_sources_and_costs(sample_trace_path: Path,
                                                                         tmp_path: Path) -> None:
    # tputrace's own XProf export writes `/device:TPU:n` planes with XLA Modules/Ops lines and the op metadata
    # stats XProf reads (source, tf_op, flops, bytes_accessed, hlo_category), one file per host.
    logdir = tmp_path / "tb"
    assert main(["export", str(sample_trace_path), "--tensorboard", str(logdir)]) == 0
    trace = _import(tmp_path, logdir)
    recorded = tputrace.open(sample_trace_path)
    sources = json.loads(trace.meta["imported"])
    assert [(source["host"], source["device"]) for source in sources] == [("tpu-vm-0", "tpu"), ("tpu-vm-1", "tpu")]
    ops = list(trace.records("ops"))
    assert len(ops) == recorded.count("ops")
    assert all(op.source is not None and op.source.line > 0 for op in ops)
    assert all(op.module and ":" in op.module for op in ops)  # tf_op: "scope/op:type"
    assert trace.count("executions") == recorded.count("executions")
    programs = list(trace.records("programs"))
    assert programs and all(program.flops and program.bytes_accessed for program in programs)
    assert Counter(step.rank for step in trace.records("steps")) == {0: 6, 1: 6}
    assert trace.count("fusions") > 0


def test_torch_trace_guard_recompiles_the_recompile_limit_and_break_reasons(tmp_path: Path) -> None:
    from captures import torch_guards_capture

    folder, script = torch_guards_capture(tmp_path)
    trace = _import(tmp_path, folder)
    compiles = [(row.name, row.reason, row.diff, row.source.line if row.source else None)
                for row in trace.records("compiles")]
    h = [row for row in compiles if row[0] == "h"]
    # Compiled for SCALE 1, 2 and 3; the fourth attempt hits the limit and still names h and its line.
    assert [row[1] for row in h] == ["first", "recompile", "recompile", "recompile"] and {row[3] for row in h} == {13}
    assert h[1][2] == f"2/0: G['SCALE'] == 1 (return x * SCALE at {script}:14 in h)"
    failed = {row.name: json.loads(row.detail)["fail_reason"] for row in trace.records("compiles")
              if "fail_reason" in (row.detail or "")}
    assert failed == {"h": "Dynamo recompile limit exceeded", "skipped": "Failed to trace builtin operator"}
    assert ("f", "recompile", "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5", 4) in compiles
    (module,) = [row for row in trace.records("compiles") if row.source and row.source.line == 29]
    assert (module.source.file, module.source.function) == (str(script), "<module>")
    breaks = sorted((row.reason, row.source.line) for row in trace.records("graph_breaks"))
    assert breaks == [("Call to `torch._dynamo.graph_break()`", 23), ("Data-dependent branching", 5),
                      ("Data-dependent branching", 5),
                      ("Failed to trace builtin operator; the function runs eagerly", 34),
                      ("Tensor.tolist() with non-integer tensor", 24)]
    # What each function runs as is read from its compiles: `f` and its resumed frame each compiled a graph; the
    # frame resumed after `graph_break()` in `outer` has no ops; Dynamo gave up on `skipped`, which runs eagerly.
    from tputrace.analysis import analyze_path

    findings = analyze_path(tmp_path / "imported.tptrace").findings
    titles = {finding.line: finding.title.split(": ", 1)[1] for finding in findings if finding.analyzer == "graph_breaks"}
    # h's recompiles are one finding, which tells that it then hit the recompile limit (no second finding says so).
    (h_finding,) = [finding for finding in findings if finding.line == 13]
    assert h_finding.analyzer == "guard_recompiles" and "recompile limit" in h_finding.suggestion
    assert titles == {5: "f() runs as 2 graphs", 23: "outer() runs as 1 graph", 24: "outer() runs as 1 graph",
                      34: "Dynamo skipped skipped(), which runs eagerly (no graph)"}


def _covered_us(intervals: list[tuple[float, float]]) -> float:
    """The time covered by some intervals (us)."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def test_torch_profiler_nested_ops_take_self_time_and_compiles_are_compiles(tmp_path: Path) -> None:
    from captures import torch_profiled_compile_capture

    capture = torch_profiled_compile_capture(tmp_path)
    trace = _import(tmp_path, capture)
    compiles = sorted(trace.records("compiles"), key=lambda row: row.start_ns)
    assert [(row.name, row.kind, row.reason) for row in compiles if row.kind == "dynamo_frame"] == [
        ("compiled frame 0", "dynamo_frame", "first"), ("compiled frame 0", "dynamo_frame", "recompile")]
    assert [json.loads(row.detail)["compile_id"] for row in compiles if row.kind == "dynamo_frame"] == ["0/0", "0/1"]
    assert {row.kind for row in compiles} <= {"dynamo_frame", "aot"}
    ops = list(trace.records("ops"))
    # What torch.compile ran while compiling (its phases, ops on fake tensors) is compile time, not ops.
    for row in compiles:
        assert not [op for op in ops if row.start_ns <= op.start_ns < row.start_ns + row.dur_ns], row.name
    assert not any("dynamo_timed" in op.op or op.op in ("entire_frame_compile", "backend_compile") for op in ops)
    # Each op's time is its own (self) time: the ops' times add up to the time the thread spent in an op.
    events = json.loads(capture.read_text())["traceEvents"]
    ranges = [(event["ts"], event["ts"] + event["dur"]) for event in events
              if event.get("cat") == "cpu_op" and event["name"] in ("entire_frame_compile", "entire_backward_compile")]
    # The compiled graph's calls (`Torch-Compiled Region`, `CompiledFunction`) are ranges around ops, no ops.
    in_ops = [(event["ts"], event["ts"] + event["dur"]) for event in events if event.get("cat") == "cpu_op"
              and not COMPILED_CALL.match(event["name"]) and not any(start <= event["ts"] < end for start, end in ranges)]
    in_op_us = _covered_us(in_ops + ranges) - _covered_us(ranges)
    assert abs(sum(op.dur_ns for op in ops) / 1000 - in_op_us) < 0.002 * len(ops) + 1
    linear = sum(op.dur_ns for op in ops if op.op == "aten::linear")
    addmm = sum(op.dur_ns for op in ops if op.op == "aten::addmm")
    assert 0 < linear < addmm  # linear's own time leaves out the addmm inside it


def test_the_windows_of_a_profiling_schedule_are_one_rank(captures: dict[str, Path], tmp_path: Path) -> None:
    from captures import torch_schedule_capture

    folder = torch_schedule_capture(tmp_path)
    windows = sorted(folder.glob("*.pt.trace.json.gz"))
    assert len(windows) == 2
    trace = _import(tmp_path, folder, captures["profiler"])
    sources = json.loads(trace.meta["imported"])
    assert [(source["rank"], len(source.get("windows", []))) for source in sources] == [(0, 2), (1, 0)]
    steps = [step for step in trace.records("steps") if step.rank == 0]
    assert [step.step for step in steps] == [2, 3, 6, 7]  # ProfilerStep#2, #3, #6, #7: the capture's numbers
    assert all(a.end_ns <= b.start_ns for a, b in zip(steps, steps[1:]))
    # Steps 3 and 4 of 9 were not recorded: the second window starts well after the first ends.
    assert steps[2].start_ns - steps[1].end_ns > steps[1].end_ns - steps[1].start_ns
    ops = [op for op in trace.records("ops") if op.rank == 0]
    assert len({op.seq for op in ops}) == len(ops)
    per_step = Counter(op.step for op in ops)
    assert set(per_step) == {2, 3, 6, 7} and len(set(per_step.values())) == 1, per_step
    assert Counter(row.name for row in trace.records("annotations") if row.rank == 0)["forward_backward"] == 4


def test_xla_cpu_collectives_over_four_virtual_devices(tmp_path: Path) -> None:
    from captures import jax_collectives_capture

    trace = _import(tmp_path, jax_collectives_capture(tmp_path))
    (run,) = trace.runs
    assert run.chips == 4  # XLA:CPU's devices have no planes; their ops name them
    (program,) = [row for row in trace.records("programs") if row.name == "jit_f"]
    assert {row.chip for row in trace.records("executions") if row.program_id == program.id} == {0, 1, 2, 3}
    # The ops carry no hlo_category on XLA:CPU: their names (psum, all_gather) say they are collectives.
    collectives = Counter((row.kind, row.step) for row in trace.records("collectives"))
    assert collectives == {("all_reduce", 0): 12, ("all_gather", 0): 12}  # 3 calls on 4 devices
    # XLA:CPU's events carry no bytes: the program's HLO sizes them (a scalar psum, an all-gather to f32[4,2,16])
    assert {(row.kind, row.bytes, row.dtype) for row in trace.records("collectives")} == {
        ("all_reduce", 4, "f32"), ("all_gather", 512, "f32")}
    assert main(["report", str(tmp_path / "imported.tptrace")]) == 0


def test_two_xprof_sessions_of_one_process_are_one_rank(captures: dict[str, Path], tmp_path: Path) -> None:
    from captures import jax_two_sessions_capture

    logdir = jax_two_sessions_capture(tmp_path)
    assert len(list(logdir.rglob("*.xplane.pb"))) == 2
    trace = _import(tmp_path, logdir, captures["jax"])  # the other capture is another process: its own rank
    sources = json.loads(trace.meta["imported"])
    assert [(source["rank"], len(source.get("windows", []))) for source in sources] == [(0, 2), (1, 0)]
    steps = [step for step in trace.records("steps") if step.rank == 0]
    assert [step.step for step in steps if step.source == "imported"] == [0, 1, 2, 10, 11, 12]  # their `step_num`s
    assert [step.step for step in steps if step.source == "end"] == [13]  # the second session's stop
    assert steps[3].start_ns - steps[2].end_ns > 1_000_000_000  # the sleep between the sessions
    assert sum(row.rank == 0 for row in trace.records("executions")) == 6
    ops = [op for op in trace.records("ops") if op.rank == 0]
    assert len(ops) == 24 and len({op.seq for op in ops}) == 24  # four ops a step


def test_captures_in_a_directory_are_ranks_in_the_numeric_order_of_their_names(captures: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    log = next(captures["torch_trace"].glob("*.log")).read_text()
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (10, 2, 0, 1):
        (folder / f"dedicated_log_torch_trace_rank_{rank}_abc.log").write_text(log)
    trace = _import(tmp_path, folder)
    paths = [Path(source["path"]).name for source in json.loads(trace.meta["imported"])]
    assert paths == [f"dedicated_log_torch_trace_rank_{rank}_abc.log" for rank in (0, 1, 2, 10)]


def test_process_group_collectives_in_torch_profiler_captures(tmp_path: Path) -> None:
    from captures import torch_gloo_capture

    trace = _import(tmp_path, torch_gloo_capture(tmp_path))
    sources = json.loads(trace.meta["imported"])
    assert [(source["rank"], source["distributed_rank"]) for source in sources] == [(0, 0), (1, 1)]
    collectives = Counter((row.rank, row.kind, row.bytes, row.dtype) for row in trace.records("collectives"))
    assert collectives == {(0, "all_reduce", 4000, "float"): 3, (1, "all_reduce", 4000, "float"): 3}
    assert all(row.dur_ns > 0 for row in trace.records("collectives"))


def test_an_import_without_ops_or_compiles_is_not_told_to_use_the_tpu_device(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A capture with nothing but annotations (a profiled region that ran no op) imports, and its summary does not
    say that the script's tensors stayed off the tpu device: the run was never on it."""
    from tputrace.summary import NO_DEVICE_OPS_BEFORE_ERROR_TEXT, NO_DEVICE_OPS_TEXT

    torch = pytest.importorskip("torch")
    capture = tmp_path / "no_ops.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with torch.profiler.record_function("idle region"):
            pass
    profiler.export_chrome_trace(str(capture))
    with _import(tmp_path, capture) as trace:
        assert trace.count("ops") == 0 and trace.count("compiles") == 0
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "imported.tptrace")]) == 0
    out = capsys.readouterr().out
    assert NO_DEVICE_OPS_TEXT not in out and NO_DEVICE_OPS_BEFORE_ERROR_TEXT not in out


GUARD_STORM = '''
import torch

@torch.compile(backend="aot_eager", dynamic=False)
def scaled_sum(x, n):  # the compiled function
    return (x * n).sum()

for size in (8, 12, 16, 20, 24, 28):
    scaled_sum(torch.randn(size), 2)
for scale in range(3, 6):
    scaled_sum(torch.randn(8), scale)
'''


def test_torch_trace_recompiles_are_a_finding_by_what_changed(tmp_path: Path) -> None:
    """A TORCH_TRACE log has no input signatures, so the shape storm analysis cannot run on it; Dynamo's recompile
    reasons say what changed, and a function recompiled again and again is one finding that counts them."""
    from captures import _torch_trace

    from tputrace.analysis import analyze_path

    logs, script = _torch_trace(tmp_path, "guard_storm.py", GUARD_STORM, "logs")
    _import(tmp_path, logs).close()
    report = analyze_path(tmp_path / "imported.tptrace")
    (finding,) = [finding for finding in report.findings if finding.analyzer == "guard_recompiles"]
    def_line = GUARD_STORM.splitlines().index("def scaled_sum(x, n):  # the compiled function") + 1
    assert finding.file == str(script) and finding.line in (def_line - 1, def_line)
    assert "the size of x, dim 0 (5 recompiles)" in finding.title and "the value of n (3 recompiles)" in finding.title
    assert "mark_dynamic" in finding.suggestion and "pass it as a tensor" in finding.suggestion
    # Its cost was measured on the machine the log was made on, which the report names as the capture's.
    from tputrace.analysis.render import report_lines

    costs = [line.text for line in report_lines(report) if line.text.startswith("cost ≈")]
    assert any(text.endswith(f"(measured on the capture's host) · at {script}:{finding.line}") for text in costs), costs
    assert not any("measured on this host" in text for text in costs), costs
    plain = report.to_dict()
    assert plain["median_step_basis"] == "measured on the capture's host"
    assert {item["cost_basis"] for item in plain["findings"]} == {"measured on the capture's host"}
