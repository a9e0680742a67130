"""Buffers: what a storage is elsewhere, one array on one chip with a version that changes on every write.

Also the interned `torch.device` of each chip, which every tensor made on the chip carries.
"""

from __future__ import annotations

from typing import Any

import torch

from tputrace.backend.core import memory

_live = memory.live
_peak = memory.peak


class Buffer:
    """One array on one chip; `version` increases with every write so views know to refresh.

    `nbytes` is what the buffer counts against its chip's memory. A plain `Buffer` counts none: it
    holds a pending (deferred) value that was never materialized, and needs no finalizer, which every
    recorded op would pay for. A `CountedBuffer` counts its bytes until it is freed; a buffer becomes
    one when it starts counting (`count`). `spec` is the array's
    (shape, torch dtype) as a plan key reads it: given for an op's output, filled in by the first op
    that reads the buffer otherwise (writes keep a buffer's shape and dtype; a tensor whose geometry
    changes is pointed at another buffer or view), so a plan lookup reads no tensor metadata.
    """

    __slots__ = ("array", "version", "chip", "nbytes", "spec", "origin", "__weakref__")

    def __init__(self, array: Any, chip: int, spec: tuple | None = None) -> None:
        self.array = array
        self.version = 0
        self.chip = chip
        self.nbytes = 0
        self.spec = spec
        # The line and module that made a pending value (an op's output), for the lifetime its flush begins.
        tracker = memory.tracker
        self.origin = None if tracker is None else tracker.op_origin() if spec is not None else tracker.origin()

    def count(self, nbytes: int) -> None:
        """Count `nbytes` against the chip from now until the buffer is freed (its pending value was
        computed, or its released array restored)."""
        self.nbytes = nbytes
        memory.allocate(self.chip, nbytes)
        if type(self) is Buffer:
            self.__class__ = CountedBuffer
        tracker = memory.tracker
        if tracker is not None:
            tracker.allocated(self, nbytes, self.origin)

    def write(self, array: Any) -> None:
        self.array = array
        self.version += 1

    def release(self) -> None:
        """Drop the array and stop counting its bytes: the storage resized to 0, as FSDP2 does to an
        unsharded parameter between uses. Views of the buffer stay views; reading one is an error."""
        if type(self.array) is ReleasedArray:
            return
        self.array = ReleasedArray(tuple(self.array.shape), self.array.dtype)
        _live[self.chip] -= self.nbytes
        self.nbytes = 0
        self.version += 1
        tracker = memory.tracker
        if tracker is not None:
            tracker.freed(self)

    def restore(self) -> None:
        """Give a released buffer a new zero-filled array of its old shape and dtype (storage resized back)."""
        released = self.array
        if type(released) is not ReleasedArray:
            return
        import jax.numpy as jnp

        from tputrace.backend.core import chips

        self.array = jnp.zeros(released.shape, released.dtype, device=chips.device(self.chip))
        self.version += 1
        self.count(released.nbytes)


class CountedBuffer(Buffer):
    """A buffer that counts its array's bytes against its chip until it is freed."""

    __slots__ = ()

    def __init__(self, array: Any, chip: int, nbytes: int, spec: tuple | None = None) -> None:
        self.array = array
        self.version = 0
        self.chip = chip
        self.nbytes = nbytes
        self.spec = spec
        self.origin = None
        live = _live[chip] + nbytes
        _live[chip] = live
        if live > _peak[chip]:
            memory.allocate(chip, 0)
        tracker = memory.tracker
        if tracker is not None and nbytes:
            # With a spec the buffer is an op's output, made just after the op was recorded with its line.
            if spec is not None:
                tracker.op_output_allocated(self, nbytes)
            else:
                tracker.allocated(self, nbytes)

    def __del__(self, _live: list[int] = _live, _memory: Any = memory) -> None:
        # `_live` and `memory` are bound at definition: buffers freed at interpreter exit outlive module globals.
        _live[self.chip] -= self.nbytes
        tracker = _memory.tracker
        if tracker is not None and self.nbytes:
            tracker.freed(self)


class ReleasedArray:
    """What a released buffer holds: the shape and dtype to restore, and no data."""

    __slots__ = ("shape", "dtype", "nbytes")

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape = shape
        self.dtype = dtype
        count = 1
        for size in shape:
            count *= size
        self.nbytes = count * dtype.itemsize

    def __jax_array__(self) -> Any:
        raise RuntimeError("this tpu tensor's storage was freed (untyped_storage().resize_(0)); resize it back before using the tensor")

TORCH_DEVICES: dict[int, torch.device] = {}


def torch_device(chip: int) -> torch.device:
    device = TORCH_DEVICES.get(chip)
    if device is None:
        device = TORCH_DEVICES[chip] = torch.device("tpu", chip)
    return device
