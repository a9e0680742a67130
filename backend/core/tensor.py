"""The tensor type of the `tpu` device: a torch wrapper subclass whose data is a JAX array.

A tensor sees one `Buffer` (`buffers`): the whole buffer (`view is None`) or a view of it, a chain of
ATen view ops applied to the buffer's array. A view computes its value from the buffer when the
buffer's version has moved, and a write through a view is scattered back into the buffer, so views
stay views as in torch.
"""

from __future__ import annotations

import collections
import copy
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax
import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor

from tputrace.backend.core import routing
from tputrace.backend.core.buffers import TORCH_DEVICES, Buffer, CountedBuffer, ReleasedArray, torch_device
from tputrace.backend.core.memory_formats import dense_strides
from tputrace.backend.core.thread_state import SyncKind, keep_interpreter_error, on_autograd_worker, on_own_thread
from tputrace.backend.core.traced_resizes import follow_resized_inners
from tputrace.backend.core.views import Geometry, ViewChain, geometry, permute_step
from tputrace.backend.integrations.make_fx_tracing import fake_mode_of, fake_of_constant, fake_of_lifted_constant, track_untraced_constants


_MAIN_THREAD = threading.main_thread().ident
_get_ident = threading.get_ident
_LIFT_FRESH = torch.ops.aten.lift_fresh.default
_dispatch_modes = torch._C._len_torch_dispatch_stack  # nonzero while a dispatch mode (make_fx's, a user's) is on


class BufferStorage(torch.UntypedStorage):
    """What `untyped_storage()` returns for a tpu tensor: the buffer's size in bytes, `resize_` to 0
    (release the buffer) and back to its size (restore it), and a host copy of its bytes (`cpu()`,
    which `torch.save` writes). Anything else raises. The object is an empty meta storage underneath,
    so identity, weak references and isinstance checks behave as for other storages; there is one
    per buffer while it is referenced."""

    _tpu_buffer: Buffer

    def size(self) -> int:
        buf = self._tpu_buffer
        if type(buf.array) is ReleasedArray:
            return 0
        # A DeferAndFuse buffer counts no bytes until its value is computed; its storage is not empty.
        return buf.nbytes or getattr(buf.array, "nbytes", 0)

    def nbytes(self) -> int:
        return self.size()

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch_device(self._tpu_buffer.chip)

    def data_ptr(self) -> int:
        """Not an address: a nonzero number unique to the live buffer, 0 while it is released."""
        return 0 if type(self._tpu_buffer.array) is ReleasedArray else id(self._tpu_buffer)

    def resize_(self, size: int) -> "BufferStorage":  # type: ignore[override]
        buf = self._tpu_buffer
        full = buf.array.nbytes if type(buf.array) is ReleasedArray else _array_nbytes(buf.array)
        if size == 0:
            buf.release()
        elif size == full:
            buf.restore()
        else:
            raise RuntimeError(f"a tpu storage can only be resized to 0 or back to its size ({full} bytes), not {size}")
        return self

    def cpu(self) -> torch.UntypedStorage:
        """A host copy of the whole buffer: the one copy `torch.save` makes of it, when it writes it."""
        from tputrace.backend.core.dtypes import to_torch

        buf = self._tpu_buffer
        whole = TpuTensor(buf, tuple(buf.array.shape), to_torch(buf.array.dtype))
        return whole._host_copy("cpu").untyped_storage()

    def _write_file(self, *args: Any) -> Any:
        """How a legacy-format `torch.save` writes a storage: from its host copy."""
        return self.cpu()._write_file(*args)

    def __reduce__(self) -> Any:
        """torch saves a storage only when its class is exactly one of torch's (`torch.is_storage`); it
        pickles any other through `__reduce__`, which for storages calls `torch.save` again, forever."""
        raise RuntimeError(
            "a tpu untyped_storage() cannot be saved or pickled (torch saves only storages of its own classes); "
            "save the tensor instead, whose views and tied weights saved with it keep sharing one storage, "
            "or tensor.storage()"
        )


def _array_nbytes(array: Any) -> int:
    count = 1
    for size in array.shape:
        count *= size
    return count * array.dtype.itemsize


_storages: "weakref.WeakValueDictionary[int, BufferStorage]" = weakref.WeakValueDictionary()


