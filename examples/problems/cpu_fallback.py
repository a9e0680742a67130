"""Planted problem: a CPU fallback in the loop. `torch.masked_select` has a data-dependent output
shape, so the tpu device has no lowering for it: every step copies the per-token losses to the host
and back.

    tputrace run examples/problems/cpu_fallback.py            # masked_select of the valid tokens
    tputrace run examples/problems/cpu_fallback.py --fixed    # a masked mean with a fixed shape
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


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, fixed: bool) -> torch.Tensor:
    per_token = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    if fixed:
        weights = valid.flatten().float()
        return (per_token * weights).sum() / weights.sum().clamp(min=1.0)
    return torch.masked_select(per_token, valid.flatten()).mean()  # tputrace: problem (no lowering: runs on the CPU)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=10, fixed_help="weight the per-token loss by the mask instead")
    model = TinyLM().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH, 1))
    valid = (torch.arange(SEQ).unsqueeze(0) < lengths)
    inputs, targets, valid = tokens[:, :-1].to(args.device), tokens[:, 1:].to(args.device), valid.to(args.device)
    losses = train(lambda _: masked_loss(model(inputs), targets, valid, args.fixed), optimizer, range(args.steps))
    print_final(losses)


if __name__ == "__main__":
    main()
