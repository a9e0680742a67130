"""Planted problem: a large module left out of FSDP2's wrapping. Each block gets its own `fully_shard`,
but the token embedding (most of the model's bytes) is left to the root's, so it is all-gathered with
the root group in one message at the start of the forward and stays unsharded while any of the model
runs.

    tputrace run --nproc 2 examples/problems/sharding_fsdp_unwrapped.py            # the problem
    tputrace run --nproc 2 examples/problems/sharding_fsdp_unwrapped.py --fixed    # fully_shard(model.embed) too
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from common import parse_args, print_final, start_ranks, train

VOCAB, WIDTH, BLOCKS, BATCH, LENGTH = 8192, 128, 2, 8, 32


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=6, fixed_help="give the embedding a fully_shard of its own")
    from torch.distributed.fsdp import fully_shard

    rank, _ = start_ranks()
    model = TokenModel().to(args.device)
    if args.fixed:
        fully_shard(model.embed)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)  # tputrace: problem (the embedding has no fully_shard of its own)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator).to(args.device) for _ in range(args.steps)]
    print_final(train(lambda tokens: model(tokens).square().mean(), optimizer, batches))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
