"""Per-op cost of strict eager on `tpu` (µs per op) next to torch on the CPU and a bare cached
`jax.jit` call, measured interleaved in one process. Writes its table to bench/RESULTS.md."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.device_module import EagerMode, set_eager_mode

from results import write_section  # type: ignore[import-not-found]

REPEATS = 7
CALLS = 2000
DEFERRED_CALLS = 500  # ops recorded into one pending graph before it is flushed (outside the timing)


def per_call_us(fn: Callable[[], object], calls: int = CALLS) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def deferred_record_us(fn: Callable[[], object]) -> float:
    """Cost of recording one op into a pending graph (cache hit), flushes excluded."""
    set_eager_mode(EagerMode.DEFER_AND_FUSE)
    samples = []
    try:
        for _ in range(REPEATS + 1):
            start = time.perf_counter()
            kept = [fn() for _ in range(DEFERRED_CALLS)]
            samples.append((time.perf_counter() - start) / DEFERRED_CALLS * 1e6)
            kept[-1].cpu()
            del kept
    finally:
        set_eager_mode(EagerMode.DEFER_NEVER)
    return statistics.median(samples[1:])


def main() -> None:
    set_eager_mode(EagerMode.DEFER_NEVER)
    cpu_a, cpu_b = torch.randn(8, 8), torch.randn(8, 8)
    tpu_a, tpu_b = cpu_a.to("tpu"), cpu_b.to("tpu")
    jax_a, jax_b = jnp.asarray(cpu_a.numpy()), jnp.asarray(cpu_b.numpy())
    jit_add = jax.jit(lambda a, b: a + b)
    jit_matmul = jax.jit(lambda a, b: a @ b)
    cases = {
        ("add", "torch cpu"): lambda: cpu_a + cpu_b,
        ("add", "tpu strict"): lambda: tpu_a + tpu_b,
        ("add", "bare jax.jit"): lambda: jit_add(jax_a, jax_b),
        ("matmul", "torch cpu"): lambda: cpu_a @ cpu_b,
        ("matmul", "tpu strict"): lambda: tpu_a @ tpu_b,
        ("matmul", "bare jax.jit"): lambda: jit_matmul(jax_a, jax_b),
    }
    for fn in cases.values():
        per_call_us(fn, 200)
    samples: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    for _ in range(REPEATS):
        for case, fn in cases.items():
            samples[case].append(per_call_us(fn))
    recording = {op: deferred_record_us(fn) for op, fn in (("add", lambda: tpu_a + tpu_b), ("matmul", lambda: tpu_a @ tpu_b))}
    rows = [
        "| op (8x8 float32) | torch cpu µs/op | tpu strict µs/op | bare jax.jit µs/op | tpu strict / jax.jit | DeferAndFuse record µs/op |",
        "|---|---|---|---|---|---|",
    ]
    for op in ("add", "matmul"):
        cpu, tpu, bare = (statistics.median(samples[(op, kind)]) for kind in ("torch cpu", "tpu strict", "bare jax.jit"))
        rows.append(f"| {op} | {cpu:.1f} | {tpu:.1f} | {bare:.1f} | {tpu / bare:.2f}x | {recording[op]:.1f} |")
    table = "\n".join(rows)
    print(table)
    write_section("Strict eager per-op overhead (bench/eager_overhead.py)", f"Median of {REPEATS} interleaved rounds of {CALLS} calls; target ≤ 20 µs per op in strict eager and ≤ 10 µs to record an op into a pending DeferAndFuse graph.\n\n{table}")


if __name__ == "__main__":
    main()
