"""Where the backend meets the user's training loop: step boundaries (optimizer.step), module paths
(`nn.Module.__call__`), profiler ranges (record_function), and the recorder that receives them."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from types import CodeType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from tputrace.backend.core import buffer_lifetimes, host_origins, memory, routing
from tputrace.backend.core.iteration_ends import IterationEnds
from tputrace.recording.interface import Recording, active

_original_module_call: Callable[..., Any] | None = None  # `nn.Module.__call__` while a recording wraps it
_original_record_function: tuple[Any, Any] | None = None
_installed = False
_constructors = threading.local()  # `depth`: optimizer constructors running on this thread
_passes = threading.local()  # `running`: a backward pass runs on this thread (one on the calling thread: several chips)
_iteration_ends = IterationEnds()


def install() -> None:
    """Hooks the backend always needs, recording or not: flush deferred work at optimizer steps and at
    the end of each backward pass, and make an optimizer's state apart from its first update."""
    global _installed
    if _installed:
        return
    register_optimizer_step_pre_hook(_before_optimizer_step)
    register_optimizer_step_post_hook(_after_optimizer_step)
    _bound_constructors(torch.optim.Optimizer)
    torch.optim.Optimizer.__init_subclass__ = classmethod(_subclass_made)
    torch.autograd._engine_run_backward = _backward_boundary(torch.autograd._engine_run_backward)
    _installed = True


def _backward_boundary(run_backward: Callable[..., Any]) -> Callable[..., Any]:
    """The engine call behind `Tensor.backward`, `torch.autograd.backward` and `torch.autograd.grad`,
    as a step boundary when it starts from tpu tensors (or DTensors of them): the backward's ops get the caller's line and
    start a fence (`backward_started`), and its end flushes. A backward that an autograd node runs
    inside another one (reentrant checkpointing), on autograd's worker or on the calling thread, is
    part of the outer pass."""

    @functools.wraps(run_backward)
    def run(outputs: Any, *args: Any, **kwargs: Any) -> Any:
        from tputrace.backend.core.tensor import TpuTensor
        from tputrace.backend.core.thread_state import on_autograd_worker

        if on_autograd_worker() or getattr(_passes, "running", False) or not any(_on_tpu(output, TpuTensor) for output in outputs):
            return run_backward(outputs, *args, **kwargs)
        backward_started()
        _passes.running = True
        try:
            result = run_backward(outputs, *args, **kwargs)
        finally:
            _passes.running = False
        flush_pending("backward_end")
        return result

    return run


def _on_tpu(tensor: Any, tpu_tensor: type) -> bool:
    """A tpu tensor, or a DTensor whose local shard is one (a tensor-parallel loss)."""
    return isinstance(tensor, tpu_tensor) or isinstance(getattr(tensor, "_local_tensor", None), tpu_tensor)


def _bound_constructors(optimizer_class: type) -> None:
    """Make the constructors of `optimizer_class` and its subclasses defined so far set-up boundaries."""
    _bound_constructor(optimizer_class)
    for subclass in optimizer_class.__subclasses__():
        _bound_constructors(subclass)


def _subclass_made(optimizer_class: type, **kwargs: Any) -> None:
    """`Optimizer.__init_subclass__`: an optimizer class defined later gets the boundary too."""
    super(torch.optim.Optimizer, optimizer_class).__init_subclass__(**kwargs)
    _bound_constructor(optimizer_class)


def _bound_constructor(optimizer_class: type) -> None:
    init = optimizer_class.__dict__.get("__init__")
    if init is not None and not getattr(init, "_tputrace_setup_boundary", False):
        optimizer_class.__init__ = _setup_boundary(init)


