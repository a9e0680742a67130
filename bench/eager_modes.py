"""Steady-state step time and peak chip memory of the GPT example and the quickstart MLP in
DEFER_AND_FUSE, DEFER_NEVER and plain torch on the CPU, measured interleaved in one process; and
compiled: `torch.compile(model, backend="tpu")` (forward and backward as XLA programs, the optimizer
eager in DEFER_AND_FUSE; `compile+opt` compiles the optimizer step too), next to torch.compile with
Inductor on the CPU as a second reference.

Writes its table to bench/RESULTS.md. `--steps`/`--rounds` trade time for precision.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import tputrace.backend  # noqa: E402,F401 - registers the tpu device
from results import write_section  # noqa: E402
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode  # noqa: E402

FOREACH: bool | None = None  # tpu optimizers' and clip_grad_norm_'s path: None lets torch choose, --single-tensor makes it False
MODES = ("DEFER_AND_FUSE", "DEFER_NEVER", "cpu", "compile", "compile+opt", "inductor")
HOST_MODES = ("cpu", "inductor")


@dataclass
class Workload:
    """One model in one mode: a step function and its measurements."""

    name: str
    mode: str
    step: Callable[[int], torch.Tensor]
    step_ms: list[float] = field(default_factory=list)
    process_cpu_ms: list[float] = field(default_factory=list)
    main_cpu_ms: list[float] = field(default_factory=list)
    peak_bytes: int = 0
    step_peak_bytes: int = 0  # peak above what was live when the measurement began (every workload's state)


def gpt_workload(mode: str) -> Workload:
    import gpt_train

    device = "cpu" if mode in HOST_MODES else "tpu"
    config = gpt_train.GPTConfig()
    torch.manual_seed(0)
    model = gpt_train.GPT(config).to(device)
    foreach = None if device == "cpu" else FOREACH
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=foreach)
    batches = [(tokens.to(device), targets.to(device)) for tokens, targets in gpt_train.synthetic_batches(config, 4, 4)]
    forward = compiled(model, mode)

    def update() -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=foreach)
        optimizer.step()

    update = torch.compile(update, backend="tpu") if mode == "compile+opt" else update

    def step(index: int) -> torch.Tensor:
        tokens, targets = batches[index % len(batches)]
        _, loss = forward(tokens, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        update()
        return loss

    return Workload("GPT (6x256, batch 4x64)", mode, step)


def mlp_workload(mode: str) -> Workload:
    import quickstart

    device = "cpu" if mode in HOST_MODES else "tpu"
    model = quickstart.make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=None if device == "cpu" else FOREACH)
    inputs, labels = (value.to(device) for value in quickstart.make_data())
    forward = compiled(model, mode)
    update = torch.compile(optimizer.step, backend="tpu") if mode == "compile+opt" else optimizer.step

    def step(index: int) -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(forward(inputs), labels)
        loss.backward()
        update()
        return loss

    return Workload("MLP (quickstart)", mode, step)


MODELS: dict[str, Callable[[str], Workload]] = {"gpt": gpt_workload, "mlp": mlp_workload}


def compiled(model: torch.nn.Module, mode: str) -> Callable:
    """The model's forward for a mode: torch.compile'd for `compile` (tpu) and `inductor` (CPU)."""
    if mode in ("compile", "compile+opt"):
        return torch.compile(model, backend="tpu")
    if mode == "inductor":
        return torch.compile(model, backend="inductor")
    return model


def use_mode(mode: str) -> None:
    if mode in ("compile", "compile+opt"):
        set_eager_mode(EagerMode.DEFER_AND_FUSE)  # the eager rest of the step (optimizer, zero_grad)
    elif mode not in HOST_MODES:
        set_eager_mode(EagerMode[mode])


def measure(workload: Workload, steps: int) -> None:
    use_mode(workload.mode)
    if workload.mode not in HOST_MODES:
        torch.tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        live_at_start = torch.tpu.memory_allocated()
    start, process_start, main_start = time.perf_counter(), time.process_time(), time.thread_time()
    for index in range(steps):
        loss = workload.step(index)
    loss.item()
    if workload.mode not in HOST_MODES:
        torch.tpu.synchronize()
        peak = torch.tpu.max_memory_allocated()
        workload.peak_bytes = max(workload.peak_bytes, peak)
        workload.step_peak_bytes = max(workload.step_peak_bytes, peak - live_at_start)
    workload.step_ms.append((time.perf_counter() - start) / steps * 1e3)
    workload.process_cpu_ms.append((time.process_time() - process_start) / steps * 1e3)
    workload.main_cpu_ms.append((time.thread_time() - main_start) / steps * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps (compiles) per workload")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS), help="models to measure")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES, help="modes to measure (DEFER_NEVER and cpu are always in)")
    parser.add_argument("--single-tensor", action="store_true", help="optimizers and clipping without _foreach_ ops (torch's per-tensor loop)")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave bench/RESULTS.md alone")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    global FOREACH
    FOREACH = False if args.single_tensor else None
    modes = [mode for mode in MODES if mode in args.modes or mode in ("DEFER_NEVER", "cpu")]
    workloads = [MODELS[model](mode) for model in args.models for mode in modes]
    for workload in workloads:
        use_mode(workload.mode)
        for index in range(args.warmup):
            workload.step(index).item()
    for _ in range(args.rounds):
        for workload in workloads:
            measure(workload, args.steps)
    rows = [
        "| model | mode | ms/step (median) | process CPU ms/step (main thread) | peak chip memory (above the start) | vs DEFER_NEVER | vs torch CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(workload.name for workload in workloads):
        by_mode = {workload.mode: workload for workload in workloads if workload.name == name}
        strict = statistics.median(by_mode["DEFER_NEVER"].step_ms)
        cpu = statistics.median(by_mode["cpu"].step_ms)
        for mode in modes:
            workload = by_mode[mode]
            ms = statistics.median(workload.step_ms)
            memory = "n/a (host)" if mode in HOST_MODES else f"{workload.peak_bytes / 2**20:.1f} MiB ({workload.step_peak_bytes / 2**20:.1f} MiB)"
            cpu_time = f"{statistics.median(workload.process_cpu_ms):.1f} ({statistics.median(workload.main_cpu_ms):.1f})"
            rows.append(f"| {name} | {mode} | {ms:.1f} | {cpu_time} | {memory} | {strict / ms:.2f}x faster | {ms / cpu:.2f}x the time |")
    table = "\n".join(rows)
    print(table)
    if args.no_write:
        return
    write_section(
        "Eager modes (bench/eager_modes.py)",
        f"Steady state after {args.warmup} warm-up steps; {args.rounds} interleaved rounds of {args.steps} steps; "
        f"XLA on the host CPU ({torch.tpu.get_device_name()}). `compile`: torch.compile(model, backend=\"tpu\"), "
        "the optimizer eager in DEFER_AND_FUSE; `compile+opt`: the optimizer step (with gradient clipping) compiled too; "
        "`inductor`: torch.compile on the CPU with Inductor. Process CPU counts every thread (XLA:CPU's and "
        f"autograd's too): with {os.cpu_count()} CPUs here, a mode whose process CPU is {os.cpu_count()}x its wall time "
        "is bound by the CPU. Peak chip memory counts every live buffer of the process, so every workload's parameters "
        "and optimizer state; the figure in parentheses is the peak above what was live when the workload's measurement began.\n\n"
        f"{table}",
    )


if __name__ == "__main__":
    main()