def buffer_storage(buf: Buffer) -> BufferStorage:
    """The storage object of a buffer (the same object while anyone holds it)."""
    storage = _storages.get(id(buf))
    if storage is None or storage._tpu_buffer is not buf:
        storage = BufferStorage(0, device="meta")
        storage._tpu_buffer = buf
        _storages[id(buf)] = storage
    return storage


# What a TpuTensor keeps in its __dict__ about its data (not copied by deepcopy: the clone has its own).
_OWN_ATTRIBUTES = frozenset({"_buf", "_view", "_cached", "_cached_version", "_traced", "_compile_data", "_geom"})


def _data_ptr(tensor: Any) -> int:
    base = buffer_storage(tensor._buf).data_ptr()
    return base and base + tensor.storage_offset() * tensor.element_size()


_make_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided
# `_make_wrapper(cls, size, strides, storage_offset, memory_format, dtype, layout, device)` by position:
# torch parses positional arguments faster than keywords (~0.15 µs of ~0.8 µs per wrapper), and every
# op output and view makes one.


# cls -> the maker of a tensor's alias of class cls, for `as_subclass` (`integrations.lazy_params.install`).
SUBCLASS_ALIASES: dict[type, Callable[[Any, type], torch.Tensor]] = {}
_TENSOR_DATA = torch._C.TensorBase.data  # torch's own `.data` descriptor, which TpuTensor extends


