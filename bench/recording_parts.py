"""What each part of recording costs a training step: the step traced with one part of the recording left out
at a time, interleaved with the step traced whole and not traced (`--no-trace`), in one process.

The parts: the op and view records (the rows of `ops`: each record's line lookup, module path and row, and the
row's insert), only their line lookups, only the trace writer's inserts (every table's), only the `ops` rows of the
flushes that replayed their template (DEFER_AND_FUSE: made and inserted; what a compact record of them could save
at most), the buffer lifetimes
(`buffers` rows and the optimizer's labels), the module paths (the wrapped `nn.Module.__call__`), the host origins (the wrapped
tensor makers) and the execution watcher (`executions` rows); and, last, the writer committing every row at the window's end
rather than every 0.25 s beside the steps (no part left out: whether an insert costs more beside them). A part is left out by replacing the recorder's or
the backend's entry point to it with nothing for that window only, so a window without a part is not a
recording anyone gets: it says what the part costs, not what a trace without it would hold.

Each window runs one step that is not timed, then `--steps` steps, and ends with the trace's rows committed.
Per configuration: process and main-thread CPU time per step, and the overhead over untraced, each the median
over rounds of the ratio within a round. A last table times one module call untraced, traced, and with global
forward hooks keeping the module stack instead of the wrapped call. Writes its tables to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
import workloads
from results import write_section
from tputrace.backend.core import hooks, host_origins, memory
from tputrace.recording import lifecycle
from tputrace.recording.recorder import Recorder


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _without_records(recorder: Recorder) -> None:
    recorder.op_deferred = _nothing  # type: ignore[method-assign]
    recorder.op_ran = _nothing  # type: ignore[method-assign]
    recorder.view_op = _nothing  # type: ignore[method-assign]


def _without_lines(recorder: Recorder) -> None:
    recorder._user_frame_id = _nothing  # type: ignore[method-assign]


def _without_inserts(recorder: Recorder) -> None:
    assert recorder.writer is not None
    recorder.writer._insert = _nothing  # type: ignore[method-assign]


def _without_replayed_rows(recorder: Recorder) -> None:
    """No `ops` rows (made or inserted) for the flushes that replayed their template: the most that recording those
    flushes' ops compactly could save of the rows' part."""
    flushed, ops_flushed = recorder.flushed, recorder.ops_flushed
    replayed = [False]

    def flushed_noting_replay(*args: Any, **kwargs: Any) -> None:
        replayed[0] = (args[10] if len(args) > 10 else kwargs.get("replay")) == "held"
        flushed(*args, **kwargs)

    def ops_flushed_unless_replayed(*args: Any) -> None:
        if not replayed[0]:
            ops_flushed(*args)

    recorder.flushed = flushed_noting_replay  # type: ignore[method-assign]
    recorder.ops_flushed = ops_flushed_unless_replayed  # type: ignore[method-assign]


def _without_buffers(recorder: Recorder) -> None:
    memory.tracker = None


def _without_module_paths(recorder: Recorder) -> None:
    hooks.unwrap_module_calls()


def _without_host_origins(recorder: Recorder) -> None:
    host_origins.uninstall()


def _committed_at_the_end(recorder: Recorder) -> None:
    """Every row kept in memory until the window's last commit (after its steps) instead of committed every
    0.25 s by the writer's thread while the steps run: whether an insert costs more beside the steps."""
    assert recorder.writer is not None
    recorder.writer.commit_interval_s = 1e9


def _without_execution_watcher(recorder: Recorder) -> None:
    recorder.execution_started = _nothing  # type: ignore[method-assign]


# configuration -> what it leaves out of a traced window (None: untraced)
CONFIGURATIONS: dict[str, Callable[[Recorder], None] | None] = {
    "untraced": None,
    "traced": _nothing,
    "without op and view records": _without_records,
    "without their line lookups": _without_lines,
    "without the writer's inserts": _without_inserts,
    "without replayed flushes' op rows": _without_replayed_rows,
    "without buffer lifetimes": _without_buffers,
    "without module paths": _without_module_paths,
    "without host origins": _without_host_origins,
    "without the execution watcher": _without_execution_watcher,
    "rows committed at the window's end": _committed_at_the_end,
}
DEFER_ONLY = ("without replayed flushes' op rows",)  # strict mode has no flushes


def run_window(step: workloads.Step, mode: str, configuration: str, steps: int, folder: Path) -> tuple[float, float, float]:
    """(process CPU ms, main-thread CPU ms, records) per step of one window."""
    leave_out = CONFIGURATIONS[configuration]
    recorder = lifecycle.start(None if leave_out is None else str(folder / "parts.tptrace"), script="bench", argv=[], mode=mode)
    try:
        if leave_out is not None:
            leave_out(recorder)
        step(0).item()
        ops = recorder.ops
        process, main = time.process_time(), time.thread_time()
        for index in range(steps):
            loss = step(index + 1)
        loss.item()
        if recorder.writer is not None:
            recorder.writer.flush()
        return ((time.process_time() - process) / steps * 1e3, (time.thread_time() - main) / steps * 1e3,
                (recorder.ops - ops) / steps)
    finally:
        lifecycle.stop(0)


