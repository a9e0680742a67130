"""XLA compiles and their time for data-dependent ops over many distinct counts, each result read.

    python bench/data_dependent_compiles.py [--counts N] [--mode DEFER_NEVER|DEFER_AND_FUSE] [--op index|nonzero|unique]

One process: `rows[values < count]` (or `nonzero(values < count)`, or `unique(values % count)`) for N
distinct counts, each result copied to the host and checked against the CPU's. Prints the XLA
compiles JAX reports (`/jax/core/compile/backend_compile_duration`) during the loop, their total time,
and the loop's wall time.
"""

from __future__ import annotations

import argparse
import time

import jax
import torch

import tputrace.backend  # noqa: F401 - registers the tpu device

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, default=200)
    parser.add_argument("--mode", default="DEFER_NEVER", choices=("DEFER_NEVER", "DEFER_AND_FUSE"))
    parser.add_argument("--op", default="index", choices=("index", "nonzero", "unique"))
    options = parser.parse_args()
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, options.mode))
    compile_seconds: list[float] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: compile_seconds.append(duration) if event == _COMPILE_EVENT else None
    )
    values = torch.randperm(4096, generator=torch.Generator().manual_seed(0))
    rows = torch.randn(4096, 8, generator=torch.Generator().manual_seed(1))
    chip_values, chip_rows = values.to("tpu"), rows.to("tpu")

    def result(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
        if options.op == "index":
            return rows[values < count]
        if options.op == "nonzero":
            return torch.nonzero(values < count)
        return torch.unique(values % count)

    counts = [3 + 13 * index for index in range(options.counts)]
    result(chip_values, chip_rows, 1).cpu()  # warm-up: the programs every count shares
    before = len(compile_seconds)
    start = time.perf_counter()
    for count in counts:
        assert torch.equal(result(chip_values, chip_rows, count).cpu(), result(values, rows, count))
    wall = time.perf_counter() - start
    loop_compiles = compile_seconds[before:]
    print(f"{options.op} {options.mode}: {len(loop_compiles)} XLA compiles ({sum(loop_compiles):.2f} s compiling) "
          f"for {len(counts)} counts, {wall:.1f} s wall")


if __name__ == "__main__":
    main()
