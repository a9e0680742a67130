"""What a recorded trace says about each compile and flush: the recompile reasons name the input and
dim, the argument, or the op and line that changed; a flush counts the user's ops; every backward
pass, whichever call starts it, ends with a flush."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tputrace
from tputrace.analysis import analyze_path

_RUN = "import sys; from tputrace.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _run(tmp_path: Path, source: str, *options: str) -> Path:
    """Record `source` in a process of its own: a reason depends on what the process compiled before."""
    script = tmp_path / "script.py"
    script.write_text(source)
    trace_path = tmp_path / "script.tptrace"
    result = subprocess.run(
        [sys.executable, "-c", _RUN, "run", "--no-summary", *options, "-o", str(trace_path), str(script)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


def _recompiles(trace_path: Path) -> list[tuple[str, str]]:
    with tputrace.open(trace_path) as trace:
        return [(compile.name, compile.diff) for compile in trace.records("compiles", order_by="start_ns") if compile.reason == "recompile"]


def test_a_changing_sequence_length_names_the_input_and_dim_even_when_a_constant_changes_first(tmp_path: Path) -> None:
    """The graph's first op is `arange(T)`, whose argument changes with the tokens' dim 1: the reason
    names the op that reads the changed program input, and its line."""
    trace_path = _run(tmp_path, (
        "import torch, tputrace\n"
        "tokens_table = torch.nn.Embedding(50, 16).to('tpu')\n"
        "positions_table = torch.nn.Embedding(32, 16).to('tpu')\n"
        "for length in (8, 9, 10):\n"
        "    tokens = torch.randint(0, 50, (2, length)).to('tpu')\n"
        "    positions = torch.arange(length, device='tpu')\n"
        "    hidden = tokens_table(tokens) + positions_table(positions)\n"
        "    hidden.square().mean()\n"
        "    tputrace.step()\n"
    ))
    assert [diff for _, diff in _recompiles(trace_path)] == [
        "op 1 aten.embedding.default (script.py:7): arg 1 dim 1: 8 -> 9",
        "op 1 aten.embedding.default (script.py:7): arg 1 dim 1: 9 -> 10",
    ]


def test_an_op_added_at_the_end_of_a_graph_is_named_with_its_line(tmp_path: Path) -> None:
    trace_path = _run(tmp_path, (
        "import torch, tputrace\n"
        "x = torch.arange(8.0).to('tpu')\n"
        "for step in range(2):\n"
        "    total = (x * 2 + 1).sum()\n"
        "    if step:\n"
        "        kept = total.neg()\n"
        "    total.item()\n"
        "    tputrace.step()\n"
    ))
    assert [diff for _, diff in _recompiles(trace_path)] == ["structure change at op 3 (script.py:6): aten.neg.default added (3 ops -> 4 ops)"]


def test_in_place_ops_are_named_as_called_in_a_structure_change(tmp_path: Path) -> None:
    """The graph runs `mul_` as `mul` and writes the result back; the reason names the ops the lines
    called, in the new graph (`add_` replaced by `mul_` and `div_`) and in the earlier one (`div_` left out)."""
    trace_path = _run(tmp_path, (
        "import torch, tputrace\n"
        "x = torch.arange(8.0).to('tpu')\n"
        "for step in range(3):\n"
        "    y = x * 2\n"
        "    if step == 0:\n"
        "        y.add_(1)\n"
        "    else:\n"
        "        y.mul_(3)\n"
        "    if step == 1:\n"
        "        y.div_(2)\n"
        "    y.sum().item()\n"
        "    tputrace.step()\n"
    ))
    assert [diff for _, diff in _recompiles(trace_path)] == [
        "structure change at op 1 (script.py:8): aten.add_.Tensor (script.py:6) -> 2 ops, aten.mul_.Tensor to aten.div_.Tensor (script.py:10) (3 ops -> 4 ops)",
        "structure change at op 2 (script.py:11): aten.div_.Tensor (script.py:10) left out (4 ops -> 3 ops)",
    ]


def test_set_up_work_left_pending_before_the_loop_is_named_with_its_line(tmp_path: Path) -> None:
    """A tensor made on the device after the optimizer and before the loop (an accumulator the loop
    never reads) is pending when the first step starts, so only the first step's graph runs it: the
    second step's recompile names it and its line, not the op its graph now starts with."""
    trace_path = _run(tmp_path, (
        "import torch\n"
        "model = torch.nn.Linear(16, 4).to('tpu')\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "total = torch.zeros((), device='tpu')\n"
        "for _ in range(3):\n"
        "    loss = model(torch.ones(8, 16).to('tpu')).square().mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    ))
    [(_, diff)] = _recompiles(trace_path)
    assert diff.startswith("structure change at op 0 (script.py:6): aten.zero_.default (script.py:4) left out ("), diff


def test_set_up_work_in_the_first_steps_graph_is_a_finding_at_its_line_and_a_synchronize_after_it_removes_it(tmp_path: Path) -> None:
    """The report names the set-up line, not the loop's, costs the recompile and suggests running the
    set-up first; a `torch.tpu.synchronize()` after the set-up leaves the run without any recompile."""
    source = (
        "import torch\n"
        "model = torch.nn.Linear(16, 4).to('tpu')\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "total = torch.zeros((), device='tpu')\n"
        "{sync}"
        "for _ in range(3):\n"
        "    loss = model(torch.ones(8, 16).to('tpu')).square().mean()\n"
        "    optimizer.zero_grad()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    trace_path = _run(tmp_path, source.format(sync=""))
    [finding] = [finding for finding in analyze_path(trace_path).findings if finding.analyzer == "set_up_work"]
    assert (Path(finding.file).name, finding.line) == ("script.py", 4), finding
    assert finding.title.startswith("Set-up work at script.py:4 ran in the first step's graph: 1 program compiled again in step 1"), finding.title
    assert finding.cost_total_ns > 0 and "torch.tpu.synchronize()" in finding.suggestion
    fixed_path = _run(tmp_path, source.format(sync="torch.tpu.synchronize()\n"))
    assert _recompiles(fixed_path) == []
    assert not [finding for finding in analyze_path(fixed_path).findings if finding.analyzer == "set_up_work"]


def test_a_new_data_dependent_length_names_the_op_and_its_line(tmp_path: Path) -> None:
    trace_path = _run(tmp_path, (
        "import torch, tputrace\n"
        "x = torch.arange(64.0).to('tpu')\n"
        "for threshold in (60, 40, 30):\n"
        "    kept = x[x > threshold]\n"
        "    (kept * 2).sum().item()\n"
        "    tputrace.step()\n"
    ))
    assert [diff for _, diff in _recompiles(trace_path)] == [
        "op 0 aten.index.Tensor (script.py:4): size 16 -> 24",
        "op 0 aten.index.Tensor (script.py:4): size 24 -> 40",
    ]


def test_strict_mode_names_a_changed_argument_of_an_op_at_the_same_line(tmp_path: Path) -> None:
    """Strict mode: an op that compiles again at its line in a later step for new non-tensor arguments
    is a recompile (it was a first compile); two calls on one line in one step are not."""
    trace_path = _run(tmp_path, (
        "import torch, tputrace\n"
        "x = torch.arange(8.0).to('tpu')\n"
        "for shift in (1, 2):\n"
        "    torch.roll(x, shifts=shift, dims=0)\n"
        "    tputrace.step()\n"
        "for length in (8, 9):\n"
        "    torch.arange(length, device='tpu')\n"
        "    tputrace.step()\n"
        "both = x.sum(0), x.view(2, 4).sum(1)\n"
    ), "--mode", "strict")
    assert _recompiles(trace_path) == [("aten.roll.default", "non-tensor arguments 1 -> 2"), ("aten.arange.default", "non-tensor arguments 8 -> 9")]


def test_a_flush_counts_the_ops_the_trace_has_for_it_not_view_reads(tmp_path: Path) -> None:
    trace_path = _run(tmp_path, (
        "import torch\n"
        "a = torch.ones(4, 16).to('tpu')\n"
        "b = torch.ones(8, 16).to('tpu')\n"
        "product = a @ b.t()\n"
        "(product + 1).sum().item()\n"
    ))
    with tputrace.open(trace_path) as trace:
        (flush,) = trace.records("flushes")
        ops = [op for op in trace.records("ops") if op.flush_id == flush.id]
        (sync,) = trace.records("syncs")
        (program,) = [program for program in trace.records("programs") if program.id == flush.program_id]
    assert flush.n_ops == len(ops) == sync.pending_ops == program.n_ops == 3
    assert program.name == "fused_3_ops"


def test_autograd_backward_and_grad_end_their_pass_with_a_flush(tmp_path: Path) -> None:
    trace_path = _run(tmp_path, (
        "import torch, tputrace\n"
        "w = torch.nn.Parameter(torch.ones(4).to('tpu'))\n"
        "x = torch.ones(4).to('tpu')\n"
        "torch.autograd.backward((w * x).sum())\n"
        "(grad,) = torch.autograd.grad((w * w * x).sum(), [w])\n"
        "(w * x).sum().backward()\n"
        "tputrace.step()\n"
    ))
    with tputrace.open(trace_path) as trace:
        flushes = [(flush.trigger, flush.source.line) for flush in trace.records("flushes", order_by="start_ns")]
    assert flushes == [("backward_end", 4), ("backward_end", 5), ("backward_end", 6)]


def test_set_up_ops_left_out_of_a_graph_are_a_structure_change_not_a_shifted_input(tmp_path: Path) -> None:
    """The first step's graph begins with the weights' initialisation on the device (no optimizer
    flushes it); the second's does not. Its inputs shift, so they are not compared one by one: the
    reason names the set-up ops left out and their line, and counts the changes after them (the
    second step adds its gradients to the first step's)."""
    trace_path = _run(tmp_path, (
        "import torch, tputrace\n"
        "with torch.device('tpu'):\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
        "for _ in range(3):\n"
        "    model(torch.randn(8, 16).to('tpu')).square().mean().backward()\n"
        "    tputrace.step()\n"
    ))
    [(_, diff)] = _recompiles(trace_path)
    assert diff == "structure change at op 0 (script.py:5): 4x aten.uniform_.default (script.py:3) left out; 2 more changes after it (20 ops -> 20 ops)", diff
