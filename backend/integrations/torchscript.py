"""TorchScript modules and functions on tpu tensors.

Moving a scripted module: `Module._apply` moves a parameter into a tpu tensor (a wrapper subclass)
with `torch.utils.swap_tensors`, which swaps the C++ tensors behind two Python objects. A scripted
module's parameters live in its C++ module, which keeps the tensor it held before the swap, so its
forward would still see the CPU parameter. `install` makes `_apply` of a scripted module store each
swapped parameter back into the C++ module.

Errors: the TorchScript interpreter calls the tpu device's `__torch_dispatch__` from C++, and when it
raises, torch turns the Python exception into a C++ `python_error` without reading its message, so
the interpreter reports `RuntimeError: ` with nothing after it. While a scripted module or function
runs, the dispatcher keeps the exception it raised (`thread_state.keep_interpreter_error`); the call then raises
the interpreter's error with that exception's type and message, chained to it.

Loading onto tpu (`map_location="tpu"`, or an archive saved from tpu): torch's TorchScript unpickler
copies each storage to the chip (`empty` then `copy_`) and then rebuilds each tensor as a new empty
tpu tensor whose C++ storage it sets directly, which the tpu tensor (data held in Python) never sees.
While a module loads, `_loading` keeps the chip copies by C++ storage, and each rebuilt tpu tensor
becomes a view of the copy it shares a storage with (before torch detaches it into a parameter).

Saving: `torch.jit.save` writes a tensor on a device by reading its whole storage back through
`empty(0).set_(tensor.storage(), 0, [n], [1]).cpu()`. A tpu tensor's C++ storage holds no data, so
while a scripted tpu module is saved, `storage_contents` finds the tensor behind such a storage, and
the archive records it on its tpu chip as `torch.save` does.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.jit
import torch.jit._serialization

from tputrace.backend.core import routing
from tputrace.backend.core.inplace_views import become
from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.core.thread_state import interpreter_state as _state

_EMPTY_INTERPRETER_MESSAGE = "RuntimeError: \n"
_installed = False


def _with_dispatch_message(error: RuntimeError, cause: BaseException) -> BaseException:
    """The interpreter's error, its empty message replaced by the device's exception."""
    text = f"{str(error)[: -len(_EMPTY_INTERPRETER_MESSAGE)]}{type(cause).__name__}: {cause}"
    try:
        replacement = type(cause)(text)
    except Exception:  # noqa: BLE001 - an exception type that takes other arguments
        replacement = RuntimeError(text)
    return replacement


def _keeping_messages(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = _state
        state.calls_running += 1
        try:
            return call(self, *args, **kwargs)
        except RuntimeError as error:
            cause = state.dispatch_error
            if cause is None or not str(error).endswith(_EMPTY_INTERPRETER_MESSAGE):
                raise
            raise _with_dispatch_message(error, cause).with_traceback(error.__traceback__) from cause
        finally:
            state.calls_running -= 1
            if not state.calls_running:
                state.dispatch_error = None

    return run


def _store_swapped_parameters(module: torch.jit.RecursiveScriptModule, held: dict[str, tuple[torch.Tensor, int]]) -> None:
    """Write into the C++ module each parameter whose Python object now holds another C++ tensor."""
    for name, (parameter, tensor_address) in held.items():
        if parameter._cdata != tensor_address:
            module._c.setattr(name, parameter)


def _module_tensors(module: torch.jit.RecursiveScriptModule) -> Iterator[torch.Tensor]:
    """The tensors `torch.jit.save` writes: parameters, buffers and the constants of each method's graph."""
    yield from module.parameters()
    yield from module.buffers()
    for submodule in module.modules():
        if not isinstance(submodule, torch.jit.RecursiveScriptModule):
            continue
        for method_name in submodule._c._method_names():
            for node in submodule._c._get_method(method_name).graph.findAllNodes("prim::Constant"):
                if node.output().type().kind() == "TensorType":
                    yield node.t("value")


@contextlib.contextmanager
def _saving(module: torch.jit.RecursiveScriptModule) -> Iterator[None]:
    tensors = {torch._C.TensorBase.untyped_storage(tensor)._cdata: tensor for tensor in _module_tensors(module) if isinstance(tensor, TpuTensor)}
    _state.saving = tensors
    try:
        yield
    finally:
        _state.saving = None


