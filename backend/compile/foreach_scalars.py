"""Foreach ops with a symbolic scalar, as one op per tensor, so that a changing float stays a graph input.

A float that changes between calls (an optimizer's `lr` under an LR scheduler) becomes a symbolic
float after Dynamo's second compile; AOTAutograd then turns each op that reads it into a tensor op
(`tensorify_python_scalars`), but only for pointwise ops such as `aten.mul.Tensor`. A foreach op
(`_foreach_mul.Scalar`, what `Adam(foreach=True)`, the default on tpu, uses for `lr`) is not one of
them, so the float was specialised: Dynamo recompiled the optimizer step at every step until its
recompile limit. With a symbolic scalar these ops become one pointwise op per tensor (XLA fuses them
again); with a plain number they stay foreach ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

aten = torch.ops.aten
_SYMBOLIC = (torch.SymFloat, torch.SymInt)


def _per_tensor_scalar(op: Any) -> Callable[..., Any]:
    def decompose(tensors: Sequence[torch.Tensor], scalar: Any) -> Any:
        if not isinstance(scalar, _SYMBOLIC):
            return NotImplemented
        return [op(tensor, scalar) for tensor in tensors]

    return decompose


def _per_tensor_list(op: Any) -> Callable[..., Any]:
    def decompose(tensors: Sequence[torch.Tensor], others: Sequence[torch.Tensor], *, alpha: Any = 1) -> Any:
        if not isinstance(alpha, _SYMBOLIC):
            return NotImplemented
        return [op(tensor, aten.mul.Tensor(other, alpha)) for tensor, other in zip(tensors, others)]

    return decompose


def _per_tensor_pointwise(op: Any) -> Callable[..., Any]:
    def decompose(tensors: Sequence[torch.Tensor], first: Sequence[torch.Tensor], second: Sequence[torch.Tensor], value: Any = 1) -> Any:
        if not isinstance(value, _SYMBOLIC):
            return NotImplemented
        return [op(tensor, one, two, value=value) for tensor, one, two in zip(tensors, first, second)]

    return decompose


def decompositions() -> dict[Any, Callable[..., Any]]:
    """Decompositions for the functional foreach overloads that take one scalar."""
    table: dict[Any, Callable[..., Any]] = {}
    for name in ("add", "sub", "mul", "div"):
        table[getattr(aten, f"_foreach_{name}").Scalar] = _per_tensor_scalar(getattr(aten, name).Tensor)
    for name in ("add", "sub"):
        table[getattr(aten, f"_foreach_{name}").List] = _per_tensor_list(getattr(aten, name).Tensor)
    table[aten._foreach_addcdiv.Scalar] = _per_tensor_pointwise(aten.addcdiv.default)
    table[aten._foreach_addcmul.Scalar] = _per_tensor_pointwise(aten.addcmul.default)
    return table
