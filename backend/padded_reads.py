"""Reads of a data-dependent output without a program per length.

`nonzero`, `x[mask]`, `unique` and the like run a program compiled for a padded length (see
`length_buckets`) and return the first `length` entries of its output: a narrow view (`cut`). Read on
the chip, that view is a slice program compiled for each distinct length, which is what bucketing
avoids. Read on the host (`.cpu()`, `.tolist()`, `.item()`, `print`), it needs no program: the padded
buffer is copied (at most a quarter more bytes, see `length_buckets`) and cut on the host. A pointwise
op on the chip (`x[mask] * 2`, `torch.where(x[mask] > 0, ...)`) runs on the padded buffers and its
result is cut in turn (`on_padded`): each entry depends only on the entries at its position, so
the first `length` are the op's on the cut, and the program is the padded length's. A sum, `amax`
or `amin` of a cut (`x[mask].sum()`) reduces the padded buffer, its padding first set to the
reduction's identity by a program that takes the length as a traced number. Other ops that read the
view (a mean, a matmul) need the exact shape, and compile for it as the op itself does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import jax.numpy as jnp
from jax import Array, lax

from tputrace.backend.entries import OpEntry
from tputrace.backend.ops.registry import Lowering
from tputrace.backend.tensor import TpuTensor

aten = torch.ops.aten

_pointwise: dict[Any, bool] = {}  # op entry -> whether it is a deterministic pointwise op of one output
# Whether this process has made a cut yet: until it has, no op's inputs need looking at for one.
cuts_made = False


def cut(padded: Any, dim: int, length: int) -> Any:
    """The first `length` entries along `dim` of `padded` (an output compiled for a padded length): a
    view whose chain is marked, so that a host read of any tensor seen through it copies the buffer
    and cuts it there (`host_cut`)."""
    global cuts_made
    if padded.shape[dim] == length:
        return padded
    view = padded.narrow(dim, 0, length)
    if padded._view is None:
        view._view.host_cut = (dim, length)
        cuts_made = True
    return view


def host_cut(tensor: Any) -> tuple[int, int] | None:
    """(dim, length) when `tensor` is the first `length` entries along `dim` of its buffer's array and
    is read by cutting that array on the host, else None. (A chain belongs to one base geometry, so
    any view of the same steps is such a cut too.)"""
    view = tensor._view
    return None if view is None else view.host_cut


def on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """`entry`'s op on the padded buffers of the cuts among its inputs, its result cut in turn where
    it keeps the cut dim; None when the op needs the exact shape (see the module's note)."""
    if entry.op in _IDENTITIES:
        return _reduction_on_padded(dispatcher, entry, args, kwargs, record_as)
    return _pointwise_on_padded(dispatcher, entry, args, kwargs, record_as)


def _pointwise_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A pointwise op whose inputs include cuts, run on their padded buffers and cut to the length;
    None when it cannot be: an op that is not pointwise (or draws random numbers), cuts of different
    lengths, dims or padded lengths, or another input that does not broadcast along the cut dim."""
    if not _is_pointwise(entry) or any(is_cut(value) for value in kwargs.values()):
        return None
    cuts = {position: _cut_from_end(value) for position, value in enumerate(args) if is_cut(value)}
    if len(set(cuts.values())) != 1:
        return None
    from_end, length, _ = next(iter(cuts.values()))
    others = [tuple(value.shape) for position, value in enumerate(args) if isinstance(value, torch.Tensor) and position not in cuts]
    try:
        shape = torch.broadcast_shapes(*others, *(tuple(args[position].shape) for position in cuts))
    except RuntimeError:  # the op raises torch's error on the cut
        return None
    if shape[from_end] != length or any(len(other) >= -from_end and other[from_end] != 1 for other in others):
        return None
    padded_args = [_padded(value) if position in cuts else value for position, value in enumerate(args)]
    result = dispatcher.compute(entry, padded_args, kwargs, record_as)
    return cut(result, result.dim() + from_end, length)


def is_cut(value: Any) -> bool:
    """Whether `value` is a tpu tensor read as a cut of its padded buffer (`cut`)."""
    return type(value) is TpuTensor and value._view is not None and value._view.host_cut is not None


def _cut_from_end(value: TpuTensor) -> tuple[int, int, int]:
    """(the cut dim counted from the end, as broadcasting aligns dims; the length; the padded length)."""
    dim, length = value._view.host_cut
    return dim - value.dim(), length, value._buf.array.shape[dim]


def _padded(value: TpuTensor) -> TpuTensor:
    """The whole buffer of a cut, as a tensor of the padded shape (an alias: it is only read)."""
    array = value._buf.array
    return TpuTensor(value._buf, tuple(array.shape), value.dtype)


def _is_pointwise(entry: Any) -> bool:
    known = _pointwise.get(entry)
    if known is None:
        op = entry.op
        known = _pointwise[entry] = (
            isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags and torch.Tag.nondeterministic_seeded not in op.tags
            and len(op._schema.returns) == 1 and entry.lowering is not None and not entry.lowering.needs_key
        )
    return known


def _lowest(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return False
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def _highest(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return True
    return float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max


# Reductions run on a padded buffer, by the value that leaves each one unchanged (for the input's dtype).
_IDENTITIES = {
    aten.sum.default: lambda dtype: False if dtype == torch.bool else 0,
    aten.sum.dim_IntList: lambda dtype: False if dtype == torch.bool else 0,
    aten.amax.default: _lowest,
    aten.amin.default: _highest,
}


def fill_past(padded: Array, length: Array, *, dim: int, fill: float | int | bool) -> Array:
    """`padded` with its entries at `length` and past along `dim` set to `fill` (`length` is traced:
    one program per padded length)."""
    position = lax.broadcasted_iota(jnp.int32, padded.shape, dim)
    return jnp.where(position < length, padded, jnp.asarray(fill, padded.dtype))


_FILL_PAST = OpEntry(aten.where.self, "aten.where.self", "lowered", lowering=Lowering(aten.where.self, fill_past), shapes_from_lowering=True, scalar_positions=frozenset({1}))


def _reduction_on_padded(dispatcher: Any, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None) -> Any | None:
    """A sum, `amax` or `amin` of a cut: of its padded buffer with the padding set to the identity,
    where it reduces the cut dim; else of the buffer as it is, the result cut in turn. None for an
    empty cut or a complex one."""
    self = args[0]
    if not is_cut(self) or any(is_cut(value) for value in (*args[1:], *kwargs.values())) or self.is_complex():
        return None
    dim, length = self._view.host_cut
    if not length:  # nothing to reduce: `amax` raises torch's error, a sum is zeros
        return None
    reduced = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    dims = range(self.dim()) if not reduced else [axis % self.dim() for axis in reduced]
    padded = _padded(self)
    if dim in dims:
        padded = dispatcher.compute(_FILL_PAST, (padded, length), {"dim": dim, "fill": _IDENTITIES[entry.op](self.dtype)})
    result = dispatcher.compute(entry, (padded, *args[1:]), kwargs, record_as)
    if dim in dims:
        return result
    return cut(result, dim if keepdim else dim - sum(1 for axis in dims if axis < dim), length)
