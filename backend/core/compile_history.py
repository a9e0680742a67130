"""Why a program compiled: first, or a recompile and what differs from the nearest earlier compile of
the same structure (its input signature, the float32 matmul precision, or its eviction), or, for an
op's own program, from the one the same op compiled at the same line in an earlier step (its
non-tensor arguments: `torch.arange(T)` with a new `T`)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from tputrace.backend.core import matmul_precision, program_cache
from tputrace.backend.core.signatures import InputSpec, key_change, nearest_signature, signature_diff
from tputrace.backend.eager.step_sites import StepSites


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


class SiteCompiles:
    """Per op and line, the structures (op and non-tensor arguments) it compiled in its last two steps.
    A new structure at a line that compiled the op in an earlier step is a recompile of the most alike
    of that step's; several structures in one step (`x.sum(0)` and `x.sum(1)` on one line) are not."""

    def __init__(self) -> None:
        self._sites: StepSites[Any] = StepSites()

    def reason(self, site: Hashable, step: int, structure_key: Any) -> tuple[str, str | None]:
        """('recompile', the arguments that changed) or ('first', None), and remember the key."""
        candidates = self._sites.earlier(site, step)
        self._sites.remember(site, step, structure_key)
        if not candidates:
            return "first", None
        nearest = max(candidates, key=lambda old: _likeness(old, structure_key))
        return "recompile", f"non-tensor arguments {key_change(nearest, structure_key)}"


def _likeness(old: Any, new: Any) -> int:
    """How many top-level parts of two keys are equal (their arguments, for an op's key)."""
    if not (isinstance(old, tuple) and isinstance(new, tuple)):
        return int(old == new)
    return sum(_likeness(a, b) if isinstance(a, tuple) and isinstance(b, tuple) else int(a == b) for a, b in zip(old, new))
