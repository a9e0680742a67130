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

The kernel follows the backends a user selects (`torch.nn.attention.sdpa_kernel`) as torch's CPU
dispatch does, which reads only the flash and math flags: with flash off it takes the math path,
whose ops have double-backward and forward-AD formulas the flash op lacks; with math off it raises
the CPU's errors where the CPU's flash kernel refuses the inputs, and runs as by default elsewhere
(the math path there computes what the CPU's flash kernel does, zeros for fully masked rows too).
"""

from __future__ import annotations

import warnings

import torch

aten = torch.ops.aten
_library: torch.library.Library | None = None

_NO_VIABLE_BACKEND = "No viable backend for scaled_dot_product_attention was found. This is likely due to turning off both the math kernel and the fused kernels."
_NO_AVAILABLE_KERNEL = "No available kernel.  Aborting execution."
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


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


def _heads_refusal(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> str | None:
    """Why the CPU's flash kernel refuses these head counts (its `check_batch_size_and_num_heads_dense`), or None."""
    query_heads, key_heads, value_heads = query.shape[1], key.shape[1], value.shape[1]
    if not enable_gqa:
        return None if query_heads == key_heads == value_heads else "query, key and value must have the same number of heads"
    if key_heads != value_heads:
        return "key and value must have the same number of heads"
    return None if query_heads % key_heads == 0 else "the number of key and value heads must divide the number of query heads"


def _mask_fits(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor) -> bool:
    """Whether the CPU's flash kernel takes this mask (its `check_attn_mask_shape`)."""
    if attn_mask.requires_grad or attn_mask.dim() not in (2, 4):
        return False
    if attn_mask.shape[-2] not in (1, query.shape[2]) or attn_mask.shape[-1] not in (1, key.shape[2]):
        return False
    return attn_mask.dim() == 2 or (attn_mask.shape[0] in (1, query.shape[0]) and attn_mask.shape[1] in (1, query.shape[1]))


def _flash_refusal(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float, enable_gqa: bool) -> str | None:
    """Why torch's CPU dispatch would not run its flash kernel on these inputs (`use_flash_attention_cpp`), or None."""
    tensors = (query, key, value)
    if dropout_p > 0.0:
        return "the flash kernel does not support non-zero dropout"
    if any(tensor.dim() != 4 for tensor in tensors):
        return "query, key and value must be 4-D"
    if not query.shape[0] == key.shape[0] == value.shape[0]:
        return "query, key and value must have the same batch size"
    heads_refusal = _heads_refusal(query, key, value, enable_gqa)
    if heads_refusal is not None:
        return heads_refusal
    if attn_mask is not None and not _mask_fits(query, key, attn_mask):
        return "the mask must not require grad and must be 2-D (L or 1, S or 1) or 4-D (N or 1, H or 1, L or 1, S or 1)"
    if not query.shape[3] == key.shape[3] == value.shape[3]:
        return "query, key and value must have the same head size"
    if any(tensor.stride(-1) != 1 for tensor in tensors):
        return "the last dimension of query, key and value must have stride 1"
    if query.dtype not in _FLASH_DTYPES or not query.dtype == key.dtype == value.dtype:
        return "query, key and value must share one dtype of float32, float64, bfloat16 or float16"
    return None


def _check_selection(flash_enabled: bool, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float, enable_gqa: bool) -> None:
    """With the math backend off, raise the CPU's errors where its dispatch finds no kernel (`select_sdp_backend_cpp`)."""
    if not flash_enabled:
        raise RuntimeError(_NO_VIABLE_BACKEND)
    refusal = _flash_refusal(query, key, value, attn_mask, dropout_p, enable_gqa)
    if refusal is not None:
        warnings.warn(f"Flash attention kernel not used because: {refusal}", stacklevel=4)
        raise RuntimeError(_NO_AVAILABLE_KERNEL)


def _takes_flash_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None, dropout_p: float, enable_gqa: bool) -> bool:
    """Whether the call runs as the flash op rather than the math path, under the user's backend selection.

    Flash off: the math path. Math off: the CPU's errors where its flash kernel refuses the inputs;
    elsewhere, as with both on (the default), the flash op where it computes as the math path does."""
    flash_enabled = torch.backends.cuda.flash_sdp_enabled()
    if not torch.backends.cuda.math_sdp_enabled():
        _check_selection(flash_enabled, query, key, value, attn_mask, dropout_p, enable_gqa)
    return flash_enabled and _flash_computes_alike(query, key, value, attn_mask, dropout_p, enable_gqa)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    if _takes_flash_op(query, key, value, attn_mask, dropout_p, enable_gqa):
        return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal, scale=scale)[0]
    return aten.scaled_dot_product_attention.default.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def register() -> None:
    """Register the kernel once."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
