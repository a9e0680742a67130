"""`x[mask]` and `torch.masked_select` on the chip: a boolean mask becomes the integer indices of
its set elements, read on the host, and the tensor is indexed where it lives.

Selecting through a mask has a data-dependent shape, so XLA cannot compile it from the shapes alone.
Before this, the call ran as a CPU fallback: the whole tensor was copied to the host, indexed there,
and the result copied back. torch's own `index` (CUDA's too) turns each mask into indices with
`nonzero` first; here that `nonzero` runs on the host, on the mask only: a mask already on the host
(`x[cpu_mask]`) needs no sync, and a chip mask is read once (a data-dependent sync, recorded as
such). The integer indices then go to the lowered `index`, so the tensor never leaves the chip.

Calls whose masks do not fit the tensor, or 0-dim masks, keep the host fallback, which raises or
computes as torch does.

The backward of `masked_select` scatters the gradient through the mask it was given
(`zeros.masked_scatter_(mask, grad)`), so a host mask reaches `masked_scatter`: there it is copied to
the chip (one host-to-chip transfer) instead of being refused as a tensor on another device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.mask_counts import MASK_DTYPES, SYNC_KIND, ToHost
from tputrace.backend.tensor import TpuTensor

aten = torch.ops.aten

Handler = Callable[[Any, Sequence[Any], dict], Any]
FromHost = Callable[[torch.Tensor, int], Any]
# Ops that take their mask from the host: `masked_select`'s backward passes the mask it was given.
_HOST_MASK_OPS = {aten.masked_scatter.default, aten.masked_scatter_.default}


def index(to_host: ToHost, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`aten.index.Tensor` with its masks replaced by indices, or None if the call has no mask this handles."""
    self = args[0]
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    converted = _without_masks(to_host, self, indices)
    if converted is None:
        return None
    return aten.index.Tensor(self, converted)


def masked_select(to_host: ToHost, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`torch.masked_select`: the tensor and the mask broadcast together, then indexed as `x[mask]`
    (None for a 0-dim result or a mask that is not bool, which torch refuses)."""
    self = args[0]
    mask = args[1] if len(args) > 1 else kwargs["mask"]
    if mask.dtype != torch.bool:
        return None
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    if not shape:
        return None
    return aten.index.Tensor(self.expand(shape), _set_positions(to_host, mask.expand(shape)))


def _without_masks(to_host: ToHost, self: Any, indices: Sequence[Any]) -> list[Any] | None:
    """The indices with each mask replaced by one host index tensor per dim it covers (None when a
    mask is 0-dim or does not match the dims it covers, and when there is no mask)."""
    converted: list[Any] = []
    dim = 0
    has_mask = False
    for index_tensor in indices:
        if index_tensor is None or index_tensor.dtype not in MASK_DTYPES:
            converted.append(index_tensor)
            dim += 1
            continue
        covered = tuple(self.shape[dim:dim + index_tensor.dim()])
        if index_tensor.dim() == 0 or tuple(index_tensor.shape) != covered:
            return None
        converted.extend(_set_positions(to_host, index_tensor))
        dim += index_tensor.dim()
        has_mask = True
    return converted if has_mask else None


def _set_positions(to_host: ToHost, mask: Any) -> list[torch.Tensor]:
    """One host index tensor per dim of `mask`, together the positions of its set elements (a chip
    mask is read first: a data-dependent sync)."""
    host_mask = mask if mask.device.type == "cpu" else to_host(mask, SYNC_KIND)
    return list(host_mask.nonzero().unbind(1))


def host_mask_route(handler: Handler, op: Any, from_host: FromHost) -> Handler:
    """The dispatcher's handler for `op`, copying a host mask to the tensor's chip first when `op`
    takes one (`masked_scatter`)."""
    if op not in _HOST_MASK_OPS:
        return handler

    def with_mask_on_chip(entry: Any, args: Sequence[Any], kwargs: dict) -> Any:
        mask = args[1] if len(args) > 1 else kwargs.get("mask")
        if not isinstance(mask, torch.Tensor) or mask.device.type != "cpu" or not isinstance(args[0], TpuTensor):
            return handler(entry, args, kwargs)
        chip_mask = from_host(mask, args[0]._buf.chip)
        if len(args) > 1:
            return handler(entry, (args[0], chip_mask, *args[2:]), kwargs)
        return handler(entry, args, {**kwargs, "mask": chip_mask})

    return with_mask_on_chip


# The ops whose calls with a mask run here rather than as a CPU fallback (see `Dispatcher.fallback`).
ROUTES: dict[Any, Callable[[ToHost, Sequence[Any], dict], Any | None]] = {
    aten.index.Tensor: index, aten.masked_select.default: masked_select,
}
