"""The lengths data-dependent outputs are compiled for: a few per doubling, not one per count.

`nonzero`, `x[mask]`, `unique` and the like compile a program for their output's length, which the
values decide. Compiled for the exact length, a run whose counts vary compiles once per count (a
recompilation storm). Compiled for the length rounded up to a geometric series (16, 20, 24, 28, 32,
40, 48, ...: four lengths per doubling, at most 25% more work), a run compiles O(log n) programs; the
output is then the first `length` entries of the padded one.
"""

from __future__ import annotations

SHORTEST = 16  # shorter outputs are all compiled at this length
_STEPS_PER_DOUBLING_BITS = 2  # 2**2 = 4 lengths per doubling


def padded_length(length: int, longest: int | None = None) -> int:
    """The length to compile for an output of `length` entries: `length` rounded up to the series,
    and at most `longest` (the most entries the output can have, when the input bounds it)."""
    if length <= SHORTEST:
        padded = SHORTEST
    else:
        step = 1 << max((length - 1).bit_length() - 1 - _STEPS_PER_DOUBLING_BITS, 0)
        padded = -(-length // step) * step
    return padded if longest is None else max(min(padded, longest), length)
