"""The positions of a mask's set elements, in a static number of slots, without a sort or a long scan.

`jnp.nonzero(mask, size=...)` runs a cumulative sum over the whole mask and scatters every element:
on XLA:CPU a cumulative sum over millions of elements is several times slower than torch's host
`nonzero`. Here the mask is packed into 32-bit words, whose popcounts give each word's first slot (a
scan over words, 32 times shorter); each slot then finds its word and, inside it, its bit by a binary
search over popcounts (elementwise work). The one scan over the slots is a running total of 0/1
marks, done as a triangular matmul over rows of 32 and a short scan across the rows.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

_WORD_BITS = 32
_INT32_LIMIT = 2**31 - _WORD_BITS
_ROW = 32  # the running total's block: a 32x32 triangular matmul, then a scan 32 times shorter


def _running_total(marks: Array) -> Array:
    """The inclusive cumulative sum of 0/1 int32 marks (exact: each row's sums are at most 32)."""
    length = marks.shape[0]
    rows = jnp.pad(marks, (0, -length % _ROW)).reshape(-1, _ROW).astype(jnp.float32)
    upper = jnp.triu(jnp.ones((_ROW, _ROW), jnp.float32))
    within = jnp.matmul(rows, upper, precision=lax.Precision.HIGHEST).astype(jnp.int32)
    before = jnp.cumsum(within[:, -1]) - within[:, -1]
    return (within + before[:, None]).reshape(-1)[:length]


def _words(flat_mask: Array) -> Array:
    """The mask's bits packed into uint32 words, element i of a word in bit i."""
    padded = jnp.pad(flat_mask.astype(jnp.bool_), (0, -flat_mask.shape[0] % _WORD_BITS))
    packed = jnp.packbits(padded, bitorder="little").reshape(-1, _WORD_BITS // 8)
    return lax.bitcast_convert_type(packed, jnp.uint32)


def _bit_of_rank(words: Array, rank: Array) -> Array:
    """In each word, the position of its set bit of index `rank` (0 for the first set bit)."""
    position = jnp.zeros(words.shape, jnp.uint32)
    step = _WORD_BITS // 2
    while step:
        candidate = position + step
        below = lax.population_count(words & ((jnp.uint32(1) << candidate) - 1)).astype(jnp.int32)
        position = jnp.where(below <= rank, candidate, position)
        step //= 2
    return position.astype(jnp.int32)


def set_positions(flat_mask: Array, size: int, fill_value: int) -> tuple[Array, Array]:
    """(positions, filled): the flat positions of the first `size` set elements of a 1-d mask in
    increasing order, slots past the last set element holding `fill_value`; and whether each slot
    holds a position (False for the filled ones). int64, as torch's indices are."""
    if size == 0 or flat_mask.shape[0] == 0:
        return jnp.full(size, fill_value, jnp.int64), jnp.zeros(size, jnp.bool_)
    if flat_mask.shape[0] >= _INT32_LIMIT:  # slots and counts past int32: XLA's own compaction
        positions = jnp.nonzero(flat_mask, size=size, fill_value=fill_value)[0].astype(jnp.int64)
        return positions, jnp.arange(size) < jnp.count_nonzero(flat_mask)
    words = _words(flat_mask)
    counts = lax.population_count(words).astype(jnp.int32)
    firsts = jnp.cumsum(counts) - counts  # each word's first slot
    word_count = words.shape[0]
    occupied = counts > 0
    occupied_rank = jnp.cumsum(occupied, dtype=jnp.int32) - 1
    occupied_words = jnp.zeros(word_count, jnp.int32).at[jnp.where(occupied, occupied_rank, word_count)].set(
        jnp.arange(word_count, dtype=jnp.int32), mode="drop"
    )
    word_starts = jnp.zeros(size, jnp.int32).at[jnp.where(occupied, firsts, size)].add(1, mode="drop")
    word = occupied_words[jnp.maximum(_running_total(word_starts) - 1, 0)]
    slots = jnp.arange(size, dtype=jnp.int32)
    bit = _bit_of_rank(words[word], slots - firsts[word])
    positions = word.astype(jnp.int64) * _WORD_BITS + bit
    is_set = slots < jnp.sum(counts)
    return jnp.where(is_set, positions, fill_value), is_set
