"""Placements as the trace writes them (`Shard(0),Partial(sum)`: one per mesh dim), compared mesh dim by mesh dim.

A redistribution on a mesh of several dims changes some dims and keeps others; which ones it changes says what
it is. A gradient that goes from `Partial` to `Replicate()` on a mesh dim where its parameter is replicated is
the data-parallel reduction of that gradient over the ranks that saw different batches: every data-parallel
step needs it, as DDP's all-reduce, and no placement of the parameter removes it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChangedDim:
    """One mesh dim whose placement a redistribution changes."""

    mesh_dim: int
    src: str
    dst: str


def split_placements(text: str) -> list[str]:
    """`Shard(0),StridedShard(1, split_factor=2)` -> its placements, one per mesh dim (commas inside brackets kept)."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        depth += (char == "(") - (char == ")")
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def changed_dims(src: str, dst: str) -> list[ChangedDim]:
    """The mesh dims whose placement differs between `src` and `dst` (every dim when their counts differ)."""
    sources, targets = split_placements(src), split_placements(dst)
    if len(sources) != len(targets):
        return [ChangedDim(index, source, target) for index, (source, target) in enumerate(zip(sources, targets))]
    return [ChangedDim(index, source, target) for index, (source, target) in enumerate(zip(sources, targets)) if source != target]


def is_partial(placement: str) -> bool:
    return placement.startswith("Partial(")


def reduction_dims(src: str, dst: str) -> list[int]:
    """The mesh dims on which `src` is a partial sum that `dst` makes whole (Partial -> Replicate())."""
    return [dim.mesh_dim for dim in changed_dims(src, dst) if is_partial(dim.src) and dim.dst == "Replicate()"]


def only_reduces(src: str, dst: str) -> bool:
    """Whether every mesh dim that changes goes from a partial sum to Replicate(): a gradient's data-parallel reduction."""
    changed = changed_dims(src, dst)
    return bool(changed) and len(reduction_dims(src, dst)) == len(changed)


def reduced(src: str, dst: str) -> str:
    """`src` with each partial-sum dim that `dst` makes whole replaced by `dst`'s placement there: the placement a
    gradient has once its data-parallel reduction is done."""
    sources, targets = split_placements(src), split_placements(dst)
    if len(sources) != len(targets):
        return src
    return ",".join(target if is_partial(source) and target == "Replicate()" else source for source, target in zip(sources, targets))
