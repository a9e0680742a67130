"""Why a program compiled: first, or a recompile and what differs from the nearest earlier compile of
the same structure (its input signature, the float32 matmul precision, or its eviction)."""

from __future__ import annotations

from collections.abc import Sequence

from tputrace.backend import matmul_precision, program_cache
from tputrace.backend.signatures import InputSpec, nearest_signature, signature_diff


class CompileHistory:
    """The signatures one structure (an op's, a fused graph's, a `torch.compile` graph's) compiled for,
    in order, each with the matmul precision it compiled at."""

    def __init__(self) -> None:
        self.signatures: list[tuple[InputSpec, ...]] = []
        self.precisions: list[str | None] = []

    def reason(self, in_specs: tuple, names: Sequence[str] | None = None, precision: str | None = None, *,
               evicted: bool = False) -> tuple[str, str | None]:
        """('first', None) for the structure's first compile, else ('recompile', what differs from the
        nearest earlier signature, led by the precision when that compile's differs); a program the cache
        dropped (`evicted`) is a recompile that says so."""
        if evicted:
            return "recompile", program_cache.evicted_diff()
        nearest = nearest_signature(self.signatures, in_specs) if self.signatures else None
        previous = None if nearest is None else self.precisions[_last_index(self.signatures, nearest)]
        self.signatures.append(in_specs)
        self.precisions.append(precision)
        if nearest is None:
            return "first", None
        return "recompile", matmul_precision.recompile_diff(signature_diff(nearest, in_specs, names), previous, precision)


def _last_index(signatures: list, signature: object) -> int:
    return max(index for index, candidate in enumerate(signatures) if candidate is signature)
