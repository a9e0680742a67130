"""`_foreach_*` ops: lists in, lists out, each element computed by the matching single-tensor lowering.

One driver reads an overload's schema: `Tensor[]` and `Scalar[]` arguments are taken element by
element, a lone `Tensor` or `Scalar` is shared by every element, except the `scalars` tensor of
addcmul/addcdiv, which holds one value per element. All elements trace into one program, so a whole
optimizer step over a parameter list is a single XLA computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import torch

from . import comparison, linalg, pointwise, reduction
from ._util import concrete_number, jax_dtype, to_float
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _per_element(overload: torch._ops.OpOverload, element_fn: Callable) -> Callable:
    arguments = overload._schema.arguments
    positional = [arg for arg in arguments if not arg.kwarg_only]
    listed = {arg.name for arg in arguments if str(arg.type).startswith("List[")}
    indexed_tensor = {arg.name for arg in arguments if arg.name == "scalars" and str(arg.type) == "Tensor"}

    def lowering(*args: object, **kwargs: object) -> list[Array]:
        values = {arg.name: value for arg, value in zip(positional, args)}
        length = len(next(values[name] for name in values if name in listed))
        results = []
        for i in range(length):
            element_args = []
            for arg in positional:
                if arg.name not in values:
                    break
                value = values[arg.name]
                if arg.name in listed:
                    value = value[i]
                elif arg.name in indexed_tensor:
                    value = value.reshape(-1)[i]
                element_args.append(value)
            results.append(element_fn(*element_args, **kwargs))
        return results

    lowering.__qualname__ = f"foreach[{overload}]"
    return lowering


def _register(packet_name: str, element_fn: Callable, overloads: Sequence[str] = ("default",)) -> None:
    """Lower each overload of a foreach op that this torch release has (older ones lack some)."""
    packet = getattr(aten, packet_name, None)
    for name in overloads if packet is not None else ():
        overload = getattr(packet, name, None)
        if overload is not None:
            lowers(overload)(_per_element(overload, element_fn))


_UNARY = {
    "abs": pointwise.abs_, "neg": pointwise.neg, "sign": pointwise.sign, "frac": pointwise.frac,
    "ceil": pointwise.LOWERING_OF["ceil"], "floor": pointwise.LOWERING_OF["floor"],
    "round": pointwise.LOWERING_OF["round"], "trunc": pointwise.LOWERING_OF["trunc"],
    "zero": comparison.zero,
}
for _name in ("acos", "asin", "atan", "cos", "cosh", "sin", "sinh", "tan", "tanh", "exp", "expm1", "log", "log10",
              "log1p", "log2", "reciprocal", "rsqrt", "sigmoid", "sqrt", "erf", "erfc", "lgamma"):
    _UNARY[_name] = pointwise.LOWERING_OF[_name]

for _name, _fn in _UNARY.items():
    _register(f"_foreach_{_name}", _fn)

_register("_foreach_clone", lambda self, memory_format=None: self)
_register("_foreach_copy", comparison.copy)
_register("_foreach_max", reduction.max_all)
_register("_foreach_mm", linalg.mm)
_register("_foreach_add", pointwise.add, ("Scalar", "List", "ScalarList", "Tensor"))
_register("_foreach_sub", pointwise.sub, ("Scalar", "List", "ScalarList"))
_register("_foreach_mul", pointwise.mul, ("Scalar", "List", "ScalarList", "Tensor"))
_register("_foreach_div", pointwise.div, ("Scalar", "List", "ScalarList", "Tensor"))
_register("_foreach_maximum", pointwise.maximum, ("Scalar", "List", "ScalarList"))
_register("_foreach_minimum", pointwise.minimum, ("Scalar", "List", "ScalarList"))
_register("_foreach_clamp_min", comparison.clamp_min, ("Scalar", "List", "ScalarList"))
_register("_foreach_clamp_max", comparison.clamp_max, ("Scalar", "List", "ScalarList"))
_register("_foreach_pow", pointwise.pow_, ("List", "Scalar", "ScalarList", "ScalarAndTensor"))
_register("_foreach_lerp", pointwise.lerp, ("List", "Scalar", "ScalarList"))
_register("_foreach_addcmul", lambda s, a, b, value=1: pointwise.addcmul(s, a, b, value=value), ("Scalar", "ScalarList", "Tensor"))
_register("_foreach_addcdiv", lambda s, a, b, value=1: pointwise.addcdiv(s, a, b, value=value), ("Scalar", "ScalarList", "Tensor"))


def _norm(self: Array, ord: object = 2, dtype: torch.dtype | None = None) -> Array:  # noqa: A002
    return reduction.linalg_vector_norm(self, ord, None, False, dtype=dtype)


def _powsum(self: Array, ord: object = 2, dtype: torch.dtype | None = None) -> Array:  # noqa: A002
    magnitude = jnp.abs(self if dtype is None else self.astype(jax_dtype(dtype)))
    return jnp.sum(magnitude**ord)


@lowers(aten._foreach_norm.Scalar)
def foreach_norm(tensors: Sequence[Array], ord: object = 2, dtype: torch.dtype | None = None) -> list[Array]:  # noqa: A002
    """Each tensor's norm. The 2-norms' square roots are taken once per dtype, over the stacked sums of
    squares: XLA:CPU does not fuse a reduction into the elementwise op that reads its result, so a square
    root per tensor would be a kernel per tensor (a gradient clip's program compiled one per parameter).
    Each element's value is the one its own square root gives."""
    if concrete_number(ord) != 2:
        return [_norm(tensor, ord, dtype) for tensor in tensors]
    sums = []
    for tensor in tensors:
        magnitude = jnp.abs(tensor.astype(jax_dtype(dtype)) if dtype is not None else to_float(tensor))
        sums.append(jnp.sum(magnitude * magnitude))
    norms: list[Array] = list(sums)
    by_dtype: dict[jnp.dtype, list[int]] = {}
    for index, total in enumerate(sums):
        by_dtype.setdefault(total.dtype, []).append(index)
    for indices in by_dtype.values():
        roots = jnp.sqrt(jnp.stack([sums[index] for index in indices]))
        for position, index in enumerate(indices):
            norms[index] = roots[position]
    return norms


_register("_foreach_powsum", _powsum, ("Scalar",))
