"""Planted problem: a recompilation storm. Each batch has its own sequence length, so every step
hands the chip a new shape and the step's program compiles again.

    tputrace run examples/problems/recompile_storm.py            # the problem
    tputrace run examples/problems/recompile_storm.py --fixed    # lengths padded to buckets of 64
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args, print_final, token_batches, train

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


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=8, fixed_help=f"pad every batch to a multiple of {BUCKET}")
    model = BagOfTokens().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        labels = tokens[:, 0] % CLASSES  # the class of a sequence: its first token's
        return nn.functional.cross_entropy(model(tokens.to(args.device)), labels.to(args.device))

    batches = token_batches(args.steps, 32, VOCAB, BUCKET if args.fixed else None)
    print_final(train(loss_of, optimizer, batches))


if __name__ == "__main__":
    main()
