"""Host-origin watching's cost: the time per call of the host functions it wraps (`backend/core/host_origins.py`),
wrapped vs not, in rounds interleaved with their order alternating, measured in CPU time (`time.process_time`).
A CPU result pays the wrapper and the walk to the user's frame; a `tpu` result (torch.cat of chip tensors) only
the wrapper. Writes bench/RESULTS.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tputrace.backend  # noqa: E402, F401 - registers the tpu device
from results import write_section  # noqa: E402
from tputrace.backend.core import host_origins  # noqa: E402


def _cases() -> dict[str, Callable[[], object]]:
    rows = [list(range(48)) for _ in range(8)]
    items = [torch.ones(48, dtype=torch.long) for _ in range(8)]
    batch = torch.ones(8, 40, dtype=torch.long)
    on_chip = [torch.ones(4, 8, device="tpu") for _ in range(2)]
    return {
        "torch.tensor(8 lists of 48 ints)": lambda: torch.tensor(rows),
        "torch.stack(8 tensors)": lambda: torch.stack(items),
        "torch.zeros(8, 48)": lambda: torch.zeros(8, 48),
        "F.pad(i64[8,40], (0, 8))": lambda: F.pad(batch, (0, 8)),
        "torch.cat(2 tpu tensors)": lambda: torch.cat(on_chip),
    }


def _per_call_us(call: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    lines = []
    for name, call in _cases().items():
        samples: dict[bool, list[float]] = {True: [], False: []}
        _per_call_us(call, args.calls // 10)  # warm-up
        for round_index in range(args.rounds):
            for watched in ((True, False) if round_index % 2 else (False, True)):
                if watched:
                    host_origins.install()
                try:
                    samples[watched].append(_per_call_us(call, args.calls))
                finally:
                    host_origins.uninstall()
        with_origins, without = statistics.median(samples[True]), statistics.median(samples[False])
        lines.append(f"| {name} | {with_origins:.2f} | {without:.2f} | {with_origins - without:+.2f} µs "
                     f"({(with_origins / without - 1) * 100:+.0f}%) |")
    table = ("| call | watched, µs/call | not watched, µs/call | cost |\n|---|---|---|---|\n" + "\n".join(lines))
    print(table)
    write_section(
        "Host origins' cost (bench/host_origins.py)",
        f"{args.rounds} interleaved rounds of {args.calls} calls per function, watched (wrapped, as while a run records) "
        f"and not, order alternating; the median CPU time per call (`time.process_time`). No other torch call is "
        f"wrapped, so they pay nothing. `TPUTRACE_HOST_ORIGINS=0` turns the watching off.\n\n{table}",
    )


if __name__ == "__main__":
    main()