def _setup_boundary(init: Callable[..., None]) -> Callable[..., None]:
    """An optimizer made for tpu parameters ends the set-up: when its outermost constructor returns,
    the work still pending (a model made on the device, its weights initialised there, and state the
    constructor made, as Adagrad's sums) runs, and not inside the first step's program, which the
    second step, without it, would compile again."""

    @functools.wraps(init)
    def run(optimizer: Any, *args: Any, **kwargs: Any) -> None:
        depth = getattr(_constructors, "depth", 0)
        _constructors.depth = depth + 1
        try:
            init(optimizer, *args, **kwargs)
        finally:
            _constructors.depth = depth
        if depth == 0 and _steps_tpu_params(optimizer):
            _iteration_ends.optimizer_made(optimizer)
            flush_pending("optimizer_init")

    run._tputrace_setup_boundary = True  # type: ignore[attr-defined]
    return run


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """A step that will make state for a parameter (an optimizer's first) records that state apart
    (DeferAndFuse), so that the update's program is the one every later step runs. Nothing inside a compiled
    region (`torch.compile(optimizer.step)`): the update is one graph there, and tracing this hook would break it."""
    if torch.compiler.is_compiling():
        return
    dispatcher = routing.active()
    creating_state = getattr(dispatcher.executor, "creating_state", None)
    if creating_state is not None and _steps_tpu_params(optimizer) and _makes_state(optimizer):
        creating_state()


def _makes_state(optimizer: Any) -> bool:
    """Whether a parameter with a gradient has no optimizer state yet."""
    state = optimizer.state
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None and not state.get(param):
                return True
    return False


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    dispatcher = routing.active()
    if not _steps_tpu_params(optimizer):
        return
    state_created = getattr(dispatcher.executor, "state_created", None)
    if state_created is not None:
        state_created()
    flush_pending("step")
    if memory.tracker is not None:
        buffer_lifetimes.label_optimizer(memory.tracker, optimizer)
    recorder = active()
    if recorder is not None and _iteration_ends.ends_iteration(optimizer):
        recorder.optimizer_stepped()


def _steps_tpu_params(optimizer: Any) -> bool:
    """Whether the optimizer updates tpu tensors: plain ones, or DTensors whose local shards are tpu
    tensors (FSDP2 and tensor-parallel parameters; read by attribute, so DTensor is never imported)."""
    from tputrace.backend.core.tensor import TpuTensor

    for group in optimizer.param_groups:
        for param in group["params"]:
            if _on_tpu(param, TpuTensor):
                return True
    return False


def backward_started() -> None:
    """Ops of the backward pass run on autograd's thread: give them the line that called backward()."""
    dispatcher = routing.active()
    recorder = active()
    if recorder is not None and recorder.enabled:
        recorder.backward_frame = recorder.frame_id()
        recorder.backward_call_frame = recorder.frame_id(by_call=True)
    if memory.tracker is not None:
        memory.tracker.backward_started()
    mark_backward = getattr(dispatcher.executor, "mark_backward", None)
    if mark_backward is not None:
        mark_backward()


def flush_pending(trigger: str) -> None:
    """Run deferred ops now (DeferAndFuse); nothing to do in strict mode."""
    dispatcher = routing.active()
    flush = getattr(dispatcher.executor, "flush", None)
    if flush is not None:
        flush(trigger)


def attach(recorder: Recording) -> None:
    """Connect a recorder: the dispatcher reports to it, module and profiler ranges feed it."""
    dispatcher = routing.active()
    install()
    _iteration_ends.reset()
    if not recorder.enabled:
        return
    from tputrace.backend.core.tensor import TpuTensor

    dispatcher.recorder = recorder
    recorder.dispatches_through(TpuTensor.__dict__["__torch_dispatch__"].__func__.__code__)
    memory.tracker = buffer_lifetimes.BufferTracker(recorder)
    host_origins.install()
    wrap_module_calls(recorder)
    _patch_record_function(recorder)


def detach() -> None:
    from tputrace.backend.compile.events import events

    events.drain()  # frame compiles no later compile wrote: one that raised, and the script caught
    collective_rows = sys.modules.get("tputrace.backend.distributed.tracing")
    if collective_rows is not None:
        collective_rows.write_held_rows()  # calls nobody waited on: never, now
    dispatcher = routing.active()
    dispatcher.recorder = None
    tracker, memory.tracker = memory.tracker, None
    if tracker is not None:
        tracker.stop()
    host_origins.uninstall()
    unwrap_module_calls()
    _unpatch_record_function()


