"""torch.compile(backend="tpu"): parity with eager and the CPU, and what the trace records (Dynamo frame
compiles with their time split, the AOT graphs, XLA compiles per shape, executions, fusions, graph
breaks, recompiles with their guard failures, shape buckets)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch._dynamo

import tputrace
from backend_helpers import host
from tputrace.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
PROBLEMS = EXAMPLES / "problems"
MARKER = "# tputrace: problem"
sys.path.insert(0, str(EXAMPLES))


def _run(tmp_path: Path, script: Path, *args: str) -> Path:
    trace_path = tmp_path / f"{script.stem}.tptrace"
    assert main(["run", "--mode", "compile", "-o", str(trace_path), str(script), *args]) == 0
    return trace_path


def _script(tmp_path: Path, name: str, source: str) -> Path:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source))
    return script


def _marked_line(script: Path) -> int:
    (line,) = [number for number, text in enumerate(script.read_text().splitlines(), 1) if MARKER in text]
    return line


def _line_of(script: Path, text: str) -> int:
    (line,) = [number for number, source in enumerate(script.read_text().splitlines(), 1) if text in source]
    return line


class _Tagger(torch.nn.Module):
    """Per-position model: padding the sequence dim cannot change the real positions."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(40, 16)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(tokens))


def test_inference_and_training_match_the_cpu() -> None:
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model.load_state_dict(reference.state_dict())
    model = model.to("tpu")
    compiled = torch.compile(model, backend="tpu")
    inputs = torch.randn(5, 6)
    with torch.no_grad():
        assert torch.allclose(host(compiled(inputs.to("tpu"))), reference(inputs), atol=1e-6)
    compiled(inputs.to("tpu")).square().mean().backward()
    reference(inputs).square().mean().backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert type(ours).__name__ == "TpuTensor" and ours.grad is not None
        assert torch.allclose(host(ours.grad), theirs.grad, atol=1e-6)


