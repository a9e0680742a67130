"""Per-op cost on `tpu` (µs per op) for a small add, a small matmul and a product with a Python number
(`x * 2`, whose number is a program input): strict eager (DEFER_NEVER) and
recording into a pending DeferAndFuse graph, next to what the same call costs elsewhere, measured
interleaved in one process: torch on the CPU, a bare cached `jax.jit` call, and torch's own part of a
Python device (an empty `__torch_dispatch__` subclass on `tpu` that returns a fresh wrapper tensor).
The table therefore says how much of an op is torch's, how much XLA's and how much the backend's.

Every case runs in rounds of many calls, the rounds of all cases interleaved. Each figure is the
median over rounds of the wall time, of this process's CPU time (all its threads) and of the main
thread's CPU time (XLA:CPU runs some programs, e.g. a dot, on its own worker threads). On a shared
machine wall time also counts the time other processes held the CPU, which CPU time does not, so
the wall spread (min-max) and the load average are reported with it. The garbage collector stays on,
as in a user's loop; the collections the timed rounds triggered are counted. Before each round the C
heap merges the small chunks earlier rounds freed (`settle_c_heap`), so that each round pays for its own.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import torch

import tputrace.backend  # noqa: F401 - registers the tpu device
from tputrace.backend.compat.device_module import EagerMode, set_eager_mode

from results import write_section  # type: ignore[import-not-found]

REPEATS = 15
CALLS = 2000
DEFERRED_CALLS = 500  # ops recorded into one pending graph per round; the flush is outside the timing
SHAPE = (8, 8)
OPS = ("add", "matmul", "x * 2")
CASES = ("torch cpu", "torch dispatch only", "bare jax.jit", "tpu strict", "tpu DeferAndFuse record")


class EmptyDevice(torch.Tensor):
    """torch's share of a Python device's op: dispatch to `__torch_dispatch__` and a new wrapper
    tensor on `tpu` for the result, with no work in between."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        return torch.Tensor._make_wrapper_subclass(cls, SHAPE, dtype=torch.float32, device=_TPU)


_TPU = torch.device("tpu", 0)


