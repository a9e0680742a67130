"""Fake `_grouped_mm` on tpu for every dtype, as the tpu runs it in eager (the CPU kernel's rules).

torch's meta kernel for `_grouped_mm` holds CUDA's rules: bfloat16 operands only. transformers sends
its mixture-of-experts layers on tpu to `torch._grouped_mm` for every dtype, eager or compiled, so
`torch.compile` of a float32 MoE model (GraniteMoE, gpt-oss, GLM-4 MoE, ...) failed while Dynamo
traced it ("Expected inputs of BF16 type"). `install()` gives tpu operands a fake rule that takes
the output's shape from the operands and `offs`, with `out_dtype` or the operands' dtype, as the
lowering computes it; other devices keep torch's meta kernel.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

aten = torch.ops.aten
DEVICE_TYPE = "tpu"
_installed = False


def install() -> None:
    """Register the tpu rule for `aten._grouped_mm` (idempotent)."""
    global _installed
    if _installed:
        return
    torch_rule = fake_impls.op_implementations_dict.get(aten._grouped_mm.default)

    def rule(fake_mode: FakeTensorMode, func: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
        result = _tpu_grouped_mm(fake_mode, *args, **kwargs)
        if result is NotImplemented and torch_rule is not None:
            return torch_rule(fake_mode, func, *args, **kwargs)
        return result

    fake_impls.op_implementations_dict[aten._grouped_mm.default] = rule
    _installed = True


def _tpu_grouped_mm(fake_mode: FakeTensorMode, mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None,
                    out_dtype: torch.dtype | None = None) -> Any:
    """The fake result for tpu operands; NotImplemented (torch's meta kernel decides) for others."""
    if not isinstance(mat_a, FakeTensor) or mat_a.fake_device.type != DEVICE_TYPE:
        return NotImplemented
    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
                 lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and mat_b.dim()={mat_b.dim()}")
    torch._check(mat_a.size(-1) == mat_b.size(-2),
                 lambda: f"contraction dimension of mat_a and mat_b must match, got {mat_a.size(-1)} and {mat_b.size(-2)}")
    if mat_a.dim() == 3 and mat_b.dim() == 3:
        torch._check(mat_a.size(0) == mat_b.size(0), lambda: "batched dimension has to match")
        shape = [mat_a.size(0), mat_a.size(1), mat_b.size(2)]
    else:
        torch._check(offs is not None, lambda: "offs must be given when an operand is 2D")
        groups = offs.size(0)
        if mat_a.dim() == 2 and mat_b.dim() == 2:
            shape = [groups, mat_a.size(0), mat_b.size(1)]
        elif mat_a.dim() == 2:
            torch._check(groups == mat_b.size(0), lambda: "matrix batch sizes have to match")
            shape = [mat_a.size(0), mat_b.size(-1)]
        else:
            torch._check(groups == mat_a.size(0), lambda: "matrix batch sizes have to match")
            shape = [mat_a.size(1), mat_b.size(1)]
    with fake_mode:
        return torch.empty(shape, dtype=out_dtype or mat_a.dtype, device=mat_a.device)
