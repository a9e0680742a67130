"""Planted problem: a recompilation storm. Each batch has its own sequence length, so every step
hands the chip a new shape and the step's program compiles again.

    tputrace run examples/problems/recompile_storm.py            # the problem
    tputrace run examples/problems/recompile_storm.py --fixed    # lengths padded to buckets of 64
"""

from __future__ import annotations

import argparse
import random

import torch
from torch import nn

VOCAB, WIDTH, CLASSES = 256, 64, 8
BUCKET = 64


class BagOfTokens(nn.Module):
    """Embed tokens, average the non-padding positions, classify."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # tputrace: problem (the sequence length of `tokens` changes every batch)
        mask = (tokens != 0).unsqueeze(-1).float()
        pooled = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def batches(steps: int, batch: int, fixed: bool, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token batches of random length 16..128 (token 0 is padding); with `fixed`, padded up to a bucket."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        length = rng.randint(16, 128)
        tokens = torch.randint(1, VOCAB, (batch, length), generator=generator)
        labels = tokens[:, 0] % CLASSES
        if fixed:
            padded = -(-length // BUCKET) * BUCKET
            tokens = nn.functional.pad(tokens, (0, padded - length), value=0)
        out.append((tokens, labels))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--fixed", action="store_true", help=f"pad every batch to a multiple of {BUCKET}")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device
    torch.manual_seed(0)
    model = BagOfTokens().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for tokens, labels in batches(args.steps, 32, args.fixed):
        tokens, labels = tokens.to(args.device), labels.to(args.device)
        loss = nn.functional.cross_entropy(model(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    print(f"{len(losses)} steps, final loss {losses[-1].item():.4f}")


if __name__ == "__main__":
    main()
