"""Tracing overhead: the GPT example's steady-state step time with tracing on vs `--no-trace`,
interleaved in one process (DeferAndFuse, the default of `tputrace run`). Writes bench/RESULTS.md."""

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
from tputrace.recording import lifecycle  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    lifecycle.start(None, script="bench", argv=[], mode="defer")
    lifecycle.stop(0)
    import gpt_train

    config = gpt_train.GPTConfig()
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

    with tempfile.TemporaryDirectory() as folder:
        samples: dict[str, list[float]] = {"traced": [], "untraced": []}
        for round_index in range(args.rounds + 1):
            for label in ("traced", "untraced"):
                path = str(Path(folder) / f"{label}-{round_index}.tptrace") if label == "traced" else None
                lifecycle.start(path, script="bench", argv=[], mode="defer")
                try:
                    step_ms = run_steps(args.steps)
                finally:
                    lifecycle.stop(0)
                if round_index > 0:
                    samples[label].append(step_ms)
    traced, untraced = statistics.median(samples["traced"]), statistics.median(samples["untraced"])
    overhead = (traced / untraced - 1) * 100
    table = (
        "| GPT step (DeferAndFuse) | ms/step (median) |\n|---|---|\n"
        f"| traced | {traced:.1f} |\n| --no-trace | {untraced:.1f} |\n| overhead | {overhead:+.1f}% (target ≤ 5%) |"
    )
    print(table)
    write_section(
        "Tracing overhead (bench/trace_overhead.py)",
        f"{args.rounds} interleaved rounds of {args.steps} steady-state steps each, after a warm-up round.\n\n{table}",
    )


if __name__ == "__main__":
    main()
