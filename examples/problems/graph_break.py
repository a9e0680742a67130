"""Planted problem: a graph break under torch.compile. The model prints a tensor inside `forward`, so
Dynamo cannot capture the forward as one graph: it compiles the part before the print, runs the print
in Python (a host sync every step), and compiles the rest as a second graph.

    tputrace run --mode compile examples/problems/graph_break.py            # the problem
    tputrace run --mode compile examples/problems/graph_break.py --fixed    # the statistic returned, printed outside
"""

from __future__ import annotations

import torch
from torch import nn

from common import parse_args, print_final, train

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
    args = parse_args(__doc__.splitlines()[0], steps=8, fixed_help="return the statistic and print it outside the model")
    model = Classifier(args.fixed).to(args.device)
    compiled = torch.compile(model, backend="tpu" if args.device.startswith("tpu") else "inductor")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(0)
    activations = []

    def loss_of(_: int) -> torch.Tensor:
        x = torch.randn(32, FEATURES, generator=generator).to(args.device)
        labels = torch.randint(0, CLASSES, (32,), generator=generator).to(args.device)
        logits, activation = compiled(x)
        activations.append(activation)
        return nn.functional.cross_entropy(logits, labels)

    losses = train(loss_of, optimizer, range(args.steps))
    if args.fixed:
        print("mean activations", [round(value.item(), 4) for value in activations])
    print_final(losses)


if __name__ == "__main__":
    main()