def wrap_module_calls(recorder: Recording) -> None:
    """Give each op the path of the modules whose forward it runs in: `nn.Module.__call__` pushes the module's path
    (its string id, made once per module) on the thread's module stack around the call. Global forward hooks would
    do it too, but they send every module call through torch's hooked call path, several times dearer."""
    global _original_module_call
    if _original_module_call is not None:
        return
    call = _original_module_call = torch.nn.Module.__call__
    torch.nn.Module.__call__ = _module_call(recorder, call)  # type: ignore[method-assign]


def _module_call(recorder: Recording, call: Callable[..., Any]) -> Callable[..., Any]:
    """`call` (`nn.Module.__call__`) with the module's path on the thread's module stack while it runs."""
    names = recorder.module_names
    path_sids: dict[int, int] = {}  # id(module) -> the string id of its path
    module_stack = recorder.module_stack
    is_compiling = torch.compiler.is_compiling
    # torch's own `__call__` only picks the module's compiled call (`module.compile()`) or its `_call_impl`: done here,
    # that is one Python call fewer per module call and one frame fewer for every op's line lookup to walk past.
    inlines_call = call is torch.nn.Module._wrapped_call_impl

    def module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return call(module, *args, **kwargs)  # inside a torch.compile'd region: nothing to trace into the graph
        path_sid = path_sids.get(id(module))
        if path_sid is None:
            path_sid = path_sids[id(module)] = recorder.intern(_module_path(module, names))
        stack = module_stack()
        stack.append(path_sid)
        try:
            if inlines_call and module._compiled_call_impl is None:
                return module._call_impl(*args, **kwargs)
            return call(module, *args, **kwargs)
        finally:
            stack.pop()

    return module_call


def module_call_code() -> CodeType:
    """The code of the wrapped `nn.Module.__call__` (one code object): Dynamo compiles no frame of it (a compiled
    module's call starts there) but traces through it and what it calls."""
    return next(const for const in _module_call.__code__.co_consts if isinstance(const, CodeType))


def unwrap_module_calls() -> None:
    """Give `nn.Module.__call__` back (`wrap_module_calls`)."""
    global _original_module_call
    if _original_module_call is not None:
        torch.nn.Module.__call__ = _original_module_call  # type: ignore[method-assign]
        _original_module_call = None


def _module_path(module: torch.nn.Module, names: dict[int, str]) -> str:
    """The module's path from the root whose call first reached it (its class name, then attribute names); a root's
    parameters are noted for the buffer lifetimes."""
    path = names.get(id(module))
    if path is None:
        root = type(module).__name__
        for name, submodule in module.named_modules(prefix=root):
            names.setdefault(id(submodule), name)
        if memory.tracker is not None:
            memory.tracker.modules_seen(module, root)
        path = names[id(module)]
    return path


def _patch_record_function(recorder: Recording) -> None:
    global _original_record_function
    record_function = torch.autograd.profiler.record_function
    if _original_record_function is not None:
        return
    original_enter, original_exit = record_function.__enter__, record_function.__exit__
    _original_record_function = (original_enter, original_exit)

    def enter(self: Any) -> Any:
        self._tputrace_start = recorder.now()
        self._tputrace_frame = recorder.frame_id()
        return original_enter(self)

    def exit_(self: Any, *exc: Any) -> Any:
        start = getattr(self, "_tputrace_start", None)
        if start is not None:
            recorder.annotation(self.name, "record_function", start, recorder.now() - start, self._tputrace_frame)
        return original_exit(self, *exc)

    record_function.__enter__ = enter
    record_function.__exit__ = exit_


def _unpatch_record_function() -> None:
    global _original_record_function
    if _original_record_function is None:
        return
    record_function = torch.autograd.profiler.record_function
    record_function.__enter__, record_function.__exit__ = _original_record_function
    _original_record_function = None
