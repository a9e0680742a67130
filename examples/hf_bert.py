"""A Hugging Face `transformers` BERT built from a config (no download): forward and backward.

    python examples/hf_bert.py [--device tpu|cpu] [--steps 20]
    tputrace run examples/hf_bert.py
"""

from __future__ import annotations

import argparse

import torch


def make_model() -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=128,
        num_labels=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def synthetic_batches(steps: int, batch: int = 8, length: int = 32, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        input_ids = torch.randint(1, 1000, (batch, length), generator=generator)
        attention_mask = torch.ones(batch, length, dtype=torch.long)
        labels = input_ids[:, 0] % 4
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return batches


def train(device: str, steps: int) -> list[float]:
    model = make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for batch in synthetic_batches(steps):
        batch = {name: value.to(device) for name, value in batch.items()}
        optimizer.zero_grad()
        loss = model(**batch).loss
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
    for step, loss in enumerate(train(args.device, args.steps)):
        print(f"step {step:3d} loss {loss:.4f}")


if __name__ == "__main__":
    main()
