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

    def compiled_for(self, in_specs: tuple) -> bool:
        """Whether the structure compiled for this signature before (then only its precision or its
        eviction makes it compile again)."""
        return in_specs in self.signatures

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
    of that step's; several structures in one step (`x.sum(0)` and `x.sum(1)` on one line) are not.
    Per structure and line, the signatures it compiled for and in which step: an op's program for new
    shapes is a recompile of one its line compiled in an earlier step, never of the same op's (or
    view's) at another line, nor of another program its line compiled in the same step (the two
    `nn.Linear` layers of one `model(x)` call)."""

    def __init__(self) -> None:
        self._sites: StepSites[Any] = StepSites()
        # (step, module path id, signature, precision) of each compile of a structure at a line
        self._histories: dict[tuple[Any, Hashable], list[tuple[int, int | None, tuple, str | None]]] = {}

    def signature_reason(self, structure_key: Any, site: Hashable, step: int, in_specs: tuple, precision: str | None,
                         module: int | None = None) -> tuple[str, str | None]:
        """('recompile', what differs from the nearest signature this structure compiled for at this line in an
        earlier step, or in the same module call path: a loop without steps feeding one model new shapes) or
        ('first', None), and remember this one."""
        compiles = self._histories.setdefault((structure_key, site), [])
        earlier = [(specs, setting) for compiled_step, compiled_module, specs, setting in compiles
                   if compiled_step < step or (module is not None and compiled_module == module)]
        compiles.append((step, module, in_specs, precision))
        if not earlier:
            return "first", None
        nearest = nearest_signature([specs for specs, _ in earlier], in_specs)
        previous = next(setting for specs, setting in reversed(earlier) if specs is nearest)
        return "recompile", matmul_precision.recompile_diff(signature_diff(nearest, in_specs, None), previous, precision)

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
