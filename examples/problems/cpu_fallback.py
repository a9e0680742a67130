"""Planted problem: a CPU fallback in the loop. `torch.histogram` has no tpu lowering (torch itself
has only a CPU kernel for it), so every step copies the targets to the host, counts them there, and
copies the counts back, cutting the step's fused graph.

    tputrace run examples/problems/cpu_fallback.py            # histogram of the batch's target tokens
    tputrace run examples/problems/cpu_fallback.py --fixed    # the same counts with a fixed shape (scatter_add_)
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args, print_final, train

VOCAB, WIDTH, BATCH, SEQ = 512, 128, 16, 64


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return self.head(x + self.mix(x))


def balanced_loss(logits: torch.Tensor, targets: torch.Tensor, fixed: bool) -> torch.Tensor:
    """Cross-entropy weighted by the inverse frequency of each target token in the batch."""
    flat = targets.flatten()
    if fixed:
        counts = torch.zeros(VOCAB, device=flat.device).scatter_add_(0, flat, torch.ones(flat.shape, device=flat.device))
    else:
        counts = torch.histogram(flat.float(), bins=VOCAB, range=(0, VOCAB)).hist  # tputrace: problem (no lowering: runs on the CPU)
    return nn.functional.cross_entropy(logits.flatten(0, 1), flat, weight=1.0 / counts.clamp(min=1.0))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=10, fixed_help="count the tokens into a fixed-size tensor instead")
    model = TinyLM().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    inputs, targets = tokens[:, :-1].to(args.device), tokens[:, 1:].to(args.device)
    losses = train(lambda _: balanced_loss(model(inputs), targets, args.fixed), optimizer, range(args.steps))
    print_final(losses)


if __name__ == "__main__":
    main()
