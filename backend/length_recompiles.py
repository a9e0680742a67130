"""Recompiles for a new length: a program like one compiled before, but for a length the data chose.

A data-dependent op's program is compiled for its output's length rounded up (`size` of
`nonzero_static` and of the sized steps, `output_size` of `repeat_interleave`; see `length_buckets`),
and a view of it for the exact length is a program of its own (`aten.slice.Tensor` with another
`end`) when the chip reads it. Each such length is a structure of its own, so the compile history
(`compile_history`) calls it a first compile. Here it is a recompile of the last program that
differs only in those lengths, with a diff that names them: `size 16 -> 20`, or
`view aten.slice.Tensor: end 37 -> 41`.
"""

from __future__ import annotations

from typing import Any

LENGTH_ARGUMENTS = ("size", "output_size")  # an op's keyword arguments that set its output's length
_VIEW_KINDS = ("chain", "scatter")  # the dispatcher's view read and write plans


class LengthRecompiles:
    """The lengths each family of programs (the same program but for its lengths) compiled for last."""

    def __init__(self) -> None:
        self._last: dict[Any, tuple] = {}

    def reason(self, structure_key: Any, in_specs: tuple) -> tuple[str, str] | None:
        """('recompile', the lengths that changed) when a program of the same family compiled before
        for other lengths; None when this structure has no lengths or its family's first compile."""
        split = _family_and_lengths(structure_key)
        if split is None:
            return None
        family, lengths, describe = split
        family = (family, in_specs)
        previous = self._last.get(family)
        self._last[family] = lengths
        if previous is None or previous == lengths:
            return None
        return "recompile", describe(previous, lengths)


def _family_and_lengths(structure_key: Any) -> tuple[Any, tuple, Any] | None:
    if not isinstance(structure_key, tuple) or len(structure_key) != 2 and len(structure_key) != 3:
        return None
    if len(structure_key) == 2 and structure_key[0] in _VIEW_KINDS:
        kind, steps = structure_key
        family = (kind, tuple((step[0], step[2], step[3]) for step in steps))
        return family, tuple(step[1] for step in steps), lambda old, new: _view_change(steps, old, new)
    if len(structure_key) != 3 or not isinstance(structure_key[2], tuple):
        return None
    op, args, kwargs = structure_key
    lengths = tuple((name, value) for name, value in kwargs if name in LENGTH_ARGUMENTS and type(value) is int)
    if not lengths:
        return None
    others = tuple((name, value) for name, value in kwargs if (name, value) not in lengths)
    return (op, args, others), lengths, _length_change


def _length_change(old: tuple, new: tuple) -> str:
    return ", ".join(f"{name} {before} -> {after}" for (name, before), (_, after) in zip(old, new) if before != after)


def _view_change(steps: tuple, old: tuple, new: tuple) -> str:
    """The first view step whose arguments changed, each changed argument by its schema name."""
    for step, before, after in zip(steps, old, new):
        if before == after:
            continue
        op = step[0]
        names = [argument.name for argument in op._schema.arguments[1:]]
        changes = [
            f"{names[position] if position < len(names) else f'arg {position + 1}'} {value_before} -> {value_after}"
            for position, (value_before, value_after) in enumerate(zip(before, after)) if value_before != value_after
        ]
        if len(before) != len(after):
            changes.append(f"arguments {before} -> {after}")
        return f"view {op}: {', '.join(changes)}"
    return "view arguments changed"
