"""Checkpoints of tpu tensors: `torch.save` writes a chip buffer as one storage tagged `tpu:N`, and
`torch.load(..., map_location="tpu")` restores storages onto a chip.

Saving: a tpu tensor pickles as torch pickles a CUDA one, `_rebuild_tensor_v2(storage, offset, size,
stride)`, where the storage is its buffer's `BufferStorage` (one per buffer), tagged `tpu:N` here, so
tensors that shared a buffer (a tensor and its views, tied weights, `tensor.storage()`) share one
storage in the file and still share it when loaded onto the host or a chip; `map_location` (a string,
a dict, a callable such as `lambda storage, loc: storage`) applies to the `tpu:N` tag as to `cuda:N`.
torch copies each storage to the host (`BufferStorage.cpu()`) only when it writes its bytes: one copy
per buffer, one buffer at a time. A bare `untyped_storage()` cannot be saved (see
`BufferStorage.__reduce__`).

Loading: torch restores a storage on a PrivateUse1 device by allocating a storage there, which a device
written in Python cannot back (the process crashes). Instead, a storage mapped to `tpu` or `tpu:N`
(a string, a `torch.device`, a dict entry, or the "tpu" tag of a checkpoint saved elsewhere) is kept
on the host as a `HostStagedStorage` that names its chip. torch then rebuilds each tensor with
`set_(storage, offset, size, stride)` on a tpu tensor: the storage's bytes go to the chip once, as
one buffer, and every tensor saved from that storage becomes a view of it, so tensors that shared
storage (tied weights) still share it.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.serialization

from tputrace.backend.core import chips, routing
from tputrace.backend.core.tensor import BufferStorage
from tputrace.backend.integrations import torchscript

_LOCATION = re.compile(r"^(?:tpu|privateuse1)(?::(\d+))?$")
_CUDA_LOCATION = re.compile(r"^cuda(?::(\d+))?$")
# Before torch's own PrivateUse1 deserializer (priority 23), which would allocate on the device.
_PRIORITY = 19  # the CUDA mapping's deserializer takes the one before it
_registered = False
_cuda_registered = False


class HostStagedStorage(torch.UntypedStorage):
    """A storage's bytes on the host, restored by `torch.load` for chip `_tpu_chip`. torch.load returns
    it as is when the checkpoint holds a bare `tensor.storage()`; saved again, it keeps its tag."""

    _tpu_chip: int
    _tpu_bases: dict[torch.dtype, Any]

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("tpu", self._tpu_chip)

    def chip_base(self, dtype: torch.dtype) -> Any:
        """The whole storage as one flat tpu tensor of `dtype`, copied to the chip on first use."""
        base = self._tpu_bases.get(dtype)
        if base is None:
            host = torch.empty(0, dtype=dtype).set_(self)
            base = self._tpu_bases[dtype] = host.to(torch.device("tpu", self._tpu_chip))
        return base

    def _set_from_file(self, *args: Any) -> Any:
        """A legacy-format checkpoint's bytes, which torch reads after it has rebuilt the tensors: the
        chip copies made for those tensors take the bytes too."""
        result = super()._set_from_file(*args)
        for dtype, base in self._tpu_bases.items():
            base.copy_(torch.empty(0, dtype=dtype).set_(self))
        return result

    def cpu(self) -> "HostStagedStorage":
        """The bytes are on the host already: `torch.save` writes them without another copy."""
        return self


def _staged(nbytes: int, chip: int) -> HostStagedStorage:
    staged = HostStagedStorage(nbytes)
    staged._tpu_chip = chip
    staged._tpu_bases = {}
    return staged


def _tag(storage: Any) -> str | None:
    """`tpu:<chip>` for a tpu buffer's storage, or one `torch.load` restored for a chip."""
    if isinstance(storage, BufferStorage):
        return f"tpu:{storage._tpu_buffer.chip}"
    if isinstance(storage, HostStagedStorage):
        return f"tpu:{storage._tpu_chip}"
    return None


def _restore(storage: torch.UntypedStorage, location: str) -> HostStagedStorage | None:
    match = _LOCATION.match(location)
    if match is None:
        return None
    chip = int(match.group(1) or 0)
    count = chips.count()
    if chip >= count:
        raise RuntimeError(
            f"torch.load: the checkpoint maps a storage to tpu:{chip}, but there are {count} tpu chip(s); "
            "pass map_location='tpu:0' (or set TPUTRACE_CHIPS)"
        )
    staged = _staged(storage.nbytes(), chip)
    staged.copy_(storage)
    return staged


def _restore_cuda(storage: torch.UntypedStorage, location: str) -> HostStagedStorage | None:
    """Under `--as-cuda`: a storage for `cuda` or `cuda:N` (`map_location="cuda"`, or a checkpoint saved on a GPU)
    restored onto the tpu chip of the same index, as one for `tpu:N`."""
    match = _CUDA_LOCATION.match(location)
    return None if match is None else _restore(storage, f"tpu:{match.group(1) or 0}")


def _no_tag(storage: Any) -> None:
    """Saving is tagged by `_tag`: the CUDA mapping adds a deserializer only."""
    return None


def register_cuda_locations() -> None:
    """Restore storages mapped to CUDA onto the tpu chips (`tputrace run --as-cuda`; once)."""
    global _cuda_registered
    if not _cuda_registered:
        torch.serialization.register_package(_PRIORITY - 1, _no_tag, _restore_cuda)
        _cuda_registered = True


def set_from_storage(args: tuple, kwargs: dict) -> Any:
    """`tensor.set_(storage[, offset, size, stride])` on a tpu tensor, for a storage `torch.load` staged."""
    dispatcher = routing.active()
    from tputrace.backend.core.inplace_views import become

    target, storage = args[0], args[1]
    if not isinstance(storage, HostStagedStorage):
        if (contents := torchscript.storage_contents(storage, target.dtype)) is not None:
            return become(target, contents)  # torch.jit.save reading a tpu tensor's storage
        raise RuntimeError(
            "set_ of a tpu tensor to a storage is supported only for storages torch.load restores on a chip; "
            "set it to a tpu tensor instead (tensor.set_(other))"
        )
    base = storage.chip_base(target.dtype)
    if len(args) > 2:
        offset, size, stride = args[2], list(args[3]), list(args[4]) if len(args) > 4 else None
    else:
        offset, size, stride = 0, [base.numel()], None
    if stride is None:
        stride = [1] * len(size)
        for dim in range(len(size) - 2, -1, -1):
            stride[dim] = stride[dim + 1] * max(size[dim + 1], 1)
    view = dispatcher.dispatch(torch.ops.aten.as_strided.default, (base, size, stride, offset), {})
    return become(target, view)


def register() -> None:
    """Add the deserializer to torch's registry and route `set_` from a storage (once)."""
    global _registered
    if _registered:
        return
    torch.serialization.register_package(_PRIORITY, _tag, _restore)
    routing.register_special(torch.ops.aten.set_.source_Storage, set_from_storage)
    routing.register_special(torch.ops.aten.set_.source_Storage_storage_offset, set_from_storage)
    _registered = True
