"""Planted problem: fragmented fusion. A NaN check after every block (`if not torch.isfinite(h).all()`)
reads a chip value in Python, so each step is cut into one small program per block.

    tputrace run examples/problems/fragmented_fusion.py            # a check in every block
    tputrace run examples/problems/fragmented_fusion.py --fixed    # one check of the loss, after the loop
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args, print_final, train

WIDTH, BATCH, DEPTH = 256, 128, 6


class Block(nn.Module):
    def __init__(self, check: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.check = check

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + torch.relu(self.fc(self.norm(x)))
        if self.check and not torch.isfinite(h).all():  # tputrace: problem (a host read inside every block)
            raise FloatingPointError("activation is not finite")
        return h


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=10, fixed_help="check the loss once, after the loop")
    model = nn.Sequential(*(Block(check=not args.fixed) for _ in range(DEPTH)), nn.Linear(WIDTH, 1)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    inputs = torch.randn(BATCH, WIDTH).to(args.device)
    targets = torch.randn(BATCH, 1).to(args.device)
    losses = train(lambda _: nn.functional.mse_loss(model(inputs), targets), optimizer, range(args.steps))
    if not torch.isfinite(torch.stack(losses)).all():
        raise FloatingPointError("loss is not finite")
    print_final(losses)


if __name__ == "__main__":
    main()