def test_buffers_randomness_mutations_aliases_and_pending_inputs() -> None:
    from tputrace.backend.compat.device_module import EagerMode

    from backend_helpers import eager

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model.load_state_dict(reference.state_dict())
    model = model.to("tpu")
    images = torch.randn(2, 3, 8, 8)
    assert torch.allclose(host(torch.compile(model, backend="tpu")(images.to("tpu"))), reference(images), atol=1e-5)
    assert torch.allclose(host(model[1].running_var), reference[1].running_var, atol=1e-6)  # buffers written back

    dropout = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5, training=True), backend="tpu")
    ones = torch.ones(2000, device="tpu")
    first, second = host(dropout(ones)), host(dropout(ones))
    assert 0.4 < (first == 0).float().mean().item() < 0.6 and not torch.equal(first, second)

    def bump(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x.view(2, 3)

    counts = torch.zeros(6, device="tpu")
    view = torch.compile(bump, backend="tpu")(counts)
    assert host(counts).tolist() == [1.0] * 6
    counts.add_(1)  # the output is a view of the input, as in eager
    assert host(view).tolist() == [[2.0] * 3] * 2

    linear = torch.nn.Linear(4, 3).to("tpu")
    compiled = torch.compile(linear, backend="tpu")
    inputs = torch.randn(2, 4)
    with eager(EagerMode.DEFER_AND_FUSE):
        pending = inputs.to("tpu") * 2  # not computed yet when the compiled graph reads it
        result = host(compiled(pending))
    expected = torch.nn.functional.linear(inputs * 2, host(linear.weight), host(linear.bias))
    assert torch.allclose(result, expected, atol=1e-6)


def test_gpt_compiled_trains_like_eager_and_the_trace_holds_its_graphs(tmp_path: Path) -> None:
    import gpt_train

    config = gpt_train.GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    steps = 4
    eager_losses = gpt_train.train("tpu", steps, batch=2, config=config)
    losses_path = tmp_path / "losses.json"
    script = _script(
        tmp_path,
        "gpt_compiled",
        f"""
        import json, sys
        sys.path.insert(0, {str(EXAMPLES)!r})
        import gpt_train
        config = gpt_train.GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
        losses = gpt_train.train("tpu", {steps}, batch=2, compile_model=True, config=config)
        open({str(losses_path)!r}, "w").write(json.dumps(losses))
        """,
    )
    trace_path = _run(tmp_path, script)
    compiled_losses = json.loads(losses_path.read_text())
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5)
    assert compiled_losses[-1] < compiled_losses[0]

    with tputrace.open(trace_path) as trace:
        compiles = [row for row in trace.records("compiles") if row.kind in ("dynamo_frame", "aot", "xla")]
        (frame,) = [row for row in compiles if row.kind == "dynamo_frame"]
        assert frame.name == "GPT.forward" and frame.reason == "first"
        assert Path(frame.source.file).name == "gpt_train.py" and frame.source.line == _line_of(EXAMPLES / "gpt_train.py", "def forward(self, tokens")
        detail = json.loads(frame.detail)
        assert detail["dynamo_ns"] > 0 and detail["aot_ns"] > 0 and detail["xla_ns"] > 0 and detail["n_ops"] > 0
        assert len(detail["graph_ids"]) == 1
        roles = {json.loads(row.detail)["role"]: row for row in compiles if row.kind == "aot"}
        assert set(roles) == {"forward", "backward"}
        assert json.loads(roles["backward"].detail)["n_ops"] > json.loads(roles["forward"].detail)["n_ops"] > 0
        xla = [row for row in compiles if row.kind == "xla"]
        assert sorted(json.loads(row.detail)["role"] for row in xla) == ["backward", "forward"]
        assert all(row.reason == "first" for row in compiles), [(row.kind, row.reason, row.diff) for row in compiles]
        assert all(row.step == 0 for row in compiles)  # nothing compiles after the warm-up step
        programs = {program.id: program for program in trace.records("programs") if program.kind == "compiled"}
        assert {row.program_id for row in xla} == set(programs)
        assert all(program.flops > 0 and program.bytes_accessed > 0 for program in programs.values())
        runs_per_program: dict[int, int] = {}
        for execution in trace.records("executions"):
            if execution.program_id in programs:
                runs_per_program[execution.program_id] = runs_per_program.get(execution.program_id, 0) + 1
                assert execution.dur_ns >= 0
        assert runs_per_program == {program_id: steps for program_id in programs}
        fused = {fusion.program_id for fusion in trace.records("fusions")}
        assert set(programs) <= fused


def test_graph_break_is_recorded_at_the_print_line(tmp_path: Path) -> None:
    script = PROBLEMS / "graph_break.py"
    with tputrace.open(_run(tmp_path, script, "--steps", "2")) as trace:
        breaks = list(trace.records("graph_breaks"))
        assert len(breaks) == 1
        (graph_break,) = breaks
        assert Path(graph_break.source.file).name == "graph_break.py" and graph_break.source.line == _marked_line(script)
        assert "print" in graph_break.reason
        frames = [row for row in trace.records("compiles") if row.kind == "dynamo_frame"]
        assert len(frames) == 2  # the forward up to the print, and the rest of it
        assert sum(json.loads(row.detail)["graph_breaks"] for row in frames) == 1
        # the print's sync is at the print, not at `def forward` (the line of the code Dynamo added for the break)
        assert {sync.source.line for sync in trace.records("syncs") if sync.kind == "print"} == {_marked_line(script)}
    fixed_dir = tmp_path / "fixed"
    fixed_dir.mkdir()
    with tputrace.open(_run(fixed_dir, script, "--steps", "2", "--fixed")) as trace:
        assert list(trace.records("graph_breaks")) == []


def test_frames_compiled_after_a_dynamo_reset_are_recorded(tmp_path: Path) -> None:
    """torch._dynamo.reset() clears Dynamo's compile callbacks; the recorder's come back with it."""
    script = _script(
        tmp_path,
        "reset_then_compile",
        """
        import torch, torch._dynamo
        import tputrace.backend

        def double(x):
            return x * 2

        x = torch.ones(3, device="tpu")
        torch.compile(double, backend="tpu")(x)
        torch._dynamo.reset()
        torch.compile(double, backend="tpu")(x)
        """,
    )
    with tputrace.open(_run(tmp_path, script)) as trace:
        frames = [row for row in trace.records("compiles") if row.kind == "dynamo_frame"]
    assert [row.name for row in frames] == ["double", "double"]