def storage_contents(storage: torch.UntypedStorage, dtype: torch.dtype) -> torch.Tensor | None:
    """The C++ storage of a tpu tensor `torch.jit.save` writes, as one flat tpu tensor of `dtype` (None outside a save)."""
    saving = _state.saving
    if saving is None:
        return None
    tensor = saving.get(storage._cdata)
    if tensor is None:
        raise RuntimeError(
            "torch.jit.save writes a tpu module's parameters, buffers and graph constants; keep other tensor "
            "attributes on the CPU (or register them as buffers), or save the module after module.cpu()"
        )
    numel = storage.nbytes() // tensor.element_size()
    if tensor.is_contiguous() and tensor.storage_offset() == 0 and tensor.numel() == numel:
        return tensor.detach().reshape(-1)
    flat = torch.zeros(numel, dtype=dtype, device=tensor.device)
    flat.as_strided(tensor.size(), tensor.stride(), tensor.storage_offset()).copy_(tensor.detach())
    return flat


def _attach(tensor: torch.Tensor, copies: dict[int, torch.Tensor]) -> None:
    """Make a tpu tensor the unpickler rebuilt on a chip copy's storage a view of that copy."""
    dispatcher = routing.active()
    if not isinstance(tensor, TpuTensor):
        return
    storage_copy = copies.get(torch._C.TensorBase.untyped_storage(tensor)._cdata)
    if storage_copy is None or storage_copy is tensor:
        return
    flat = dispatcher.dispatch(torch.ops.aten.view.default, (storage_copy, [storage_copy.numel()]), {})
    view = dispatcher.dispatch(torch.ops.aten.as_strided.default, (flat, list(tensor.size()), list(tensor.stride()), tensor.storage_offset()), {})
    become(tensor, view)


@contextlib.contextmanager
def _loading() -> Iterator[dict[int, torch.Tensor]]:
    """Keep the tpu tensors that `copy_` writes inside the block (the unpickler's chip copies) by C++
    storage, and attach a rebuilt tensor to its copy before torch detaches it (to make a parameter)."""
    dispatcher = routing.active()
    copies: dict[int, torch.Tensor] = {}
    copy, detach = dispatcher.special[torch.ops.aten.copy_.default], dispatcher.special[torch.ops.aten.detach.default]

    def copy_and_keep(args: tuple, kwargs: dict) -> Any:
        target = copy(args, kwargs)
        if isinstance(target, TpuTensor):
            copies[torch._C.TensorBase.untyped_storage(target)._cdata] = target
        return target

    def attach_and_detach(args: tuple, kwargs: dict) -> Any:
        _attach(args[0], copies)
        return detach(args, kwargs)

    routing.register_special(torch.ops.aten.copy_.default, copy_and_keep)
    routing.register_special(torch.ops.aten.detach.default, attach_and_detach)
    try:
        yield copies
    finally:
        routing.register_special(torch.ops.aten.copy_.default, copy)
        routing.register_special(torch.ops.aten.detach.default, detach)


def _loading_tpu_tensors(load: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _loading() as copies:
            module = load(*args, **kwargs)
        for tensor in _module_tensors(module):
            _attach(tensor, copies)
        return module

    return run


def _saving_tpu_tensors(save: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(save)
    def run(self: torch.jit.RecursiveScriptModule, *args: Any, **kwargs: Any) -> Any:
        with _saving(self):
            return save(self, *args, **kwargs)

    return run


def install() -> None:
    """Let scripted modules move to tpu, run with the device's error messages, save and load (once)."""
    global _installed
    if _installed:
        return
    module_apply = torch.jit.RecursiveScriptModule._apply

    @functools.wraps(module_apply)
    def apply_and_store(self: torch.jit.RecursiveScriptModule, fn: Any, recurse: bool = True) -> Any:
        held = {name: (parameter, parameter._cdata) for name, parameter in self._parameters.items() if parameter is not None}
        result = module_apply(self, fn, recurse)
        _store_swapped_parameters(self, held)
        return result

    torch.jit.RecursiveScriptModule._apply = apply_and_store
    for name in ("save", "save_to_buffer"):
        setattr(torch.jit.RecursiveScriptModule, name, _saving_tpu_tensors(getattr(torch.jit.RecursiveScriptModule, name)))
    torch.jit.load = torch.jit._serialization.load = _loading_tpu_tensors(torch.jit._serialization.load)
    for script_callable in (torch._C.ScriptMethod, torch._C.ScriptFunction):
        script_callable.__call__ = _keeping_messages(script_callable.__call__)
    _installed = True
