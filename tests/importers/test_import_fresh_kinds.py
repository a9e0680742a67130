"""torch.profiler captures of torch.compile's runtime: its compiled graphs' calls, and a compile that failed, seen in
the profile alone (no TORCH_TRACE log)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.analysis import analyze_path
from tputrace.analysis.imported import COMPILE_OUTCOMES
from tputrace.cli.main import main

# A model compiled (aot_eager) before the profile, trained for 3 profiled steps: each call runs through Dynamo's
# cache lookup, the compiled region and AOTAutograd's CompiledFunction (and CompiledFunctionBackward).
COMPILED_CALLS = textwrap.dedent("""
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="aot_eager")
    compiled(torch.randn(32, 64)).sum().backward()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=3, repeat=1),
                 record_shapes=True, on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for _ in range(3):
            compiled(torch.randn(32, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
""")

_RUNTIME_RANGES = ("Torch-Compiled Region: 0/0", "TorchDynamo Cache Lookup", "CompiledFunction",
                   "CompiledFunctionBackward", "autograd::engine::evaluate_function: CompiledFunctionBackward")


def test_compiled_graph_calls_are_ranges_not_ops(tmp_path: Path) -> None:
    from captures import _capture

    output = tmp_path / "calls.tptrace"
    assert main(["import", str(_capture(tmp_path, "calls.py", COMPILED_CALLS, "tb")), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        op_names = {name for (name,) in trace.sql("SELECT s.text FROM ops o JOIN strings s ON s.id = o.op_sid")}
        ranges = [name for (name,) in trace.sql(
            "SELECT s.text FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.source = 'record_function'")]
    assert not op_names & set(_RUNTIME_RANGES)
    assert not [name for name in op_names if "Compiled" in name or "Dynamo" in name]
    assert "aten::addmm" in op_names and "aten::mm" in op_names  # the compiled graph's own ops stay ops
    for name in _RUNTIME_RANGES:
        assert ranges.count(name) == 3, name


@pytest.mark.parametrize("stacks", [True, False])
def test_a_failed_compile_seen_in_a_profile_alone_is_a_finding(tmp_path: Path, stacks: bool) -> None:
    from captures import TORCH_FAILED_COMPILE, _capture

    source = TORCH_FAILED_COMPILE if stacks else TORCH_FAILED_COMPILE.replace("with_stack=True", "with_stack=False")
    capture = _capture(tmp_path, "failed_compile.py", source, "tb")
    output = tmp_path / "failed.tptrace"
    assert main(["import", str(capture), "-o", str(output)]) == 0
    report = analyze_path(output)
    (finding,) = [found for found in report.findings if "left no compiled code" in found.title]
    assert finding.severity == "warning" and "backend failed" in finding.title and "runs eagerly" in finding.title
    assert "TORCH_TRACE" in finding.explanation
    assert report.imported is not None and COMPILE_OUTCOMES in report.imported.skipped
    if stacks:  # the function that ran eagerly after its compile, at its `def` line, and its eager time
        def_line = next(index for index, text in enumerate(source.splitlines(), 1) if "def loss_of" in text)
        assert finding.title.startswith(f"torch.compile of loss_of (failed_compile.py:{def_line})")
        assert finding.cost_per_step_ns is not None and finding.cost_per_step_ns > 0
        assert "4 eager calls" in finding.explanation


def test_a_compile_whose_region_ran_is_no_failure(tmp_path: Path, capsys: object) -> None:
    from captures import torch_profiled_compile_capture

    output = tmp_path / "compiled.tptrace"
    assert main(["import", str(torch_profiled_compile_capture(tmp_path)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        details = [json.loads(row.detail) for row in trace.records("compiles") if row.kind == "dynamo_frame"]
    assert [detail["region_ran"] for detail in details] == [True, True]
    assert not [found for found in analyze_path(output).findings if "left no compiled code" in found.title]


# A loop that keeps every step's loss, with its graph, in a list (line 18): each step's activations stay alive.
# Profiled with memory (and, where `stacks`, Python stacks).
KEPT_LOSSES = textwrap.dedent("""\
    import sys, torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    model = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []

    def train_step(x):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward(retain_graph=True)
        opt.step()
        return loss

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=6, repeat=1),
                 profile_memory=True, with_stack=sys.argv[2] == "stacks",
                 on_trace_ready=tensorboard_trace_handler(sys.argv[1])) as prof:
        for _ in range(6):
            losses.append(train_step(torch.randn(64, 256)))
            prof.step()
""")


@pytest.mark.parametrize("stacks", ["stacks", "none"])
def test_memory_kept_across_steps_is_placed_where_the_capture_can(tmp_path: Path, stacks: str) -> None:
    from captures import _capture

    output = tmp_path / "kept.tptrace"
    assert main(["import", str(_capture(tmp_path, "kept.py", KEPT_LOSSES, "tb", stacks)), "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        assert trace.count("buffers") > 0
    (finding,) = [found for found in analyze_path(output).findings if found.title.startswith("Live memory grows")]
    if stacks == "stacks":
        def_line = next(index for index, text in enumerate(KEPT_LOSSES.splitlines(), 1) if "def train_step" in text)
        assert "buffers made in train_step (kept.py:" + str(def_line) + ") survive" in finding.title
        assert (Path(finding.file or "").name, finding.line) == ("kept.py", def_line)
        assert finding.module is not None and finding.module.startswith("Sequential_0.")
        assert "name the function that made them" in finding.explanation
    else:
        assert "no Python stacks" in finding.title and "with_stack=True" in finding.explanation


# A function compiled for batches of 8, whose backend raises for a batch of 5 (Dynamo's errors suppressed).
FAILED_RECOMPILE = textwrap.dedent("""
    import sys, torch
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.config.suppress_errors = True

    def picky_backend(gm, example_inputs):
        if example_inputs[0].shape[0] != 8:
            raise RuntimeError("only batches of 8")
        return gm.forward

    def step(x):
        return torch.tanh(x @ x.T).sum()

    compiled = torch.compile(step, backend=picky_backend, dynamic=False)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for n in (8, 8, 5, 5, 8):
            compiled(torch.randn(n, 16))
    prof.export_chrome_trace(sys.argv[1])
""")


def test_a_failed_recompile_of_a_frame_that_compiled_is_not_told_as_eager(tmp_path: Path) -> None:
    from captures import _capture

    output = tmp_path / "recompile.tptrace"
    assert main(["import", str(_capture(tmp_path, "recompile.py", FAILED_RECOMPILE, "trace.json")),
                 "-o", str(output)]) == 0
    with tputrace.open(output) as trace:
        outcomes = [json.loads(row.detail).get("region_ran") for row in trace.records("compiles")
                    if row.kind == "dynamo_frame"]
    assert outcomes == [True, False]
    assert not [found for found in analyze_path(output).findings if "left no compiled code" in found.title]
