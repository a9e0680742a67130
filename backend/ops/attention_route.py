"""`scaled_dot_product_attention` on tpu as one op forward and one op backward.

Torch picks a fused attention kernel only for the CPU and CUDA (its choice is a C++ stub a Python
backend cannot fill), so on tpu the call decomposes into torch's math path: per attention about 20
recorded ops forward (scale, mask, bmm, `_safe_softmax`, bmm, and the views and copies between
them) and as many backward. A kernel for the AutogradPrivateUse1 key runs the cases the math path
and `_scaled_dot_product_flash_attention_for_cpu` compute alike as that op instead: it has
torch's own autograd formula, its backward op, and lowerings (`nn.sdpa_flash_for_cpu`), so XLA gets
the whole attention in one place. Other cases keep the math path: dropout (it needs a random key),
an explicit mask (a fully masked row is zeros in the math path's `_safe_softmax`, and a float mask
may need a gradient the flash op does not give), grouped-query heads, inputs that are not 4-D,
batches that broadcast, and a value head size other than the query's (the flash op needs one).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_library: torch.library.Library | None = None


def _flash_computes_alike(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float, enable_gqa: bool) -> bool:
    return (
        attn_mask is None
        and dropout_p == 0.0
        and not enable_gqa
        and query.dim() == key.dim() == value.dim() == 4
        and query.dtype == key.dtype == value.dtype
        and query.dtype.is_floating_point
        and query.shape[0] == key.shape[0] == value.shape[0]
        and query.shape[1] == key.shape[1] == value.shape[1]
        and query.shape[3] == key.shape[3] == value.shape[3]
        and key.shape[2] == value.shape[2]
    )


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    if _flash_computes_alike(query, key, value, attn_mask, dropout_p, enable_gqa):
        return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal, scale=scale)[0]
    return aten.scaled_dot_product_attention.default.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def register() -> None:
    """Register the kernel once."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