class TpuTensor(torch.Tensor):
    """A tensor on `tpu:<chip>`; its data is `self._buf.array`, seen through `self._view`.

    For torch.compile it is a traceable wrapper subclass: it flattens to one inner tensor, `_inner`
    (a `TpuData` handle on a real tensor). While Dynamo and AOTAutograd trace, a TpuTensor holds a
    fake or functional inner tensor in `_traced` instead of a buffer, and its ops run on that inner
    tensor (see `__torch_dispatch__`).
    """

    _buf: Buffer
    _view: Any = None
    _cached: Any = None
    _cached_version: int = -1
    _traced: Any = None
    _compile_data: "TpuData | None" = None
    _geom: Geometry | None = None  # set by `geometry_of`; cleared wherever the geometry changes

    @staticmethod
    def __new__(
        cls,
        buf: Buffer,
        shape: tuple[int, ...] | None = None,
        dtype: torch.dtype | None = None,
        strides: tuple[int, ...] | None = None,
        storage_offset: int = 0,
        view: Any = None,
        requires_grad: bool | None = None,
    ) -> "TpuTensor":
        if shape is None:
            # `type(parameter)(data, requires_grad=...)`, with which libraries rebuild a parameter of the
            # same class (accelerate's offload hooks put weights back on meta so): a Parameter's constructor.
            return torch.nn.Parameter(buf, True if requires_grad is None else requires_grad)
        if strides is None:
            tensor = _make_wrapper(cls, shape, dtype=dtype, device=torch_device(buf.chip), requires_grad=bool(requires_grad))
        else:
            tensor = _make_wrapper(
                cls, shape, strides=strides, storage_offset=storage_offset, dtype=dtype, device=torch_device(buf.chip),
                requires_grad=bool(requires_grad),
            )
        tensor._buf = buf
        if view is not None:
            tensor._view = view
        return tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        dispatcher = _dispatcher or _load_dispatcher()
        try:
            if _traced_seen and _holds_traced(args, kwargs):
                if _dispatch_modes() and track_untraced_constants(TpuTensor, args, kwargs or {}):
                    return func(*args, **(kwargs or {}))  # now make_fx's proxy mode traces it
                return _dispatch_traced(func, args, kwargs or {})
            if _dispatch_modes():
                if func is _LIFT_FRESH and (fake := fake_of_lifted_constant(args[0])) is not None:
                    return fake
                if track_untraced_constants(TpuTensor, args, kwargs or {}):
                    return func(*args, **(kwargs or {}))  # now make_fx's proxy mode traces it
            if _get_ident() != _MAIN_THREAD:
                if on_autograd_worker():
                    if _concurrent:
                        with dispatcher.thread_lock:
                            return dispatcher.dispatch_on_worker(func, args, kwargs or {})
                    return dispatcher.dispatch_on_worker(func, args, kwargs or {})
                if not on_own_thread():
                    return _dispatch_from_user_thread(dispatcher, func, args, kwargs or {})
            if _concurrent:
                with dispatcher.thread_lock:
                    return dispatcher.dispatch(func, args, kwargs or {})
            route = dispatcher.routes.get(id(func))
            if route is None:
                return dispatcher.dispatch(func, args, kwargs or {})
            return route[0](route[1], args, kwargs or {})
        except BaseException as error:
            keep_interpreter_error(error)  # the TorchScript interpreter would drop its message
            raise

    # ----------------------------------------------------------------- torch.compile
    @property
    def _inner(self) -> torch.Tensor:
        """The one inner tensor torch.compile sees: the traced inner tensor, or a `TpuData` handle."""
        traced = self._traced
        if traced is not None:
            return traced
        data = self._compile_data
        if data is None or data._buf is not self._buf or data._view is not self._view or data.shape != self.shape:
            data = self._compile_data = TpuData(self)
        return data

    @_inner.setter
    def _inner(self, inner: torch.Tensor) -> None:
        """AOTAutograd's coerced inner tensor of a gradient: a handle of this tensor's buffer and
        view with other (equivalent) strides (`TpuData.__coerce_same_metadata_as_tangent__`)."""
        if type(inner) is not TpuData or inner._buf is not self._buf or inner._view is not self._view or inner.shape != self.shape:
            raise TypeError(f"a TpuTensor's inner tensor can only be a handle of its own buffer, not {type(inner).__name__}")
        self._compile_data = inner

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors: dict[str, Any], ctx: Any, outer_size: Any, outer_stride: Any) -> "TpuTensor":
        """The TpuTensor around an inner tensor: a compiled graph's output (already a TpuTensor), an
        alias over a `TpuData` handle's buffer, or a traced TpuTensor around a fake/functional one."""
        inner = inner_tensors["_inner"]
        if type(inner) is TpuTensor:
            return inner
        if type(inner) is TpuData:
            return inner.tensor()
        return _traced_tensor(inner, outer_size, outer_stride)

    @property
    def chip(self) -> int:
        return self._buf.chip

    @property
    def data(self) -> torch.Tensor:
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        """`x.data = t`: torch gives x t's sizes, strides and dtype (and refuses a tensor of another
        kind); x then reads and writes t's buffer, as a CPU tensor would share t's storage."""
        _TENSOR_DATA.__set__(self, new)
        self._see(new)

    def _see(self, source: "TpuTensor") -> None:
        """Read and write what `source` does: its buffer, through its view chain (geometry unchanged)."""
        self._buf = source._buf
        self._view = source._view
        self._cached = None
        self._cached_version = -1
        self._geom = None

    def as_subclass(self, cls: type) -> torch.Tensor:
        """torch's, and for a class in `SUBCLASS_ALIASES` (torch's `UninitializedParameter`, made so by
        `.to("tpu")` of a lazy module's buffer) an alias of its tpu class: torch cannot give a wrapper
        subclass's Python object another class."""
        make = SUBCLASS_ALIASES.get(cls)
        if make is not None:
            return make(self, cls)
        return super().as_subclass(cls)

    def untyped_storage(self) -> BufferStorage:
        """The buffer's storage: its size, and resizing to 0 and back (how FSDP2 frees parameters)."""
        return buffer_storage(self._buf)

    def data_ptr(self) -> int:
        """The storage's number plus the offset in bytes, as a host tensor's address would be: tensors
        share it exactly when they start at the same place in one buffer (how checkpoint writers such
        as safetensors find shared weights). Not an address; 0 while the buffer is released."""
        return _data_ptr(self)

    def _host_copy(self, kind: str) -> torch.Tensor:
        with SyncKind(kind):
            return self.detach().to("cpu")

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        if self._traced is not None:
            return f"TpuTensor(traced, {self._traced!r})"
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
            with SyncKind("print"):
                return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __bool__(self) -> bool:
        with SyncKind("bool"):
            return super().__bool__()

    def tolist(self) -> Any:
        return self._host_copy("tolist").tolist()

    def numpy(self, *, force: bool = False) -> Any:
        if self.requires_grad and not force:
            raise RuntimeError(
                "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
            )
        return self._host_copy("numpy").numpy()

    def register_hook(self, hook: Any) -> Any:
        """torch's, with the hook's exception raised on the user's thread (`worker_errors`)."""
        from tputrace.backend.core.worker_errors import worker_safe

        return super().register_hook(worker_safe(hook))

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        """torch's, with the hook's exception raised on the user's thread (`worker_errors`)."""
        from tputrace.backend.core.worker_errors import worker_safe

        return super().register_post_accumulate_grad_hook(worker_safe(hook))

    def __deepcopy__(self, memo: dict) -> "TpuTensor":
        """A clone on the chip, as torch deep-copies wrapper subclasses (its other path copies the
        storage, which would allocate a tpu storage), with the same requires_grad, a deep copy of the
        gradient and of the attributes set on the tensor (`_is_param`, a user's own)."""
        if not self.is_leaf:
            return super().__deepcopy__(memo)  # torch's error for non-leaf tensors
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            copied = self.clone()
        if self.requires_grad:
            copied.requires_grad_()
        if self.grad is not None:
            copied.grad = copy.deepcopy(self.grad, memo)
        for name, value in self.__dict__.items():
            if name not in _OWN_ATTRIBUTES:
                setattr(copied, name, copy.deepcopy(value, memo))
        memo[id(self)] = copied
        return copied

    def __reduce_ex__(self, proto: int) -> Any:
        """Pickled as torch pickles a CUDA tensor: its buffer's storage (tagged `tpu:N`; tensors of one
        buffer share it, so views and tied weights still share it when loaded) and its geometry. A
        parameter loads as a parameter, as torch's `Parameter.__reduce_ex__` has it (a tpu one is a
        TpuTensor marked `_is_param`, so that method is not its own)."""
        if isinstance(self, torch.nn.Parameter):
            return (torch._utils._rebuild_parameter, (self.data, self.requires_grad, collections.OrderedDict()))
        geometry = (self.storage_offset(), tuple(self.size()), self.stride(), self.requires_grad, collections.OrderedDict())
        if self.dtype not in torch.storage._dtype_to_storage_type_map():
            # float8, uint16-64: no typed storage class, so torch saves the bytes and the dtype apart (v3)
            storage = torch.storage.TypedStorage(wrap_storage=buffer_storage(self._buf), dtype=torch.uint8, _internal=True)
            return (torch._utils._rebuild_tensor_v3, (storage, *geometry, self.dtype))
        storage = torch.storage.TypedStorage(wrap_storage=buffer_storage(self._buf), dtype=self.dtype, _internal=True)
        return (torch._utils._rebuild_tensor_v2, (storage, *geometry))

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        array = self.numpy(force=True)
        return array if dtype is None else array.astype(dtype)


