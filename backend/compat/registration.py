"""Registers the `tpu` device with PyTorch: the PrivateUse1 backend name, its device module
(`torch.tpu`), hooks and device guard, the factory kernels, `torch.Generator(device="tpu")`, the op
lowerings, the fake-tensor strides of tpu convolutions, the multi-tensor (`_foreach_*`) path of
optimizers and gradient clipping, and the third-party entry points adapted to tpu (checkpoints,
DataParallel, safetensors loads, accelerate). torch's reference kernels (the meta kernels of shape
inference) run without importing Dynamo until something else imports it (`refs_before_dynamo`)."""

from __future__ import annotations

import torch
import torch.utils.backend_registration as backend_registration

from tputrace.backend import distributed
from tputrace.backend.compat import (
    accelerator_api,
    autocast,
    chip_backward,
    device_module,
    gradient_devices,
    host_pinning,
    module_moves,
    process_sharing,
)
from tputrace.backend.core import dispatch  # noqa: F401 - makes the process's Dispatcher, which `routing.active()` gives
from tputrace.backend.core import generators, hooks, inplace_views, kernels, op_routes, sparse, worker_errors
from tputrace.backend.indexing import packed_sequences
from tputrace.backend.indexing.cuts import routes as cut_routes
from tputrace.backend.integrations import (
    accelerate_support,
    checkpoints,
    control_flow,
    data_parallel,
    export_constants,
    export_decompositions,
    export_dims,
    fake_constants,
    fake_convolutions,
    fake_grouped_mm,
    flex_attention,
    lazy_params,
    refs_before_dynamo,
    safetensors_devices,
    torchscript,
)
from tputrace.backend.compile import register as register_dynamo_backend
from tputrace.backend.ops import activation_route, attention_route, register_all, rnn_route

BACKEND_NAME = "tpu"
_registered = False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_PRIVATE_USE1 = torch._C._autograd.DeviceType.PrivateUse1


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self) -> torch._C._autograd.DeviceType:
        """Called from C++ around every op and autograd node on a tpu tensor: a constant."""
        return _PRIVATE_USE1


def register() -> None:
    """Make `tpu` a PyTorch device (idempotent)."""
    global _registered
    if _registered:
        return
    register_all()
    if torch._C._get_privateuse1_backend_name() != BACKEND_NAME:
        backend_registration._setup_privateuseone_for_python_backend(
            rename=BACKEND_NAME, backend_module=device_module, hook=_Hooks(), device_guard=_DeviceGuard()
        )
    kernels.register()
    refs_before_dynamo.install()
    generators.install()
    host_pinning.register()
    process_sharing.install()
    checkpoints.register()
    sparse.register()
    inplace_views.register()
    op_routes.register()
    packed_sequences.register()
    cut_routes.install()
    attention_route.register()
    activation_route.register()
    rnn_route.register()
    autocast.register()
    hooks.install()
    worker_errors.install()
    gradient_devices.install()
    chip_backward.install()
    accelerator_api.install()
    data_parallel.install()
    module_moves.install()
    lazy_params.install()
    safetensors_devices.install()
    accelerate_support.install()
    torchscript.install()
    flex_attention.install()
    control_flow.install()
    export_dims.install()
    export_constants.install()
    export_decompositions.install()
    fake_convolutions.install()
    fake_constants.install()
    fake_grouped_mm.install()
    distributed.register()
    register_dynamo_backend()
    _enable_foreach()
    _disable_mha_fast_path()
    _registered = True


def _disable_mha_fast_path() -> None:
    """Turn off torch's inference fast path of `nn.MultiheadAttention` and `nn.Transformer*` (eval,
    no grad): on an accelerator it converts padded batches to nested tensors, which XLA cannot hold,
    and runs fused CUDA kernels, which would be CPU fallbacks here. The standard path is lowered and
    fused by XLA. The switch is process-wide (`torch.backends.mha`); results are the same."""
    torch.backends.mha.set_fastpath_enabled(False)


def _enable_foreach() -> None:
    """Let optimizers and `clip_grad_norm_` default to their `_foreach_*` path on tpu, one op per
    parameter list instead of one per parameter: torch allows it only for the exact tensor types it
    lists (as DTensor adds itself), and a TpuTensor is a subclass."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    from tputrace.backend.core.tensor import TpuTensor

    for supported in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if TpuTensor not in supported:
            supported.append(TpuTensor)