@dataclass
class Samples:
    """Per-round µs per op of one case, wall and CPU, and the garbage collections during its rounds."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    thread: list[float] = field(default_factory=list)
    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    ops: int = 0


def _gc_counts() -> list[int]:
    return [generation["collections"] for generation in gc.get_stats()]


def settle_c_heap() -> None:
    """Merge the C heap's freed small chunks now, not inside the next round: glibc keeps them unmerged
    ("fastbins") until a large request merges them all at once, and the rounds before (XLA's frees in
    strict ops) leave thousands. Without this one call of a 500-op round paid 1-4 ms for them, every
    other round (bench/RESULTS.md, eighteenth session). A 64 KiB buffer is such a request."""
    bytearray(1 << 16)


def timed_round(fn: Callable[[], object], calls: int, samples: Samples, keep: bool = False) -> list[object]:
    """One round of `calls` calls, on a settled C heap; with `keep`, the results are kept (a pending
    graph's outputs)."""
    settle_c_heap()
    collections = _gc_counts()
    kept: list[object] = []
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    if keep:
        kept = [fn() for _ in range(calls)]
    else:
        for _ in range(calls):
            fn()
    thread, cpu, wall = time.thread_time() - thread, time.process_time() - cpu, time.perf_counter() - wall
    samples.wall.append(wall / calls * 1e6)
    samples.cpu.append(cpu / calls * 1e6)
    samples.thread.append(thread / calls * 1e6)
    samples.collections = [total + after - before for total, before, after in zip(samples.collections, collections, _gc_counts())]
    samples.ops += calls
    return kept


def deferred_round(fn: Callable[[], object], samples: Samples) -> None:
    set_eager_mode(EagerMode.DEFER_AND_FUSE)
    try:
        kept = timed_round(fn, DEFERRED_CALLS, samples, keep=True)
        kept[-1].cpu()  # type: ignore[attr-defined]
        del kept
    finally:
        set_eager_mode(EagerMode.DEFER_NEVER)


def measure(repeats: int) -> dict[tuple[str, str], Samples]:
    set_eager_mode(EagerMode.DEFER_NEVER)
    cpu_a, cpu_b = torch.randn(SHAPE), torch.randn(SHAPE)
    tpu_a, tpu_b = cpu_a.to("tpu"), cpu_b.to("tpu")
    jax_a, jax_b = jnp.asarray(cpu_a.numpy()), jnp.asarray(cpu_b.numpy())
    empty_a, empty_b = (torch.Tensor._make_wrapper_subclass(EmptyDevice, SHAPE, dtype=torch.float32, device=_TPU) for _ in range(2))
    jit_add = jax.jit(lambda a, b: a + b)
    jit_matmul = jax.jit(lambda a, b: a @ b)
    jit_scale = jax.jit(lambda a, number: a * number)
    calls: dict[tuple[str, str], Callable[[], object]] = {
        ("add", "torch cpu"): lambda: cpu_a + cpu_b,
        ("add", "torch dispatch only"): lambda: empty_a + empty_b,
        ("add", "bare jax.jit"): lambda: jit_add(jax_a, jax_b),
        ("add", "tpu strict"): lambda: tpu_a + tpu_b,
        ("add", "tpu DeferAndFuse record"): lambda: tpu_a + tpu_b,
        ("matmul", "torch cpu"): lambda: cpu_a @ cpu_b,
        ("matmul", "torch dispatch only"): lambda: empty_a @ empty_b,
        ("matmul", "bare jax.jit"): lambda: jit_matmul(jax_a, jax_b),
        ("matmul", "tpu strict"): lambda: tpu_a @ tpu_b,
        ("matmul", "tpu DeferAndFuse record"): lambda: tpu_a @ tpu_b,
        ("x * 2", "torch cpu"): lambda: cpu_a * 2,
        ("x * 2", "torch dispatch only"): lambda: empty_a * 2,
        ("x * 2", "bare jax.jit"): lambda: jit_scale(jax_a, 2),
        ("x * 2", "tpu strict"): lambda: tpu_a * 2,
        ("x * 2", "tpu DeferAndFuse record"): lambda: tpu_a * 2,
    }
    warmup = Samples()
    for (_, case), fn in calls.items():
        for _ in range(2):
            if case == "tpu DeferAndFuse record":
                deferred_round(fn, warmup)
            else:
                timed_round(fn, 200, warmup)
    samples = {key: Samples() for key in calls}
    for _ in range(repeats):
        for (op, case), fn in calls.items():
            if case == "tpu DeferAndFuse record":
                deferred_round(fn, samples[(op, case)])
            else:
                timed_round(fn, CALLS, samples[(op, case)])
    return samples


def _median(values: list[float]) -> float:
    return statistics.median(values)


def render(samples: dict[tuple[str, str], Samples], repeats: int, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> str:
    rows = [
        "| op (8x8 float32) | case | wall µs/op (min-max) | process CPU µs/op | main thread CPU µs/op (min) |",
        "|---|---|---|---|---|",
    ]
    for op in OPS:
        for case in CASES:
            found = samples[(op, case)]
            rows.append(
                f"| {op} | {case} | {_median(found.wall):.1f} ({min(found.wall):.1f}-{max(found.wall):.1f}) | "
                f"{_median(found.cpu):.1f} | {_median(found.thread):.1f} ({min(found.thread):.1f}) |"
            )

    def ours(op: str, case: str, *minus: str) -> str:
        value = min(samples[(op, case)].thread) - sum(min(samples[(op, other)].thread) for other in minus)
        return f"{value:.1f}"

    def collections(op: str) -> str:
        found = samples[(op, "tpu DeferAndFuse record")]
        return "/".join(f"{count * 1000 / found.ops:.1f}" for count in found.collections)

    notes = [
        "The backend's own share (main-thread CPU minima; XLA:CPU's worker threads excluded): strict = tpu strict - torch dispatch only - bare jax.jit: "
        + ", ".join(f"{op} {ours(op, 'tpu strict', 'torch dispatch only', 'bare jax.jit')} µs" for op in OPS)
        + "; DeferAndFuse record - torch dispatch only: "
        + ", ".join(f"{op} {ours(op, 'tpu DeferAndFuse record', 'torch dispatch only')} µs" for op in OPS) + ".",
        f"Garbage collections (generation 0/1/2) per 1,000 recorded DeferAndFuse ops: {', '.join(f'{op} {collections(op)}' for op in OPS)}; "
        f"strict rounds: {', '.join(f'{op} ' + '/'.join(map(str, samples[(op, 'tpu strict')].collections)) for op in OPS)} in {samples[('add', 'tpu strict')].ops:,} ops each.",
        f"Load average ({os.cpu_count()} CPUs) before {', '.join(f'{value:.2f}' for value in load_before)}; after {', '.join(f'{value:.2f}' for value in load_after)}.",
    ]
    head = (
        f"Median of {repeats} interleaved rounds ({CALLS} calls per round; DeferAndFuse: {DEFERRED_CALLS} ops recorded per round, "
        f"the flush outside the timing). Wall time with its min-max over rounds, the process's CPU time, and the main thread's CPU time with its minimum (the least disturbed round). "
        f"Targets: tpu strict ≤ 20 µs per op; recording an op into a pending DeferAndFuse graph ≤ 10 µs."
    )
    return head + "\n\n" + "\n".join(rows) + "\n\n" + "\n".join(f"- {note}" for note in notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    parser.add_argument("--json", help="also write the per-round samples to this file")
    options = parser.parse_args()
    load_before = os.getloadavg()
    samples = measure(options.repeats)
    text = render(samples, options.repeats, load_before, os.getloadavg())
    print(text)
    if options.json:
        with open(options.json, "w") as out:
            json.dump({f"{op}/{case}": {"wall": found.wall, "cpu": found.cpu, "thread": found.thread, "collections": found.collections} for (op, case), found in samples.items()}, out)
    if not options.no_write:
        write_section("Strict eager per-op overhead (bench/eager_overhead.py)", text)


if __name__ == "__main__":
    main()
