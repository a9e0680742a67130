"""The tensor type of the `tpu` device: a torch wrapper subclass whose data is a JAX array.

A `Buffer` is what a storage is elsewhere: one array on one chip, with a version that changes on
every write. A tensor is either the whole buffer (`view is None`) or a view of it: a chain of ATen
view ops applied to the buffer's array. A view computes its value from the buffer when the buffer's
version has moved, and a write through a view is scattered back into the buffer, so views stay views
as in torch.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
import torch

from tputrace.backend import memory

_live = memory.live
_peak = memory.peak

_local = threading.local()
_MAIN_THREAD = threading.main_thread().ident


def _on_autograd_worker() -> bool:
    """True on a thread that PyTorch's C++ autograd engine started (Python sees a dummy thread)."""
    return isinstance(threading.current_thread(), threading._DummyThread)


def sync_hint() -> str | None:
    """The kind of host sync the user's call is making (set around tolist/numpy/print/bool)."""
    return getattr(_local, "sync_kind", None)


class _SyncKind:
    """Marks the host syncs inside a block as being of one kind (e.g. 'print')."""

    __slots__ = ("kind", "previous")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.previous: str | None = None

    def __enter__(self) -> None:
        self.previous = getattr(_local, "sync_kind", None)
        if self.previous is None:
            _local.sync_kind = self.kind

    def __exit__(self, *exc: object) -> None:
        _local.sync_kind = self.previous


class Buffer:
    """One array on one chip; `version` increases with every write so views know to refresh.

    `nbytes` is what the buffer counts against its chip's memory: 0 while it holds a pending
    (deferred) value that was never materialized, its size once it has been.
    """

    __slots__ = ("array", "version", "chip", "nbytes", "__weakref__")

    def __init__(self, array: Any, chip: int, nbytes: int) -> None:
        self.array = array
        self.version = 0
        self.chip = chip
        self.nbytes = nbytes
        live = _live[chip] + nbytes
        _live[chip] = live
        if live > _peak[chip]:
            memory.allocate(chip, 0)

    def __del__(self) -> None:
        _live[self.chip] -= self.nbytes

    def write(self, array: Any) -> None:
        self.array = array
        self.version += 1


_DEVICES: dict[int, torch.device] = {}
_make_wrapper = torch.Tensor._make_wrapper_subclass


def torch_device(chip: int) -> torch.device:
    device = _DEVICES.get(chip)
    if device is None:
        device = _DEVICES[chip] = torch.device("tpu", chip)
    return device


class TpuTensor(torch.Tensor):
    """A tensor on `tpu:<chip>`; its data is `self._buf.array`, seen through `self._view`."""

    _buf: Buffer
    _view: Any = None
    _cached: Any = None
    _cached_version: int = -1

    @staticmethod
    def __new__(
        cls,
        buf: Buffer,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        strides: tuple[int, ...] | None = None,
        storage_offset: int = 0,
        view: Any = None,
        requires_grad: bool = False,
    ) -> "TpuTensor":
        if strides is None:
            tensor = _make_wrapper(cls, shape, dtype=dtype, device=torch_device(buf.chip), requires_grad=requires_grad)
        else:
            tensor = _make_wrapper(
                cls, shape, strides=strides, storage_offset=storage_offset, dtype=dtype, device=torch_device(buf.chip), requires_grad=requires_grad
            )
        tensor._buf = buf
        if view is not None:
            tensor._view = view
        return tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        from tputrace.backend.dispatch import dispatcher

        if threading.get_ident() != _MAIN_THREAD and _on_autograd_worker():
            return dispatcher.dispatch_on_worker(func, args, kwargs or {})
        return dispatcher.dispatch(func, args, kwargs or {})

    @property
    def chip(self) -> int:
        return self._buf.chip

    def _host_copy(self, kind: str) -> torch.Tensor:
        with _SyncKind(kind):
            return self.detach().to("cpu")

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        host = self._host_copy("print")
        text = torch._tensor_str._str(host.detach())
        suffixes = [f"device='{self.device}'"]
        if self.grad_fn is not None:
            suffixes.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            suffixes.append("requires_grad=True")
        head, _, _ = text.rpartition(")")
        dtype_marker = ", dtype="
        if dtype_marker in head:
            before, _, after = head.rpartition(dtype_marker)
            head = f"{before}, {suffixes[0]}{dtype_marker}{after}"
            suffixes = suffixes[1:]
        return head + "".join(f", {suffix}" for suffix in suffixes) + ")"

    __str__ = __repr__

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            with _SyncKind("print"):
                return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __bool__(self) -> bool:
        with _SyncKind("bool"):
            return super().__bool__()

    def tolist(self) -> Any:
        return self._host_copy("tolist").tolist()

    def numpy(self, *, force: bool = False) -> Any:
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
            )
        return self._host_copy("numpy").numpy()

    def backward(self, gradient: Any = None, retain_graph: Any = None, create_graph: bool = False, inputs: Any = None) -> None:
        from tputrace.backend import hooks

        from tputrace.backend.dispatch import dispatcher

        hooks.backward_started()
        super().backward(gradient, retain_graph, create_graph, inputs)
        dispatcher.raise_worker_errors()
        hooks.flush_pending("backward_end")

    def __reduce_ex__(self, proto: int) -> Any:
        """Saved as a CPU tensor plus its device, which `torch.load(weights_only=True)` accepts."""
        host = self._host_copy("cpu")
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor, (host, self.dtype, str(self.device), self.requires_grad))

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        array = self.numpy(force=True)
        return array if dtype is None else array.astype(dtype)


def is_tpu_tensor(value: object) -> bool:
    return isinstance(value, TpuTensor)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def new_tensor(array: jax.Array | Any, chip: int, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> TpuTensor:
    """A fresh (non-view) tpu tensor owning `array` (the dispatcher's hot path)."""
    device = _DEVICES.get(chip) or torch_device(chip)
    tensor = _make_wrapper(TpuTensor, shape, dtype=dtype, device=device)
    tensor._buf = Buffer(array, chip, nbytes)
    return tensor