class TpuData(torch.Tensor):
    """What a TpuTensor flattens to for torch.compile: a storage-less tpu tensor with the same shape,
    strides and dtype, holding the TpuTensor's buffer and view. Dynamo and AOTAutograd turn it into a
    fake tensor to trace; a compiled graph receives it at run time and reads the array through it
    (`dispatcher.read` accepts it as it accepts a TpuTensor)."""

    _buf: Buffer
    _view: Any = None
    _cached: Any = None
    _cached_version: int = -1

    @staticmethod
    def __new__(cls, outer: TpuTensor | TpuData, strides: tuple[int, ...] | None = None) -> "TpuData":
        """A handle of `outer` (a TpuTensor, or a handle to alias), with its strides or `strides`."""
        strides = outer.stride() if strides is None else strides
        data = _make_wrapper(cls, outer.shape, strides=strides, storage_offset=outer.storage_offset(), dtype=outer.dtype, device=outer.device)
        data._buf = outer._buf
        data._view = outer._view
        return data

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        """An op on handles: a graph that AOTAutograd runs eagerly (`backend="aot_eager"`). It runs
        on TpuTensors over the same buffers, and its tpu results come back as handles."""
        from torch.utils._pytree import tree_map

        def tensor_of(value: Any) -> Any:
            return value.tensor() if type(value) is TpuData else value

        def handle_of(value: Any) -> Any:
            return value._inner if type(value) is TpuTensor else value

        return tree_map(handle_of, func(*tree_map(tensor_of, args), **tree_map(tensor_of, kwargs or {})))

    def __coerce_same_metadata_as_tangent__(self, expected_metadata: Any, expected_type: type | None = None) -> "TpuData | None":
        """AOTAutograd traced gradients as plain tensors; at run time this handle stands for one.
        A gradient that is contiguous but lacks a contiguous tensor's strides (an empty one, or one
        whose size-1 dims have other strides) gets them, as the traced gradient has: they address the
        same elements, and AOTAutograd would otherwise restride it into a new tpu tensor, which is not
        the plain tensor it traced."""
        if expected_type not in (None, torch.Tensor):
            return None
        strides = dense_strides(self)
        return self if strides is None or strides == self.stride() else TpuData(self, strides)

    def untyped_storage(self) -> BufferStorage:
        """The buffer's storage (what code that unwraps a TpuTensor with `__tensor_flatten__`, such
        as huggingface_hub's shared-weight check, asks of the handle)."""
        return buffer_storage(self._buf)

    def data_ptr(self) -> int:
        return _data_ptr(self)

    def tensor(self) -> TpuTensor:
        """A TpuTensor over the same buffer and view (an alias of the one this handle came from)."""
        return TpuTensor(self._buf, tuple(self.shape), self.dtype, tuple(self.stride()), self.storage_offset(), view=self._view)


