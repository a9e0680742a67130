"""Fully sharded data parallel training (FSDP2, `fully_shard`) of the GPT from gpt_train.py on `tpu`.

Each rank holds 1/N of every parameter, gradient and optimizer state. A block's parameters are
all-gathered just before it runs and freed again right after (forward and backward), so the peak
memory per rank is about the shards, one block's gathered parameters (twice while they are copied
out of FSDP2's flat all-gather buffer), the root's parameters (FSDP2 keeps them between forward and
backward) and the activations, not the whole model. The default model is gpt_train.py's (6 blocks,
width 256).

    tputrace run --nproc 4 examples/fsdp_train.py [--steps 10] [--save result.pt]
    tputrace run --mode strict --no-trace examples/fsdp_train.py --no-shard --batch 1
        # one rank, plain module, the same batch per rank: the unsharded peak to compare with
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn import functional as F

from gpt_train import GPT, GPTConfig, synthetic_batches


def make_config(layers: int, width: int, heads: int) -> GPTConfig:
    return GPTConfig(n_layer=layers, n_embd=width, n_head=heads)


def make_model(config: GPTConfig) -> GPT:
    torch.manual_seed(0)
    return GPT(config)


def make_optimizer(parameters: object) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=3e-4, weight_decay=0.1)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits, _ = model(tokens)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.detach()


def train_reference(config: GPTConfig, steps: int, batch: int) -> GPT:
    """One process, whole batches, CPU: the parameters every rank should end with."""
    model = make_model(config)
    optimizer = make_optimizer(model.parameters())
    for tokens, targets in synthetic_batches(config, batch, steps):
        train_step(model, optimizer, tokens, targets)
    return model


def shard(model: GPT) -> GPT:
    """One FSDP unit per block, and the rest (embeddings, final norm, tied head) in the root unit."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def train(config: GPTConfig, steps: int, batch: int, sharded: bool) -> tuple[GPT, list[float]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if batch % world:
        raise SystemExit(f"--batch {batch} must be divisible by the {world} ranks")
    local = batch // world
    model = make_model(config).to("tpu")
    if sharded:
        model = shard(model)
    optimizer = make_optimizer(model.parameters())
    torch.tpu.reset_peak_memory_stats()
    losses = []
    for tokens, targets in synthetic_batches(config, batch, steps):
        tokens, targets = tokens[rank * local : (rank + 1) * local].to("tpu"), targets[rank * local : (rank + 1) * local].to("tpu")
        losses.append(train_step(model, optimizer, tokens, targets))
    return model, [loss.item() for loss in losses]


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter as a whole CPU tensor (sharded ones are gathered: a collective on every rank)."""
    parameters = {}
    for name, value in model.state_dict().items():
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        parameters[name] = value.detach().cpu()
    return parameters


def peaks_of_all_ranks(peak: int) -> list[int]:
    gathered = [torch.zeros(1, dtype=torch.int64, device="tpu") for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([peak], dtype=torch.int64, device="tpu"))
    return [int(value.item()) for value in gathered]


def init_distributed() -> None:
    """Join the ranks a launcher started (env://), or be the only rank when run directly."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("tpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8, help="global batch size (split across ranks)")
    parser.add_argument("--layers", type=int, default=GPTConfig.n_layer)
    parser.add_argument("--width", type=int, default=GPTConfig.n_embd)
    parser.add_argument("--heads", type=int, default=GPTConfig.n_head)
    parser.add_argument("--no-shard", action="store_true", help="train the plain module (no FSDP): the unsharded reference")
    parser.add_argument("--save", metavar="PATH", help="rank 0 saves {'parameters', 'losses', 'peak_bytes'} here")
    args = parser.parse_args()
    import tputrace.backend  # noqa: F401 - registers the tpu device and the "tpu" process group backend

    init_distributed()
    config = make_config(args.layers, args.width, args.heads)
    model, losses = train(config, args.steps, args.batch, sharded=not args.no_shard)
    peaks = peaks_of_all_ranks(torch.tpu.max_memory_allocated())
    parameters = full_parameters(model)
    if dist.get_rank() == 0:
        for step, loss in enumerate(losses):
            print(f"step {step:3d} loss (rank 0's slice) {loss:.4f}")
        layout = "unsharded" if args.no_shard else f"FSDP2 over {dist.get_world_size()} ranks"
        print(f"peak tpu memory per rank ({layout}): " + ", ".join(f"{peak / 2**20:.2f} MiB" for peak in peaks))
        if args.save:
            torch.save({"parameters": parameters, "losses": losses, "peak_bytes": peaks}, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
