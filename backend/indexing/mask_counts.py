"""Writes through a boolean mask that read one value per set element: torch's refusal of a count
that does not match.

`x[mask] = values` (`index_put` with one mask) and `x.masked_scatter_(mask, source)` are lowered
without a sync: the chip picks the k-th value for the k-th set element. Without a check, values of
the wrong length were silently cut or repeated. The count of set elements is data, so checking it
reads one number on the host (a sync), taken only when the shapes alone cannot settle it: values
whose dimension facing the mask has a size other than 1 (a broadcast needs no count), or a source
with fewer elements than the mask has positions. CUDA syncs on the same calls: its `index_put_`
turns a mask into indices with `nonzero`, and its `masked_scatter_` counts the mask.

The last few chip masks counted keep their count while their buffer is unwritten, so that the
backward of `x[mask]` (an `index_put` of the gradient through the same mask) and a second `y[mask]`
read no count again: in DEFER_AND_FUSE each such read would also flush the pending graph.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

aten = torch.ops.aten

# What the count's read is recorded as: the op's own data-dependent sync, as `x[mask]`'s.
SYNC_KIND = "data_dependent"
MASK_DTYPES = (torch.bool, torch.uint8)

ToHost = Callable[[Any, str], torch.Tensor]
CountCheck = Callable[[ToHost, Sequence[Any], dict], None]

_REMEMBERED = 8  # how many counted masks keep their count
# id(mask) -> (weak references to the mask and its buffer, the buffer's version when counted, the count)
_counted: dict[int, tuple[weakref.ref, weakref.ref, int, int]] = {}


def count_set(to_host: ToHost, mask: Any) -> int:
    """The number of set (nonzero) elements of a mask, or of any tensor: counted on the chip and read
    on the host for a tpu tensor (a data-dependent sync); a host mask (as `x[host_mask] = values`
    passes, or the backward of `x[host_mask]`) is counted where it is. A chip mask counted lately
    and unwritten since is not read again (see the module's note)."""
    if mask.numel() == 0:
        return 0
    if mask.device.type != "tpu":
        return int(mask.count_nonzero())
    buf = getattr(mask, "_buf", None)  # None while torch.compile traces
    known = _counted.get(id(mask))
    if known is not None and buf is not None and known[0]() is mask and known[1]() is buf and known[2] == buf.version:
        return known[3]
    count = int(to_host(aten.count_nonzero.default(mask), SYNC_KIND).item())
    if buf is not None:
        # An entry under this id (this mask written since, or a dead mask whose id it reuses) is replaced
        # at the newest end: updated in place, it would keep its old place and be the next one dropped.
        _counted.pop(id(mask), None)
        if len(_counted) >= _REMEMBERED:
            del _counted[next(iter(_counted))]
        _counted[id(mask)] = (weakref.ref(mask), weakref.ref(buf), buf.version, count)
    return count


def _broadcasts(value_shape: Sequence[int], result_shape: Sequence[int]) -> bool:
    """Whether values of `value_shape` expand to `result_shape` (`index_put_` drops no leading 1s;
    `x[mask] = values` has dropped them before it calls `index_put_`)."""
    if len(value_shape) > len(result_shape):
        return False
    return all(size in (1, target) for size, target in zip(reversed(value_shape), reversed(result_shape)))


def check_index_put(to_host: ToHost, args: Sequence[Any], kwargs: dict) -> None:
    """`index_put` with one mask: values must broadcast to (count,) + the unmasked dims."""
    self = args[0]
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    values = args[2] if len(args) > 2 else kwargs["values"]
    if len(indices) != 1 or indices[0] is None or indices[0].dtype not in MASK_DTYPES:
        return
    mask = indices[0]
    rest = tuple(self.shape[mask.dim():])
    value_shape = tuple(values.shape)
    facing = len(value_shape) - len(rest) - 1  # the values' dimension that meets the mask's count
    if facing < 0 or (facing == 0 and value_shape[0] == 1):
        return
    result_shape = (count_set(to_host, mask), *rest)
    if not _broadcasts(value_shape, result_shape):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(value_shape)} cannot be broadcast to indexing result of shape {list(result_shape)}")


def check_masked_scatter(to_host: ToHost, args: Sequence[Any], kwargs: dict) -> None:
    """`masked_scatter`: the source needs at least one element per set element of the broadcast mask."""
    self = args[0]
    mask = args[1] if len(args) > 1 else kwargs["mask"]
    source = args[2] if len(args) > 2 else kwargs["source"]
    positions = torch.broadcast_shapes(tuple(self.shape), tuple(mask.shape)).numel()
    if source.numel() >= positions or mask.numel() == 0:
        return
    copies = positions // mask.numel()  # how many times the broadcast repeats each mask element
    if source.numel() < count_set(to_host, mask) * copies:
        raise RuntimeError("Number of elements of source < number of ones in mask")


COUNT_CHECKS: dict[Any, CountCheck] = {
    aten.index_put.default: check_index_put,
    aten.index_put_.default: check_index_put,
    aten._index_put_impl_.default: check_index_put,
    aten.masked_scatter.default: check_masked_scatter,
    aten.masked_scatter_.default: check_masked_scatter,
}
