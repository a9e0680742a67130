"""Planted problem: a recompile storm under torch.compile. The model is compiled with `dynamic=False`
(static shapes, which XLA likes), but every batch has its own sequence length: each new length fails
Dynamo's shape guard, so the whole frame is traced, lowered and compiled again, until Dynamo's
recompile limit sends the rest of the run to eager mode.

    tputrace run --mode compile examples/problems/compile_recompile_storm.py            # the problem
    tputrace run --mode compile examples/problems/compile_recompile_storm.py --fixed    # lengths padded to buckets of 64
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args, print_final, token_batches, train

VOCAB, WIDTH, CLASSES = 256, 64, 8
BUCKET = 64


class TokenTagger(nn.Module):
    """Tags every token: embedding, a position-wise MLP, a classifier per position."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # tputrace: problem (recompiled for every new sequence length)
        x = self.embed(tokens)
        return self.head(x + self.mlp(x))


def batches(steps: int, batch: int, fixed: bool, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token batches of random length 16..128 with a tag per token (padding, token 0, is tagged -100:
    ignored by the loss); with `fixed`, padded up to a multiple of BUCKET."""
    return [(tokens, torch.where(tokens == 0, -100, tokens % CLASSES))
            for tokens in token_batches(steps, batch, VOCAB, BUCKET if fixed else None, seed)]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=12, fixed_help=f"pad every batch to a multiple of {BUCKET}")
    model = TokenTagger().to(args.device)
    compiled = torch.compile(model, backend="tpu" if args.device.startswith("tpu") else "inductor", dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def loss_of(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens, labels = batch[0].to(args.device), batch[1].to(args.device)
        logits = compiled(tokens)  # a new sequence length every batch: Dynamo's shape guard fails
        return nn.functional.cross_entropy(logits.view(-1, CLASSES), labels.view(-1), ignore_index=-100)

    print_final(train(loss_of, optimizer, batches(args.steps, 16, args.fixed)))


if __name__ == "__main__":
    main()
