"""A small training script the bench scripts share: a text classifier (an embedding, one
`nn.TransformerEncoderLayer` with a padding mask and dropout, a mean over the unpadded tokens), AdamW.

    python bench/text_classifier.py   # three steps on tpu, each step's loss printed
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class TextClassifier(nn.Module):
    def __init__(self, vocab: int = 1000, width: int = 128, classes: int = 4) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width, padding_idx=0)
        self.encoder = nn.TransformerEncoderLayer(width, 4, 256, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embedding(tokens), src_key_padding_mask=padding)
        kept = (~padding).unsqueeze(-1).float()
        logits: torch.Tensor = self.head((hidden * kept).sum(1) / kept.sum(1))
        return logits


def train(steps: int, after_step: Callable[[int, torch.Tensor], None]) -> None:
    """`steps` training steps on tpu of batches of 8 padded sequences; `after_step(step, loss)` after each."""
    torch.manual_seed(0)
    model = TextClassifier().to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        tokens, lengths = torch.randint(1, 1000, (8, 32)), torch.randint(8, 33, (8,))
        padding = torch.arange(32)[None] >= lengths[:, None]
        tokens, labels = tokens.masked_fill(padding, 0).to("tpu"), torch.randint(0, 4, (8,)).to("tpu")
        loss = F.cross_entropy(model(tokens, padding.to("tpu")), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        after_step(step, loss)


if __name__ == "__main__":
    train(3, lambda step, loss: print(f"step {step}: loss {loss.item():.4f}"))
