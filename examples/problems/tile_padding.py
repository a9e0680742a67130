"""Planted problem: tile padding. A hidden size of 1000 is not a multiple of the MXU size (256 on
v6e) or of the 128-lane tiles, so the chip pads every product with that dim.

    tputrace run examples/problems/tile_padding.py            # hidden size 1000
    tputrace run examples/problems/tile_padding.py --fixed    # hidden size 1024
    --scale K multiplies every size by K (e.g. 8 on a GPU: hidden size 8000 against 8192)
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args, print_final, train

FEATURES, BATCH, CLASSES = 512, 512, 256


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))  # tputrace: problem (a hidden x hidden product: both dims are 1000)
        return self.out(h)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=10, fixed_help="use a hidden size of 1024", scalable=True)
    features, batch, classes = FEATURES * args.scale, BATCH * args.scale, CLASSES * args.scale
    hidden = (1024 if args.fixed else 1000) * args.scale
    model = MLP(features, hidden, classes).to(args.device, torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # A small synthetic dataset, kept on the chip.
    batches = [(torch.randn(batch, features).to(args.device, torch.bfloat16),
                torch.randint(0, classes, (batch,)).to(args.device)) for _ in range(2)]

    def loss_of(step: int) -> torch.Tensor:
        inputs, labels = batches[step % len(batches)]
        return nn.functional.cross_entropy(model(inputs).float(), labels)

    print_final(train(loss_of, optimizer, range(args.steps)))


if __name__ == "__main__":
    main()
