"""`silu_backward` and `mish_backward` on tpu as one op each.

Both are CompositeImplicitAutograd in torch: the CPU and CUDA have kernels that compute in float32 and
round once, but any other device gets torch's composite, a chain of ops each rounded to the input's
dtype (a bfloat16 silu gradient was up to 245 ulp off the float64 one where the CPU's is 0.5). A
kernel for the AutogradPrivateUse1 key sends the op below autograd, where it reaches the dispatcher
and its lowering (`activations.silu_backward`, `activations.mish_backward`). When the gradient itself
needs a gradient (grad mode on and an input that requires one) the composite runs, so double
backward keeps working.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_library: torch.library.Library | None = None

# CompositeImplicitAutograd ops whose lowerings this route makes reachable.
ROUTED_OPS = (aten.silu_backward.default, aten.mish_backward.default)


def _as_one_op(op: torch._ops.OpOverload):
    def kernel(grad_output: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (grad_output.requires_grad or self.requires_grad):
            return op.decompose(grad_output, self)
        with torch._C._AutoDispatchBelowAutograd():
            return op(grad_output, self)

    return kernel


def register() -> None:
    """Register the kernels once."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    for op in ROUTED_OPS:
        _library.impl(op._schema.name.split("::")[1], _as_one_op(op), "AutogradPrivateUse1")
