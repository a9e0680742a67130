"""What the planted problems share: the command line (`--device`, `--steps`, `--fixed`), the training
loop around each model, and token batches of varying length. Each script keeps its model, its data
and its planted problem in plain sight; the problem is never in here."""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
from torch import nn

Batch = TypeVar("Batch")


def parse_args(description: str, steps: int, fixed_help: str, scalable: bool = False) -> argparse.Namespace:
    """The script's arguments. On a tpu device the backend is imported first (it registers the device
    and the "tpu" torch.compile backend); the seed is fixed so before and after runs see the same data.
    A `scalable` script also takes `--scale K`, which multiplies its model and batch sizes by K (the
    defaults suit virtual CPU chips; a real accelerator needs larger products to be compute-bound)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--fixed", action="store_true", help=fixed_help)
    if scalable:
        parser.add_argument("--scale", type=int, default=1, help="multiply the model and batch sizes by this")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" compile backend
    torch.manual_seed(0)
    return args


def train(
    loss_of: Callable[[Batch], torch.Tensor], optimizer: torch.optim.Optimizer, batches: Iterable[Batch]
) -> list[torch.Tensor]:
    """One optimizer step per batch; the losses stay on the device (reading them would sync every step)."""
    losses = []
    for batch in batches:
        loss = loss_of(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def print_final(losses: list[torch.Tensor]) -> None:
    """One line after the loop: the number of steps and the last loss (the run's only read of a loss)."""
    print(f"{len(losses)} steps, final loss {losses[-1].item():.4f}")


def token_batches(steps: int, batch: int, vocab: int, bucket: int | None, seed: int = 0) -> list[torch.Tensor]:
    """Batches of random tokens 1..vocab-1, each batch its own length in 16..128; with `bucket`,
    right-padded with token 0 up to a multiple of it."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        length = rng.randint(16, 128)
        tokens = torch.randint(1, vocab, (batch, length), generator=generator)
        if bucket is not None:
            tokens = nn.functional.pad(tokens, (0, -(-length // bucket) * bucket - length), value=0)
        out.append(tokens)
    return out


def start_ranks() -> tuple[int, int]:
    """Join the "tpu" process group (`tputrace run --nproc N` sets the rank variables; run alone, the
    script is rank 0 of 1) and return (rank, world size)."""
    import os

    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("tpu")
    return dist.get_rank(), dist.get_world_size()
