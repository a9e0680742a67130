"""Optimizers and learning-rate schedules in a steady training loop on tpu: after 8 steps the
parameters match the same run on the CPU, and from step 4 on nothing new is compiled (a Python number
that changes every step, such as a bias correction, a step count or a scheduled `lr`, `betas` or
`momentum`, is a program input, not a constant) and nothing runs on the host CPU.

A sample of the probed matrix (every torch.optim optimizer, with foreach, fused and capturable
variants, and the common schedulers): each case covers a different path through torch's optimizer
code (single-tensor, multi-tensor, fused kernel, capturable tensors, scheduled betas)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher

optim = torch.optim
schedules = torch.optim.lr_scheduler
STEPS = 8
STEADY_FROM = 3  # steps 1-3 may compile (first step, state created, momentum buffers filled)


@dataclass(frozen=True)
class Case:
    """One training loop: the optimizer, its schedule, and how the loop uses them."""

    make_optimizer: Callable[[Any], torch.optim.Optimizer]
    make_schedule: Callable[[torch.optim.Optimizer], Any] | None = None
    cpu_optimizer: Callable[[Any], torch.optim.Optimizer] | None = None  # capturable=True runs only on accelerators
    micro_batches: int = 1
    set_to_none: bool = True
    clip_norm: float | None = None
    clip_value: float | None = None
    closure: bool = False
    plateau: bool = False
    tolerance: dict[str, float] = field(default_factory=lambda: {"rtol": 1e-4, "atol": 1e-5})


CASES: dict[str, Case] = {
    "SGD-nesterov-single-tensor-StepLR": Case(
        lambda params: optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False),
        lambda optimizer: schedules.StepLR(optimizer, 2, 0.5),
    ),
    "SGD-dampening-accumulate-keep-grads-clip": Case(
        lambda params: optim.SGD(params, lr=0.05, momentum=0.9, dampening=0.1),
        lambda optimizer: schedules.CosineAnnealingWarmRestarts(optimizer, T_0=3),
        micro_batches=2, set_to_none=False, clip_norm=0.5,
    ),
    "Adam-amsgrad-maximize-OneCycleLR": Case(
        lambda params: optim.Adam(params, lr=1e-2, amsgrad=True, maximize=True, weight_decay=0.1),
        lambda optimizer: schedules.OneCycleLR(optimizer, max_lr=1e-2, total_steps=10),
    ),
    "Adam-single-tensor-tensor-lr": Case(
        lambda params: optim.Adam(params, lr=torch.tensor(1e-2), foreach=False),
        lambda optimizer: schedules.StepLR(optimizer, 1, 0.8),
    ),
    "AdamW-fused-OneCycleLR": Case(
        lambda params: optim.AdamW(params, lr=1e-2, fused=True, amsgrad=True),
        lambda optimizer: schedules.OneCycleLR(optimizer, max_lr=1e-2, total_steps=10),
    ),
    "AdamW-capturable-single-tensor": Case(
        lambda params: optim.AdamW(params, lr=1e-2, capturable=True, foreach=False),
        lambda optimizer: schedules.CosineAnnealingLR(optimizer, T_max=8),
        cpu_optimizer=lambda params: optim.AdamW(params, lr=1e-2, foreach=False),
    ),
    "AdamW-warmup-then-cosine-clip-value": Case(
        lambda params: optim.AdamW(params, lr=1e-2, weight_decay=0.1),
        lambda optimizer: schedules.SequentialLR(
            optimizer, [schedules.LinearLR(optimizer, 0.1, 1.0, total_iters=3), schedules.CosineAnnealingLR(optimizer, T_max=5)], milestones=[3]
        ),
        clip_value=0.05,
    ),
    "NAdam-decoupled-LambdaLR-warmup": Case(
        lambda params: optim.NAdam(params, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
        lambda optimizer: schedules.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4)),
    ),
    "RAdam-capturable": Case(
        lambda params: optim.RAdam(params, lr=1e-2, capturable=True),
        cpu_optimizer=lambda params: optim.RAdam(params, lr=1e-2),
        tolerance={"rtol": 1e-4, "atol": 5e-5},
    ),
    "RMSprop-centered-momentum-CyclicLR": Case(
        lambda params: optim.RMSprop(params, lr=1e-2, centered=True, momentum=0.9),
        lambda optimizer: schedules.CyclicLR(optimizer, 1e-3, 1e-2, step_size_up=2),
    ),
    "Adagrad-lr-decay-cosine": Case(
        lambda params: optim.Adagrad(params, lr=1e-1, lr_decay=0.01),
        lambda optimizer: schedules.CosineAnnealingLR(optimizer, T_max=8),
    ),
    "Adadelta-single-tensor": Case(lambda params: optim.Adadelta(params, lr=1.0, foreach=False)),
    "Adamax-ReduceLROnPlateau": Case(
        lambda params: optim.Adamax(params, lr=1e-2, weight_decay=0.01),
        lambda optimizer: schedules.ReduceLROnPlateau(optimizer, patience=0, factor=0.5, threshold=10.0),
        plateau=True,
    ),
    "ASGD": Case(lambda params: optim.ASGD(params, lr=1e-2, t0=3)),
    "Rprop": Case(lambda params: optim.Rprop(params, lr=1e-2), lambda optimizer: schedules.ExponentialLR(optimizer, 0.9)),
    "Adafactor": Case(lambda params: optim.Adafactor(params, lr=1e-2, weight_decay=0.1), lambda optimizer: schedules.StepLR(optimizer, 1, 0.8)),
    # The line search's `.item()` syncs are LBFGS's own; the tolerance covers its amplified rounding.
    "LBFGS": Case(lambda params: optim.LBFGS(params, lr=0.5, max_iter=4), closure=True, tolerance={"rtol": 1e-3, "atol": 1e-4}),
}
STRICT_SAMPLE = ("SGD-nesterov-single-tensor-StepLR", "Adam-amsgrad-maximize-OneCycleLR", "AdamW-fused-OneCycleLR", "Adafactor")


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device)


def _train(case: Case, device: str, after_step: Callable[[], None] | None = None) -> list[torch.Tensor]:
    model = _model(device)
    make_optimizer = case.cpu_optimizer if device == "cpu" and case.cpu_optimizer else case.make_optimizer
    optimizer = make_optimizer(model.parameters())
    schedule = case.make_schedule(optimizer) if case.make_schedule else None
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        batches = [(torch.randn(8, 6, generator=generator), torch.randn(8, 3, generator=generator)) for _ in range(case.micro_batches)]

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batches[0][0].to(device)), batches[0][1].to(device))
            loss.backward()
            return loss

        if case.closure:
            loss = optimizer.step(closure)
        else:
            optimizer.zero_grad(set_to_none=case.set_to_none)
            for inputs, targets in batches:
                loss = torch.nn.functional.mse_loss(model(inputs.to(device)), targets.to(device)) / case.micro_batches
                loss.backward()
            if case.clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), case.clip_norm)
            if case.clip_value is not None:
                torch.nn.utils.clip_grad_value_(model.parameters(), case.clip_value)
            optimizer.step()
        if schedule is not None:
            schedule.step(loss.item()) if case.plateau else schedule.step()
        if after_step is not None:
            after_step()
    return [host(parameter) for parameter in model.parameters()]


def _check_steady_run(case: Case, mode: EagerMode, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps 4-8 run only programs that steps 1-3 ran (a per-step constant would make a new plan each
    step, whether or not an earlier test already compiled it), DeferAndFuse compiles no new fused
    program then, and no op runs on the host CPU."""
    expected = _train(case, "cpu")
    fallbacks: list[str] = []
    warn_fallback = dispatcher._warn_fallback

    def counting_warn_fallback(op_name: str, why: str) -> None:  # called on every fallback, warned once
        fallbacks.append(op_name)
        warn_fallback(op_name, why)

    monkeypatch.setattr(dispatcher, "_warn_fallback", counting_warn_fallback)
    plans_per_step: list[set[int]] = [set()]
    programs_per_step: list[int] = []
    with eager(mode):
        executor = dispatcher.executor
        run = type(executor).run

        def recording_run(self: Any, plan: Any, *args: Any, **kwargs: Any) -> Any:
            plans_per_step[-1].add(id(plan))
            return run(self, plan, *args, **kwargs)

        # On the class: patched on the instance, monkeypatch's undo would leave the instance a `run` of its own,
        # which hides every later patch of the class's method.
        monkeypatch.setattr(type(executor), "run", recording_run)

        def after_step() -> None:
            plans_per_step.append(set())
            programs_per_step.append(len(executor.programs) if executor.deferred else 0)

        result = _train(case, "tpu", after_step)
    for got, want in zip(result, expected):
        assert torch.allclose(got, want, **case.tolerance), (got - want).abs().max()
    warm_plans = set().union(*plans_per_step[:STEADY_FROM])
    new_plans = [len(plans - warm_plans) for plans in plans_per_step[STEADY_FROM:STEPS]]
    assert new_plans == [0] * (STEPS - STEADY_FROM), f"ops with new plans in steps {STEADY_FROM + 1}-{STEPS}: {new_plans}"
    new_programs = [after - before for before, after in zip(programs_per_step[STEADY_FROM - 1 :], programs_per_step[STEADY_FROM:])]
    assert new_programs == [0] * (STEPS - STEADY_FROM), f"fused programs compiled in steps {STEADY_FROM + 1}-{STEPS}: {new_programs}"
    assert not fallbacks, f"ran on the host CPU: {sorted(set(fallbacks))}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_deferred_training_matches_cpu_and_compiles_nothing_after_step_three(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_steady_run(CASES[name], EagerMode.DEFER_AND_FUSE, monkeypatch)


@pytest.mark.parametrize("name", STRICT_SAMPLE)
def test_strict_training_matches_cpu_and_compiles_nothing_after_step_three(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_steady_run(CASES[name], EagerMode.DEFER_NEVER, monkeypatch)
