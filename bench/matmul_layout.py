"""Weight-gradient products on XLA:CPU as XLA folds them, and as the backend lowers them.

    python bench/matmul_layout.py [--rounds 5] [--calls 200] [--no-write]

A weight gradient is `grad.t() @ x`: XLA folds the transpose into the dot's dimension numbers, and
XLA:CPU then runs it on its generic dot, as YNNPACK takes only a left operand whose contracted
dimension is its last in memory. The backend's lowering of `aten.mm` (`ops.linalg.mm`) copies the
left matrix row by row first. For each of examples/gpt_train.py's weight shapes (256 tokens), both jitted
functions run interleaved in the same process: median ms per call over the rounds, with the product's
GFLOP/s. The section "Matmul layout" of bench/RESULTS.md is rewritten.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tputrace.backend  # noqa: E402,F401 - configures JAX's devices as the backend does
from results import write_section  # noqa: E402
from tputrace.backend.core import chips  # noqa: E402
from tputrace.backend.ops.linalg import mm  # noqa: E402

SECTION = "Matmul layout"
TOKENS = 256
# (name, out features, in features) of the GPT example's Linear layers
WEIGHTS = (("qkv", 768, 256), ("attention proj", 256, 256), ("mlp fc", 1024, 256), ("mlp proj", 256, 1024), ("lm head", 512, 256))


def _folded(grad: jax.Array, inputs: jax.Array) -> jax.Array:
    return grad.T @ inputs


def _lowered(grad: jax.Array, inputs: jax.Array) -> jax.Array:
    return mm(grad.T, inputs)


def _ms_per_call(function: Callable, arguments: tuple, calls: int) -> float:
    function(*arguments).block_until_ready()
    start = time.perf_counter()
    for _ in range(calls):
        result = function(*arguments)
    result.block_until_ready()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave bench/RESULTS.md alone")
    args = parser.parse_args()
    if chips.platform() != "cpu":
        print(f"matmul_layout: the rule is XLA:CPU's; this host's chips are {chips.platform()}", file=sys.stderr)
        return 2
    folded, lowered = jax.jit(_folded), jax.jit(_lowered)
    rows = ["| weight (out x in) | as XLA folds it: ms (GFLOP/s) | row-major left matrix: ms (GFLOP/s) | speed-up |", "|---|---|---|---|"]
    keys = iter(jax.random.split(jax.random.key(0), 2 * len(WEIGHTS)))
    for name, out_features, in_features in WEIGHTS:
        arguments = (jax.random.normal(next(keys), (TOKENS, out_features)), jax.random.normal(next(keys), (TOKENS, in_features)))
        assert jnp.allclose(folded(*arguments), lowered(*arguments), atol=1e-3)
        times: dict[str, list[float]] = {"folded": [], "lowered": []}
        for _ in range(args.rounds):
            times["folded"].append(_ms_per_call(folded, arguments, args.calls))
            times["lowered"].append(_ms_per_call(lowered, arguments, args.calls))
        gflop = 2 * TOKENS * out_features * in_features / 1e9
        folded_ms, lowered_ms = statistics.median(times["folded"]), statistics.median(times["lowered"])
        rows.append(
            f"| {name} ({out_features} x {in_features}) | {folded_ms:.3f} ({gflop / folded_ms * 1e3:.0f}) | "
            f"{lowered_ms:.3f} ({gflop / lowered_ms * 1e3:.0f}) | {folded_ms / lowered_ms:.2f}x |"
        )
    body = (
        f"`bench/matmul_layout.py`: `grad.t() @ x` with {TOKENS} tokens, jitted, median of {args.rounds} interleaved rounds "
        f"of {args.calls} calls (wall ms per call, XLA's worker threads included).\n\n" + "\n".join(rows)
    )
    print(body)
    if not args.no_write:
        write_section(SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
