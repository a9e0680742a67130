"""The batch a step's model takes, so that a smaller-batch suggestion divides no more than the batch has: the
leading dim of the first input, not shaped like a parameter, of the step's first ops inside a module (the data
a model's first layer reads: `x` of `layer_norm(x, weight, bias)`, the token ids of `embedding(weight, ids)`)."""

from __future__ import annotations

import re
from collections.abc import Collection

from tputrace.store.reader import Trace

# How many of the step's first ops inside modules are looked at.
FIRST_OPS = 16
_SHAPE = re.compile(r"\w+\[([\d,]*)\]")


def model_batch(trace: Trace, rank: int, step: int, parameter_shapes: Collection[tuple[int, ...]]) -> int | None:
    """The batch of `step`'s first module call, or None when no op inside a module there reads data of 2 dims or
    more that is not shaped like a parameter."""
    rows = trace.sql("SELECT inputs FROM ops_v WHERE rank = ? AND step = ? AND module IS NOT NULL ORDER BY seq "
                     f"LIMIT {FIRST_OPS}", (rank, step))
    for (inputs,) in rows:
        for match in _SHAPE.finditer(inputs or ""):
            shape = tuple(int(size) for size in match.group(1).split(",") if size)
            if len(shape) >= 2 and shape not in parameter_shapes:
                return shape[0]
    return None
