"""Planted problem: a straggler. One rank does extra host work (here: sleeps, standing in for slow
data loading or logging) before every step, so in each gradient all-reduce the other ranks wait
for it. The merged trace shows which rank arrives last, by how much, and how long the others wait.

    tputrace run --nproc 2 examples/problems/straggler.py              # the problem (last rank is slow)
    tputrace run --nproc 2 examples/problems/straggler.py --fixed      # every rank does the same work
    tputrace report <merged trace>                                      # names the straggler
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES, HIDDEN, CLASSES = 32, 128, 4


def load_batch(step: int, rank: int, slow_rank: int, delay_s: float, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch; `slow_rank` takes `delay_s` longer to produce it."""
    if rank == slow_rank:
        time.sleep(delay_s)  # tputrace: problem (only this rank does the extra work)
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(batch, FEATURES, generator=generator), torch.randint(0, CLASSES, (batch,), generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=200.0, help="extra work per step on the slow rank")
    parser.add_argument("--slow-rank", type=int, help="the rank that is late (default: the last one)")
    parser.add_argument("--fixed", action="store_true", help="no extra work on any rank")
    args = parser.parse_args()
    import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" process group backend

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29514")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow_rank = -1 if args.fixed else (world - 1 if args.slow_rank is None else args.slow_rank)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)).to("tpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        inputs, labels = load_batch(step, rank, slow_rank, args.delay_ms / 1000, 16)
        loss = nn.functional.cross_entropy(model(inputs.to("tpu")), labels.to("tpu"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"{args.steps} steps, final loss {loss.item():.4f}" + ("" if args.fixed else f"; rank {slow_rank} was {args.delay_ms:.0f} ms late every step"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
