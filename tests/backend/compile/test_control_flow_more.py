"""`torch.cond` on tpu beyond the basics of test_control_flow.py, in both eager modes: random ops
inside a branch (reproducible under torch.manual_seed, drawing what the taken branch draws run op by
op, with gradients that use the forward's draws) and inside a `while_loop`; outputs with the strides torch's CPU cond gives
(transposed, expanded, channels-last)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._higher_order_ops import while_loop

from backend_helpers import eager, host, recorded_host_reads
from tputrace.backend.compat.device_module import EagerMode

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
DROP = 0.5


def _noisy(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random ops: a dropout of x and uniform noise like x."""
    return torch.nn.functional.dropout(x, DROP), torch.rand_like(x) + x


def _quiet(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x.sin()


def _seeded_cond(x: torch.Tensor, sign: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The outputs of a cond on x (random branch taken when sign > 0) after torch.manual_seed(7),
    and two numbers drawn after it."""
    torch.manual_seed(7)
    outputs = torch.cond(x.sum() * sign > 0, _noisy, _quiet, (x,))
    return [host(output) for output in outputs], host(torch.rand(2, device=x.device))


def _positive_input() -> torch.Tensor:
    return torch.randn(64, generator=torch.Generator().manual_seed(4)).abs() + 0.1


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_random_ops_in_the_taken_branch_draw_as_the_branch_does_run_op_by_op(mode: EagerMode) -> None:
    x = _positive_input()
    with eager(mode):
        chip_x = x.to("tpu")
        with recorded_host_reads() as reads:
            torch.manual_seed(7)
            outputs = torch.cond(chip_x.sum() > 0, _noisy, _quiet, (chip_x,))
            after = torch.rand(2, device="tpu")
            assert reads == []  # the predicate is not read on the host
        actual = [host(output) for output in outputs]
        torch.manual_seed(7)
        expected = [host(output) for output in _noisy(chip_x)]
        expected_after = host(torch.rand(2, device="tpu"))
        again, again_after = _seeded_cond(chip_x, 1.0)
    for got, want, repeated in zip(actual, expected, again):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        torch.testing.assert_close(repeated, want, atol=0, rtol=0)
    torch.testing.assert_close(host(after), expected_after, atol=0, rtol=0)
    torch.testing.assert_close(again_after, expected_after, atol=0, rtol=0)
    dropped, noise = actual
    kept = dropped != 0
    assert 0 < int(kept.sum()) < x.numel()
    torch.testing.assert_close(dropped[kept], x[kept] / (1 - DROP))  # the kept values are the CPU's scaled x
    assert bool(((noise - x >= 0) & (noise - x < 1)).all())


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_the_untaken_random_branch_still_advances_the_generator_by_its_draws(mode: EagerMode) -> None:
    """The host never learns which branch ran, so a cond takes its busiest branch's counters either
    way: the numbers drawn after it do not depend on the predicate."""
    x = _positive_input()
    with eager(mode):
        outputs, after = _seeded_cond(x.to("tpu"), -1.0)
        _, after_random_branch = _seeded_cond(x.to("tpu"), 1.0)
    for got, want in zip(outputs, _quiet(x)):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(after, after_random_branch, atol=0, rtol=0)


def _dropout_times_x(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, DROP) * x


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_the_backward_of_a_random_branch_uses_the_forward_draws(mode: EagerMode) -> None:
    """torch's backward of cond runs the branch again; on tpu it draws the forward's mask again, so
    the gradient of dropout(x) * x is 2 * output / x (torch on the CPU draws a new mask there)."""
    x = _positive_input()
    with eager(mode):
        chip_x = x.to("tpu").requires_grad_()
        torch.manual_seed(3)
        output = torch.cond(chip_x.sum() > 0, _dropout_times_x, lambda x: x * 2, (chip_x,))
        other = torch.cond(chip_x.sum() > 0, _dropout_times_x, lambda x: x * 2, (chip_x,))
        (output.sum() + 0 * other.sum()).backward()
        value, grad, other_value = host(output), host(chip_x.grad), host(other)
    assert not torch.equal(value, other_value)  # the second call drew its own mask
    torch.testing.assert_close(grad, 2 * value / x)
    kept = value != 0
    torch.testing.assert_close(value[kept], x[kept] ** 2 / (1 - DROP))


def _noisy_walk() -> tuple[Callable[..., torch.Tensor], Callable[..., tuple[torch.Tensor, torch.Tensor]]]:
    """A loop of four steps that each add uniform noise with half of it dropped; the condition draws too."""

    def keep_going(i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (i < 4) & (torch.rand((), device=v.device) >= 0)

    def step(i: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i + 1, v + torch.nn.functional.dropout(torch.rand_like(v), DROP)

    return keep_going, step


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_random_ops_in_a_while_loop_draw_as_the_loop_does_run_op_by_op(mode: EagerMode) -> None:
    """Condition then body, each iteration drawing after the last: the loop's values and the numbers
    drawn after it equal a Python loop's run op by op after the same seed (the loop's count is read
    on the host, once, to advance the generator past the loop's draws)."""
    x = _positive_input()
    keep_going, step = _noisy_walk()
    with eager(mode):
        chip_x, start = x.to("tpu"), torch.zeros((), dtype=torch.int64, device="tpu")
        torch.manual_seed(9)
        with recorded_host_reads() as reads:
            steps, value = while_loop(keep_going, step, (start, chip_x))
            after = torch.rand(2, device="tpu")
            assert reads == ["data_dependent"]
        actual = [host(steps), host(value), host(after)]
        torch.manual_seed(9)
        i, v = start, chip_x
        while bool(host(keep_going(i, v))):
            i, v = step(i, v)
        expected = [host(i), host(v), host(torch.rand(2, device="tpu"))]
    assert int(actual[0]) == 4
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    noise = actual[1] - x
    assert bool(((noise >= 0) & (noise < 4 / (1 - DROP))).all()) and not torch.equal(actual[1], x)


def test_random_ops_in_a_while_loop_that_needs_gradients_are_refused_with_a_one_line_error() -> None:
    x = torch.randn(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="body_fn draws random numbers.*require grad; draw the random tensor before the call") as raised:
        while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x + torch.rand_like(x)), (torch.zeros((), dtype=torch.int64, device="tpu"), x))
    assert "\n" not in str(raised.value)


