"""Per-call cost of the index checks inside a `torch.compile(backend="tpu")` program, in a loop of
calls with no sync in between: each call returns its check flag, which waits for the next sync, and
one tiny program folds every `index_checks._COMBINED` flags. Measured against folding each call's
flag at once (`_COMBINED = 1`, what the backend did before), interleaved in one process, in both
eager modes; the checks off (`TPUTRACE_INDEX_CHECKS=0`) runs in a child process of its own, since
a program's checks are decided when it compiles.

    python bench/compiled_index_flags.py [--calls 200] [--rounds 7] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode
from tputrace.backend.indexing import index_checks

from results import write_section  # type: ignore[import-not-found]

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
BATCHES = (1, index_checks._COMBINED)


def _loop_us(call: object, ids: torch.Tensor, calls: int) -> float:
    """µs per call of `calls` compiled calls and one sync at the end."""
    start = time.perf_counter()
    for _ in range(calls):
        result = call(ids)
    result.sum().item()
    return (time.perf_counter() - start) / calls * 1e6


def measure(calls: int, rounds: int, batches: tuple[int, ...]) -> dict[str, dict[int, float]]:
    """Median µs per call, per mode and flags folded per program, the cases interleaved round by round."""
    table = torch.nn.Embedding(100, 16).to("tpu")
    compiled = torch.compile(lambda ids: table(ids).sum(0), backend="tpu", dynamic=False)
    ids = torch.randint(0, 100, (32,)).to("tpu")
    samples: dict[str, dict[int, list[float]]] = {mode.name: {batch: [] for batch in batches} for mode in MODES}
    default = index_checks._COMBINED
    with torch.no_grad():
        for mode in MODES:  # warm up: each case's programs compiled before timing
            set_eager_mode(mode)
            for batch in batches:
                index_checks._COMBINED = batch
                _loop_us(compiled, ids, calls)
        for _ in range(rounds):
            for mode in MODES:
                set_eager_mode(mode)
                for batch in batches:
                    index_checks._COMBINED = batch
                    samples[mode.name][batch].append(_loop_us(compiled, ids, calls))
    index_checks._COMBINED = default
    set_eager_mode(EagerMode.DEFER_NEVER)
    return {mode: {batch: statistics.median(values) for batch, values in by_batch.items()} for mode, by_batch in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md as it is")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's output
    options = parser.parse_args()
    if options.json:
        print(json.dumps(measure(options.calls, options.rounds, (index_checks._COMBINED,))))
        return
    checked = measure(options.calls, options.rounds, BATCHES)
    child = subprocess.run(
        [sys.executable, __file__, "--json", "--calls", str(options.calls), "--rounds", str(options.rounds)],
        capture_output=True, text=True, check=True, env={**os.environ, index_checks.ENV_VARIABLE: "0"},
    )
    unchecked = json.loads(child.stdout.strip().splitlines()[-1])
    lines = [
        f"A compiled embedding lookup (32 ids into a 100x16 table, summed), {options.calls} calls then one sync, median of "
        f"{options.rounds} interleaved rounds, µs per call:",
        "",
        "| mode | checks off | a combine program per call | one per 16 calls (now) |",
        "|---|---|---|---|",
    ]
    for mode in MODES:
        off = next(iter(unchecked[mode.name].values()))
        per_call, batched = checked[mode.name][1], checked[mode.name][index_checks._COMBINED]
        lines.append(f"| {mode.name} | {off:.1f} | {per_call:.1f} | {batched:.1f} |")
    body = "\n".join(lines)
    print(body)
    if not options.no_write:
        write_section("Index checks in a loop of compiled calls", body)


if __name__ == "__main__":
    main()