def test_recompile_storm_records_each_guard_failure(tmp_path: Path) -> None:
    script = PROBLEMS / "compile_recompile_storm.py"
    steps = 3
    sys.path.insert(0, str(PROBLEMS))
    import compile_recompile_storm

    lengths = [tokens.shape[1] for tokens, _ in compile_recompile_storm.batches(steps, 16, fixed=False)]
    with tputrace.open(_run(tmp_path, script, "--steps", str(steps))) as trace:
        frames = [row for row in trace.records("compiles") if row.kind == "dynamo_frame"]
    assert [row.reason for row in frames] == ["first"] + ["guard_failure"] * (steps - 1)
    for previous, current, row in zip(lengths, lengths[1:], frames[1:]):
        assert row.diff == f"tensor 'tokens' size mismatch at index 1. expected {previous}, actual {current}"
        assert row.name == "TokenTagger.forward" and row.source.line == _marked_line(script)
        assert json.loads(row.detail)["call_site"] == f"{script.name}:{_line_of(script, 'logits = compiled(tokens)')}"


def test_dynamic_dims_compile_once_in_dynamo_and_per_shape_in_xla(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "dynamic",
        """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to("tpu")
        compiled = torch.compile(model, backend="tpu")
        with torch.no_grad():
            for rows in (4, 6, 4, 9):
                x = torch.randn(rows, 8).to("tpu")
                torch._dynamo.mark_dynamic(x, 0)
                compiled(x)
        """,
    )
    with tputrace.open(_run(tmp_path, script)) as trace:
        compiles = [row for row in trace.records("compiles") if row.kind in ("dynamo_frame", "xla")]
    assert [row.kind for row in compiles if row.kind == "dynamo_frame"] == ["dynamo_frame"]
    xla = [row for row in compiles if row.kind == "xla"]
    assert [row.reason for row in xla] == ["first", "recompile", "recompile"]
    assert "dim 0: 4 -> 6" in xla[1].diff and "dim 0: 6 -> 9" in xla[2].diff


