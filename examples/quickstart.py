"""Quickstart: train a small MLP classifier on the `tpu` device and print its loss.

    python examples/quickstart.py            # on tpu (imports tputrace.backend)
    python examples/quickstart.py --device cpu
    tputrace run examples/quickstart.py      # traced
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def make_data(seed: int = 0, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch, 64, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    return inputs, labels


def train(device: str, steps: int) -> list[float]:
    model = make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, labels = make_data()
    inputs, labels = inputs.to(device), labels.to(device)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return [loss.item() for loss in losses]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device
    losses = train(args.device, args.steps)
    for step, loss in enumerate(losses):
        print(f"step {step:3d} loss {loss:.4f}")


if __name__ == "__main__":
    main()
