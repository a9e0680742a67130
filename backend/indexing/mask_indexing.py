"""`x[mask]` and `torch.masked_select` on the chip: the tensor is indexed where it lives, only the
mask's count is read on the host.

Selecting through a mask has a data-dependent shape, so XLA cannot compile it from the shapes alone.
torch's own `index` (CUDA's too) turns each mask into indices with `nonzero` first. Here a chip mask
is counted on the chip and the host reads only the count (a data-dependent sync, recorded as such);
a program compiled for that count (rounded up, see `length_buckets`) then finds the set positions
and gathers on the chip, in one program: the mask being the only index (`x[mask]`, `x[:, mask]`,
`masked_select`), or one mask beside indices that broadcast along its count (`x[mask, idx]`, and
writes such as `x[:, mask] = v`: see `mask_beside_indices`). Other calls with masks (two masks, an
index or values as long as the count) go through `nonzero_static` and the lowered `index`, at the
exact count. A mask already on the host
(`x[cpu_mask]`) needs no sync: its positions are found on the host and copied to the chip.

Calls whose masks do not fit the tensor, or 0-dim masks, keep the host fallback, which raises or
computes as torch does.

The backward of `masked_select` scatters the gradient through the mask it was given
(`zeros.masked_scatter_(mask, grad)`), so a host mask reaches `masked_scatter`: there it is copied to
the chip (one host-to-chip transfer) instead of being refused as a tensor on another device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.core.entries import bound
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.indexing import mask_beside_indices
from tputrace.backend.indexing.cuts.layout import cut
from tputrace.backend.indexing.data_dependent import nonzero, sized_step
from tputrace.backend.indexing.length_buckets import padded_length
from tputrace.backend.indexing.mask_counts import MASK_DTYPES, count_set
from tputrace.backend.ops import sized

aten = torch.ops.aten

Handler = Callable[[Any, Sequence[Any], dict], Any]
FromHost = Callable[[torch.Tensor, int], Any]
# Ops that take their mask from the host: `masked_select`'s backward passes the mask it was given.
_HOST_MASK_OPS = {aten.masked_scatter.default, aten.masked_scatter_.default}
_SELECT = sized_step(aten.index.Tensor, sized.mask_select)


def index(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`aten.index.Tensor` with masks, or None if the call has no mask this handles."""
    self = args[0]
    indices = list(args[1] if len(args) > 1 else kwargs["indices"])
    masks = [dim for dim, index_tensor in enumerate(indices) if index_tensor is not None and index_tensor.dtype in MASK_DTYPES]
    if len(masks) == 1 and _chip_mask_alone(indices, masks[0]):
        mask = indices[masks[0]]
        if tuple(mask.shape) != tuple(self.shape[masks[0]:masks[0] + mask.dim()]):
            return None
        return _select(dispatcher, self, mask, masks[0])
    if len(masks) == 1 and (selected := mask_beside_indices.select(dispatcher, self, indices, masks[0])) is not None:
        return selected
    converted = _without_masks(dispatcher, self, indices)
    if converted is None:
        return None
    return aten.index.Tensor(self, converted)


def index_put(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict, op: Any) -> Any | None:
    """`index_put` (or `index_put_`, `_index_put_impl_`) whose masks come with other indices (one mask
    alone is lowered): the same op with each mask replaced by the positions of its set elements, found
    as `x[mask]` finds them; None if the call has no mask this handles."""
    self, indices, values, accumulate = bound(op, args, kwargs)[:4]
    masks = [dim for dim, index_tensor in enumerate(indices) if index_tensor is not None and index_tensor.dtype in MASK_DTYPES]
    if len(masks) == 1 and (written := mask_beside_indices.put(dispatcher, op, self, indices, values, accumulate, masks[0])) is not None:
        return written
    converted = _without_masks(dispatcher, self, indices)
    if converted is None:
        return None
    return op(self, converted, *args[2:], **{name: value for name, value in kwargs.items() if name != "indices"})


def masked_select(dispatcher: DispatcherApi, args: Sequence[Any], kwargs: dict) -> Any | None:
    """`torch.masked_select`: the tensor and the mask broadcast together, then indexed as `x[mask]`
    (None for a 0-dim result or a mask that is not bool, which torch refuses)."""
    self = args[0]
    mask = args[1] if len(args) > 1 else kwargs["mask"]
    if mask.dtype != torch.bool:
        return None
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    if not shape:
        return None
    if mask.device.type == "tpu":
        return _select(dispatcher, self.expand(shape), mask.expand(shape), 0)
    return aten.index.Tensor(self.expand(shape), _host_positions(mask.expand(shape)))


def _chip_mask_alone(indices: Sequence[Any], mask_dim: int) -> bool:
    """Whether the index at `mask_dim` is a chip mask (not 0-dim) and every other index is None."""
    mask = indices[mask_dim]
    return mask.device.type == "tpu" and mask.dim() > 0 and all(index_tensor is None for dim, index_tensor in enumerate(indices) if dim != mask_dim)


def _select(dispatcher: DispatcherApi, self: Any, mask: Any, dim: int) -> Any:
    """`self[..., mask, ...]` (`dim` leading dims before the mask) gathered on the chip by one program
    compiled for the count rounded up, then cut to the count."""
    count = count_set(dispatcher.to_host, mask)
    selected = dispatcher.compute(_SELECT, (self, mask), {"size": padded_length(count, mask.numel()), "dim": dim})
    return cut(selected, dim, count)


def _without_masks(dispatcher: DispatcherApi, self: Any, indices: Sequence[Any]) -> list[Any] | None:
    """The indices with each mask replaced by one index tensor per dim it covers (None when a
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
        converted.extend(_set_positions(dispatcher, index_tensor))
        dim += index_tensor.dim()
        has_mask = True
    return converted if has_mask else None


def _set_positions(dispatcher: DispatcherApi, mask: Any) -> list[Any]:
    """One index tensor per dim of `mask`, together the positions of its set elements: found on the
    chip for a chip mask (only its count is read: a data-dependent sync), on the host for a host one."""
    if mask.device.type == "cpu":
        return _host_positions(mask)
    return list(nonzero(dispatcher, (mask,), {}).unbind(1))


def _host_positions(mask: torch.Tensor) -> list[torch.Tensor]:
    """One host index tensor per dim of a host mask, together the positions of its set elements."""
    return list(mask.nonzero().unbind(1))


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
ROUTES: dict[Any, Callable[[Any, Sequence[Any], dict], Any | None]] = {
    aten.index.Tensor: index, aten.masked_select.default: masked_select,
    **{op: functools.partial(index_put, op=op) for op in (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)},
}
