"""Parts of a fused program that do not depend on the executor: its inputs' specs (half of its cache key),
the Python scalars it reads packed into one array per kind, the fence in front of a backward pass, and the
inputs it donates."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import dtypes

from tputrace.backend.core.dtypes import JAX_TO_TORCH, to_torch
from tputrace.backend.core.plans import Plan
from tputrace.backend.core.signatures import InputSpec

# A flush packs a graph's Python scalars into one array per kind (float, int, bool, complex), and the program
# unpacks them as the weakly typed scalars jax.jit would have made of them.
SCALAR_KINDS = {float: 0, int: 1, bool: 2, complex: 3}
SCALAR_DTYPES = tuple(dtypes.canonicalize_dtype(kind) for kind in (np.float64, np.int64, np.bool_, np.complex128))
SCALAR_WEAK = (True, True, False, True)


def scalar_identity(value: Any) -> Any:
    """What makes two Python scalars of one kind the same packed value: their value, and a float's sign,
    which sets a zero's bits (0.0 == -0.0). A foreach op's scalar arguments that are the same share one slot
    of the packed scalars (`deferred`): XLA computes what derives from a slot (a foreach division's reciprocal) once
    for all of them instead of in a kernel per slot. A NaN is the same only as itself (its object)."""
    if type(value) is float:
        return (value, math.copysign(1.0, value))
    if type(value) is complex:
        return (value, math.copysign(1.0, value.real), math.copysign(1.0, value.imag))
    return value


def input_specs(inputs: Sequence[Any], _torch_dtypes: dict = JAX_TO_TORCH) -> tuple[InputSpec, ...]:
    """Each program input's spec, (shape, torch dtype) or (type name,), as every flush's cache key holds
    it: an array's torch dtype is one dict lookup of its own dtype (`to_torch` makes a JAX dtype of it first).
    A JAX array's shape and dtype are read from its `aval`, which its `shape` and `dtype` properties
    return them from (two Python calls per input of a flush saved)."""
    return tuple([
        (tuple(aval.shape), _torch_dtypes.get(aval.dtype) or to_torch(aval.dtype)) if (aval := getattr(value, "aval", None)) is not None
        else (type(value).__name__,) if (shape := getattr(value, "shape", None)) is None
        else (tuple(shape), _torch_dtypes.get(value.dtype) or to_torch(value.dtype))
        for value in inputs
    ])


def saved_values(nodes: Sequence[tuple[Plan, tuple]], backward_from: int) -> tuple[tuple[int, int], ...]:
    """The values of ops recorded before a backward pass that its ops read: autograd's saved tensors."""
    return tuple(sorted({(ref[1], ref[2]) for _, refs in nodes[backward_from:] for ref in refs if ref[0] == 1 and ref[1] < backward_from}))


def fence(values: list[tuple], saved: Sequence[tuple[int, int]]) -> None:
    """Pass the saved values through one optimization barrier. Without it XLA merges the backward's
    recomputations with the forward's intermediates (gelu's backward recomputes the forward's erfc)
    and keeps those intermediates alive from the forward to the backward, beyond what autograd saved."""
    fenced = jax.lax.optimization_barrier([values[node][index] for node, index in saved])
    for (node, index), value in zip(saved, fenced):
        outputs = list(values[node])
        outputs[index] = value
        values[node] = tuple(outputs)


def unpack(packed: Sequence[Any], kind: int, position: int) -> Any:
    """One packed scalar, typed as jax.jit types a Python scalar argument (weak, except bool).

    No public function makes a weakly typed value from a strongly typed one: `lax.convert_element_type`
    always gives a strong type. jax.lax exports the primitive, whose `weak_type` parameter does it; the
    programs are the ones jax's private `_convert_element_type` gave (same StableHLO, same compiles).
    """
    value = packed[kind][position]
    if not SCALAR_WEAK[kind]:
        return value
    return jax.lax.convert_element_type_p.bind(value, new_dtype=SCALAR_DTYPES[kind], weak_type=True, sharding=None)


def donation(graph: Any, outputs: dict[tuple[int, int], Any], lazy_type: type) -> tuple[tuple[int, ...], dict[tuple[int, int], Any]]:
    """The inputs of a pending graph (a `deferred.PendingGraph`, whose pending values are `lazy_type`) to
    donate, and the outputs reordered so that each donated input holds the value that replaced it in its buffer.

    JAX gives each output, in order, the first donated input of its shape and dtype not given
    yet. Where a graph read same-shaped buffers in another order than it wrote them, an input
    would hold another buffer's new value, and XLA copies each such input before the program
    overwrites it. So the replacing values come first, in the order of their inputs, and an
    input whose buffer holds no output of this graph is not donated. Decided from the graph
    alone, so the same step compiles to the same program every time."""
    paired: dict[tuple[int, int], Any] = {}
    donate: list[int] = []
    replaced = graph.replaced_inputs
    inputs = graph.inputs
    for index in sorted(replaced):
        buffer = replaced[index]()
        value = buffer.array if buffer is not None else None
        if type(value) is not lazy_type or value.graph is not graph:
            continue
        key = (value.node, value.index)
        if key in paired or key not in outputs or not _is_jax_array(inputs[index]):
            continue
        paired[key] = value
        donate.append(index)
    if not paired:
        return (), outputs
    paired.update((key, value) for key, value in outputs.items() if key not in paired)
    return tuple(donate), paired


_ARRAY_TYPES: set[type] = set()


def _is_jax_array(value: Any) -> bool:
    """`isinstance(value, jax.Array)`, remembered by type (an ABC check costs a flush ~1 µs per input)."""
    kind = type(value)
    if kind in _ARRAY_TYPES:
        return True
    if isinstance(value, jax.Array):
        _ARRAY_TYPES.add(kind)
        return True
    return False
