"""The random numbers a `torch.cond` on tpu draws: the (seed, first counter) its branches draw
with, and the same pair again for the backward of that call.

The branches draw from the chip's default generator as consecutive eager ops would (see
`compile.control_flow.Subgraph`). The predicate stays on the chip, so the host cannot know which
branch runs: each call takes as many counters as its branch with the most random ops, whichever
branch is taken.

torch's backward of `cond` (`CondAutogradOp`) runs the branch's forward again inside the backward
branch, so a dropout there would draw a new mask (torch on the CPU does, and its gradients then
disagree with its outputs). On tpu the backward call draws with its forward's pair instead. It is
recognised as the call the autograd engine makes with the forward's predicate and operands (the
same tensor objects, which the backward saved) followed by the output gradients.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tputrace.backend.core import rng


@dataclass(frozen=True)
class _ForwardDraws:
    """One forward call's operands (weak references to its tensors, numbers as they were) and the
    (seed, first counter, number of random ops) its branches drew with."""

    operands: tuple[Any, ...]
    seed: int
    first_counter: int
    draws: int

    def alive(self) -> bool:
        return all(not isinstance(operand, weakref.ref) or operand() is not None for operand in self.operands)

    def is_forward_of(self, values: Sequence[Any]) -> bool:
        """Whether `values` are this call's operands followed by gradients (the backward's inputs)."""
        if len(values) <= len(self.operands):
            return False
        for kept, value in zip(self.operands, values):
            if isinstance(kept, weakref.ref):
                if kept() is not value:
                    return False
            elif isinstance(value, torch.Tensor) or kept != value:
                return False
        return True


# By the predicate's id, with a weak reference to it (a WeakKeyDictionary would compare tensors with
# `==`, an op and a host read): the calls of each live predicate.
_forward_draws: dict[int, tuple[weakref.ref, list[_ForwardDraws]]] = {}


def _calls_of(pred: torch.Tensor) -> list[_ForwardDraws]:
    held = _forward_draws.get(id(pred))
    return held[1] if held is not None and held[0]() is pred else []


def _forget(pred_ref: weakref.ref, pred_id: int) -> None:
    held = _forward_draws.get(pred_id)
    if held is not None and held[0] is pred_ref:
        del _forward_draws[pred_id]


def seed_and_counter(pred: torch.Tensor, operands: Sequence[Any], chip: int, draws: int) -> tuple[int, int]:
    """The (seed, first counter) for a cond call on `chip` whose branches draw `draws` random
    numbers at most: its forward's pair when this is the backward of a call seen here, else the
    next `draws` counters of the chip's default generator."""
    if torch._C._current_graph_task_id() != -1:
        forward = next((entry for entry in _calls_of(pred) if entry.is_forward_of(operands)), None)
        if forward is not None:
            if forward.draws != draws:
                raise RuntimeError(
                    f"torch.cond's backward on tpu draws {draws} random numbers where its forward drew {forward.draws}, so it cannot draw the forward's again"
                )
            return forward.seed, forward.first_counter
    seed, first_counter = rng.next_seed_and_counter(chip, draws)
    kept = tuple(weakref.ref(value) if isinstance(value, torch.Tensor) else value for value in operands)
    entries = [entry for entry in _calls_of(pred) if entry.alive()]
    entries.append(_ForwardDraws(kept, seed, first_counter, draws))
    pred_id = id(pred)
    _forward_draws[pred_id] = (weakref.ref(pred, lambda pred_ref: _forget(pred_ref, pred_id)), entries)
    return seed, first_counter