def test_shape_buckets_compile_once_per_bucket_and_give_the_same_results(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Tagger().to("tpu").eval()
    compiled = torch.compile(model, backend="tpu", options={"shape_buckets": [16, 32]})
    trace_path = tmp_path / "buckets.tptrace"
    from tputrace.recording import lifecycle

    lifecycle.start(str(trace_path), script="buckets", argv=[], mode="compile")
    try:
        with torch.no_grad():
            for length in (5, 9, 13, 20, 31):
                tokens = torch.randint(0, 40, (2, length)).to("tpu")
                torch._dynamo.mark_dynamic(tokens, 1)
                assert torch.allclose(host(compiled(tokens)), host(model(tokens)), atol=1e-6)
    finally:
        lifecycle.stop(0)
    with tputrace.open(trace_path) as trace:
        xla = [row for row in trace.records("compiles") if row.kind == "xla"]
        buckets = [json.loads(row.detail)["bucket"] for row in xla]
        assert [next(iter(bucket.values()))["bucket"] for bucket in buckets] == [16, 32]
        hits = [annotation.name for annotation in trace.records("annotations") if annotation.origin == "bucket"]
        assert len(hits) == 5 and "5 -> 16" in hits[0] and "31 -> 32" in hits[-1]


def test_bucketing_is_refused_where_padding_would_change_results(tmp_path: Path) -> None:
    class Pool(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.softmax(dim=1)

    compiled = torch.compile(Pool(), backend="tpu", options={"shape_buckets": 16})
    trace_path = tmp_path / "refused.tptrace"
    from tputrace.recording import lifecycle

    lifecycle.start(str(trace_path), script="refused", argv=[], mode="compile")
    try:
        for length in (5, 7):
            x = torch.randn(3, length)
            tpu_x = x.to("tpu")
            torch._dynamo.mark_dynamic(tpu_x, 1)
            assert torch.allclose(host(compiled(tpu_x)), x.softmax(dim=1), atol=1e-6)
    finally:
        lifecycle.stop(0)
    with tputrace.open(trace_path) as trace:
        (lowered,) = [row for row in trace.records("compiles") if row.kind == "aot"]
        assert "softmax" in json.loads(lowered.detail)["bucket_refusal"]
        assert [row.reason for row in trace.records("compiles") if row.kind == "xla"] == ["first", "recompile"]


def test_graphs_with_value_dependent_shapes_run_op_by_op(tmp_path: Path) -> None:
    """With `capture_dynamic_output_shape_ops`/`capture_scalar_outputs`, Dynamo keeps `x[mask]` and a size read
    with `.item()` in the graph: XLA cannot make one program of it, so the graph runs with the tpu's eager ops,
    forward and backward, matching the CPU; its compile records say why. A read value that only enters
    arithmetic still compiles as one program."""
    from torch._dynamo import config

    from tputrace.recording import lifecycle

    def masked(x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        return (kept * 2).sum() + kept.numel()

    def sized(x: torch.Tensor) -> torch.Tensor:
        return torch.ones(int(x.sum().item()), device=x.device) * 3

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item()

    values = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0])
    trace_path = tmp_path / "eager.tptrace"
    torch._dynamo.reset()
    with config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        lifecycle.start(str(trace_path), script="eager", argv=[], mode="compile")
        try:
            on_chip = values.to("tpu").requires_grad_()
            loss = torch.compile(masked, backend="tpu", fullgraph=True)(on_chip)
            loss.backward()
            on_cpu = values.clone().requires_grad_()
            masked(on_cpu).backward()
            assert host(loss).item() == 21.0 and torch.equal(host(on_chip.grad), on_cpu.grad)
            counts = torch.tensor([1, 2], device="tpu")
            assert host(torch.compile(sized, backend="tpu", fullgraph=True)(counts)).tolist() == [3.0] * 3
            assert host(torch.compile(scaled, backend="tpu", fullgraph=True)(values.to("tpu"))).tolist() == (values * 3).tolist()
        finally:
            lifecycle.stop(0)
            torch._dynamo.reset()
    with tputrace.open(trace_path) as trace:
        lowered = [json.loads(row.detail) for row in trace.records("compiles") if row.kind == "aot"]
        op_lines = {(op.op, op.source.line) for op in trace.records("ops") if op.source is not None and op.source.file == __file__}
    eager = [(detail["role"], detail.get("runs_eagerly")) for detail in lowered]
    assert eager == [
        ("forward", "aten.index.Tensor gives a shape that depends on values"),
        ("backward", "aten.expand.default takes a size from input sym_size_int, which depends on values"),
        ("inference", "aten.full.default takes a size from aten._local_scalar_dense.default, which depends on values"),
        ("inference", None),
    ], eager
    # The graph's ops are recorded as eager ops, each at the line it was traced from, forward and backward.
    kept_line = masked.__code__.co_firstlineno + 1
    assert {("aten.index.Tensor", kept_line), ("aten.index_put.default", kept_line), ("aten.sum.dim_IntList", kept_line + 1)} <= op_lines


def test_modes_and_options_behave_as_torch_compile_documents() -> None:
    model = torch.nn.Linear(3, 2).to("tpu")
    inputs = torch.randn(4, 3)
    expected = host(model(inputs.to("tpu")))
    for mode in ("reduce-overhead", "max-autotune"):
        torch._dynamo.reset()
        assert torch.allclose(host(torch.compile(model, backend="tpu", mode=mode)(inputs.to("tpu"))), expected, atol=1e-6)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unrecognized mode"):
        torch.compile(model, backend="tpu", mode="fastest")(inputs.to("tpu"))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="optimization option 'autotune'"):
        torch.compile(model, backend="tpu", options={"autotune": True})(inputs.to("tpu"))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="graph break|print"):
        def broken(x: torch.Tensor) -> torch.Tensor:
            print("no graph breaks allowed")
            return x * 2

        torch.compile(broken, backend="tpu", fullgraph=True)(inputs.to("tpu"))


