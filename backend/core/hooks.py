"""Where the backend meets the user's training loop: step boundaries (optimizer.step), module paths
(forward hooks), profiler ranges (record_function), and the recorder that receives them."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from tputrace.backend.core import buffer_lifetimes, host_origins, memory, routing
from tputrace.backend.core.iteration_ends import IterationEnds
from tputrace.recording.interface import Recording, active

_removable: list[Any] = []
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
    _removable.append(torch.nn.modules.module.register_module_forward_pre_hook(_module_entered(recorder)))
    _removable.append(torch.nn.modules.module.register_module_forward_hook(_module_left(recorder), always_call=True))
    _patch_record_function(recorder)


def detach() -> None:
    from tputrace.backend.compile.events import events

    events.drain()  # frame compiles no later compile wrote: one that raised, and the script caught
    dispatcher = routing.active()
    dispatcher.recorder = None
    tracker, memory.tracker = memory.tracker, None
    if tracker is not None:
        tracker.stop()
    host_origins.uninstall()
    while _removable:
        _removable.pop().remove()
    _unpatch_record_function()


def _module_entered(recorder: Recording) -> Any:
    names = recorder.module_names

    def entered(module: torch.nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            return  # inside a torch.compile'd region: nothing to trace into the graph
        path = names.get(id(module))
        if path is None:
            root = type(module).__name__
            for name, submodule in module.named_modules(prefix=root):
                names.setdefault(id(submodule), name)
            if memory.tracker is not None:
                memory.tracker.modules_seen(module, root)
            path = names[id(module)]
        recorder.push_module(path)

    return entered


def _module_left(recorder: Recording) -> Any:
    def left(module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        recorder.pop_module()

    return left


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
