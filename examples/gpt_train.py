"""Train a nanoGPT-style decoder (6 layers, width 256) on synthetic tokens with AdamW.

    python examples/gpt_train.py [--device tpu|cpu] [--steps 20] [--compile]
    tputrace run examples/gpt_train.py
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 512
    block_size: int = 64
    n_layer: int = 6
    n_head: int = 4
    n_embd: int = 256
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q = q.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2)
        k = k.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2)
        v = v.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, parameter in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        seq = tokens.shape[1]
        positions = torch.arange(seq, device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def synthetic_batches(config: GPTConfig, batch: int, steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token sequences with a learnable pattern (each token predicts the next), made on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        start = torch.randint(0, config.vocab_size, (batch, 1), generator=generator)
        tokens = (start + torch.arange(config.block_size + 1)) % config.vocab_size
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return batches


def train(device: str, steps: int, batch: int = 4, compile_model: bool = False, config: GPTConfig = GPTConfig()) -> list[float]:
    torch.manual_seed(0)
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    forward = torch.compile(model, backend="tpu" if device.startswith("tpu") else "inductor") if compile_model else model
    losses = []
    for tokens, targets in synthetic_batches(config, batch, steps):
        loss = train_step(forward, model, optimizer, tokens.to(device), targets.to(device))
        losses.append(loss.detach())
    return [loss.item() for loss in losses]


def train_step(forward: Callable, model: GPT, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One training step: forward (`forward` is the model or its compiled form), backward, gradient
    clipping to norm 1 and the optimizer step. Returns the loss."""
    _, loss = forward(tokens, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device
    losses = train(args.device, args.steps, args.batch, args.compile)
    for step, loss in enumerate(losses):
        print(f"step {step:3d} loss {loss:.4f}")


if __name__ == "__main__":
    main()
