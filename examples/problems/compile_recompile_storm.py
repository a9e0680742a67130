"""Planted problem: a recompile storm under torch.compile. The model is compiled with `dynamic=False`
(static shapes, which XLA likes), but every batch has its own sequence length: each new length fails
Dynamo's shape guard, so the whole frame is traced, lowered and compiled again, until Dynamo's
recompile limit sends the rest of the run to eager mode.

    tputrace run --mode compile examples/problems/compile_recompile_storm.py            # the problem
    tputrace run --mode compile examples/problems/compile_recompile_storm.py --fixed    # lengths padded to buckets of 64
"""

from __future__ import annotations

import argparse
import random

import torch
from torch import nn

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
    """Token batches of random length 16..128 (token 0 is padding, labelled -100); with `fixed`,
    padded up to a multiple of BUCKET."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        length = rng.randint(16, 128)
        tokens = torch.randint(1, VOCAB, (batch, length), generator=generator)
        labels = tokens % CLASSES
        if fixed:
            padded = -(-length // BUCKET) * BUCKET
            tokens = nn.functional.pad(tokens, (0, padded - length), value=0)
            labels = nn.functional.pad(labels, (0, padded - length), value=-100)
        out.append((tokens, labels))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--fixed", action="store_true", help=f"pad every batch to a multiple of {BUCKET}")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" compile backend
    torch.manual_seed(0)
    model = TokenTagger().to(args.device)
    backend = "tpu" if args.device.startswith("tpu") else "inductor"
    compiled = torch.compile(model, backend=backend, dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for tokens, labels in batches(args.steps, 16, args.fixed):
        tokens, labels = tokens.to(args.device), labels.to(args.device)
        logits = compiled(tokens)  # a new sequence length every batch: Dynamo's shape guard fails
        loss = nn.functional.cross_entropy(logits.view(-1, CLASSES), labels.view(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    print(f"{len(losses)} steps, final loss {losses[-1].item():.4f}")


if __name__ == "__main__":
    main()
