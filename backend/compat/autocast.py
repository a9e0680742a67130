"""Autocast on device type `tpu`: matmul-like ops run in the autocast dtype (bfloat16 by default on
TPUs), precision-sensitive ops in float32, everything else falls through, as torch does on CUDA.

PyTorch registers no autocast kernels for a Python backend, so the policy is registered here on the
AutocastPrivateUse1 key. torch's default autocast dtype for such a backend is float16, kept per
thread; `torch.autocast("tpu")` with no dtype gives bfloat16 here, on every thread.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_LOWER_PRECISION = (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input",
    "_convolution", "convolution", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "mv",
    "linear", "prelu", "chain_matmul", "linalg_multi_dot", "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
_FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "group_norm", "norm.Scalar", "norm.ScalarOpt_dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
    "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "softmax.int", "log_softmax.int", "cross_entropy_loss", "cumsum", "cumprod", "sum", "prod",
)

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_library: torch.library.Library | None = None
_fallthrough_library: torch.library.Library | None = None
_thread_default = threading.local()  # `.applied`: this thread's tpu autocast dtype was defaulted


def _apply_thread_default() -> None:
    """Make bfloat16 this thread's tpu autocast dtype, once per thread, unless the thread already
    chose another dtype than torch's float16 default."""
    if getattr(_thread_default, "applied", False):
        return
    _thread_default.applied = True
    if torch.get_autocast_dtype("tpu") == torch.float16:
        torch.set_autocast_dtype("tpu", torch.bfloat16)


def _install_thread_default() -> None:
    """Default the dtype on the importing thread now and on any other thread when it first makes a
    tpu autocast context without naming a dtype."""
    autocast_class = torch.amp.autocast_mode.autocast
    original_init = autocast_class.__init__

    def __init__(self: Any, device_type: str, dtype: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_type == "tpu" and dtype is None:
            _apply_thread_default()
        original_init(self, device_type, dtype, *args, **kwargs)

    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    autocast_class.__init__ = __init__
    _apply_thread_default()


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == "tpu" and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, dtype) for item in value)
    return value


def _kernel(op: Any, policy: str) -> Any:
    def autocast_kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("tpu") if policy == "lower" else torch.float32
        args = _cast(args, dtype)
        kwargs = {name: _cast(value, dtype) for name, value in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
            return op(*args, **kwargs)

    return autocast_kernel


def _overload(name: str) -> Any:
    packet_name, _, overload_name = name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None)
    if packet is None:
        return None
    return getattr(packet, overload_name or "default", None)


def register() -> None:
    """Register the autocast policy once: fallthrough for every op, casts for the listed ones."""
    global _library, _fallthrough_library
    if _library is not None:
        return
    _install_thread_default()
    _fallthrough_library = torch.library.Library("_", "IMPL")
    _fallthrough_library.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _library = torch.library.Library("aten", "IMPL")
    for policy, names in (("lower", _LOWER_PRECISION), ("float32", _FLOAT32)):
        for name in names:
            op = _overload(name)
            if op is None:
                continue
            _library.impl(op._schema.name.split("::")[1] + (f".{op._overloadname}" if op._overloadname != "default" else ""), _kernel(op, policy), "AutocastPrivateUse1")
