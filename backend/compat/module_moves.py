"""`Module.to("tpu")` while an autograd graph still holds the module's parameters.

A module moves to tpu by swapping each parameter's contents with its tpu copy
(`torch.utils.swap_tensors`): a tpu tensor is a wrapper subclass, which `Module._apply` never moves
with `.data =` as it moves a parameter to CUDA. torch refuses the swap when anything beyond the
parameter's AccumulateGrad node holds it, such as the saved tensors of a CPU forward pass whose
output is still alive (`out = model(x); model.to("tpu")`, common in notebooks), which CUDA allows.

For a swap into a tpu tensor those references are let stand: the old graph keeps the host tensor
it saved, and the parameter's old AccumulateGrad node is poisoned as torch poisons it when it
allows the swap, so a backward through the old graph raises torch's own error instead of
accumulating into a tensor the module no longer holds.

The swap also gives a lazy module's uninitialized parameter its tpu class back (torch swaps the
classes too), so that it stays uninitialized on tpu, as `.data =` keeps it on CUDA.
"""

from __future__ import annotations

import copyreg
import functools
from typing import Any

import torch

from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.integrations.lazy_params import keep_uninitialized

_USE_COUNT_REFUSAL = "Expected use_count of t1"
_installed = False


def _poison_accumulate_grad(tensor: torch.Tensor) -> None:
    if not (tensor.is_leaf and tensor.requires_grad):
        return

    def refuse(grad_outputs: Any) -> None:
        raise RuntimeError(
            "Trying to execute AccumulateGrad node that was poisoned by swap_tensors "
            "this can happen when you try to run backward on a tensor that was swapped: a graph built "
            "before the module moved to tpu (e.g. m.to('tpu') between forward and backward). To resolve "
            "this, please only change the device/dtype before running forward (or after both forward and backward)."
        )

    torch.autograd.graph.get_gradient_edge(tensor).node.register_prehook(refuse)


def _swap_held(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """torch's swap (class, attributes, slots, then the C++ tensors) for a t1 the old graph holds."""
    slots = set(copyreg._slotnames(t1.__class__))  # type: ignore[attr-defined]
    if slots != set(copyreg._slotnames(t2.__class__)):  # type: ignore[attr-defined]
        raise RuntimeError("Cannot swap t1 and t2 if they have different slots")
    _poison_accumulate_grad(t1)
    for name in ("__class__", "__dict__"):
        held = getattr(t1, name)
        setattr(t1, name, getattr(t2, name))
        setattr(t2, name, held)
    for slot in slots:
        in_t1, in_t2 = hasattr(t1, slot), hasattr(t2, slot)
        if in_t1 and in_t2:
            held = getattr(t1, slot)
            setattr(t1, slot, getattr(t2, slot))
            setattr(t2, slot, held)
        elif in_t1:
            setattr(t2, slot, getattr(t1, slot))
            delattr(t1, slot)
        elif in_t2:
            setattr(t1, slot, getattr(t2, slot))
            delattr(t2, slot)
    torch._C._swap_tensor_impl(t1, t2)


def install() -> None:
    """Route `torch.utils.swap_tensors` (which `Module._apply` calls) for swaps into tpu tensors (once)."""
    global _installed
    if _installed:
        return
    original = torch.utils.swap_tensors

    @functools.wraps(original)
    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        if type(t2) is not TpuTensor:
            return original(t1, t2)
        uninitialized_class = keep_uninitialized(t1)
        try:
            original(t1, t2)
        except RuntimeError as refusal:
            if not str(refusal).startswith(_USE_COUNT_REFUSAL) or t2._use_count() > 1:
                raise
            _swap_held(t1, t2)
        if uninitialized_class is not None:
            t1.__class__ = uninitialized_class  # a lazy module's parameter stays uninitialized, as on CUDA

    torch.utils.swap_tensors = swap_tensors
    _installed = True
