"""XLA compiles per step and steady-state step time of a small training loop through `torch.cond`
(and `torch.while_loop`), forward and backward, on tpu against torch on the CPU.

    python bench/control_flow_steady.py [--op cond|while] [--mode DEFER_NEVER|DEFER_AND_FUSE|compile|cpu] [--steps N]

The model: a linear layer, a `torch.cond` on the sign of its output's mean whose true branch reads
another layer's weights, then (with `--op while`) a `while_loop` of three steps whose body reads a
parameter; loss, backward, SGD step, the loss read on the host each step. `compile` runs the model
under `torch.compile(backend="tpu")` (the optimizer eager). Prints the XLA compiles JAX reports
(`/jax/core/compile/backend_compile_duration`) in each step, the loss's largest difference from the
CPU's, and the median step time after the first `--warmup` steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import torch
from torch._higher_order_ops import while_loop

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Routed(torch.nn.Module):
    """A layer, a data-dependent choice between two computations, and optionally a short loop."""

    def __init__(self, loop: bool) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, 16)
        self.gate = torch.nn.Linear(16, 16)
        self.shift = torch.nn.Parameter(torch.randn(16) * 0.1)
        self.loop = loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.inp(x)
        hidden = torch.cond(hidden.mean() > 0, lambda h: self.gate(h).tanh(), lambda h: (h * 0.5).relu(), (hidden,))
        if self.loop:
            shift = self.shift
            count = torch.zeros((), dtype=torch.int64, device=x.device)
            _, hidden = while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, h * 0.9 + shift.sin()), (count, hidden))
        return (hidden**2).mean()


def train(device: str, loop: bool, steps: int, compiled: bool, compiles: list[float]) -> tuple[list[float], list[float], list[int]]:
    """Losses, step times (s) and XLA compiles of each step."""
    torch.manual_seed(0)
    model = Routed(loop).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = [torch.randn(8, 16, generator=torch.Generator().manual_seed(index)).to(device) for index in range(4)]
    forward = torch.compile(model, backend="tpu") if compiled else model
    losses, times, step_compiles = [], [], []
    for step in range(steps):
        before, start = len(compiles), time.perf_counter()
        loss = forward(batches[step % len(batches)])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach().cpu()))
        times.append(time.perf_counter() - start)
        step_compiles.append(len(compiles) - before)
    return losses, times, step_compiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="cond", choices=("cond", "while"))
    parser.add_argument("--mode", default="DEFER_NEVER", choices=("DEFER_NEVER", "DEFER_AND_FUSE", "compile", "cpu"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    options = parser.parse_args()
    compiles: list[float] = []
    jax.monitoring.register_event_duration_secs_listener(lambda event, duration, **_: compiles.append(duration) if event == _COMPILE_EVENT else None)
    loop = options.op == "while"
    cpu_losses, cpu_times, _ = train("cpu", loop, options.steps, False, compiles)
    if options.mode == "cpu":
        print(f"{options.op} cpu: {1000 * statistics.median(cpu_times[options.warmup:]):.1f} ms/step")
        return
    if options.mode != "compile":
        set_eager_mode(getattr(EagerMode, options.mode))
    losses, times, step_compiles = train("tpu", loop, options.steps, options.mode == "compile", compiles)
    difference = max(abs(a - b) for a, b in zip(losses, cpu_losses))
    print(f"{options.op} {options.mode}: XLA compiles per step {step_compiles}, {sum(step_compiles[options.warmup:])} after step {options.warmup}; "
          f"{1000 * statistics.median(times[options.warmup:]):.1f} ms/step (CPU {1000 * statistics.median(cpu_times[options.warmup:]):.1f}); "
          f"largest loss difference {difference:.2g}")


if __name__ == "__main__":
    main()