def measure(model: str, mode: str, rounds: int, steps: int) -> str:
    """The table of one model and mode: every configuration per round, the order reversed every other round."""
    step = workloads.build(model, "tpu", None)
    names = [name for name in CONFIGURATIONS if mode == "defer" or name not in DEFER_ONLY]
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        for name in names:
            run_window(step, mode, name, 2, folder)  # compiles, and each part's first use
        for round_index in range(rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                samples[name].append(run_window(step, mode, name, steps, folder))
    untraced, traced = samples["untraced"], samples["traced"]
    added = statistics.median(full[0] - base[0] for full, base in zip(traced, untraced))
    rows = [
        f"{workloads.describe(model)}, {mode}: {statistics.median(sample[2] for sample in traced):.0f} records a step, "
        f"{rounds} rounds of {steps} steps.\n",
        "| configuration | process CPU ms/step | over untraced | main-thread CPU ms/step | over untraced | share of what recording adds |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        runs = samples[name]
        over = [statistics.median((run[part] / base[part] - 1) * 100 for run, base in zip(runs, untraced)) for part in (0, 1)]
        saved = statistics.median(full[0] - run[0] for full, run in zip(traced, runs))
        share = "" if name in ("untraced", "traced") or added <= 0 else f"{saved / added * 100:.0f}%"
        rows.append(f"| {name} | {statistics.median(run[0] for run in runs):.2f} | {over[0]:+.1f}% | "
                    f"{statistics.median(run[1] for run in runs):.2f} | {over[1]:+.1f}% | {share} |")
    return "\n".join(rows)


MODULE_CALLS = 100_000


def module_call_table(rounds: int) -> str:
    """Main-thread CPU per call of a module doing nothing (`nn.Identity` on a host tensor): untraced, traced (the
    wrapped `nn.Module.__call__` that keeps module paths), and with a pair of global forward hooks doing the same
    bookkeeping (torch's hooked call path), in interleaved windows."""
    module, tensor = torch.nn.Identity(), torch.ones(1)

    def per_call() -> float:
        start = time.thread_time_ns()
        for _ in range(MODULE_CALLS):
            module(tensor)
        return (time.thread_time_ns() - start) / MODULE_CALLS / 1e3

    def with_global_hooks(recorder: Recorder) -> float:
        hooks.unwrap_module_calls()
        stack = recorder.module_stack()
        entered = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: stack.append(0))
        left = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, output: stack.pop(), always_call=True)
        try:
            return per_call()
        finally:
            entered.remove()
            left.remove()

    samples: dict[str, list[float]] = {"untraced": [], "traced (wrapped call)": [], "global forward hooks instead": []}
    with tempfile.TemporaryDirectory() as directory:
        for round_index in range(rounds):
            names = list(samples) if round_index % 2 == 0 else list(samples)[::-1]
            for name in names:
                recorder = lifecycle.start(None if name == "untraced" else str(Path(directory) / "calls.tptrace"), script="bench", argv=[], mode="defer")
                try:
                    samples[name].append(with_global_hooks(recorder) if name == "global forward hooks instead" else per_call())
                finally:
                    lifecycle.stop(0)
    base = statistics.median(samples["untraced"])
    rows = ["| configuration | µs per module call (main-thread CPU) | added |", "|---|---|---|"]
    for name, values in samples.items():
        median = statistics.median(values)
        rows.append(f"| {name} | {median:.2f} | {median - base:+.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small_lm", choices=workloads.MODELS)
    parser.add_argument("--modes", nargs="+", default=["defer", "strict"], choices=["defer", "strict"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--no-write", action="store_true", help="print the tables without writing bench/RESULTS.md")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    tables = [measure(args.model, mode, args.rounds, args.steps) for mode in args.modes]
    tables.append(f"One module call ({MODULE_CALLS} calls a window, {args.rounds} rounds):\n\n" + module_call_table(args.rounds))
    text = "\n\n".join(tables)
    print(text)
    if args.no_write:
        return
    write_section(
        "Recording's parts: what each costs a step (bench/recording_parts.py)",
        "The step traced whole, traced with one part of the recording left out, and untraced, interleaved; a part's share "
        "is the process CPU a step saves without it over what recording adds (parts overlap: the records' share includes "
        "their line lookups and their rows' inserts).\n\n" + text,
    )


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
