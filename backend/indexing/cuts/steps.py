"""Programs on the padded buffers of cuts that take the cut's length as a traced number."""

from __future__ import annotations

from typing import Any

from tputrace.backend.core.entries import OpEntry
from tputrace.backend.ops.registry import Lowering


def padded_step(op: Any, fn: Any, length_at: int, *, matmul_precision: bool = False) -> OpEntry:
    """A program of `op` on padded buffers, recorded under its name, that takes the length as a
    traced number at `length_at` (one program per padded length)."""
    lowering = Lowering(op, fn, matmul_precision=matmul_precision)
    return OpEntry(op, str(op), "lowered", lowering=lowering, shapes_from_lowering=True, scalar_positions=frozenset({length_at}))