_dispatcher: routing.DispatcherApi | None = None  # the process's Dispatcher (`routing.active()`), looked up on the first op


def _load_dispatcher() -> routing.DispatcherApi:
    global _dispatcher
    _dispatcher = routing.active()
    return _dispatcher


_traced_seen = False  # set once torch.compile has traced a TpuTensor; until then eager dispatch skips the check
# Set once a thread other than the main one and autograd's dispatches an op: from then on every op
# holds the dispatcher's lock, so one thread's pending values are not flushed, donated or replaced
# halfway through another thread's op (a single-threaded program never pays for the lock).
_concurrent = False


def _dispatch_from_user_thread(dispatcher: routing.DispatcherApi, func: Any, args: tuple, kwargs: dict) -> Any:
    global _concurrent
    _concurrent = True
    with dispatcher.thread_lock:
        return dispatcher.dispatch(func, args, kwargs)


def _traced_tensor(inner: torch.Tensor, size: Any, stride: Any) -> TpuTensor:
    """A TpuTensor that torch.compile is tracing: no buffer, its ops run on `inner`."""
    global _traced_seen
    _traced_seen = True
    for outer_dim, inner_dim in zip(size, inner.shape):
        if isinstance(inner_dim, torch.SymInt) and (not isinstance(outer_dim, torch.SymInt) or outer_dim.node.expr != inner_dim.node.expr):
            # Dynamo and export give a dynamic dim of the TpuTensor and of its inner tensor two size
            # symbols (export makes every inner dim dynamic: `export_dims`); they are one size, and
            # saying so lets shape reasoning relate the two (a static outer dim specialises the inner).
            torch._check(outer_dim == inner_dim)
    tensor = _make_wrapper(
        TpuTensor, size, strides=stride, storage_offset=inner.storage_offset(), dtype=inner.dtype, device=inner.device, requires_grad=inner.requires_grad
    )
    tensor._traced = inner
    # A traced tensor has no buffer: the tracers see torch's own (empty) wrapper storage.
    tensor.untyped_storage = functools.partial(_traced_storage, tensor)
    return tensor


def _traced_storage(tensor: TpuTensor) -> torch.UntypedStorage:
    """torch's wrapper storage of a traced tensor, whose `resize_` resizes the inner tensor's storage.
    Tracing an empty (or released) tpu tensor gives its fake 0 bytes so, and torch would ask the
    PrivateUse1 hooks to resize a tpu storage, which a device written in Python cannot register."""
    storage = torch.Tensor.untyped_storage(tensor)
    if "resize_" not in vars(storage):
        inner_storage = tensor._traced.untyped_storage()

        def resize(nbytes: int) -> torch.UntypedStorage:
            inner_storage.resize_(nbytes)
            return storage

        storage.resize_ = resize
    return storage


