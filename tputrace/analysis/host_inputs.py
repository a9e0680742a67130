"""Shapes the host chose: the batches a script copies to the chip, matched to recompilation storms.

A storm whose changing dim is the shape of data copied from the host (a `collate_fn` that pads each
batch to its own longest sequence is the usual cause) is fixed in the data pipeline, and the line that
copies the batch is where it enters the chip. The transfers table records every host-to-chip copy
with its bytes, step and line: a compile is explained by a copy made in its own step with exactly the
bytes of one of its varying inputs, from a line whose matched copies came in several sizes (a copy of one size,
such as a weight that happens to have an input's bytes, explains no changing size). One batch reaches several programs (the forward's, the backward's,
a mask's); a program whose varying inputs are all made on the chip (a `bool` mask of the batch) is
matched by its sizes instead: the sizes, step by step, of the programs already matched to a copy line.
The line to change is where the batch was made: the copies' `origin_frame_id`, recorded when a watched host
function (a `collate_fn`'s `pad_sequence`, `torch.stack`, `torch.tensor`) made it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.shapes import parse_specs

MIN_MATCHED_SHARE = 0.8  # share of a storm's compiles a copy line must explain
MIN_MATCHED_SIZES = 2  # ... covering at least this many distinct sizes


@dataclass(frozen=True)
class CopyMatch:
    """The copy line matched to a storm: its frame, the most dims a matched input had, and the (step, bytes) of the
    copies that matched."""

    frame_id: int
    dims: int
    copies: frozenset[tuple[int, int]]


def copies_by_step(context: AnalysisContext) -> dict[int, dict[int, set[int]]]:
    """The rank's host-to-chip copies: step -> bytes -> the frames that copied that many bytes (cached)."""
    cached = context.cache.get("host_copies")
    if cached is not None:
        return cached  # type: ignore[return-value]
    copies: dict[int, dict[int, set[int]]] = {}
    rows = context.trace.sql(
        "SELECT COALESCE(step, 0), bytes, frame_id FROM transfers "
        "WHERE rank = ? AND direction = 'h2d' AND bytes > 0 AND frame_id IS NOT NULL GROUP BY 1, 2, 3",
        (context.rank,),
    )
    for step, size, frame_id in rows:
        copies.setdefault(step, {}).setdefault(size, set()).add(frame_id)
    context.cache["host_copies"] = copies
    return copies


def copy_line(context: AnalysisContext, signatures: Sequence[str], steps: Sequence[int],
              varying_inputs: set[int], sizes: Sequence[int]) -> CopyMatch | None:
    """The frame whose host-to-chip copies have the bytes of a varying input (indices `varying_inputs` of each
    signature) in the compile's own step, for `MIN_MATCHED_SHARE` of the compiles and `MIN_MATCHED_SIZES` of
    their `sizes` (the varying dim, per compile), with the most dims such an input had (a copied batch keeps its
    own dims; a flattened view of it has the same bytes and fewer); None when no line does."""
    copies = copies_by_step(context)
    votes: Counter[int] = Counter()
    matched_sizes: dict[int, set[int]] = {}
    matched_copies: dict[int, set[tuple[int, int]]] = {}
    dims: dict[int, int] = {}
    for signature, step, size in zip(signatures, steps, sizes):
        by_bytes = copies.get(step, {})
        specs = parse_specs(signature)
        frames: set[int] = set()
        for index in varying_inputs:
            spec = specs[index] if index < len(specs) else None
            if spec is None:
                continue
            for frame_id in by_bytes.get(spec.nbytes, set()):
                frames.add(frame_id)
                dims[frame_id] = max(dims.get(frame_id, 0), len(spec.shape))
                matched_copies.setdefault(frame_id, set()).add((step, spec.nbytes))
        for frame_id in frames:
            votes[frame_id] += 1
            matched_sizes.setdefault(frame_id, set()).add(size)
    for frame_id, pairs in matched_copies.items():  # a copy of one size explains no changing size
        if len({size for _, size in pairs}) < MIN_MATCHED_SIZES:
            del votes[frame_id]
    best = _best(votes, matched_sizes, len(signatures))
    return None if best is None else CopyMatch(best, dims[best], frozenset(matched_copies[best]))


def origin_line(context: AnalysisContext, copy_frame: int, copies: set[tuple[int, int]]) -> int | None:
    """The line that made the batches copied at `copy_frame` in these (step, bytes) copies (`transfers.origin_frame_id`:
    a collate_fn's pad, a `torch.tensor` of padded lists), when the recording knew it for most of them; None for a
    trace without origins."""
    if not copies or not _has_origins(context):
        return None
    votes: Counter[int] = Counter()
    rows = context.trace.sql(
        "SELECT COALESCE(step, 0), bytes, origin_frame_id FROM transfers "
        "WHERE rank = ? AND direction = 'h2d' AND frame_id = ? AND origin_frame_id IS NOT NULL",
        (context.rank, copy_frame),
    )
    for step, size, origin in rows:
        if (step, size) in copies:
            votes[origin] += 1
    if not votes:
        return None
    origin, count = votes.most_common(1)[0]
    return origin if count >= MIN_MATCHED_SHARE * len(copies) else None


def _has_origins(context: AnalysisContext) -> bool:
    cached = context.cache.get("transfer_origins")
    if cached is None:
        cached = context.cache["transfer_origins"] = any(
            row[1] == "origin_frame_id" for row in context.trace.sql("PRAGMA table_info(transfers)"))
    return bool(cached)


def line_of_sizes(known: dict[int, set[tuple[int, int]]], steps: Sequence[int], sizes: Sequence[int]) -> int | None:
    """The copy line (a key of `known`, whose (step, size) pairs its matched programs compiled for) that explains
    the same share of these compiles' (step, size) pairs; None when none does. A pair is explained by the same pair,
    or by a size the line's programs had compiled for in an earlier step (they ran it from their cache then, where a
    program that first saw it later compiled), so long as `MIN_MATCHED_SIZES` sizes match step for step."""
    votes: Counter[int] = Counter()
    matched_sizes: dict[int, set[int]] = {}
    exact: Counter[int] = Counter()
    for step, size in zip(steps, sizes):
        for frame_id, pairs in known.items():
            if (step, size) in pairs:
                exact[frame_id] += 1
            elif not any(seen == size and earlier < step for earlier, seen in pairs):
                continue
            votes[frame_id] += 1
            matched_sizes.setdefault(frame_id, set()).add(size)
    for frame_id in [frame_id for frame_id in votes if exact[frame_id] < MIN_MATCHED_SIZES]:
        del votes[frame_id]
    return _best(votes, matched_sizes, len(sizes))


def _best(votes: Counter[int], matched_sizes: dict[int, set[int]], compiles: int) -> int | None:
    if not votes:
        return None
    frame_id, matched = votes.most_common(1)[0]
    if matched < MIN_MATCHED_SHARE * compiles or len(matched_sizes[frame_id]) < MIN_MATCHED_SIZES:
        return None
    return frame_id
