"""Resizes while torch.compile traces: a traced tpu tensor whose inner tensor an op resized takes the
inner tensor's sizes and strides, as a CPU tensor's fake would."""

from __future__ import annotations

from typing import Any

import torch

from tputrace.backend.core.entries import written_arguments


def follow_resized_inners(func: Any, args: tuple, kwargs: dict, tensor_type: type) -> None:
    """A traced TpuTensor the op wrote whose inner tensor it resized (an `out=` tensor of another
    shape, `resize_`) takes the inner tensor's sizes and strides, as a CPU tensor's fake would: so
    Dynamo sees the resize, and breaks the graph there as it does on the CPU (instead of guarding
    on sizes the wrapper no longer agrees with its inner tensor on). `tensor_type`: the TpuTensor class."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    from torch.utils._mode_utils import no_dispatch

    for argument in written_arguments(func):
        written = args[argument.position] if argument.position < len(args) else kwargs.get(argument.name)
        for tensor in written if isinstance(written, (list, tuple)) else (written,):
            if type(tensor) is not tensor_type or tensor._traced is None:
                continue
            inner = tensor._traced
            outer_geometry = (tensor.dim(), *tensor.shape, *tensor.stride(), tensor.storage_offset())
            inner_geometry = (inner.dim(), *inner.shape, *inner.stride(), inner.storage_offset())
            if len(outer_geometry) == len(inner_geometry) and all(statically_known_true(a == b) for a, b in zip(outer_geometry, inner_geometry)):
                continue
            # torch's way to change a wrapper's metadata only (as `return_and_correct_aliasing` does
            # for in-place view ops): a meta kernel, which grows the wrapper's empty storage too.
            with no_dispatch():
                meta_in_tls = torch._C._meta_in_tls_dispatch_include()
                torch._C._set_meta_in_tls_dispatch_include(True)
                try:
                    torch.ops.aten.set_.source_Storage_storage_offset(
                        tensor, torch.Tensor.untyped_storage(tensor), inner.storage_offset(), inner.shape, inner.stride()
                    )
                finally:
                    torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
