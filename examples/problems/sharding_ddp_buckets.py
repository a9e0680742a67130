"""Planted problem: tiny DDP buckets. `bucket_cap_mb=0.05` splits the gradients into a message per
layer or two, each paying the collective's fixed latency; one or a few larger buckets move the same
bytes in far fewer calls.

    tputrace run --nproc 2 examples/problems/sharding_ddp_buckets.py            # the problem
    tputrace run --nproc 2 examples/problems/sharding_ddp_buckets.py --fixed    # the default 25 MB buckets
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from common import parse_args, print_final, start_ranks, train

WIDTH, LAYERS, BATCH, CLASSES = 128, 8, 32, 10


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=6, fixed_help="DDP's default bucket size")
    rank, _ = start_ranks()
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES)).to(args.device)
    if args.fixed:
        wrapped = DistributedDataParallel(model)
    else:
        wrapped = DistributedDataParallel(model, bucket_cap_mb=0.05)  # tputrace: problem (a bucket per layer or two)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, WIDTH, generator=generator).to(args.device), torch.randint(0, CLASSES, (BATCH,), generator=generator).to(args.device))
               for _ in range(args.steps)]
    print_final(train(lambda batch: nn.functional.cross_entropy(wrapped(batch[0]), batch[1]), optimizer, batches))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
