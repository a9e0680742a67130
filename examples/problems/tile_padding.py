"""Planted problem: tile padding. A hidden size of 1000 is not a multiple of the MXU size (256 on
v6e) or of the 128-lane tiles, so the chip pads every product with that dim.

    tputrace run examples/problems/tile_padding.py            # hidden size 1000
    tputrace run examples/problems/tile_padding.py --fixed    # hidden size 1024
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fixed", action="store_true", help="use a hidden size of 1024")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device
    torch.manual_seed(0)
    model = MLP(1024 if args.fixed else 1000).to(args.device, torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # A small synthetic dataset, kept on the chip.
    batches = [(torch.randn(BATCH, FEATURES).to(args.device, torch.bfloat16),
                torch.randint(0, CLASSES, (BATCH,)).to(args.device)) for _ in range(2)]
    losses = []
    for step in range(args.steps):
        inputs, labels = batches[step % len(batches)]
        loss = nn.functional.cross_entropy(model(inputs).float(), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    print(f"{args.steps} steps, final loss {losses[-1].item():.4f}")


if __name__ == "__main__":
    main()
