"""Training steps that bench scripts share: a small and a mid-sized GPT language model (the GPT example at
two sizes) and a small ResNet classifier (the CNN example), each buildable on the CPU or on tpu, eager or
wrapped in torch.compile.

`build(model, device, compile_backend)` returns a `Step`: a function running one training step (forward,
backward, gradient clipping, AdamW) on batch `index` and returning the loss.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

Step = Callable[[int], torch.Tensor]

# name -> (description, GPT config fields, batch); the classifier has no config.
LM_SIZES: dict[str, tuple[str, dict[str, int], int]] = {
    "small_lm": ("small LM (GPT 2x64, batch 2x32)", {"n_layer": 2, "n_embd": 64, "n_head": 2, "block_size": 32, "vocab_size": 256}, 2),
    "mid_lm": ("mid LM (GPT 6x256, batch 4x64)", {}, 4),
}
CLASSIFIER = "classifier"
MODELS = (*LM_SIZES, CLASSIFIER)
BATCHES = 4  # distinct batches a step cycles through


def describe(model: str) -> str:
    """The model's name as a table shows it."""
    return "classifier (ResNet 16, batch 16x3x32x32)" if model == CLASSIFIER else LM_SIZES[model][0]


def build(model: str, device: str, compile_backend: str | None = None) -> Step:
    """One training step of `model` on `device`; `compile_backend` wraps the model's forward in
    `torch.compile(backend=...)` (the loss, backward and optimizer stay eager)."""
    torch.manual_seed(0)
    if model == CLASSIFIER:
        return _classifier_step(device, compile_backend)
    return _lm_step(model, device, compile_backend)


def _forward(module: torch.nn.Module, compile_backend: str | None) -> Callable:
    return torch.compile(module, backend=compile_backend) if compile_backend else module


def _lm_step(model: str, device: str, compile_backend: str | None) -> Step:
    import gpt_train

    _, fields, batch = LM_SIZES[model]
    config = gpt_train.GPTConfig(**fields)
    network = gpt_train.GPT(config).to(device)
    optimizer = torch.optim.AdamW(network.parameters(), lr=3e-4, weight_decay=0.1)
    batches = [(tokens.to(device), targets.to(device)) for tokens, targets in gpt_train.synthetic_batches(config, batch, BATCHES)]
    forward = _forward(network, compile_backend)

    def step(index: int) -> torch.Tensor:
        return gpt_train.train_step(forward, network, optimizer, *batches[index % BATCHES])

    return step


def _classifier_step(device: str, compile_backend: str | None) -> Step:
    import cnn_train

    network = cnn_train.SmallResNet().to(device)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3)
    batches = [(images.to(device), labels.to(device)) for images, labels in cnn_train.synthetic_batches(BATCHES)]
    forward = _forward(network, compile_backend)

    def step(index: int) -> torch.Tensor:
        images, labels = batches[index % BATCHES]
        loss = torch.nn.functional.cross_entropy(forward(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
        optimizer.step()
        return loss

    return step
