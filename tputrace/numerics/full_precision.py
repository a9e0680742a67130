"""The CPU reference keeps full precision: a cast of a float32 (or float64) tensor down to bfloat16 or float16 in the
replayed code keeps the tensor as it was, so a cast the script makes on the tpu shows up as a divergence instead of
being copied into the reference."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

REDUCED = (torch.bfloat16, torch.float16)
FULL = (torch.float32, torch.float64)
_CASTS = {torch.Tensor.to, torch.Tensor.type, torch.Tensor.bfloat16, torch.Tensor.half}


def _target_dtype(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.dtype | None:
    """The dtype a cast call asks for, or None when it asks for none (a device move, a tensor-like target)."""
    if func is torch.Tensor.bfloat16:
        return torch.bfloat16
    if func is torch.Tensor.half:
        return torch.float16
    for value in (*args[1:], *kwargs.values()):
        if isinstance(value, torch.dtype):
            return value
    return None


class FullPrecision(TorchFunctionMode):
    """While active, `Tensor.to(bfloat16|float16)`, `.type(...)`, `.bfloat16()` and `.half()` of a float32/float64
    tensor return the tensor unchanged, and float32 matrix products run at torch's "highest" precision (a script's
    `set_float32_matmul_precision("medium")` would have the CPU multiply in bfloat16 where it can); every other
    call runs as written."""

    def __init__(self) -> None:
        super().__init__()
        self._previous_setting: str | None = None

    def __enter__(self) -> FullPrecision:
        try:
            self._previous_setting = torch.get_float32_matmul_precision()
        except RuntimeError:  # the per-backend API was mixed with the legacy one: torch gives no single answer
            self._previous_setting = None
        if self._previous_setting is not None and self._previous_setting != "highest":
            torch.set_float32_matmul_precision("highest")
        super().__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        if self._previous_setting is not None and self._previous_setting != "highest":
            torch.set_float32_matmul_precision(self._previous_setting)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CASTS and args and isinstance(args[0], torch.Tensor) and args[0].dtype in FULL:
            if _target_dtype(func, args, kwargs) in REDUCED:
                return args[0]
        return func(*args, **kwargs)
