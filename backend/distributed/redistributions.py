"""Redistributions a different plan avoids, told apart while they run, within one step on one thread:

- a round trip: a DTensor gathered from a Shard to Replicate and later split back to the same Shard on
  the same mesh (same global shape and placements): the split moves no data, so it has no collective of
  its own; it is recorded as a `round_trip` cause (with no collective) whose line is the split's;
- a partial sum reduced again: a Partial DTensor's local tensor reduced (Partial -> Replicate or Shard)
  a second time, or an all-reduce issued on a tensor that a DTensor reduction produced: the repeated
  collective gets a `reduce_again` cause.

Tensors are held weakly and forgotten at each step boundary. The state is the process's, not a thread's:
the backward runs on autograd's thread and reduces the Partial tensors the forward saved again (a
`square()` of a row-parallel output reduces it in the forward and once more in its gradient).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from tputrace.backend.distributed import causes
from tputrace.recording.interface import Recording

GATHER, SPLIT, REDUCE, OTHER = "gather", "split", "reduce", "other"


class _StepState:
    step: int = -1
    recorder: Any = None
    # (id(mesh), global shape, source placements, target placements, phase) of the gathers so far
    gathers: set[tuple[Any, ...]] | None = None
    reduced_inputs: dict[int, weakref.ref[torch.Tensor]] | None = None  # Partial local tensors reduced so far
    reduced_outputs: dict[int, weakref.ref[torch.Tensor]] | None = None  # what those reductions produced


_state = _StepState()
_kinds: dict[tuple[Any, Any], str] = {}  # (source placements, target placements) -> GATHER, SPLIT, REDUCE or OTHER
_round_trips: set[tuple[Any, ...]] = set()  # (id(recorder), cause, frame id) already recorded


def kind_of(source: Any, target: Any) -> str:
    """What a redistribution between two placement tuples does: gathers a Shard to Replicate, splits a
    Replicate into a Shard (no data moves), reduces a Partial, or anything else."""
    key = (source, target)
    kind = _kinds.get(key)
    if kind is None:
        kind = _kinds[key] = _classify(source, target)
    return kind


def _classify(source: Any, target: Any) -> str:
    changed = [(before, after) for before, after in zip(source, target, strict=False) if before != after]
    if not changed:
        return OTHER
    if any(before.is_partial() and not after.is_partial() for before, after in changed):
        return REDUCE
    if all(before.is_shard() and after.is_replicate() for before, after in changed):
        return GATHER
    if all(before.is_replicate() and after.is_shard() for before, after in changed):
        return SPLIT
    return OTHER


def _fresh(recorder: Recording) -> _StepState:
    """This thread's state for the recorder's current step (emptied when the step changed)."""
    state = _state
    if state.step != recorder.step_index or state.recorder is not recorder or state.gathers is None:
        state.step, state.recorder = recorder.step_index, recorder
        state.gathers, state.reduced_inputs, state.reduced_outputs = set(), {}, {}
    return state


def _held(refs: dict[int, weakref.ref[torch.Tensor]], tensor: Any) -> bool:
    if tensor is None:
        return False
    known = refs.get(id(tensor))
    return known is not None and known() is tensor


def _key(current_spec: Any, target_spec: Any, phase: str) -> tuple[Any, ...]:
    meta = current_spec.tensor_meta
    shape = tuple(meta.shape) if meta is not None else None
    return (id(current_spec.mesh), shape, current_spec.placements, target_spec.placements, phase)


def before(recorder: Recording, local_tensor: torch.Tensor, current_spec: Any, target_spec: Any, cause: causes.Cause) -> causes.Cause:
    """The cause of a redistribution about to run: `cause`, or a `reduce_again` one when it reduces a
    Partial tensor already reduced this step."""
    if kind_of(current_spec.placements, target_spec.placements) != REDUCE:
        return cause
    state = _fresh(recorder)
    if not _held(state.reduced_inputs, local_tensor):  # type: ignore[arg-type]
        return cause
    return (causes.REDUCE_AGAIN, *cause[1:])


def after(recorder: Recording, local_tensor: torch.Tensor, result: Any, current_spec: Any, target_spec: Any, cause: causes.Cause) -> None:
    """Note what a redistribution that ran did, and record a round trip when it split back a gather."""
    kind = kind_of(current_spec.placements, target_spec.placements)
    if kind == OTHER:
        return
    state = _fresh(recorder)
    phase = cause[1]
    if kind == GATHER:
        state.gathers.add(_key(current_spec, target_spec, phase))  # type: ignore[union-attr]
    elif kind == REDUCE:
        state.reduced_inputs[id(local_tensor)] = weakref.ref(local_tensor)  # type: ignore[index]
        if isinstance(result, torch.Tensor):
            state.reduced_outputs[id(result)] = weakref.ref(result)  # type: ignore[index]
    elif _key(target_spec, current_spec, phase) in state.gathers:  # type: ignore[operator]
        _record_round_trip(recorder, cause)


def _record_round_trip(recorder: Recording, cause: causes.Cause) -> None:
    origin = cause[-1] if cause[-1] is not None else recorder.frame_id()
    key = (id(recorder), cause, origin)
    if key in _round_trips:
        return
    _round_trips.add(key)
    recorder.collective_cause((causes.ROUND_TRIP, *cause[1:-1], origin))


def reduces_again(recorder: Recording, tensor: Any) -> bool:
    """Whether `tensor` (an all-reduce's input) is, or views, what a DTensor reduction produced this step."""
    state = _state
    if state.reduced_outputs is None or state.step != recorder.step_index or state.recorder is not recorder:
        return False
    return _held(state.reduced_outputs, tensor) or _held(state.reduced_outputs, getattr(tensor, "_base", None))
