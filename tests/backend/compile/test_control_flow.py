"""`torch.cond` and `torch.while_loop` on tpu tensors match the CPU, in both eager modes (as one XLA
conditional or loop, the predicate never read on the host; an int carry read once at the end) and
under torch.compile(backend="tpu"), with gradients through `torch.cond`; the trace names both ops."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch._higher_order_ops import while_loop

import tputrace
from backend_helpers import assert_matches_cpu, eager, host, recorded_fallbacks, recorded_host_reads
from tputrace.backend.compat.device_module import EagerMode
from tputrace.cli.main import main

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


class Gate(torch.nn.Module):
    """A module whose forward picks one of two computations with `torch.cond` (its weights are
    read inside a branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def dense(x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.linear(x).tanh(), (x * bias).sum(0)

        def shortcut(x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (x - bias).relu(), x.amax(0)

        return torch.cond(x.mean() > 0, dense, shortcut, (x, bias))


def _gate_inputs(sign: float) -> tuple[Gate, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    gate = Gate()
    x = torch.randn(3, 4, generator=generator).abs() * sign
    bias = torch.randn(4, generator=generator)
    return gate, x, bias


def _gate_run(gate: Gate, x: torch.Tensor, bias: torch.Tensor, device: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs and the gradients of x, bias and the weights after backward of the outputs' sum."""
    gate = gate.to(device)
    x, bias = x.to(device).requires_grad_(), bias.to(device).requires_grad_()
    outputs = gate(x, bias)
    sum(output.sum() for output in outputs).backward()
    leaves = [x, bias, gate.linear.weight, gate.linear.bias]
    grads = [torch.zeros(leaf.shape) if leaf.grad is None else host(leaf.grad) for leaf in leaves]
    return [host(output) for output in outputs], grads


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_cond_on_a_chip_predicate_matches_cpu_without_reading_it(mode: EagerMode, sign: float) -> None:
    gate, x, bias = _gate_inputs(sign)
    expected = [output.detach() for output in gate(x, bias)]
    chip_gate, chip_x, chip_bias = gate.to("tpu"), x.to("tpu"), bias.to("tpu")
    with eager(mode), recorded_host_reads() as reads, recorded_fallbacks() as fallbacks:
        outputs = chip_gate(chip_x, chip_bias)
        assert reads == []
        if mode is EagerMode.DEFER_AND_FUSE:
            from tputrace.backend.core.dispatch import dispatcher

            pending = [plan.op_name for graph in dispatcher.executor.graphs.values() for plan, _ in graph.nodes]
            assert "higher_order.cond" in pending  # one node of the pending graph, which was not cut
        actual = [host(output) for output in outputs]
    assert fallbacks == []
    assert_matches_cpu(actual, expected)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_cond_gradients_match_cpu(mode: EagerMode, sign: float) -> None:
    gate, x, bias = _gate_inputs(sign)
    expected_outputs, expected_grads = _gate_run(gate, x, bias, "cpu")
    gate, x, bias = _gate_inputs(sign)
    with eager(mode):
        outputs, grads = _gate_run(gate, x, bias, "tpu")
    assert_matches_cpu(outputs, expected_outputs)
    assert_matches_cpu(grads, expected_grads)


def _halve_until_small(start: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps taken and the value after halving `start` (and adding a captured offset) until its norm is under `limit`."""
    offset = torch.full_like(start, 0.01)

    def keep_going(steps: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return value.norm() > limit

    def halve(steps: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return steps + 1, value * 0.5 + offset

    return while_loop(keep_going, halve, (torch.zeros((), dtype=torch.int64, device=start.device), start))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_while_loop_matches_cpu_without_reading_the_condition(mode: EagerMode) -> None:
    start = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)) * 40
    limit = torch.tensor(0.5)
    expected_steps, expected_value = _halve_until_small(start, limit)
    with eager(mode), recorded_host_reads() as reads, recorded_fallbacks() as fallbacks:
        steps, value = _halve_until_small(start.to("tpu"), limit.to("tpu"))
        assert reads == []
        actual = [host(steps), host(value)]
    assert fallbacks == []
    assert int(expected_steps) > 5
    assert_matches_cpu(actual, [expected_steps, expected_value])


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_while_loop_with_an_int_carry_returns_an_int_read_in_one_data_dependent_sync(mode: EagerMode) -> None:
    start = torch.randn(4, 2, generator=torch.Generator().manual_seed(3))

    def run(start: torch.Tensor) -> tuple[int, torch.Tensor]:
        return while_loop(lambda count, value: 2 * count < value.shape[0] + 3, lambda count, value: (count + 1, value + count), (0, start))

    expected_count, expected_value = run(start)
    with eager(mode), recorded_host_reads() as reads:
        count, value = run(start.to("tpu"))
        assert reads == ["data_dependent"]
        actual = host(value)
    assert type(count) is int and count == expected_count == 4
    assert_matches_cpu([actual], [expected_value])


def test_the_op_called_directly_on_a_branch_closing_over_a_tpu_tensor_raises_a_one_line_error() -> None:
    """torch.cond passes the tensors a branch closes over as operands (Dynamo lifts them); the op
    called by hand with such a branch is refused, saying to pass the tensor in."""
    from torch._higher_order_ops.cond import cond_op

    x, scale = torch.ones(3, device="tpu"), torch.full((3,), 2.0, device="tpu")
    with pytest.raises(RuntimeError, match="reads a tpu tensor that is not one of its operands") as raised:
        cond_op(x.sum() > 0, lambda x: (x * scale,), lambda x: (x - 1,), (x,))
    assert "\n" not in str(raised.value)


def _compiled_model(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mixed = torch.cond(x.sum() > 0, lambda x, weight: (x @ weight).sin(), lambda x, weight: (x * 3).cos(), (x, weight))
    steps, value = _halve_until_small(mixed.detach() * 50, torch.tensor(1.0, device=x.device))
    return mixed * 2, steps, value


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
def test_compiled_cond_and_while_loop_match_cpu(sign: float) -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, generator=generator).abs() * sign
    weight = torch.randn(4, 4, generator=generator)
    cpu_x, cpu_weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    expected = _compiled_model(cpu_x, cpu_weight)
    expected[0].sum().backward()
    torch._dynamo.reset()
    chip_x, chip_weight = x.to("tpu").requires_grad_(), weight.to("tpu").requires_grad_()
    with warnings.catch_warnings(), recorded_fallbacks() as fallbacks:
        warnings.simplefilter("error", RuntimeWarning)  # a graph op on the host warns
        actual = torch.compile(_compiled_model, backend="tpu")(chip_x, chip_weight)
        actual[0].sum().backward()
    assert fallbacks == []
    assert_matches_cpu([host(value) for value in actual], [value.detach() for value in expected])
    assert_matches_cpu([host(chip_x.grad), host(chip_weight.grad)], [cpu_x.grad, cpu_weight.grad])


def test_the_trace_names_cond_and_while_loop_and_records_no_sync_for_them(tmp_path: Path) -> None:
    script = tmp_path / "control_flow.py"
    script.write_text(
        "import torch\n"
        "from torch._higher_order_ops import while_loop\n"
        "x = torch.randn(8, 8, device='tpu')\n"
        "y = torch.cond(x.sum() > 0, lambda x: x.sin() + 1, lambda x: x.cos() - 1, (x,))\n"
        "steps = torch.zeros((), dtype=torch.int64, device='tpu')\n"
        "steps, z = while_loop(lambda i, z: i < 4, lambda i, z: (i + 1, z * 0.5), (steps, y))\n"
        "print(z.sum().item())\n"
    )
    trace_path = tmp_path / "control_flow.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        ops = {record.op: record.source.line for record in trace.records("ops")}
        assert ops["higher_order.cond"] == 4
        assert ops["higher_order.while_loop"] == 6
        assert [sync.source.line for sync in trace.records("syncs")] == [7]
        assert trace.count("fallbacks") == 0
