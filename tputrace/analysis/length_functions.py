"""Programs whose changing dims are functions of one changing length: a multiple of it (a flattened batch times
length, length times a head dim), its square or a multiple of the square (attention scores, length by length), of
the length or of the length one shorter or longer (a language model's inputs and targets, `tokens[:, :-1]` and
`tokens[:, 1:]`; a class token put before the sequence).

In strict mode every op is its own program, so the views and matmuls around an attention layer compile per length
with dims that are not the length itself. A storm joins the group of a length (a copied batch's, or one made on the
chip) when, compile by compile, some dim of its inputs is the same function of the length the group had in that
step, over `MIN_FUNCTION_LENGTHS` lengths: two lengths that change independently stay two groups, as no fixed
function maps one onto the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from tputrace.analysis.host_inputs import MIN_MATCHED_SHARE
from tputrace.analysis.shapes import parse_specs
from tputrace.analysis.storms import CompileRow

MIN_FUNCTION_LENGTHS = 3  # distinct lengths one function must map, to say a dim follows the length
POWERS = (1, 2)  # the length, its square
OFFSETS = (0, -1, 1)  # the length itself, one token shorter (shifted inputs and targets), one longer (a class token)

# A function of a length at one input dim: (input index, dim, offset to the length, power of it, factor).
_Function = tuple[int, int, int, int, int]


def group_of_length(known: dict[int, set[tuple[int, int]]], rows: Sequence[CompileRow]) -> int | None:
    """The group (a key of `known`, whose (step, length) pairs its programs compiled for) whose length explains
    `MIN_MATCHED_SHARE` of these compiles by a fixed function at some input dim; None when none does (the group
    explaining the most compiles wins)."""
    best: tuple[int, int] | None = None
    for key, pairs in known.items():
        explained = _explained(_lengths_by_step(pairs), rows)
        if explained >= MIN_MATCHED_SHARE * len(rows) and (best is None or explained > best[1]):
            best = (key, explained)
    return None if best is None else best[0]


def _lengths_by_step(pairs: set[tuple[int, int]]) -> dict[int, set[int]]:
    by_step: dict[int, set[int]] = {}
    for step, length in pairs:
        by_step.setdefault(step, set()).add(length)
    return by_step


def _lengths_at(by_step: dict[int, set[int]], step: int) -> set[int]:
    """The group's lengths in a compile's step (or the step before: ops after a step boundary in the same loop
    iteration); else every length of earlier steps (a program that first met a length the group had met before)."""
    lengths = by_step.get(step, set()) | by_step.get(step - 1, set())
    if lengths:
        return lengths
    return {length for earlier, seen in by_step.items() if earlier < step for length in seen}


def _explained(by_step: dict[int, set[int]], rows: Sequence[CompileRow]) -> int:
    """How many compiles have an input dim that a function of the group's length explains, the function holding
    for `MIN_FUNCTION_LENGTHS` distinct lengths across the compiles."""
    functions_per_row: list[set[_Function]] = []
    lengths_of: dict[_Function, set[int]] = {}
    for row in rows:
        functions: set[_Function] = set()
        lengths = [length for length in _lengths_at(by_step, row.step) if length > 1]
        for index, spec in enumerate(parse_specs(row.signature)):
            if spec is None:
                continue
            for dim, size in enumerate(spec.shape):
                for length in lengths:
                    for offset in OFFSETS:
                        for power in POWERS:
                            unit = (length + offset) ** power
                            if unit > 1 and size >= unit and size % unit == 0:
                                function = (index, dim, offset, power, size // unit)
                                functions.add(function)
                                lengths_of.setdefault(function, set()).add(length)
        functions_per_row.append(functions)
    held = {function for function, lengths in lengths_of.items() if len(lengths) >= MIN_FUNCTION_LENGTHS}
    return sum(1 for functions in functions_per_row if functions & held)
