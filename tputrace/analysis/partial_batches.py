"""Batches whose number of examples changes: the partial batches of a loader that keeps them (the last of an epoch, or
the last of each length bucket a batch sampler fills) are smaller in dim 0 of the batch and of its labels alike, while
full batches, of the largest size, run most. The fix is to drop or pad them, not to pad a sequence length."""

from __future__ import annotations

from collections import Counter

from tputrace.analysis.storms import Storm

THEN = (". Batches of fewer examples (the last of an epoch, or the last of each bucket a batch sampler fills) are no "
        "problem on a GPU; on a TPU each number of examples is a new XLA program.")


def full_batch(storm: Storm) -> int | None:
    """The full batch's number of examples when the storm's changing dim is dim 0 of at least two inputs (a batch and
    its labels) and the programs ran most at its largest size; None otherwise."""
    dim = storm.main
    if len(dim.positions) < 2 or any(position != 0 for _, position in dim.positions):
        return None
    runs: Counter[int] = Counter()
    for row, size in zip(storm.rows, dim.values):
        runs[size] += max(row.runs, 1)
    largest = max(runs)
    return largest if runs[largest] == max(runs.values()) else None


def suggestion(batches: str, full: int) -> str:
    """The fix for `batches` whose partial batches are smaller than `full` examples."""
    return (f"Keep every one of {batches} at {full} examples: drop the partial batches (`drop_last=True` on the "
            f"DataLoader, or only full batches from a batch sampler), or pad them to {full} rows with examples weighted "
            "0 in the loss. A few fixed lengths (a bucketing sampler's) compile once each, which is fine.")
