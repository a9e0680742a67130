"""Optimizers in DeferAndFuse: making one runs the set-up still pending (a model made on the device,
state its constructor made), and its first step runs the state it makes (zeros, fills) as a program of its own before its update
reads it, so the first step's programs are the ones every later step runs and the second step
compiles nothing. Values match the same loop on the CPU, including an op that overwrites a
value the pending graph still reads."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tputrace
from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.dispatch import dispatcher

STEPS = 4


class RunningTotal(torch.optim.Optimizer):
    """Keeps a running total of each parameter, then overwrites the parameter: `zero_` of a value the
    pending graph reads stays in that graph, as in every later step (recorded apart, it would make the
    first step's update a program of its own, and donate a value the pending graph still reads)."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state[param]
                if not state:
                    state["total"] = torch.zeros_like(param)
                state["total"].add_(param)
                param.zero_()
                param.add_(state["total"] * 0.1 - param.grad)


class HeavyBall(torch.optim.Adagrad):
    """Momentum buffers made in the constructor, as Adagrad makes its sums, in a class defined after
    the backend was imported, whose constructor wraps Adagrad's: the state both make runs when the
    outer constructor returns, not inside the first step's forward program."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=1e-2)
        for group in self.param_groups:
            for param in group["params"]:
                self.state[param]["velocity"] = torch.zeros_like(param)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        super().step()
        for group in self.param_groups:
            for param in group["params"]:
                velocity = self.state[param]["velocity"]
                velocity.mul_(0.9).add_(param.grad)
                param.sub_(velocity, alpha=1e-2)


def _two_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    weights = [param for param in model.parameters() if param.ndim == 2]
    biases = [param for param in model.parameters() if param.ndim == 1]
    return [{"params": weights, "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.0}]


# Each case has shapes of its own, so that no program an earlier test compiled is found in the cache.
CASES: dict[str, tuple[tuple[int, int, int], Callable[[torch.nn.Module], torch.optim.Optimizer], bool]] = {
    "AdamW-clip": ((5, 11, 3), lambda model: torch.optim.AdamW(model.parameters(), lr=1e-2), True),
    "Adam-two-groups": ((6, 13, 2), lambda model: torch.optim.Adam(_two_groups(model), lr=1e-2), False),
    "RMSprop-centered-momentum": ((7, 9, 4), lambda model: torch.optim.RMSprop(model.parameters(), lr=1e-2, centered=True, momentum=0.9), False),
    "RunningTotal": ((3, 10, 5), lambda model: RunningTotal(model.parameters()), False),
    "HeavyBall": ((2, 14, 3), lambda model: HeavyBall(model.parameters()), False),
    # full_like of each gradient (a weight's is a transposed view; clipping leaves each pending) and
    # `sign[sign.gt(0)] = etaplus` in the update
    "Rprop-clip": ((5, 8, 7), lambda model: torch.optim.Rprop(model.parameters(), lr=1e-2), True),
    # its learning rate copied to the chip and cloned into each parameter's state
    "ASGD": ((3, 7, 9), lambda model: torch.optim.ASGD(model.parameters(), lr=1e-2), False),
    "Adagrad": ((4, 12, 6), lambda model: torch.optim.Adagrad(model.parameters(), lr=1e-2, initial_accumulator_value=0.1), False),
}


def _train(name: str, device: str, after_step: Callable[[], None]) -> list[torch.Tensor]:
    (n_in, n_hidden, n_out), make_optimizer, clip = CASES[name]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(n_in, n_hidden), torch.nn.Tanh(), torch.nn.Linear(n_hidden, n_out)).to(device)
    optimizer = make_optimizer(model)
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        inputs, targets = torch.randn(8, n_in, generator=generator), torch.randn(8, n_out, generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs.to(device)), targets.to(device)).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        after_step()
    return [host(param) for param in model.parameters()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_second_step_compiles_nothing_and_values_match_the_cpu(name: str) -> None:
    expected = _train(name, "cpu", lambda: None)
    with eager(EagerMode.DEFER_AND_FUSE):
        programs = dispatcher.executor.programs
        programs_after_step: list[int] = []
        result = _train(name, "tpu", lambda: programs_after_step.append(len(programs)))
    for got, want in zip(result, expected):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()
    new_programs = [after - before for before, after in zip(programs_after_step, programs_after_step[1:])]
    assert new_programs == [0] * (STEPS - 1)


def test_the_trace_shows_the_set_up_and_state_flushes_and_no_recompile(tmp_path: Path) -> None:
    """A model made on the device: its initialisation runs when the optimizer is made, not in the
    first step's program."""
    script = tmp_path / "script.py"
    script.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "with torch.device('tpu'):\n"
        "    model = torch.nn.Linear(4, 3)\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)\n"
        "for _ in range(3):\n"
        "    model(torch.randn(2, 4).to('tpu')).square().sum().backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
    )
    trace_path = tmp_path / "script.tptrace"
    run = "import sys; from tputrace.cli.main import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", run, "run", "--no-summary", "-o", str(trace_path), str(script)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with tputrace.open(trace_path) as trace:
        flushes = [(flush.step, flush.trigger, flush.source.line, flush.cache_hit) for flush in trace.records("flushes", order_by="start_ns")]
        reasons = [compile.reason for compile in trace.records("compiles", order_by="start_ns")]
    assert flushes == [
        (0, "optimizer_init", 5, False),
        (0, "backward_end", 7, False), (0, "optimizer_state", 8, False), (0, "step", 8, False),
        (1, "backward_end", 7, True), (1, "step", 8, True),
        (2, "backward_end", 7, True), (2, "step", 8, True),
    ]
    assert reasons == ["first"] * 4
