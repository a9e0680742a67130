"""XLA compiles and their time for data-dependent ops over many distinct counts, each result read.

    python bench/data_dependent_compiles.py [--counts N] [--mode DEFER_NEVER|DEFER_AND_FUSE] [--op OP]

One process: for N distinct counts, with `mask = values < count`, one of (`--op`)
  index           rows[mask]                  nonzero         nonzero(mask)
  unique          unique(values % count)      index_slice     rows[mask, 1:]
  index_idx       rows[mask, idx]             (idx of shape (2, 1): a (2, count) result)
  index_put_idx   rows[mask, idx] = 0         (idx of shape (1,))
  index_put_cols  rows.t()[:, mask] = 0.5     (on a copy of the transposed rows)
  index_sum       (rows[mask] * 2).sum(0)     (ops on the chip that read the cut result)
  masked_loss     cross_entropy(rows[mask], values[mask] % 8) and its gradient with respect to rows
  masked_smoothed the same with label_smoothing=0.1
  masked_linear   cross_entropy(linear(rows[mask], weight), values[mask] % 8) and the gradients of rows and weight
  masked_reshaped the same with rows[mask] viewed as (count, 2, 4), a (4, 8) weight and the logits reshaped to (2 * count, 8)
  masked_inplace  masked_loss of rows[mask] scaled and clamped in place (mul_, clamp_)
each result copied to the host and checked against the CPU's (sums of up to 2,600 rows within 1e-4). Prints the XLA
compiles JAX reports (`/jax/core/compile/backend_compile_duration`) during the loop, their total time,
and the loop's wall time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jax
import torch
import torch.nn.functional as F

import tputrace.backend  # noqa: F401 - registers the tpu device

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _put_idx(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    written = rows.clone()
    written[values < count, torch.tensor([3], device=rows.device)] = 0.0
    return written


def _put_cols(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    written = rows.t().clone()
    written[:, values < count] = 0.5
    return written


def _masked_loss(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """A masked loss and its backward (the gradient scattered through the mask): the loss, then the gradient."""
    leaf = rows.detach().requires_grad_()
    mask = values < count
    loss = F.cross_entropy(leaf[mask], values[mask] % 8)
    loss.backward()
    return torch.cat([loss.detach().reshape(1), leaf.grad.reshape(-1)])


def _masked_smoothed(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """`_masked_loss` with label smoothing (its smoothing term fills the ignored rows in place)."""
    leaf = rows.detach().requires_grad_()
    mask = values < count
    loss = F.cross_entropy(leaf[mask], values[mask] % 8, label_smoothing=0.1)
    loss.backward()
    return torch.cat([loss.detach().reshape(1), leaf.grad.reshape(-1)])


def _masked_linear(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """A linear layer on the selected rows, its loss, then the gradients of the rows and of the weight
    (a sum over the selected rows)."""
    leaf = rows.detach().requires_grad_()
    weight = torch.linspace(-1.0, 1.0, 64, device=rows.device).reshape(8, 8).requires_grad_()
    mask = values < count
    loss = F.cross_entropy(F.linear(leaf[mask], weight), values[mask] % 8)
    loss.backward()
    return torch.cat([loss.detach().reshape(1), leaf.grad.reshape(-1), weight.grad.reshape(-1)])


def _masked_reshaped(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """A linear layer on the selected rows viewed as (count, 2, 4), its logits reshaped to (2 * count, 8)
    (views that merge the cut dim with the one after it, or split it), then the gradients."""
    leaf = rows.detach().requires_grad_()
    weight = torch.linspace(-1.0, 1.0, 32, device=rows.device).reshape(8, 4).requires_grad_()
    mask = values < count
    labels = torch.stack([values % 8, values % 5], -1)[mask].reshape(-1)
    loss = F.cross_entropy(F.linear(leaf[mask].reshape(-1, 2, 4), weight).reshape(-1, 8), labels)
    loss.backward()
    return torch.cat([loss.detach().reshape(1), leaf.grad.reshape(-1), weight.grad.reshape(-1)])


def _masked_inplace(values: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """`_masked_loss` of the selected rows scaled and clamped in place."""
    leaf = rows.detach().requires_grad_()
    mask = values < count
    selected = leaf[mask]
    selected.mul_(2)
    selected.clamp_(-1.0, 1.0)
    loss = F.cross_entropy(selected, values[mask] % 8)
    loss.backward()
    return torch.cat([loss.detach().reshape(1), leaf.grad.reshape(-1)])


Result = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # (values, rows, count) -> what is read
_RESULTS: dict[str, Result] = {
    "index": lambda values, rows, count: rows[values < count],
    "nonzero": lambda values, rows, count: torch.nonzero(values < count),
    "unique": lambda values, rows, count: torch.unique(values % count),
    "index_slice": lambda values, rows, count: rows[values < count, 1:],
    "index_idx": lambda values, rows, count: rows[values < count, torch.tensor([[1], [5]], device=rows.device)],
    "index_put_idx": _put_idx,
    "index_put_cols": _put_cols,
    "index_sum": lambda values, rows, count: (rows[values < count] * 2).sum(0),
    "masked_loss": _masked_loss,
    "masked_smoothed": _masked_smoothed,
    "masked_linear": _masked_linear,
    "masked_reshaped": _masked_reshaped,
    "masked_inplace": _masked_inplace,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, default=200)
    parser.add_argument("--mode", default="DEFER_NEVER", choices=("DEFER_NEVER", "DEFER_AND_FUSE"))
    parser.add_argument("--op", default="index", choices=tuple(_RESULTS))
    options = parser.parse_args()
    result = _RESULTS[options.op]
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, options.mode))
    compile_seconds: list[float] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: compile_seconds.append(duration) if event == _COMPILE_EVENT else None
    )
    values = torch.randperm(4096, generator=torch.Generator().manual_seed(0))
    rows = torch.randn(4096, 8, generator=torch.Generator().manual_seed(1))
    chip_values, chip_rows = values.to("tpu"), rows.to("tpu")
    counts = [3 + 13 * index for index in range(options.counts)]
    result(chip_values, chip_rows, 1).cpu()  # warm-up: the programs every count shares
    before = len(compile_seconds)
    start = time.perf_counter()
    for count in counts:
        torch.testing.assert_close(result(chip_values, chip_rows, count).cpu(), result(values, rows, count), rtol=1e-5, atol=1e-4)
    wall = time.perf_counter() - start
    loop_compiles = compile_seconds[before:]
    print(f"{options.op} {options.mode}: {len(loop_compiles)} XLA compiles ({sum(loop_compiles):.2f} s compiling) "
          f"for {len(counts)} counts, {wall:.1f} s wall")


if __name__ == "__main__":
    main()
