"""A closed recording window's cost per op: the host CPU time of small elementwise ops recorded fully, run
outside the window (`tputrace run --from-code` before `tputrace.start()`), and run with `--no-trace`, in
interleaved rounds in one process, in DeferAndFuse and strict mode. Writes bench/RESULTS.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from results import write_section
from tputrace.recording import lifecycle
from tputrace.recording.recording_window import FROM_CODE, WindowSpec

SETUPS = ("full recording", "closed window", "--no-trace")


OPS_PER_SYNC = 50


def cpu_ns_per_op(ops: int) -> float:
    """CPU time per op of `ops` small ops on the tpu device, synchronised every `OPS_PER_SYNC` ops (in
    DeferAndFuse, a flush of one cached program each time, as a training step's end)."""
    x = torch.ones(8, device="tpu")
    start = time.process_time_ns()
    for index in range(ops // 2):
        x = x * 1.0001
        x = x + 0.5
        if (index + 1) % (OPS_PER_SYNC // 2) == 0:
            torch.tpu.synchronize()
    torch.tpu.synchronize()
    return (time.process_time_ns() - start) / ops


def measure(mode: str, ops: int, rounds: int, folder: Path) -> dict[str, float]:
    """The median CPU ns per op of each setup, over `rounds` interleaved rounds after a warm-up round."""
    samples: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    for round_index in range(rounds + 1):
        for setup in SETUPS:
            path = None if setup == "--no-trace" else str(folder / f"{mode}-{setup.replace(' ', '_')}-{round_index}.tptrace")
            window = WindowSpec(FROM_CODE) if setup == "closed window" else None
            lifecycle.start(path, script="bench", argv=[], mode=mode, window=window)
            try:
                per_op = cpu_ns_per_op(ops)
            finally:
                lifecycle.stop(0)
            if round_index > 0:
                samples[setup].append(per_op)
    return {setup: statistics.median(values) for setup, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=4000, help="ops per round (default: 4000)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default: 5)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("defer", "strict"):
            medians = measure(mode, args.ops, args.rounds, Path(folder))
            untraced = medians["--no-trace"]
            rows.append(
                f"| {mode} | {medians['full recording'] / 1e3:.1f} | {medians['closed window'] / 1e3:.1f} | {untraced / 1e3:.1f} | "
                f"{medians['full recording'] / untraced:.2f}x | {medians['closed window'] / untraced:.2f}x |"
            )
    table = (
        "| mode | full recording (µs CPU/op) | closed window (µs CPU/op) | --no-trace (µs CPU/op) | full / no-trace | closed / no-trace |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
    print(table)
    write_section(
        "Recording window cost (bench/window_cost.py)",
        f"Host CPU time (`time.process_time`) per small elementwise op (f32[8]), median of {args.rounds} interleaved rounds of "
        f"{args.ops} ops (a sync every {OPS_PER_SYNC}) after a warm-up round; the closed window is a `--from-code` recording before `tputrace.start()`.\n\n{table}",
    )


if __name__ == "__main__":
    sys.exit(main())
