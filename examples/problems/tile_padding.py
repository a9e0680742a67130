"""Planted problem: tile padding. A hidden size of 1000 is not a multiple of the MXU size (256 on
v6e) or of the 128-lane tiles, so the chip pads every product with that dim.

    tputrace run examples/problems/tile_padding.py            # hidden size 1000
    tputrace run examples/problems/tile_padding.py --fixed    # hidden size 1024
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args, print_final, train

FEATURES, BATCH, CLASSES = 512, 512, 256


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))  # tputrace: problem (a hidden x hidden product: both dims are 1000)
        return self.out(h)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], steps=10, fixed_help="use a hidden size of 1024")
    model = MLP(1024 if args.fixed else 1000).to(args.device, torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # A small synthetic dataset, kept on the chip.
    batches = [(torch.randn(BATCH, FEATURES).to(args.device, torch.bfloat16),
                torch.randint(0, CLASSES, (BATCH,)).to(args.device)) for _ in range(2)]

    def loss_of(step: int) -> torch.Tensor:
        inputs, labels = batches[step % len(batches)]
        return nn.functional.cross_entropy(model(inputs).float(), labels)

    print_final(train(loss_of, optimizer, range(args.steps)))


if __name__ == "__main__":
    main()
