"""torch's float32 matmul precision setting, as the XLA precision of a lowering's products.

`torch.set_float32_matmul_precision` picks how float32 (and complex64) matrix products run, as
torch_xla maps it: "highest" is `Precision.HIGHEST` (full float32: six bfloat16 passes on a TPU's
MXU), "high" is `HIGH` (bf16_3x, three passes), "medium" is `DEFAULT` (one bfloat16 pass). Products
of other dtypes run at `HIGHEST` whatever the setting.

The dispatcher reads the setting when a precision-sensitive op (`Lowering.matmul_precision`) is
dispatched on float32 or complex64 inputs, keys the op's program on it, and traces the lowering in
`scope(name)`; lowerings ask `for_operands(...)` for their products' precision. A lowering traced
outside any scope (every other op) gets `HIGHEST`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

SETTINGS = ("highest", "high", "medium")
XLA_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "medium": lax.Precision.DEFAULT}
# torch.backends.fp32_precision (the per-backend API's root, inherited by backends set to "none").
_ROOT_SETTINGS = {"tf32": "high", "bf16": "medium"}
_REDUCIBLE_TORCH = frozenset({torch.float32, torch.complex64})
_REDUCIBLE_JAX = frozenset({jnp.dtype(jnp.float32), jnp.dtype(jnp.complex64)})
_get_legacy = torch._C._get_float32_matmul_precision
_state = threading.local()


def setting() -> str:
    """The setting in effect: torch's backend-agnostic one, or, where torch refuses that answer (the
    per-backend API was mixed with the legacy one), the per-backend API's root setting (its CUDA,
    cuDNN and mkldnn entries are for those backends, not tpu)."""
    try:
        return _get_legacy()
    except RuntimeError:
        return _ROOT_SETTINGS.get(torch.backends.fp32_precision, "highest")


def reducible(dtype: torch.dtype) -> bool:
    """Whether products on inputs of `dtype` follow the setting."""
    return dtype in _REDUCIBLE_TORCH


def of_call(specs: Sequence[tuple]) -> str | None:
    """The setting for a call whose inputs have these specs ((shape, dtype, ...) for a tensor): None
    unless its first tensor input is float32 or complex64 (matrix products take one dtype)."""
    for spec in specs:
        if len(spec) > 1:
            if spec[1] not in _REDUCIBLE_TORCH:
                return None
            return setting()
    return None


@contextlib.contextmanager
def scope(name: str | None) -> Iterator[None]:
    """Trace the products inside at setting `name` (None: at HIGHEST)."""
    previous = getattr(_state, "name", None)
    _state.name = name
    try:
        yield
    finally:
        _state.name = previous


def for_operands(*operands: jax.Array) -> lax.Precision:
    """The precision of a product of these operands in the current scope."""
    name = getattr(_state, "name", None)
    if name is None or any(operand.dtype not in _REDUCIBLE_JAX for operand in operands):
        return lax.Precision.HIGHEST
    return XLA_PRECISION[name]


def combined(names: Sequence[str | None]) -> str | None:
    """The settings of a program's products as the trace records them: one name, or several joined by
    "," (first seen first) when the setting changed between the ops of one fused program."""
    seen = list(dict.fromkeys(name for name in names if name is not None))
    return ",".join(seen) if seen else None


def recompile_diff(diff: str, before: str | None, after: str | None) -> str:
    """A recompile's diff, led by the precision change when the setting `after` differs from `before`,
    the earlier compile's (the input signature may then be the same)."""
    if before is None or after is None or before == after:
        return diff
    change = f"float32 matmul precision: {before} -> {after}"
    return change if diff.startswith("same signature") else f"{change}; {diff}"
