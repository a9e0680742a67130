"""Buffer-lifetime recording's cost: the GPT example's steady-state step time with the `buffers` table recorded
vs without it (the tracker detached), in one recording per eager mode, rounds interleaved with their order
alternating, strict and DeferAndFuse. Writes bench/RESULTS.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from results import write_section  # noqa: E402
from tputrace.backend.core import memory  # noqa: E402
from tputrace.recording import lifecycle  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import gpt_train

    config = gpt_train.GPTConfig()
    rows = []
    for mode in ("defer", "strict"):
        lifecycle.start(None, script="bench", argv=[], mode=mode)
        lifecycle.stop(0)
        torch.manual_seed(0)
        model = gpt_train.GPT(config).to("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        batches = [(tokens.to("tpu"), targets.to("tpu")) for tokens, targets in gpt_train.synthetic_batches(config, 4, 4)]

        def run_steps(count: int) -> float:
            start = time.perf_counter()
            for index in range(count):
                loss = gpt_train.train_step(model, model, optimizer, *batches[index % len(batches)])
            loss.item()
            torch.tpu.synchronize()
            return (time.perf_counter() - start) / count * 1e3

        samples: dict[str, list[float]] = {"buffers": [], "no buffers": []}
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"{mode}.tptrace"
            lifecycle.start(str(path), script="bench", argv=[], mode=mode)
            tracker = memory.tracker
            try:
                run_steps(args.steps)  # warm-up: compiles
                for round_index in range(args.rounds):
                    order = ("buffers", "no buffers") if round_index % 2 else ("no buffers", "buffers")
                    for label in order:
                        memory.tracker = tracker if label == "buffers" else None
                        samples[label].append(run_steps(args.steps))
            finally:
                memory.tracker = tracker
                lifecycle.stop(0)
            import sqlite3

            rows_recorded = sqlite3.connect(path).execute("SELECT COUNT(*) FROM buffers").fetchone()[0]
        steps_with_buffers = args.steps * (args.rounds + 1)
        with_buffers, without = statistics.median(samples["buffers"]), statistics.median(samples["no buffers"])
        rows.append((mode, with_buffers, without, (with_buffers / without - 1) * 100, rows_recorded / steps_with_buffers))
    table = "| GPT step | buffers recorded, ms/step | without, ms/step | cost | buffers rows/step |\n|---|---|---|---|---|\n" + "\n".join(
        f"| {'DeferAndFuse' if mode == 'defer' else 'strict'} | {traced:.1f} | {untraced:.1f} | {cost:+.1f}% (target ≤ 5%) | {per_step:.0f} |"
        for mode, traced, untraced, cost, per_step in rows
    )
    print(table)
    write_section(
        "Buffer lifetimes' cost (bench/memory_cost.py)",
        f"{args.rounds} interleaved rounds of {args.steps} steady-state steps each in one recording per mode, after a "
        f"warm-up round; the median step with the buffer tracker attached vs detached.\n\n{table}",
    )


if __name__ == "__main__":
    main()
