"""Step replay in DEFER_AND_FUSE: a training step with replay on and off, side by side in one process, on models of
three step sizes (bench/workloads.py), next to torch's CPU eager and the strict mode (DEFER_NEVER) as references.

Each case runs windows of steady-state steps (after warm-up); replay on and off run in pairs whose order alternates
from pair to pair, and all cases are interleaved round by round, so load from other processes falls on both sides of
a pair alike. A window measures wall time, the process's CPU time and the main thread's CPU time per step; the gain
is the median over pairs of off / on. A second, instrumented pass per model times the executor itself in CPU time of
the thread that calls it: its recording per op (`DeferredExecutor.run`, while replay holds: the check against the template) and its flushes per
step (cache key or template check, donation, launch, filling in the outputs), less what the timers themselves cost.
Writes the table to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
import workloads
from results import write_section
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode
from tputrace.backend.core.dispatch import dispatcher
from tputrace.backend.eager import step_replay

_cpu_ns = time.thread_time_ns  # the calling thread's CPU time: what other processes on the host do not change
MODES = ("cpu eager", "DEFER_NEVER", "DEFER_AND_FUSE replay off", "DEFER_AND_FUSE replay on")


@dataclass
class Case:
    model: str
    mode: str
    step: workloads.Step
    wall_ms: list[float] = field(default_factory=list)
    process_ms: list[float] = field(default_factory=list)
    main_ms: list[float] = field(default_factory=list)
    index: int = 0

    def enter(self) -> None:
        """Switch the backend to this case's mode (replay on or off for DEFER_AND_FUSE)."""
        if self.mode == "cpu eager":
            return
        set_eager_mode(EagerMode.DEFER_NEVER if self.mode == "DEFER_NEVER" else EagerMode.DEFER_AND_FUSE)
        if self.mode.startswith("DEFER_AND_FUSE"):
            executor = dispatcher.executor
            on = self.mode.endswith("on")
            if (executor.replay_chains is not None) != on:
                executor.replay_chains = step_replay.Chains() if on else None

    def run(self, steps: int) -> torch.Tensor:
        loss = None
        for _ in range(steps):
            loss = self.step(self.index)
            self.index += 1
        assert loss is not None
        return loss


def _sync(case: Case, loss: torch.Tensor) -> None:
    loss.item()
    if case.mode != "cpu eager":
        torch.tpu.synchronize()


def measure(case: Case, steps: int) -> None:
    case.enter()
    _sync(case, case.run(1))
    start, process_start, main_start = time.perf_counter(), time.process_time(), time.thread_time()
    _sync(case, case.run(steps))
    case.wall_ms.append((time.perf_counter() - start) / steps * 1e3)
    case.process_ms.append((time.process_time() - process_start) / steps * 1e3)
    case.main_ms.append((time.thread_time() - main_start) / steps * 1e3)


@dataclass
class ExecutorTimes:
    run_ns: int = 0
    ops: int = 0
    flush_ns: int = 0
    flushes: int = 0


