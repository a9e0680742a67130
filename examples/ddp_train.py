"""Data-parallel training with DistributedDataParallel on the `tpu` device: each rank trains on its
slice of every global batch and DDP averages the gradients, so all ranks end with the parameters a
single process would get from the whole batch.

    tputrace run --nproc 2 examples/ddp_train.py [--steps 20] [--save params.pt]
    torchrun --nproc-per-node 2 examples/ddp_train.py        # without tracing
    python examples/ddp_train.py                              # one rank
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IN_FEATURES, HIDDEN, CLASSES = 64, 256, 10


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def global_batches(steps: int, batch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same global batches on every rank (made on the CPU); each rank takes its slice."""
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, IN_FEATURES, generator=generator), torch.randint(0, CLASSES, (batch,), generator=generator)) for _ in range(steps)]


def make_optimizer(parameters: object) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.01)


def train_reference(steps: int, batch: int) -> nn.Module:
    """One process, whole batches, CPU: the parameters every rank should end with."""
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    for inputs, labels in global_batches(steps, batch):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    return model


def train(steps: int, batch: int, device: str) -> tuple[nn.Module, list[float]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if batch % world:
        raise SystemExit(f"--batch {batch} must be divisible by the {world} ranks")
    local = batch // world
    model = DistributedDataParallel(make_model().to(device))
    optimizer = make_optimizer(model.parameters())
    losses = []
    for inputs, labels in global_batches(steps, batch):
        inputs, labels = inputs[rank * local : (rank + 1) * local].to(device), labels[rank * local : (rank + 1) * local].to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return model.module, [loss.item() for loss in losses]


def init_distributed(backend: str = "tpu") -> None:
    """Join the ranks a launcher started (env://), or be the only rank when run directly."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group(backend)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="global batch size (split across ranks)")
    parser.add_argument("--save", metavar="PATH", help="rank 0 saves the final parameters (CPU tensors) here")
    parser.add_argument("--backend", default="tpu", help='c10d backend ("tpu"; "gloo" serves tpu tensors through it too)')
    args = parser.parse_args()
    import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" process group backend

    init_distributed(args.backend)
    model, losses = train(args.steps, args.batch, "tpu")
    if dist.get_rank() == 0:
        for step, loss in enumerate(losses):
            print(f"step {step:3d} loss (rank 0's slice) {loss:.4f}")
        if args.save:
            torch.save({name: value.detach().cpu() for name, value in model.state_dict().items()}, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