def test_a_tpu_tensor_flattens_to_a_handle_on_its_buffer() -> None:
    from tputrace.backend.core.tensor import TpuData, TpuTensor

    tensor = torch.arange(6.0).reshape(2, 3).to("tpu")
    view = tensor.t()
    names, context = view.__tensor_flatten__()
    (inner,) = [getattr(view, name) for name in names]
    assert type(inner) is TpuData and inner.shape == view.shape and inner.stride() == view.stride()
    alias = TpuTensor.__tensor_unflatten__({names[0]: inner}, context, view.shape, view.stride())
    assert type(alias) is TpuTensor and host(alias).tolist() == host(view).tolist()
    tensor.add_(1)  # writes through the shared buffer reach the alias
    assert host(alias).tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]]


def test_a_compiled_train_step_breaks_only_where_torch_does(tmp_path: Path) -> None:
    """A compiled function holding the whole step (forward, `loss.backward()`, `optimizer.step()`) breaks its graph at
    the backward, which Dynamo does not trace, and wherever torch itself breaks, never inside the backend: neither in
    the wrapper that remembers where a host tensor was made (autograd's `ones_like` runs in the break's eager code)
    nor in the optimizer's step hooks."""
    script = tmp_path / "whole_step.py"
    script.write_text(textwrap.dedent('''
        import torch
        from torch import nn

        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        @torch.compile(backend="tpu")
        def train_step(x, y):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        for step in range(3):
            loss = train_step(torch.randn(8, 16).to("tpu"), torch.randint(0, 4, (8,)).to("tpu"))
        print(loss.item())
    '''))
    with tputrace.open(_run(tmp_path, script)) as trace:
        places = {(Path(row.source.file).name, row.reason.split(" - ")[0]) for row in trace.records("graph_breaks")}
    assert ("whole_step.py", "Unsupported Tensor.backward() call") in places
    assert all(not name.startswith("<") and name not in ("hooks.py", "host_origins.py") for name, _ in places), places


def test_a_compiled_optimizer_step_with_host_step_counts_is_told_to_be_capturable(tmp_path: Path) -> None:
    """A compiled `optimizer.step()` of an AdamW that keeps its step counts on the CPU copies them back after each
    call (a sync of kind `host_outputs` at the call); a `capturable=True` one keeps them on the chip and does not."""
    from tputrace.analysis import analyze_path

    script = tmp_path / "compiled_steps.py"
    script.write_text(textwrap.dedent('''
        import torch
        from torch import nn

        models = [nn.Linear(16, 4).to("tpu"), nn.Linear(16, 4).to("tpu")]
        on_host = torch.optim.AdamW(models[0].parameters(), lr=1e-3)
        on_chip = torch.optim.AdamW(models[1].parameters(), lr=1e-3, capturable=True)
        step_on_host = torch.compile(on_host.step, backend="tpu")
        step_on_chip = torch.compile(on_chip.step, backend="tpu")
        for step in range(4):
            for model in models:
                model(torch.randn(8, 16, device="tpu")).sum().backward()
            step_on_host()  # host step counts
            step_on_chip()  # chip step counts
            on_host.zero_grad()
            on_chip.zero_grad()
    '''))
    lines = script.read_text().splitlines()
    host_line = next(number for number, text in enumerate(lines, 1) if "# host step counts" in text)
    trace_path = _run(tmp_path, script)
    with tputrace.open(trace_path) as trace:
        kinds = {(Path(row.source.file).name, row.source.line, row.kind) for row in trace.records("syncs")}
    assert ("compiled_steps.py", host_line, "host_outputs") in kinds
    assert not [kind for kind in kinds if kind[2] == "host_outputs" and kind[1] != host_line]
    findings = [finding for finding in analyze_path(trace_path).findings if finding.analyzer == "syncs" and finding.line == host_line]
    assert findings and "capturable=True" in findings[0].suggestion
