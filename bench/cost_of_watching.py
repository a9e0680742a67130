"""The cost of watching: what recording a trace adds to a training step, side by side in one process, for
torch on the CPU (eager and torch.compile with Inductor), the tpu backend's strict eager mode (DEFER_NEVER),
DEFER_AND_FUSE and torch.compile(backend="tpu"), on models of three step sizes (bench/workloads.py).

Each case runs in pairs of measurement windows, one recording a trace and one under a recording that
writes none (`tputrace run --no-trace`), the order alternating from pair to pair and the cases interleaved
round by round. A window runs one step that is not timed (a new recording's first ops intern their
strings and source lines), then enough steps to last `--window-s`, and ends with the chip synced and the
trace writer's rows committed, so the writer thread's work is inside the window. The overhead of a case is
the median over its pairs of traced / untraced: wall time, process CPU time (every thread: the writer's,
XLA's) and the main thread's CPU time. A second table splits the CPU a traced step adds by thread (where
Linux's per-thread run times can be read): the main thread, autograd's (the backward's ops), the recording's
own threads (the trace writer's inserts, the execution watcher) and the rest (XLA's). A third times one
recorded op in isolation (`x + x` on an 8x8 tensor). Writes the tables to bench/RESULTS.md; `--pairs` trades
time for precision.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
import workloads
from results import write_section
from tputrace.recording import lifecycle

# case -> (device, torch.compile backend, recording mode); a recording's mode sets the tpu eager mode.
CASES: dict[str, tuple[str, str | None, str]] = {
    "cpu eager": ("cpu", None, "defer"),
    "cpu inductor": ("cpu", "inductor", "defer"),
    "tpu strict": ("tpu", None, "strict"),
    "tpu DeferAndFuse": ("tpu", None, "defer"),
    "tpu torch.compile": ("tpu", "tpu", "defer"),
}
ISOLATED_OPS = 2000
THREAD_GROUPS = ("main", "autograd", "recording", "other")


@dataclass
class Window:
    wall_ms: float
    process_ms: float
    main_ms: float
    ops: float  # ops recorded per step (0 untraced)
    threads: dict[str, float] = field(default_factory=dict)  # CPU ms per step by thread group (empty: not readable)


@dataclass
class Case:
    model: str
    name: str
    step: workloads.Step
    mode: str
    device: str
    steps: int = 3
    traced: list[Window] = field(default_factory=list)
    untraced: list[Window] = field(default_factory=list)


def _sync(loss: torch.Tensor, device: str) -> None:
    loss.item()
    if device == "tpu":
        torch.tpu.synchronize()


def thread_cpu_ns() -> dict[int, tuple[str, int]]:
    """Each thread's CPU time so far and its group (`THREAD_GROUPS`), by Linux thread id, from the kernel's
    per-thread run times; empty where they cannot be read."""
    main = threading.main_thread().native_id
    recording = {thread.native_id for thread in threading.enumerate() if thread.name.startswith("tputrace-")}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {}
    threads: dict[int, tuple[str, int]] = {}
    for task in tasks:
        try:
            run_ns = int(Path(f"/proc/self/task/{task}/schedstat").read_text().split()[0])
            name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile, or no schedstat
        tid = int(task)
        threads[tid] = ("main" if tid == main else "recording" if tid in recording else "autograd" if name.startswith("pt_autograd") else "other", run_ns)
    return threads if main in threads else {}


def _per_step(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], steps: int, commit_ns: int) -> dict[str, float]:
    """CPU ms per step by group between two readings (a thread started meanwhile counts from 0); `commit_ns`,
    the main thread's time in the window's last commit of the trace's rows, counts as the recording threads'."""
    if not before or not after:
        return {}
    totals = dict.fromkeys(THREAD_GROUPS, 0)
    for tid, (group, run_ns) in after.items():
        totals[group] += run_ns - before.get(tid, (group, 0))[1]
    totals["main"] -= commit_ns
    totals["recording"] += commit_ns
    return {group: total / steps / 1e6 for group, total in totals.items()}


def run_window(case: Case, folder: Path, traced: bool, label: str) -> Window:
    """One measurement window of `case.steps` steps inside a recording of its own."""
    path = str(folder / f"{label}.tptrace") if traced else None
    recorder = lifecycle.start(path, script="bench", argv=[], mode=case.mode)
    try:
        _sync(case.step(0), case.device)
        ops_before = recorder.ops
        threads = thread_cpu_ns()
        wall, process, main = time.perf_counter(), time.process_time(), time.thread_time()
        for index in range(case.steps):
            loss = case.step(index + 1)
        _sync(loss, case.device)
        commit_ns = time.thread_time_ns()
        if recorder.writer is not None:
            recorder.writer.flush()
        commit_ns = time.thread_time_ns() - commit_ns
        steps = case.steps
        window = Window((time.perf_counter() - wall) / steps * 1e3, (time.process_time() - process) / steps * 1e3,
                        (time.thread_time() - main) / steps * 1e3, (recorder.ops - ops_before) / steps if traced else 0.0,
                        _per_step(threads, thread_cpu_ns(), steps, commit_ns))
    finally:
        lifecycle.stop(0)
    if path is not None:
        Path(path).unlink(missing_ok=True)
    return window


def prepare(model: str, name: str, folder: Path, window_s: float) -> Case:
    """Build the case, compile what it compiles (a step traced and one not), and size its window."""
    device, backend, mode = CASES[name]
    case = Case(model, name, workloads.build(model, device, backend), mode, device, steps=1)
    run_window(case, folder, True, "warm")
    timing = run_window(case, folder, False, "warm")
    case.steps = max(3, round(window_s * 1e3 / max(timing.wall_ms, 1e-3)))
    return case


def _ratio(case: Case, metric: Callable[[Window], float]) -> tuple[float, float, float]:
    """The median, lowest and highest over pairs of traced / untraced, as percentages over 1."""
    ratios = sorted((metric(traced) / metric(untraced) - 1) * 100 for traced, untraced in zip(case.traced, case.untraced))
    return statistics.median(ratios), ratios[0], ratios[-1]


def _percent(values: tuple[float, float, float]) -> str:
    median, low, high = values
    return f"{median:+.1f}% ({low:+.0f}…{high:+.0f})"


def step_table(cases: list[Case]) -> str:
    rows = [
        "| model | case | ops/step | untraced ms/step (CPU) | traced ms/step (CPU) | wall | process CPU | main-thread CPU | recording µs/op (process CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        ops = statistics.median(window.ops for window in case.traced)
        untraced_wall = statistics.median(window.wall_ms for window in case.untraced)
        traced_wall = statistics.median(window.wall_ms for window in case.traced)
        untraced_cpu = statistics.median(window.process_ms for window in case.untraced)
        traced_cpu = statistics.median(window.process_ms for window in case.traced)
        per_op = f"{(traced_cpu - untraced_cpu) * 1e3 / ops:.1f}" if ops >= 1 else "n/a (no tpu ops)"
        rows.append(
            f"| {workloads.describe(case.model)} | {case.name} | {ops:.0f} | {untraced_wall:.1f} ({untraced_cpu:.1f}) | {traced_wall:.1f} ({traced_cpu:.1f}) "
            f"| {_percent(_ratio(case, lambda w: w.wall_ms))} | {_percent(_ratio(case, lambda w: w.process_ms))} "
            f"| {_percent(_ratio(case, lambda w: w.main_ms))} | {per_op} |"
        )
    return "\n".join(rows)


def thread_table(cases: list[Case]) -> str:
    """The CPU ms a traced step adds, by thread group: the median over pairs of traced - untraced."""
    rows = ["| model | case | untraced CPU ms/step | added: main | autograd | recording threads | other (XLA) |", "|---|---|---|---|---|---|---|"]
    for case in cases:
        pairs = [(traced.threads, untraced.threads) for traced, untraced in zip(case.traced, case.untraced) if traced.threads and untraced.threads]
        if not pairs:
            continue
        untraced_total = statistics.median(sum(untraced.values()) for _, untraced in pairs)
        added = [f"{statistics.median(traced[group] - untraced[group] for traced, untraced in pairs):+.2f}" for group in THREAD_GROUPS]
        rows.append(f"| {workloads.describe(case.model)} | {case.name} | {untraced_total:.1f} | " + " | ".join(added) + " |")
    return "\n".join(rows) if len(rows) > 2 else ""


def isolated_op_table(pairs: int) -> str:
    """Main-thread and process CPU per `x + x` (8x8), traced and untraced, in pairs of windows."""
    rows = ["| mode | untraced µs/op main (process) | traced µs/op main (process) | recording µs/op main (process) |", "|---|---|---|---|"]
    for mode, label in (("strict", "tpu strict"), ("defer", "tpu DeferAndFuse")):
        samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for pair in range(pairs + 1):
            for traced in (True, False) if pair % 2 == 0 else (False, True):
                with tempfile.TemporaryDirectory() as folder:
                    recorder = lifecycle.start(str(Path(folder) / "op.tptrace") if traced else None, script="bench", argv=[], mode=mode)
                    try:
                        x = torch.ones(8, 8, device="tpu")
                        (x + x).cpu()
                        main, process = time.thread_time(), time.process_time()
                        for _ in range(ISOLATED_OPS):
                            y = x + x
                        y.cpu()
                        if recorder.writer is not None:
                            recorder.writer.flush()
                        sample = ((time.thread_time() - main) / ISOLATED_OPS * 1e6, (time.process_time() - process) / ISOLATED_OPS * 1e6)
                    finally:
                        lifecycle.stop(0)
                if pair > 0:  # the first pair compiles
                    samples[traced].append(sample)
        untraced = [statistics.median(value[part] for value in samples[False]) for part in (0, 1)]
        traced_cost = [statistics.median(value[part] for value in samples[True]) for part in (0, 1)]
        rows.append(f"| {label} | {untraced[0]:.1f} ({untraced[1]:.1f}) | {traced_cost[0]:.1f} ({traced_cost[1]:.1f}) "
                    f"| {traced_cost[0] - untraced[0]:+.1f} ({traced_cost[1] - untraced[1]:+.1f}) |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="traced/untraced pairs per case")
    parser.add_argument("--window-s", type=float, default=0.5, help="seconds of steps per measurement window")
    parser.add_argument("--models", nargs="+", default=list(workloads.MODELS), choices=workloads.MODELS)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-write", action="store_true", help="print the tables without writing bench/RESULTS.md")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        cases = [prepare(model, name, folder, args.window_s) for model in args.models for name in args.cases]
        for pair in range(args.pairs):
            for case in cases:
                for traced in (True, False) if pair % 2 == 0 else (False, True):
                    window = run_window(case, folder, traced, f"{case.model}-{pair}")
                    (case.traced if traced else case.untraced).append(window)
            print(f"pair {pair + 1}/{args.pairs} done", flush=True)
    steps = step_table(cases)
    threads = thread_table(cases)
    isolated = isolated_op_table(args.pairs)
    by_thread = ("\n\nThe CPU a traced step adds, by thread (ms per step, median over pairs of traced - untraced): the main thread, "
                 "autograd's (the backward's ops and their records), the recording's threads (the trace writer's inserts, the "
                 "execution watcher) and the rest (XLA's).\n\n" + threads) if threads else ""
    print(steps, by_thread, "\n\n" + isolated)
    if args.no_write:
        return
    write_section(
        "Cost of watching: tracing overhead (bench/cost_of_watching.py)",
        f"{args.pairs} interleaved traced/untraced pairs per case, windows of about {args.window_s} s, each ending with the chip synced and "
        "the trace's rows committed. Overhead: the median over pairs of traced / untraced (lowest…highest pair in parentheses); "
        "recording µs/op: the process CPU a step gains, over the ops it records. Targets: ≤ 3% on small steps, ≤ 1% on large ones, "
        "≤ 1 µs recorded per op.\n\n" + steps + by_thread + f"\n\nOne recorded op in isolation: `x + x` on an 8x8 tensor, {ISOLATED_OPS} per window, "
        f"{args.pairs} pairs.\n\n" + isolated,
    )


if __name__ == "__main__":
    main()
