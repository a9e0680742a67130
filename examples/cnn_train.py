"""Train a small ResNet on synthetic images (random 32x32 RGB with class-dependent means).

    python examples/cnn_train.py [--device tpu|cpu] [--steps 20]
    tputrace run examples/cnn_train.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = BasicBlock(width, width, 1)
        self.layer2 = BasicBlock(width, 2 * width, 2)
        self.layer3 = BasicBlock(2 * width, 4 * width, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def synthetic_batches(steps: int, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        labels = torch.randint(0, 10, (batch,), generator=generator)
        images = torch.randn(batch, 3, 32, 32, generator=generator) + labels.view(-1, 1, 1, 1) / 5.0
        batches.append((images, labels))
    return batches


def train(device: str, steps: int, batch: int = 16) -> list[float]:
    torch.manual_seed(0)
    model = SmallResNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for images, labels in synthetic_batches(steps, batch):
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return [loss.item() for loss in losses]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device
    for step, loss in enumerate(train(args.device, args.steps, args.batch)):
        print(f"step {step:3d} loss {loss:.4f}")


if __name__ == "__main__":
    main()
