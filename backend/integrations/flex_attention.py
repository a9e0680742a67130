"""FlexAttention (`torch.nn.attention.flex_attention`) on tpu tensors.

torch runs `flex_attention` as a higher-order op (HOP): its autograd rule (`FlexAttentionAutogradOp`)
traces the `score_mod` into a joint graph, and below autograd the op reaches the Python key, where a
HOP has no rule for a tensor subclass unless one is registered with `py_impl(TpuTensor)`. The rules
here run torch's own dense implementation (`sdpa_dense`, `sdpa_dense_backward`: scores materialised,
`score_mod` and `mask_mod` applied with vmap) on tpu tensors, so every op of the attention is an
ATen op on the chip, recorded one by one in strict eager and fused by XLA in DeferAndFuse. While
torch.compile traces (Dynamo's fake run, AOTAutograd), the rules pass the HOP on to the traced
tensors inside, and the HOP node reaching the tpu backend is decomposed into ATen ops by
`compile/hop_decompositions.py`.

torch refuses FlexAttention for a device outside its list (`_validate_device`); it is let through
for tpu tensors only, with backward, which torch refuses on the CPU because its CPU path lacks one.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from tputrace.backend.core.tensor import TpuTensor, _traced_tensor

_installed = False


def _hop_module() -> Any:
    """`torch._higher_order_ops.flex_attention` (the package attribute of that name is the HOP)."""
    return importlib.import_module("torch._higher_order_ops.flex_attention")


def _holds_traced(args: tuple) -> bool:
    return any(type(value) is TpuTensor and value._traced is not None for value in pytree.tree_leaves(args))


def _on_traced(hop: Any, args: tuple) -> Any:
    """The HOP on the traced tensors inside tpu tensors; its tpu results wrapped as traced tpu tensors."""

    def inner(value: TpuTensor) -> torch.Tensor:
        return value._inner

    def wrap(value: torch.Tensor) -> torch.Tensor:
        if type(value) is not TpuTensor and value.device.type == "tpu":
            return _traced_tensor(value, value.size(), value.stride())
        return value

    return pytree.tree_map_only(torch.Tensor, wrap, hop(*pytree.tree_map_only(TpuTensor, inner, args)))


def _rule(hop: Any, dense: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        if _holds_traced(args):
            return _on_traced(hop, args)
        return dense(*args)

    return run


def _validating_device(original: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]) -> Callable[..., None]:
    @functools.wraps(original)
    def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "tpu":
            original(query, key, value)

    return validate_device


def install() -> None:
    """Register the tpu rules of the forward and backward HOPs and admit tpu tensors (once)."""
    global _installed
    if _installed:
        return
    import torch.nn.attention.flex_attention as flex_api

    hops = _hop_module()
    hops.flex_attention.py_impl(TpuTensor)(_rule(hops.flex_attention, hops.sdpa_dense))
    hops.flex_attention_backward.py_impl(TpuTensor)(_rule(hops.flex_attention_backward, hops.sdpa_dense_backward))
    flex_api._validate_device = _validating_device(flex_api._validate_device)
    _installed = True
