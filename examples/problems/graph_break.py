"""Planted problem: a graph break under torch.compile. The model prints a tensor inside `forward`, so
Dynamo cannot capture the forward as one graph: it compiles the part before the print, runs the print
in Python (a host sync every step), and compiles the rest as a second graph.

    tputrace run --mode compile examples/problems/graph_break.py            # the problem
    tputrace run --mode compile examples/problems/graph_break.py --fixed    # the statistic returned, printed outside
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

FEATURES, HIDDEN, CLASSES = 64, 256, 10


class Classifier(nn.Module):
    """A two-layer MLP that reports the mean activation of its hidden layer."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.fixed = fixed
        self.hidden = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU())
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.hidden(x)
        activation = hidden.mean()
        if not self.fixed:
            print(f"mean activation {activation}")  # tputrace: problem (printing a tensor breaks the graph)
        return self.head(hidden), activation.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--fixed", action="store_true", help="return the statistic and print it outside the model")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" compile backend
    torch.manual_seed(0)
    model = Classifier(args.fixed).to(args.device)
    compiled = torch.compile(model, backend="tpu" if args.device.startswith("tpu") else "inductor")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    activations = []
    for _ in range(args.steps):
        x = torch.randn(32, FEATURES, generator=generator).to(args.device)
        labels = torch.randint(0, CLASSES, (32,), generator=generator).to(args.device)
        logits, activation = compiled(x)
        loss = nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        activations.append(activation)
    if args.fixed:
        print("mean activations", [round(value.item(), 4) for value in activations])
    print(f"{args.steps} steps, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
