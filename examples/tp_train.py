"""Tensor-parallel training with DTensor on `tpu`: each feed-forward block's first linear layer is split
by output features (ColwiseParallel) and its second by input features (RowwiseParallel), so a block
needs one all-reduce forward and one backward. All ranks see the same batch.

    tputrace run --nproc 2 examples/tp_train.py [--steps 20] [--save params.pt]
    python examples/tp_train.py        # one rank
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

IN_FEATURES, WIDTH, CLASSES = 32, 128, 10


class FeedForward(nn.Module):
    """A pre-norm residual MLP block: x + down(gelu(up(norm(x))))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Classifier(nn.Module):
    def __init__(self, blocks: int = 2, width: int = WIDTH) -> None:
        super().__init__()
        self.embed = nn.Linear(IN_FEATURES, width)
        self.blocks = nn.ModuleList(FeedForward(width) for _ in range(blocks))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model(blocks: int = 2) -> Classifier:
    torch.manual_seed(0)
    return Classifier(blocks)


def batches(steps: int, batch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, IN_FEATURES, generator=generator), torch.randint(0, CLASSES, (batch,), generator=generator)) for _ in range(steps)]


def make_optimizer(parameters: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


def train_reference(steps: int, batch: int, blocks: int = 2) -> Classifier:
    """One process, CPU: the parameters the tensor-parallel ranks should end with."""
    model = make_model(blocks)
    optimizer = make_optimizer(model.parameters())
    for inputs, labels in batches(steps, batch):
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    return model


def parallelize(model: Classifier) -> Classifier:
    """Split every block's MLP across all ranks (a 1-D "tpu" device mesh)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = DeviceMesh("tpu", list(range(dist.get_world_size())))
    plan = {}
    for index in range(len(model.blocks)):
        plan[f"blocks.{index}.up"] = ColwiseParallel()
        plan[f"blocks.{index}.down"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def train(steps: int, batch: int, blocks: int) -> tuple[Classifier, list[float]]:
    model = parallelize(make_model(blocks).to("tpu"))
    optimizer = make_optimizer(model.parameters())
    losses = []
    for inputs, labels in batches(steps, batch):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs.to("tpu")), labels.to("tpu"))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return model, [loss.item() for loss in losses]


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a whole CPU tensor (sharded ones are gathered: a collective on every rank)."""
    parameters = {}
    for name, value in model.state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        parameters[name] = value.detach().cpu()
    return parameters


def init_distributed() -> None:
    """Join the ranks a launcher started (env://), or be the only rank when run directly."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("tpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--save", metavar="PATH", help="rank 0 saves the final parameters (whole, CPU tensors) here")
    args = parser.parse_args()
    import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" process group backend

    init_distributed()
    model, losses = train(args.steps, args.batch, args.blocks)
    parameters = full_parameters(model)
    if dist.get_rank() == 0:
        for step, loss in enumerate(losses):
            print(f"step {step:3d} loss {loss:.4f}")
        if args.save:
            torch.save(parameters, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
