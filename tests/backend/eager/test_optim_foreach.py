"""Optimizer steps on tpu: the multi-tensor (`_foreach_*`) path, gradient writes through views, norms
with a constant order, and host tensors copied (not shared) on the way to the chip."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher
from tputrace.backend.core.plans import Plan
from tputrace.backend.eager.deferred import DeferredExecutor

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 5)).to(device)


def _train(device: str, steps: int = 3) -> list[torch.Tensor]:
    model = _model(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        inputs, labels = torch.randn(16, 12, generator=generator), torch.randint(0, 5, (16,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(inputs.to(device)), labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
    return [host(parameter) for parameter in model.parameters()]


def test_optimizers_default_to_foreach_on_tpu() -> None:
    from torch.optim.optimizer import _default_to_fused_or_foreach
    from torch.utils._foreach_utils import _has_foreach_support

    parameters = list(_model("tpu").parameters())
    assert _default_to_fused_or_foreach(parameters, differentiable=False) == (False, True)
    assert _has_foreach_support(parameters, parameters[0].device)
    assert all(parameter.device == torch.device("tpu:0") for parameter in parameters)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_foreach_adamw_with_clipping_matches_cpu(mode: EagerMode) -> None:
    expected = _train("cpu")
    with eager(mode):
        result = _train("tpu")
    for got, want in zip(result, expected):
        assert torch.allclose(got, want, atol=2e-5), (got - want).abs().max()


# Fused optimizers, with the programs a run may compile: SGD's first step (which fills its momentum
# buffers) is its own program.
FUSED_OPTIMIZERS: dict[str, tuple[Callable[[Any], torch.optim.Optimizer], int]] = {
    "Adam": (lambda params: torch.optim.Adam(params, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True), 1),
    "AdamW": (lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True), 1),
    "SGD-nesterov": (lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.1, fused=True), 2),
    "SGD-maximize": (lambda params: torch.optim.SGD(params, lr=1e-2, maximize=True, fused=True), 1),
    "Adagrad": (lambda params: torch.optim.Adagrad(params, lr=1e-1, lr_decay=0.01, weight_decay=0.1, fused=True), 1),
}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("optimizer_name", sorted(FUSED_OPTIMIZERS))
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "grad_scaler"])
def test_fused_optimizers_run_on_the_chip_and_match_cpu(mode: EagerMode, optimizer_name: str, scaled: bool) -> None:
    """`fused=True` (common in scripts written for CUDA) is lowered, not a CPU fallback: every list it
    updates matches the CPU's fused kernel, with a scheduled learning rate (no new program per value)
    and a GradScaler whose overflowing step is skipped."""
    make_optimizer, programs = FUSED_OPTIMIZERS[optimizer_name]

    def train(device: str) -> list[torch.Tensor]:
        model = _model(device)
        optimizer = make_optimizer(model.parameters())
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**8) if scaled else None
        generator = torch.Generator().manual_seed(1)
        for step in range(4):
            inputs = torch.randn(16, 12, generator=generator)
            optimizer.zero_grad()
            loss = model(inputs.to(device)).pow(2).mean() * (float("inf") if step == 2 and scaled else 1.0)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            schedule.step()
        return [host(parameter) for parameter in model.parameters()]

    expected = train("cpu")
    fused_plans = lambda: sum(1 for key in dispatcher.plans if getattr(key[0], "name", "").startswith("aten._fused_"))  # noqa: E731
    before = fused_plans()
    with eager(mode), warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*CPU fallback", category=RuntimeWarning)
        result = train("tpu")
    for got, want in zip(result, expected):
        assert torch.allclose(got, want, atol=2e-5), (got - want).abs().max()
    assert fused_plans() - before <= programs, "a new learning rate compiled a new program"


def test_deferred_optimizer_step_records_one_op_per_parameter_list(monkeypatch: pytest.MonkeyPatch) -> None:
    flushed: list[tuple[str, list[str]]] = []
    flush_graph = DeferredExecutor.flush_graph

    def recording_flush(self: DeferredExecutor, graph, trigger, extra=()) -> None:  # noqa: ANN001
        flushed.append((trigger, [plan.op_name for plan, _ in graph.nodes]))
        flush_graph(self, graph, trigger, extra)

    monkeypatch.setattr(DeferredExecutor, "flush_graph", recording_flush)
    with eager(EagerMode.DEFER_AND_FUSE):
        _train("tpu", steps=2)
    step_ops = [ops for trigger, ops in flushed if trigger == "step"][-1]
    assert step_ops.count("aten._foreach_addcdiv.ScalarList") == 1
    assert step_ops.count("aten._foreach_lerp.Scalar") == 1
    assert "aten.lerp.Scalar" not in step_ops and "aten.addcdiv.default" not in step_ops
    assert "aten.linalg_vector_norm.default" in step_ops  # the total norm over the per-list norms
    assert step_ops.count("aten._foreach_norm.Scalar") == 1


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize(
    "make_view",
    [lambda base: base.t(), lambda base: base.view(-1), lambda base: base.view(3, 2, 4).transpose(0, 2),
     lambda base: base[:, 1:3], lambda base: base.unsqueeze(0).permute(2, 0, 1), lambda base: base.t()[1:]],
    ids=["t", "flat", "transpose3d", "slice", "permute", "t-slice"],
)
def test_in_place_writes_through_views_match_cpu(mode: EagerMode, make_view: Callable[[torch.Tensor], torch.Tensor]) -> None:
    expected = torch.arange(24.0).reshape(6, 4)
    with eager(mode):
        chip = expected.to("tpu")
        make_view(chip).mul_(3).add_(1)
        make_view(expected).mul_(3).add_(1)
        assert torch.equal(host(chip), expected)
        make_view(chip).fill_(2.5)
        make_view(expected).fill_(2.5)
        assert torch.equal(host(chip), expected)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_foreach_writes_bump_version_counters_as_on_the_cpu(mode: EagerMode, device: str) -> None:
    """Each tensor a `_foreach_*_` op writes has its `_version` go up by one, so a step between a forward
    and its backward is caught; an inference tensor written outside inference mode raises after the write."""
    with eager(mode):
        first, second = torch.ones(3, device=device), torch.ones(3, device=device)
        torch._foreach_mul_([first, second], 2)
        torch._foreach_add_([first], [second])
        assert (first._version, second._version) == (2, 1)
        found_inf = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_([first], found_inf, torch.ones(1, device=device))
        assert (first._version, found_inf._version) == (2, 0)  # torch's unscale bumps none
        weight = torch.nn.Parameter(torch.ones(3, device=device))
        optimizer = torch.optim.SGD([weight], lr=0.1, foreach=True)
        loss = (weight * weight).sum()
        loss.backward(retain_graph=True)
        optimizer.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
        with torch.inference_mode():
            frozen = torch.ones(2, device=device)
            torch._foreach_add_([frozen], 1)
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            torch._foreach_add_([frozen], 1)
        assert host(frozen).tolist() == [3.0, 3.0]


def test_host_tensor_changed_after_the_copy_leaves_the_chip_copy_alone() -> None:
    source = torch.zeros(64)
    chip = source.to("tpu")
    source.add_(1)
    assert torch.equal(host(chip), torch.zeros(64))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("order", [2.0, 1, 0, 3.0, float("inf"), float("-inf")])
def test_norm_order_is_a_constant_of_the_program(mode: EagerMode, order: float) -> None:
    torch.manual_seed(0)
    values = torch.randn(41, 37)  # a shape no other test uses
    values[0, :5] = 0
    with eager(mode):
        norm = host(torch.linalg.vector_norm(values.to("tpu"), order))
    assert torch.allclose(norm, torch.linalg.vector_norm(values, order), rtol=1e-5)
    plans = [plan for plan in list(dispatcher.plans.values()) if isinstance(plan, Plan) and plan.op_name == "aten.linalg_vector_norm.default" and plan.in_specs[0][0] == (41, 37)]
    assert plans and all(len(plan.in_specs) == 1 for plan in plans)  # the order is no input of the program
    if order == 2.0:  # a sum of squares: no pow (exp/log), no max/min or nonzero count computed alongside
        hlo = jax.jit(plans[0].fn).lower(jax.ShapeDtypeStruct((41, 37), jnp.float32)).compile().as_text()
        assert "exponential" not in hlo and "log(" not in hlo and "s64" not in hlo
