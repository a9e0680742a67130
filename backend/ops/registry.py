"""One registry of ATen lowerings: each ATen overload maps to one JAX function.

A lowering is a pure function written with `jax.numpy`/`jax.lax`. It receives the op's arguments in
ATen schema order with every tensor replaced by a `jax.Array` (lists of tensors by lists of arrays,
absent optional tensors by None); other arguments arrive as the Python values torch passed (ints,
floats, bools, lists, torch.dtype, ...). It returns an array, or a tuple of arrays in the order of the
schema's returns. Non-tensor arguments other than `Scalar`s are compile-time constants; `Scalar`
arguments arrive as traced 0-d values so that a changing learning rate does not recompile.

The dispatcher casts results to the dtype torch's own meta kernel computes, so lowerings need not
reproduce torch's type promotion exactly, but shapes must match.

Random lowerings declare `needs_key=True` and receive a `key` keyword argument (a JAX PRNG key
derived from the chip's seed and a counter): they never hold a fixed key.

Matrix products declare `matmul_precision=True`: their programs are keyed on torch's float32 matmul
precision setting, and they ask `matmul_precision.for_operands` for their products' precision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


@dataclass(frozen=True)
class Lowering:
    """How one ATen overload runs on a chip."""

    op: OpOverload
    fn: Callable
    needs_key: bool = False
    matmul_precision: bool = False


class DuplicateLoweringError(RuntimeError):
    """Two lowerings registered for one ATen overload."""


LOWERINGS: dict[OpOverload, Lowering] = {}


def _overloads(target: OpOverload | OpOverloadPacket) -> list[OpOverload]:
    """The overloads a target names; a packet names its functional overloads only.

    In-place and `out=` overloads are not lowered: the dispatcher runs them through the functional
    overload and writes the result into the target tensor.
    """
    if isinstance(target, OpOverloadPacket):
        overloads = [getattr(target, name) for name in target.overloads()]
        return [overload for overload in overloads if not overload._schema.is_mutable]
    return [target]


def lowers(*targets: OpOverload | OpOverloadPacket, needs_key: bool = False, matmul_precision: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated JAX function as the lowering of each target.

    A target is an overload (`aten.add.Tensor`) or a packet (`aten.relu`, meaning every overload
    it has). Registering one overload twice is an error.
    """

    def register(fn: Callable) -> Callable:
        for target in targets:
            for overload in _overloads(target):
                if overload in LOWERINGS:
                    raise DuplicateLoweringError(f"{overload} already lowered by {LOWERINGS[overload].fn.__qualname__}")
                LOWERINGS[overload] = Lowering(overload, fn, needs_key, matmul_precision)
        return fn

    return register


def lowering_for(op: OpOverload) -> Lowering | None:
    return LOWERINGS.get(op)
