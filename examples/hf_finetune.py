"""A Hugging Face causal-LM fine-tuning loop as it is often written for a GPU, run on tpu.

    python examples/hf_finetune.py [--device tpu|cpu] [--steps 12] [--layers 2] [--eval-batches 4] [--no-autocast]
    tputrace run examples/hf_finetune.py

A small GPT-2 built from a config (no download) learns synthetic token sequences of varying length.
The loop keeps the GPU habits a port starts with: a `collate_fn` that pads each batch to its own
longest sequence (a new shape, so a new XLA program, for most batches), `loss.item()` logged every
step (a host sync), gradient accumulation over two micro-batches, bfloat16 autocast, AdamW with a
linear warmup schedule, gradient clipping, and an evaluation pass that reports perplexity.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

VOCAB_SIZE = 256
PAD_TOKEN_ID = 0
MAX_LENGTH = 64
ACCUMULATION_STEPS = 2
MICRO_BATCH_SIZE = 4


class CountingSequences(Dataset):
    """Token sequences that count up from a random start with a random stride (mod the vocabulary, token 0
    kept for padding), each of its own length: a model learns the stride from the first tokens."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.sequences: list[torch.Tensor] = []
        for _ in range(size):
            length = int(torch.randint(8, MAX_LENGTH + 1, (1,), generator=generator))
            start = int(torch.randint(1, VOCAB_SIZE, (1,), generator=generator))
            stride = int(torch.randint(1, 8, (1,), generator=generator))
            positions = torch.arange(length)
            self.sequences.append((start + stride * positions) % (VOCAB_SIZE - 1) + 1)

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.sequences[index]


def pad_to_longest(sequences: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-pads a batch to its longest sequence; padded positions are masked out of attention and loss."""
    longest = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), longest), PAD_TOKEN_ID, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = sequence
        attention_mask[row, : len(sequence)] = 1
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_model(layers: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=MAX_LENGTH,
        n_embd=64,
        n_layer=layers,
        n_head=4,
        pad_token_id=PAD_TOKEN_ID,
        bos_token_id=1,
        eos_token_id=1,
        # No dropout, so a tpu run and a CPU run draw no random masks and can be compared step by step.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def make_train_loader(steps: int) -> DataLoader:
    """Shuffled micro-batches for `steps` optimizer steps, each padded to its own longest sequence."""
    return DataLoader(
        CountingSequences(steps * ACCUMULATION_STEPS * MICRO_BATCH_SIZE, seed=1),
        batch_size=MICRO_BATCH_SIZE,
        shuffle=True,
        collate_fn=pad_to_longest,
        generator=torch.Generator().manual_seed(2),
        num_workers=0,
    )


@dataclass
class FinetuneResult:
    """What one run produced: the loss of every optimizer step and the evaluation perplexity."""

    losses: list[float]
    eval_perplexity: float


def evaluate(model: torch.nn.Module, loader: DataLoader, device: str, autocast: bool) -> float:
    """Perplexity over the evaluation set: exp of the token-weighted mean loss."""
    model.eval()
    total_loss = torch.zeros((), device=device)
    total_tokens = 0
    with torch.no_grad():
        for batch in loader:
            batch = {name: value.to(device) for name, value in batch.items()}
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
                loss = model(**batch).loss
            # Labels are shifted by one inside the model: each row predicts all but its first real token.
            predicted_tokens = int(batch["attention_mask"].sum()) - len(batch["attention_mask"])
            total_loss += loss.float() * predicted_tokens
            total_tokens += predicted_tokens
    model.train()
    return math.exp(total_loss.item() / total_tokens)


def finetune(device: str, steps: int, autocast: bool = True, layers: int = 2, eval_batches: int = 4) -> FinetuneResult:
    """Trains for `steps` optimizer steps of ACCUMULATION_STEPS micro-batches each, printing each step's loss,
    then evaluates on `eval_batches` batches."""
    from transformers import get_linear_schedule_with_warmup

    model = make_model(layers).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=max(1, steps // 10), num_training_steps=steps)
    train_loader = make_train_loader(steps)
    eval_loader = DataLoader(
        CountingSequences(eval_batches * MICRO_BATCH_SIZE, seed=3), batch_size=MICRO_BATCH_SIZE, collate_fn=pad_to_longest
    )
    losses = []
    optimizer.zero_grad()
    for micro_step, batch in enumerate(train_loader):
        batch = {name: value.to(device) for name, value in batch.items()}
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch).loss / ACCUMULATION_STEPS
        loss.backward()
        if (micro_step + 1) % ACCUMULATION_STEPS == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step_loss = loss.item() * ACCUMULATION_STEPS
            losses.append(step_loss)
            print(f"step {len(losses):3d} loss {step_loss:.4f} lr {scheduler.get_last_lr()[0]:.2e}")
    perplexity = evaluate(model, eval_loader, device, autocast)
    print(f"eval perplexity {perplexity:.2f}")
    return FinetuneResult(losses, perplexity)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--no-autocast", action="store_true", help="train in float32 (bitwise closer to the CPU)")
    args = parser.parse_args()
    if args.device.startswith("tpu"):
        import tputrace.backend  # noqa: F401 - registers the tpu device
    finetune(args.device, args.steps, autocast=not args.no_autocast, layers=args.layers, eval_batches=args.eval_batches)


if __name__ == "__main__":
    main()
