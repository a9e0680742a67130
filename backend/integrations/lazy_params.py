"""Uninitialized parameters and buffers (lazy modules: `nn.LazyLinear`, `nn.LazyConv2d`, ...) on tpu.

torch makes `UninitializedParameter`/`UninitializedBuffer` with `Tensor._make_subclass` and
`as_subclass`, which give an existing tensor a new Python class. A tpu tensor is a wrapper subclass
whose Python object is already a `TpuTensor`, so torch refuses both. An uninitialized tensor on tpu
is instead one of the classes here: torch's uninitialized class and `TpuTensor` at once, an empty
tpu tensor that `is_lazy` recognises, that moves between chips and dtypes as on CUDA, and that
`materialize` turns into an ordinary tpu parameter (or buffer) on its chip.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter, UninitializedTensorMixin

from tputrace.backend.core.tensor import SUBCLASS_ALIASES, TpuTensor

_installed = False


def _shape(self: torch.Tensor) -> torch.Size:
    """torch's error for a user's `.shape`; the empty shape for the device's own kernels, which run
    with torch functions off (the only ops they see are the moves and casts torch allows)."""
    if torch._C._is_torch_function_enabled():
        return UninitializedTensorMixin.shape.fget(self)  # type: ignore[attr-defined]
    return torch._C.TensorBase.shape.__get__(self)


class TpuUninitializedParameter(UninitializedParameter, TpuTensor):  # type: ignore[misc]
    """An `UninitializedParameter` on a tpu chip."""

    cls_to_become = TpuTensor
    torch_class = UninitializedParameter
    shape = property(_shape)  # type: ignore[assignment]

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """torch's, refusing a move off tpu: `Module._apply` would keep its result as an initialized
        empty parameter (a CPU tensor cannot take a tpu tensor's place with `.data =`)."""
        result = super().__torch_function__(func, types, args, kwargs)
        if isinstance(result, torch.Tensor) and not isinstance(result, TpuTensor):
            raise RuntimeError(
                f"an uninitialized parameter on tpu cannot move to {result.device}: run the lazy module's first forward "
                "(or load_state_dict) before moving it off tpu, or move it to tpu only after building it on the host"
            )
        return result

    def materialize(self, shape: Any, device: Any = None, dtype: torch.dtype | None = None) -> None:
        """torch's materialize: an empty tensor of `shape` on this chip (or `device`), then a tpu parameter."""
        super().materialize(shape, device, dtype)
        self._is_param = True

    def __repr__(self) -> str:
        return f"<{self.torch_class.__name__}>"

    __str__ = __repr__

    def __deepcopy__(self, memo: dict) -> Any:
        if id(self) not in memo:
            memo[id(self)] = self.torch_class(self.requires_grad, self.data.device, self.data.dtype)
        return memo[id(self)]

    def __reduce_ex__(self, proto: int) -> Any:
        """Pickled as torch pickles an uninitialized tensor: its class and requires_grad, no device."""
        return (self.torch_class, (self.requires_grad,))


class TpuUninitializedBuffer(UninitializedBuffer, TpuTensor):  # type: ignore[misc]
    """An `UninitializedBuffer` on a tpu chip."""

    cls_to_become = TpuTensor
    torch_class = UninitializedBuffer
    shape = property(_shape)  # type: ignore[assignment]
    __repr__ = __str__ = TpuUninitializedParameter.__repr__
    __reduce_ex__ = TpuUninitializedParameter.__reduce_ex__

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """torch's: the allowed methods only, and their tensor results as uninitialized buffers
        (`.to`, `.double()` keep the buffer lazy, as `Tensor.__torch_function__` does on CUDA)."""
        result = super().__torch_function__(func, types, args, kwargs)
        if func in torch.overrides.get_default_nowrap_functions():
            return result
        return torch._tensor._convert(result, UninitializedBuffer)

    def __deepcopy__(self, memo: dict) -> Any:
        if id(self) not in memo:
            data = self.data
            persistent = getattr(self, "persistent", True)
            memo[id(self)] = UninitializedBuffer(self.requires_grad, data.device, data.dtype, persistent)
        return memo[id(self)]


_TPU_CLASSES: dict[type, type] = {UninitializedParameter: TpuUninitializedParameter, UninitializedBuffer: TpuUninitializedBuffer}


def tpu_class_of(cls: type) -> type | None:
    """The tpu class standing for torch's uninitialized class `cls` (or `cls`, already one), else None."""
    if cls in _TPU_CLASSES.values():
        return cls
    return _TPU_CLASSES.get(cls)


def as_uninitialized(tensor: TpuTensor, cls: type, requires_grad: bool | None = None) -> TpuTensor:
    """`tensor.as_subclass(cls)` for an uninitialized class: an alias of the tensor of its tpu class."""
    tpu_class = tpu_class_of(cls)
    if tpu_class is None:
        raise TypeError(f"{cls.__name__} is not an uninitialized tensor class")
    return TpuTensor.__new__(
        tpu_class,
        tensor._buf,
        tuple(tensor.size()),
        tensor.dtype,
        tuple(tensor.stride()),
        tensor.storage_offset(),
        view=tensor._view,
        requires_grad=tensor.requires_grad if requires_grad is None else requires_grad,
    )


def _make_uninitialized(cls: type, requires_grad: bool, device: Any, dtype: torch.dtype | None) -> torch.Tensor | None:
    """The empty tensor torch's `__new__` would make, as a tpu uninitialized tensor when it is on tpu
    (a `device="tpu"` argument or a `with torch.device("tpu")` block); None when it is not."""
    data = torch.empty(0, device=device, dtype=dtype)
    if not isinstance(data, TpuTensor):
        return None
    return as_uninitialized(data, cls, requires_grad)


def _install_constructors() -> None:
    """Route torch's uninitialized classes to their tpu classes when their device is tpu."""
    make_parameter = UninitializedParameter.__new__
    make_buffer = UninitializedBuffer.__new__

    def new_parameter(cls: type, requires_grad: bool = True, device: Any = None, dtype: torch.dtype | None = None) -> Any:
        if cls is UninitializedParameter:
            made = _make_uninitialized(cls, requires_grad, device, dtype)
            if made is not None:
                made._is_param = True
                return made
        return make_parameter(cls, requires_grad, device, dtype)

    def new_buffer(cls: type, requires_grad: bool = False, device: Any = None, dtype: torch.dtype | None = None, persistent: bool = True) -> Any:
        if cls is UninitializedBuffer:
            made = _make_uninitialized(cls, requires_grad, device, dtype)
            if made is not None:
                made.persistent = persistent
                made._is_buffer = True
                return made
        return make_buffer(cls, requires_grad, device, dtype, persistent)

    UninitializedParameter.__new__ = new_parameter  # type: ignore[method-assign]
    UninitializedBuffer.__new__ = new_buffer  # type: ignore[method-assign]


def keep_uninitialized(held: torch.Tensor) -> type | None:
    """The tpu class an uninitialized parameter `held` must keep after `Module._apply` swaps a tpu
    tensor into it (torch swaps the classes too), or None for any other tensor."""
    if isinstance(held, UninitializedParameter):
        return TpuUninitializedParameter
    if isinstance(held, UninitializedBuffer):
        return TpuUninitializedBuffer
    return None


def install() -> None:
    """Make torch's uninitialized classes build tpu uninitialized tensors on tpu (once)."""
    global _installed
    if _installed:
        return
    _install_constructors()
    for cls in (*_TPU_CLASSES, *_TPU_CLASSES.values()):
        SUBCLASS_ALIASES[cls] = as_uninitialized
    _installed = True


__all__ = ["TpuUninitializedBuffer", "TpuUninitializedParameter", "as_uninitialized", "install", "keep_uninitialized", "tpu_class_of"]