def _holds_traced(args: tuple, kwargs: dict | None) -> bool:
    """Whether an op's arguments hold a traced TpuTensor, or a fake tensor (a fake trace reading a
    real tpu tensor, such as the real gradient `create_fw_bw_graph` of FlexAttention traces with)."""
    for value in args:
        if type(value) is TpuTensor:
            if value._traced is not None:
                return True
        elif type(value) is _FakeTensor:
            return True
        elif type(value) in (list, tuple):
            for item in value:
                if (type(item) is TpuTensor and item._traced is not None) or type(item) is _FakeTensor:
                    return True
    if kwargs:
        return _holds_traced(tuple(kwargs.values()), None)
    return False


def _dispatch_traced(func: Any, args: tuple, kwargs: dict) -> Any:
    """An op on traced TpuTensors: run it on their inner tensors, wrap tpu results as traced TpuTensors."""
    from torch.utils._python_dispatch import return_and_correct_aliasing
    from torch.utils._pytree import tree_leaves, tree_map

    fake_mode = fake_mode_of(tree_leaves((args, kwargs)))

    def unwrap(value: Any) -> Any:
        if type(value) is not TpuTensor:
            return value
        if value._traced is None and fake_mode is not None:
            return fake_of_constant(value, fake_mode)
        return value._inner

    def wrap(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and type(value) is not TpuTensor and value.device.type == "tpu":
            return _traced_tensor(value, value.size(), value.stride())
        return value

    result = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if not any(type(value) is TpuTensor and value._traced is not None for value in tree_leaves((args, kwargs))):
        return result  # fake tensors and real tpu constants: fake results, as for real CPU constants
    result = return_and_correct_aliasing(func, args, kwargs, tree_map(wrap, result))
    if func._schema.is_mutable:
        follow_resized_inners(func, args, kwargs, TpuTensor)
    return result


def is_tpu_tensor(value: object) -> bool:
    return isinstance(value, TpuTensor)


def geometry_of(tensor: TpuTensor) -> Geometry:
    """The tensor's interned geometry (read from its metadata once, then kept on the tensor)."""
    geom = tensor._geom
    if geom is None:
        geom = tensor._geom = geometry(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), tensor.dtype, tensor._buf.chip)
    return geom


def whole_buffer(tensor: TpuTensor) -> TpuTensor:
    """The tensor's whole buffer, as a tensor of the buffer's shape (an alias: only to be read), e.g.
    the padded buffer a data-dependent result was cut from."""
    return TpuTensor(tensor._buf, tuple(tensor._buf.array.shape), tensor.dtype)


def view_tensor(buf: Buffer, geom: Geometry, view: ViewChain | None) -> TpuTensor:
    """A tpu tensor seeing `buf` through `view` with geometry `geom` (views and aliases)."""
    device = TORCH_DEVICES.get(geom.chip) or torch_device(geom.chip)
    if geom.dense:
        tensor = _make_wrapper(TpuTensor, geom.shape, None, None, None, geom.dtype, _STRIDED, device)
    else:
        tensor = _make_wrapper(TpuTensor, geom.shape, geom.strides, geom.offset, None, geom.dtype, _STRIDED, device)
    tensor._buf = buf
    if view is not None:
        tensor._view = view
    tensor._geom = geom
    return tensor


def channels_last_tensor(buf: Buffer, shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype, order: tuple[int, ...]) -> TpuTensor:
    """A channels-last tpu tensor of these strides over `buf`, which holds its dims in `order`
    (`memory_formats.storage_order`): a permuted view of the buffer, as the tensor is of its storage."""
    inverse = tuple(order.index(dim) for dim in range(len(order)))
    return view_tensor(buf, geometry(shape, strides, 0, dtype, buf.chip), ViewChain.root(permute_step(inverse)))


def new_tensor(array: jax.Array | Any, chip: int, spec: tuple[tuple[int, ...], torch.dtype], nbytes: int) -> TpuTensor:
    """A fresh (non-view) tpu tensor owning `array`, of `spec` = (shape, dtype), which its buffer
    keeps as its plan-key spec (the dispatcher's hot path)."""
    shape, dtype = spec
    device = TORCH_DEVICES.get(chip) or torch_device(chip)
    tensor = _make_wrapper(TpuTensor, shape, None, None, None, dtype, _STRIDED, device)
    tensor._buf = CountedBuffer(array, chip, nbytes, spec) if nbytes else Buffer(array, chip, spec)
    return tensor