def executor_times(case: Case, steps: int) -> ExecutorTimes:
    """The executor's own time over `steps` steps: its recording (`run`) per op and its flushes."""
    case.enter()
    executor = dispatcher.executor
    times = ExecutorTimes()
    run, flush_graph = executor.run, executor.flush_graph

    def timed_run(*args: object, **kwargs: object) -> tuple:
        start = _cpu_ns()
        try:
            return run(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            times.run_ns += _cpu_ns() - start
            times.ops += 1

    def timed_flush(*args: object, **kwargs: object) -> None:
        start = _cpu_ns()
        try:
            flush_graph(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            times.flush_ns += _cpu_ns() - start
            times.flushes += 1

    _sync(case, case.run(2))
    executor.run, executor.flush_graph = timed_run, timed_flush  # type: ignore[method-assign]
    try:
        _sync(case, case.run(steps))
    finally:
        del executor.run, executor.flush_graph
    return times


def timer_cost_ns(calls: int = 20_000) -> float:
    """What the timers of `executor_times` add to each call's figure: the CPU time they read around a call that does
    nothing. Subtracted from the executor's figures."""
    totals = [0]

    def nothing() -> None:
        return None

    def timed() -> None:
        start = _cpu_ns()
        try:
            return nothing()
        finally:
            totals[0] += _cpu_ns() - start

    for _ in range(calls):
        timed()
    return totals[0] / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="interleaved rounds (pairs of replay on and off) per model")
    parser.add_argument("--window-ms", type=float, default=400, help="about how long a window runs")
    parser.add_argument("--models", nargs="+", choices=workloads.MODELS, default=list(workloads.MODELS))
    parser.add_argument("--no-write", action="store_true", help="print the table, leave bench/RESULTS.md alone")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    cases: list[Case] = []
    for model in args.models:
        for mode in MODES:
            device = "cpu" if mode == "cpu eager" else "tpu"
            case = Case(model, mode, workloads.build(model, device))
            case.enter()
            for _ in range(3):
                _sync(case, case.run(1))  # compiles, optimizer state
            cases.append(case)
    steps = {}
    for case in cases:
        if case.mode == "DEFER_AND_FUSE replay on":
            case.enter()
            start = time.perf_counter()
            _sync(case, case.run(2))
            steps[case.model] = max(2, round(args.window_ms / ((time.perf_counter() - start) / 2 * 1e3)))
    for round_index in range(args.pairs):
        for model in args.models:
            by_mode = {case.mode: case for case in cases if case.model == model}
            order = list(MODES) if round_index % 2 == 0 else [*MODES[:2], MODES[3], MODES[2]]
            for mode in order:
                measure(by_mode[mode], steps[model])
    table = _table(cases, args.models, steps)
    print(table)
    if not args.no_write:
        write_section(
            "Step replay (bench/step_replay.py)",
            f"{args.pairs} interleaved rounds per model, replay on and off in alternating order within each round; windows of "
            f"about {args.window_ms:.0f} ms of steady-state steps after 3 warm-up steps; XLA on the host CPU "
            f"({os.cpu_count()} CPUs, shared with other work while measured). ms/step and CPU: medians over windows; "
            "`off / on`: the median over rounds of the replay-off window's figure over the replay-on window's (above 1: "
            "replay is faster). Recording µs/op and flush ms/step are CPU time of the calling thread, from a separate pass "
            "with timers around the executor's `run` and `flush_graph`, less the timers' own cost (measured beside): the "
            "executor's own work, not the dispatch around it.\n\n"
            f"{table}",
        )


def _ratios(off: list[float], on: list[float]) -> str:
    ratios = sorted(before / after for before, after in zip(off, on))
    return f"{statistics.median(ratios):.3f} ({ratios[0]:.2f}…{ratios[-1]:.2f})"


def _table(cases: list[Case], models: list[str], steps: dict[str, int]) -> str:
    rows = [
        "| model | mode | ms/step | main-thread CPU ms/step | process CPU ms/step | recording µs/op | flushes ms/step | vs torch CPU | vs DEFER_NEVER |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in models:
        by_mode = {case.mode: case for case in cases if case.model == model}
        cpu = statistics.median(by_mode["cpu eager"].wall_ms)
        strict = statistics.median(by_mode["DEFER_NEVER"].wall_ms)
        for mode in MODES:
            case = by_mode[mode]
            wall = statistics.median(case.wall_ms)
            recording = flushes = "-"
            if mode.startswith("DEFER_AND_FUSE"):
                times = executor_times(case, steps[model])
                overhead = timer_cost_ns()
                recording = f"{(times.run_ns / max(times.ops, 1) - overhead) / 1e3:.2f}"
                flushes = f"{(times.flush_ns - overhead * times.flushes) / steps[model] / 1e6:.2f}"
            rows.append(
                f"| {workloads.describe(model)} | {mode} | {wall:.2f} | {statistics.median(case.main_ms):.2f} | "
                f"{statistics.median(case.process_ms):.2f} | {recording} | {flushes} | {wall / cpu:.2f}x the time | {strict / wall:.2f}x faster |"
            )
        off, on = by_mode[MODES[2]], by_mode[MODES[3]]
        rows.append(
            f"| {workloads.describe(model)} | replay off / on | {_ratios(off.wall_ms, on.wall_ms)} | {_ratios(off.main_ms, on.main_ms)} | "
            f"{_ratios(off.process_ms, on.process_ms)} | | | | |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