_STRIDED_BRANCHES = {
    "transposed": (lambda x, v: (x + 1).t(), lambda x, v: (x * 2).t()),
    "expanded": (lambda x, v: (v + 1).expand(3, 4), lambda x, v: (v * 2).expand(3, 4)),
    "expanded-and-transposed": (lambda x, v: (x + 1).t().unsqueeze(0).expand(2, 4, 3), lambda x, v: x.cos().t().unsqueeze(0).expand(2, 4, 3)),
    "channels-last": (
        lambda x, v: x.reshape(1, 3, 2, 2).contiguous(memory_format=torch.channels_last) + 1,
        lambda x, v: x.reshape(1, 3, 2, 2).contiguous(memory_format=torch.channels_last) * 2,
    ),
}


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
@pytest.mark.parametrize("case", sorted(_STRIDED_BRANCHES))
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_outputs_keep_the_strides_the_cpu_cond_gives(mode: EagerMode, case: str, sign: float) -> None:
    true_fn, false_fn = _STRIDED_BRANCHES[case]
    generator = torch.Generator().manual_seed(5)
    x, v = torch.randn(3, 4, generator=generator), torch.randn(4, generator=generator)
    expected = torch.cond(x.sum() * sign > -1e6 * sign, true_fn, false_fn, (x, v))
    assert not expected.is_contiguous()
    with eager(mode):
        chip_x, chip_v = x.to("tpu"), v.to("tpu")
        actual = torch.cond(chip_x.sum() * sign > -1e6 * sign, true_fn, false_fn, (chip_x, chip_v))
        assert actual.stride() == expected.stride()
        torch.testing.assert_close(host(actual), expected)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_gradients_through_a_transposed_and_an_expanded_output_match_cpu(mode: EagerMode) -> None:
    def run(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        outputs = torch.cond(x.sum() > 0, lambda x, v: ((x * v).t(), v.sin().expand(2, 4)), lambda x, v: ((x - v).t(), v.cos().expand(2, 4)), (x, v))
        (outputs[0] * torch.arange(12.0, device=x.device).reshape(4, 3)).sum().add(outputs[1].pow(2).sum()).backward()
        return outputs[0].stride(), outputs[1].stride(), x.grad, v.grad

    generator = torch.Generator().manual_seed(6)
    x, v = torch.randn(3, 4, generator=generator), torch.randn(4, generator=generator)
    *expected_strides, expected_x_grad, expected_v_grad = run(x.clone().requires_grad_(), v.clone().requires_grad_())
    with eager(mode):
        *strides, x_grad, v_grad = run(x.to("tpu").requires_grad_(), v.to("tpu").requires_grad_())
        actual_grads = [host(x_grad), host(v_grad)]
    assert strides == expected_strides == [(1, 4), (0, 1)]
    for got, want in zip(actual_grads, [expected_x_grad, expected_v_grad]):
        torch.testing.assert_close(got, want)


def _plus_one(x: torch.Tensor) -> tuple[torch.Tensor]:
    return (x + 1,)


def _doubled(x: torch.Tensor) -> tuple[torch.Tensor]:
    return (x * 2,)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_output_strides_follow_the_operands_strides_from_call_to_call(mode: EagerMode) -> None:
    """The op called with the same branches on a row-major operand, then on a transposed one of the
    same shape (torch.cond would hand Dynamo's new branch graphs to the second call)."""
    from torch._higher_order_ops.cond import cond_op

    square = torch.randn(4, 4, generator=torch.Generator().manual_seed(8))
    with eager(mode):
        for operand, chip_operand in ((square, square.to("tpu")), (square.t(), square.to("tpu").t())):
            (expected,) = cond_op(operand.sum() > -1e6, _plus_one, _doubled, (operand,))
            (actual,) = cond_op(chip_operand.sum() > -1e6, _plus_one, _doubled, (chip_operand,))
            assert actual.stride() == expected.stride()
            torch.testing.assert_close(host(actual), expected)


class _Routed(torch.nn.Module):
    """A module whose forward picks a branch with torch.cond; one branch reads its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: self.linear(x).relu(), lambda x: x.sin() * 2, (x,))


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_an_exported_module_using_cond_runs_on_tpu_like_the_cpu(mode: EagerMode, strict: bool) -> None:
    torch.manual_seed(0)
    module = _Routed()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(9)).abs()
    chip_module = _Routed()
    chip_module.load_state_dict(module.state_dict())
    chip_module = chip_module.to("tpu")
    with eager(mode):
        exported = torch.export.export(chip_module, (x.to("tpu"),), strict=strict)
        assert [node.target for node in exported.graph.nodes if node.op == "call_function"].count(torch.ops.higher_order.cond) == 1
        for sign in (1.0, -1.0):
            chip_x = (x * sign).to("tpu").requires_grad_()
            output = exported.module()(chip_x)
            output.sum().backward()
            cpu_x = (x * sign).requires_grad_()
            expected = module(cpu_x)
            expected.sum().backward()
            torch.testing.assert_close(host(output), expected.detach())
            torch.testing.assert_close(host(chip_x.grad), cpu_x.grad)


def _branch_then_loop(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mixed = torch.cond(x.sum() > 0, lambda x, weight: (x @ weight).sin(), lambda x, weight: (x * 3).cos(), (x, weight))
    steps, halved = while_loop(
        lambda steps, value: value.abs().sum() > 1, lambda steps, value: (steps + 1, value * 0.5), (torch.zeros((), dtype=torch.int64, device=x.device), mixed.detach() * 40)
    )
    return mixed * 2, steps, halved


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true-branch", "false-branch"])
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_aot_eager_compiled_cond_and_while_loop_match_cpu(mode: EagerMode, sign: float) -> None:
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(3, 4, generator=generator).abs() * sign
    weight = torch.randn(4, 4, generator=generator)
    cpu_x, cpu_weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    expected = _branch_then_loop(cpu_x, cpu_weight)
    expected[0].sum().backward()
    torch._dynamo.reset()
    with eager(mode):
        chip_x, chip_weight = x.to("tpu").requires_grad_(), weight.to("tpu").requires_grad_()
        actual = torch.compile(_branch_then_loop, backend="aot_eager")(chip_x, chip_weight)
        actual[0].sum().backward()
        values = [host(value) for value in actual]
        grads = [host(chip_x.grad), host(chip_weight.grad)]
    assert int(expected[1]) > 3
    for got, want in zip([*values, *grads], [*(value.detach() for value in expected), cpu_x.grad, cpu_weight.grad]):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_aot_eager_compiled_cond_draws_as_the_eager_cond(mode: EagerMode) -> None:
    x = _positive_input()
    torch._dynamo.reset()
    with eager(mode):
        chip_x = x.to("tpu")
        eager_outputs, eager_after = _seeded_cond(chip_x, 1.0)
        compiled_outputs, compiled_after = torch.compile(_seeded_cond, backend="aot_eager")(chip_x, 1.0)
    for got, want in zip([*compiled_outputs, compiled_after], [*eager_outputs, eager_after]):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def _grow(x: torch.Tensor, w: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps taken and the value after doubling x and adding w until its absolute sum reaches `limit`."""
    steps = torch.zeros((), dtype=torch.int64, device=x.device)
    return while_loop(lambda steps, value: value.abs().sum() < limit, lambda steps, value: (steps + 1, value * 2 + w.sin()), (steps, x))


@pytest.mark.parametrize("limit", [100.0, 0.0], ids=["several-steps", "no-step"])
@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_while_loop_gradients_match_cpu(mode: EagerMode, limit: float) -> None:
    generator = torch.Generator().manual_seed(11)
    x, w = torch.randn(3, generator=generator), torch.randn(3, generator=generator)
    cpu_x, cpu_w = x.clone().requires_grad_(), w.clone().requires_grad_()
    expected_steps, expected_value = _grow(cpu_x, cpu_w, limit)
    (expected_value**2).sum().backward()
    with eager(mode):
        chip_x, chip_w = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
        with recorded_host_reads() as reads:
            steps, value = _grow(chip_x, chip_w, limit)
            assert reads == ["data_dependent"]  # the loop's count, which the stacked values' size needs
        (value**2).sum().backward()
        actual = [host(steps), host(value), host(chip_x.grad), host(chip_w.grad)]
    assert int(expected_steps) == (6 if limit else 0)
    for got, want in zip(actual, [expected_steps, expected_value.detach(), cpu_x.grad, cpu_w.grad]):
        torch.testing.assert_close(got, want)


def test_a_while_loop_backward_over_an_int_carry_is_refused_as_on_the_cpu() -> None:
    """torch's while_loop backward stacks tensor carries only; an int carry fails on the CPU too."""

    def run(x: torch.Tensor) -> tuple[int, torch.Tensor]:
        return while_loop(lambda count, value: count < 3, lambda count, value: (count + 1, value * 2), (0, x))

    messages = []
    for device in ("cpu", "tpu"):
        with pytest.raises(Exception, match="all carried_inputs must be tensors for stack_output") as raised:
            run(torch.ones(3, device=device, requires_grad=True))
        messages.append(type(raised.value).__name__)
    assert messages[0] == messages[1]


@pytest.mark.parametrize("backend", ["aot_eager", "tpu"])
def test_compiled_while_loop_gradients_match_cpu(backend: str) -> None:
    """As on the CPU, AOTAutograd cannot trace the backward's `.item()`: Dynamo breaks the graph at the
    loop, which runs eagerly (it raised BackendCompilerFailed before: the stacking op's fake and
    functional rules did not see through traced tpu tensors)."""
    generator = torch.Generator().manual_seed(12)
    x, w = torch.randn(3, generator=generator), torch.randn(3, generator=generator)
    cpu_x, cpu_w = x.clone().requires_grad_(), w.clone().requires_grad_()
    expected_steps, expected_value = _grow(cpu_x, cpu_w, 100.0)
    (expected_value**2).sum().backward()
    torch._dynamo.reset()
    chip_x, chip_w = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    steps, value = torch.compile(_grow, backend=backend)(chip_x, chip_w, 100.0)
    (value**2).sum().backward()
    assert int(expected_steps) > 3
    for got, want in zip([host(steps), host(value), host(chip_x.grad), host(chip_w.grad)], [expected_steps, expected_value.detach(), cpu_x.grad, cpu_w.grad]):
        torch.testing.assert_close(got, want)
