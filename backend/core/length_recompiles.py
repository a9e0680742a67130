"""Recompiles for a new length: a program like one compiled before, but for a length the data chose.

A data-dependent op's program is compiled for its output's length rounded up (`size` of
`nonzero_static` and of the sized steps, `output_size` of `repeat_interleave`; see `length_buckets`),
and a view of it for the exact length is a program of its own (`aten.slice.Tensor` with another
`end`) when the chip reads it. Each such length is a structure of its own, so the compile history
(`compile_history`) calls it a first compile. Here it is a recompile of the last program that
differs only in those lengths, with a diff that names them: `size 16 -> 20`, or
`view aten.slice.Tensor: end 37 -> 41` (and `; buffer dim 0: 40 -> 48` when the padded length changed
too). A fused graph (DEFER_AND_FUSE) whose ops are an earlier one's but for such lengths names the
first op whose lengths changed and its line (`op 0 aten.index.Tensor (train.py:14): size 16 -> 20`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from tputrace.backend.core.signatures import is_tensor_spec, signature_diff
from tputrace.backend.eager.step_sites import StepSites

LENGTH_ARGUMENTS = ("size", "output_size")  # an op's keyword arguments that set its output's length
_VIEW_KINDS = ("chain", "scatter")  # the dispatcher's view read and write plans
Describe = Callable[[tuple, tuple], str]  # (lengths before, lengths now) -> what changed


class LengthRecompiles:
    """The lengths each family of programs (the same program but for its lengths) compiled for last."""

    def __init__(self) -> None:
        self._last: dict[Any, tuple] = {}  # fused graphs' families
        self._sites: StepSites[tuple] = StepSites()  # single-op programs' families, per line and step

    def reason(self, structure_key: Any, in_specs: tuple, site: Hashable = None, step: int = 0) -> tuple[str, str] | None:
        """('recompile', the lengths that changed) when a program of the same family compiled at the
        same `site` (an op's line) last for other lengths; None when this structure has no lengths or
        its family's first compile there. In one step only a data-dependent op's new length, or a new
        cut of a buffer of the same shape, counts: there a view of another buffer is another program
        (the weights of the layers one call runs), each a first compile."""
        split = _family_and_lengths(structure_key, in_specs)
        if split is None:
            return None
        family, lengths, describe = split
        is_view = structure_key[0] in _VIEW_KINDS
        alike = [old for old in self._sites.current((site, family), step) if not is_view or old[1] == lengths[1]]
        previous = (alike or self._sites.earlier((site, family), step) or [None])[-1]
        self._sites.remember((site, family), step, lengths)
        return None if previous is None or previous == lengths else ("recompile", describe(previous, lengths))

    def fused_reason(self, nodes: Sequence[tuple[Any, tuple]], rest: tuple, in_specs: tuple, op_text: Callable[[int], str] | None = None) -> tuple[str, str] | None:
        """`reason` for a fused graph (`deferred`): its ops (plan, input refs), the rest of its
        structure and its inputs; the diff names the first op whose lengths changed, as `op_text` of
        its node gives it (`op 0 aten.index.Tensor (train.py:14)`). Graphs of the same ops are one
        family when only lengths and the shapes that follow from them differ."""
        splits = [_family_and_lengths(plan.structure_key, plan.in_specs) for plan, _ in nodes]
        if all(split is None for split in splits):
            return None
        ops = tuple((plan.structure_key if split is None else split[0], refs) for (plan, refs), split in zip(nodes, splits))
        lengths = tuple(None if split is None else split[1] for split in splits)
        previous = self._previous((ops, rest, _ranks_and_dtypes(in_specs)), lengths)
        if previous is None:
            return None
        index, plan, describe, before, after = next(
            (index, plan, split[2], before, after)
            for index, ((plan, _), split, before, after) in enumerate(zip(nodes, splits, previous, lengths))
            if split is not None and before != after
        )
        return "recompile", f"{op_text(index) if op_text else f'op {index} {plan.op_name}'}: {describe(before, after)}"

    def _previous(self, family: Any, lengths: tuple) -> tuple | None:
        """The lengths `family` compiled for last when they differ from `lengths` (now its last), else None."""
        previous = self._last.get(family)
        self._last[family] = lengths
        return None if previous == lengths else previous


def _family_and_lengths(structure_key: Any, in_specs: tuple) -> tuple[Any, tuple, Describe] | None:
    """(family, lengths, how to describe a change of lengths) of a plan: a view's steps, with its
    steps' arguments and its buffer's shape as the lengths (a new padded length is a new buffer shape);
    or an op and its input signature, with its length arguments as the lengths; None for other programs."""
    if not isinstance(structure_key, tuple) or len(structure_key) not in (2, 3):
        return None
    if len(structure_key) == 2 and structure_key[0] in _VIEW_KINDS:
        kind, steps = structure_key
        family = (kind, tuple((step[0], step[2], step[3]) for step in steps), _ranks_and_dtypes(in_specs))
        return family, (tuple(step[1] for step in steps), in_specs), lambda old, new: _view_change(steps, old, new)
    if len(structure_key) != 3 or not isinstance(structure_key[2], tuple):
        return None
    op, args, kwargs = structure_key
    lengths = tuple((name, value) for name, value in kwargs if name in LENGTH_ARGUMENTS and type(value) is int)
    if not lengths:
        return None
    others = tuple((name, value) for name, value in kwargs if (name, value) not in lengths)
    return (op, args, others, in_specs), lengths, _length_change


def _ranks_and_dtypes(in_specs: tuple) -> tuple:
    """Input specs without their sizes: what a change of lengths leaves as it was."""
    return tuple((len(spec[0]), *spec[1:]) if is_tensor_spec(spec) else spec for spec in in_specs)


def _length_change(old: tuple, new: tuple) -> str:
    return ", ".join(f"{name} {before} -> {after}" for (name, before), (_, after) in zip(old, new) if before != after)


def _view_change(steps: tuple, old: tuple, new: tuple) -> str:
    """The view steps' arguments that changed, by their schema names, and the buffer's sizes."""
    (old_args, old_specs), (new_args, new_specs) = old, new
    changes = []
    for step, before, after in zip(steps, old_args, new_args):
        names = [argument.name for argument in step[0]._schema.arguments[1:]]
        changes.extend(
            f"{names[position] if position < len(names) else f'arg {position + 1}'} {value_before} -> {value_after}"
            for position, (value_before, value_after) in enumerate(zip(before, after)) if value_before != value_after
        )
    parts = [", ".join(changes)] if changes else []
    if old_specs != new_specs:
        parts.append(signature_diff(old_specs, new_specs, ["buffer"]))
    return f"view {', '.join(str(step[0]) for step in steps)}: {'; '.join(parts)}"
