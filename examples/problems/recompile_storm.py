"""Planted problem: a recompilation storm. The collate function pads each batch to its own longest
sequence, so every step hands the chip a new shape and the step's program compiles again.

    tputrace run examples/problems/recompile_storm.py            # the problem
    tputrace run examples/problems/recompile_storm.py --fixed    # lengths padded to buckets of 64
"""

from __future__ import annotations

import random

import torch
from torch import nn

from common import parse_args, print_final, train

VOCAB, WIDTH, CLASSES = 256, 64, 8
BUCKET = 64


class BagOfTokens(nn.Module):
    """Embed tokens, average the non-padding positions, classify."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        mask = (tokens != 0).unsqueeze(-1).float()
        pooled = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def sequences(steps: int, batch: int, seed: int = 0) -> list[list[torch.Tensor]]:
    """`steps` batches of `batch` token sequences (tokens 1..VOCAB-1); the longest of each batch is 16..128 long."""
    longest_rng, length_rng = random.Random(seed), random.Random(seed + 1)
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        longest = longest_rng.randint(16, 128)
        lengths = [longest] + [length_rng.randint(longest // 2, longest) for _ in range(batch - 1)]
        batches.append([torch.randint(1, VOCAB, (length,), generator=generator) for length in lengths])
    return batches


def collate(batch: list[torch.Tensor], bucket: int | None) -> torch.Tensor:
    """One tensor of the batch's sequences, right-padded with token 0 to the longest (with `bucket`: to the longest
    rounded up to a multiple of it)."""
    longest = max(len(tokens) for tokens in batch)
    width = longest if bucket is None else -(-longest // bucket) * bucket
    return torch.stack([nn.functional.pad(tokens, (0, width - len(tokens))) for tokens in batch])  # tputrace: problem


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=8, fixed_help=f"pad every batch to a multiple of {BUCKET}")
    model = BagOfTokens().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        labels = tokens[:, 0] % CLASSES  # the class of a sequence: its first token's
        return nn.functional.cross_entropy(model(tokens.to(args.device)), labels.to(args.device))

    batches = [collate(batch, BUCKET if args.fixed else None) for batch in sequences(args.steps, 32)]
    print_final(train(loss_of, optimizer, batches))


if __name__ == "__main__":
    main()
