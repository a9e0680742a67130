"""Storms whose changing shape is the flat ids of `nn.EmbeddingBag` (or `F.embedding_bag`): each batch's bags hold
as many ids as its examples have features, so the ids' length changes with every batch while the offsets (one per
bag) keep theirs. Padding with a mask does not apply; ids of the bag's `padding_idx` add nothing to a bag."""

from __future__ import annotations

from tputrace.analysis.storms import ShapeEntry

_BAG_OPS = ("aten._embedding_bag", "aten.embedding_bag")
_IDS_ARGUMENT = "arg 1 dim 0"  # `indices` of `_embedding_bag(weight, indices, offsets, ...)`

THEN = (". Embedding bags of a length that changes from batch to batch (a recommender's multi-hot features) are no "
        "problem on a GPU; on a TPU each length is a new XLA program.")


def bag_ids(entry: ShapeEntry | None) -> bool:
    """Whether the changing shape enters the programs as the flat ids of an embedding bag."""
    return entry is not None and entry.op.startswith(_BAG_OPS) and entry.argument.endswith(_IDS_ARGUMENT)


def suggestion(batches: str, bucketing: str) -> str:
    """Pad the flat ids to a few lengths with ids the bags ignore."""
    return (f"Pad {batches} to a few fixed lengths, {bucketing}. They are the flat ids of embedding bags: append the "
            "padding to the last bag with the id of the bag's `padding_idx` (`nn.EmbeddingBag(..., padding_idx=p)` "
            "leaves it out of the sum and the mean), or with any id and a zero in `per_sample_weights` (mode "
            "'sum'); the offsets stay as they are, so every bag's value is unchanged.")
