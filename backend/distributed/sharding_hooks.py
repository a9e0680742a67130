"""Hooks on torch's sharding code that tell each collective's cause (`causes`) and note the models whose
parameter placements are recorded (`placements`).

- DTensor: `redistribute_local_tensor` as `_dispatch` (an op's sharding propagation asked for other
  placements; `OpDispatcher.redistribute_local_args` names the op), `_redistribute` (an explicit
  `redistribute()`, a parallel style's input or output layouts, and their backward) and `_api`
  (`from_local`'s backward) call it; `Redistribute` and `_FromTorchTensor` carry the module they ran
  in over to their backward.
- Tensor parallelism: `ParallelStyle.__init__` keeps the line that made the style (the plan entry);
  each style's `_apply` adds hooks that tell the module a redistribution belongs to, and notes the
  module's parameters and the whole module the plan was applied to (its parameters outside the plan
  are recorded as replicated, `none`).
- Round trips and partial sums reduced again: `redistributions`, around every redistribution.
- FSDP2: `FSDPParamGroup.__init__` keeps the `fully_shard(...)` line; `unshard` and `post_backward` are
  the group's all-gather and reduce-scatter; `_prefetch_unshard` marks prefetches.
- DDP: its constructor keeps the `DDP(...)` line, its bucket cap and process group (`causes`); the
  broadcasts around each forward (rebuilt bucket indices, buffers) are `ddp_forward`.
- `DeviceMesh.__init__` keeps the line that made the mesh.

Each hook costs an attribute read when nothing records and stays out of torch.compile's graphs; installed
once, with the op handlers.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tputrace.backend.distributed import causes, joins, placements, redistributions, tracing, unsynced
from tputrace.recording.interface import Recording

_installed = False


@dataclass(frozen=True)
class _StyleUse:
    """A tensor-parallel style applied to a module, and where the module's forward is."""

    module: Any
    style: str  # the style's class name
    origin_frame_id: int | None


_stack_state = causes.state


def _stack() -> list[list[Any]]:
    """The tensor-parallel modules whose forward runs on this thread, innermost last: [style use, stage]."""
    entries = getattr(_stack_state, "tensor_parallel", None)
    if entries is None:
        entries = _stack_state.tensor_parallel = []
    return entries


def install() -> None:
    """Install every hook (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    _hook_device_mesh()
    _hook_dtensor()
    _hook_parallel_styles()
    _hook_fsdp()
    _hook_ddp()
    joins.install()
    unsynced.install()


def _compiling() -> bool:
    """Inside a torch.compile trace: the hooks stay out of the graph (compiled collectives keep their line, not a cause)."""
    return torch.compiler.is_compiling()


def _module_path(recorder: Recording, module: Any) -> str | None:
    return recorder.module_names.get(id(module)) if module is not None else None


# ----------------------------------------------------------------- device meshes
def _hook_device_mesh() -> None:
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        frame_id = tracing.user_frame_id()
        if frame_id is not None:
            try:
                self._tputrace_frame_id = frame_id
            except AttributeError:
                pass

    DeviceMesh.__init__ = __init__  # type: ignore[method-assign]


# ----------------------------------------------------------------- DTensor redistributions
_causes_by_spec: dict[tuple[Any, ...], causes.Cause] = {}


def _redistribute_cause(recorder: Recording, local_tensor: torch.Tensor, current_spec: Any, target_spec: Any, via: str) -> causes.Cause:
    stack = _stack()
    use, stage = (stack[-1][0], stack[-1][1]) if stack else (getattr(_stack_state, "backward_use", None), "backward")
    op = _stack_state.op if via == "op" else None
    if op is None:
        op = f"{use.style} {stage}" if use is not None else via
    phase = causes.phase()
    key = (id(recorder), current_spec, target_spec, use, op, phase)
    cause = _causes_by_spec.get(key)
    if cause is None:
        meta = current_spec.tensor_meta
        cause = causes.make(
            "redistribute", module=_module_path(recorder, use.module if use is not None else None),
            tensor=placements.local_tensor_name(local_tensor), op=op, mesh_id=placements.mesh_id(recorder, current_spec.mesh),
            src=placements.placements_text(current_spec.placements), dst=placements.placements_text(target_spec.placements),
            global_shape=placements.shape_text(meta.shape) if meta is not None else None, local_shape=placements.shape_text(local_tensor.shape),
            origin_frame_id=use.origin_frame_id if use is not None else None,
        )
        _causes_by_spec[key] = cause
    return cause


def _redistributing(original: Callable[..., torch.Tensor], via: str) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def redistribute_local_tensor(local_tensor: torch.Tensor, current_spec: Any, target_spec: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        recorder = tracing.active_recorder()
        if recorder is None or _compiling():
            return original(local_tensor, current_spec, target_spec, *args, **kwargs)
        cause = redistributions.before(recorder, local_tensor, current_spec, target_spec,
                                       _redistribute_cause(recorder, local_tensor, current_spec, target_spec, via))
        with causes.caused_by(cause):
            result = original(local_tensor, current_spec, target_spec, *args, **kwargs)
        redistributions.after(recorder, local_tensor, result, current_spec, target_spec, cause)
        return result

    return redistribute_local_tensor


def _hook_dtensor() -> None:
    from torch.distributed.tensor import _api, _dispatch, _redistribute

    _dispatch.redistribute_local_tensor = _redistributing(_dispatch.redistribute_local_tensor, "op")
    _redistribute.redistribute_local_tensor = _redistributing(_redistribute.redistribute_local_tensor, "redistribute")
    _api.redistribute_local_tensor = _redistributing(_api.redistribute_local_tensor, "from_local")

    dispatcher_class = _dispatch.OpDispatcher
    original_args = dispatcher_class.redistribute_local_args  # a staticmethod

    @functools.wraps(original_args)
    def redistribute_local_args(op_info: Any, *args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return original_args(op_info, *args, **kwargs)
        previous = _stack_state.op
        # the dispatcher's cached path leaves op_info.schema unset; the suggested schema names the same op
        schema = op_info.schema or (args[0] if args else kwargs.get("suggested_input_schema"))
        _stack_state.op = str(schema.op) if schema is not None and hasattr(schema, "op") else None
        try:
            return original_args(op_info, *args, **kwargs)
        finally:
            _stack_state.op = previous

    dispatcher_class.redistribute_local_args = staticmethod(redistribute_local_args)
    _carry_module_to_backward(_redistribute.Redistribute)
    _carry_module_to_backward(_api._FromTorchTensor)


def _carry_module_to_backward(function: Any) -> None:
    """The tensor-parallel module a forward ran in, for the collectives of its backward."""
    forward, backward = function.forward, function.backward

    def carried_forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return forward(ctx, *args, **kwargs)
        stack = _stack()
        ctx._tputrace_use = stack[-1][0] if stack else None
        return forward(ctx, *args, **kwargs)

    def carried_backward(ctx: Any, *grads: Any) -> Any:
        if _compiling():
            return backward(ctx, *grads)
        previous = getattr(_stack_state, "backward_use", None)
        _stack_state.backward_use = getattr(ctx, "_tputrace_use", None)
        try:
            return backward(ctx, *grads)
        finally:
            _stack_state.backward_use = previous

    function.forward = staticmethod(carried_forward)
    function.backward = staticmethod(carried_backward)


# ----------------------------------------------------------------- tensor-parallel styles
def _hook_parallel_styles() -> None:
    from torch.distributed.tensor.parallel import style

    original_init = style.ParallelStyle.__init__

    def style_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        frame_id = tracing.user_frame_id()
        if frame_id is not None:
            self._tputrace_frame_id = frame_id

    style.ParallelStyle.__init__ = style_init  # type: ignore[method-assign]
    for name in ("ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput"):
        style_class = getattr(style, name, None)
        if style_class is not None and "_apply" in vars(style_class):
            style_class._apply = _applying(style_class._apply)


def _plan_root() -> Any:
    """The module the outermost `parallelize_module` call on the stack applies its plan to (None outside one):
    read from the stack, since the user's script may have bound `parallelize_module` before the hooks."""
    from torch.distributed.tensor.parallel import api

    code = getattr(api.parallelize_module, "__code__", None)
    root = None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            root = frame.f_locals.get("module")
        frame = frame.f_back
    return root if isinstance(root, torch.nn.Module) else None


def _applying(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _apply(self: Any, module: torch.nn.Module, device_mesh: Any) -> Any:
        result = original(self, module, device_mesh)
        frame_id = getattr(self, "_tputrace_frame_id", None) or tracing.user_frame_id()
        use = _StyleUse(module, type(self).__name__, frame_id)
        _add_stage_hooks(module, use)
        style_text = repr(self)
        for parameter in module.parameters(recurse=False):
            placements.note_owner(parameter, "tp", module, frame_id, style=style_text)
        placements.note_styled(module)
        placements.note_model(module)
        root = _plan_root()
        if root is not None:
            placements.note_model(root)
        return result

    return _apply


def _add_stage_hooks(module: torch.nn.Module, use: _StyleUse) -> None:
    """Hooks around the style's own: its input layouts, the module's forward, its output layouts."""

    def entered(module: Any, args: Any) -> None:
        if not _compiling():
            _stack().append([use, "input_layouts"])

    def started(module: Any, args: Any) -> None:
        if _compiling():
            return
        stack = _stack()
        if stack:
            stack[-1][1] = "forward"

    def finishing(module: Any, args: Any, output: Any) -> None:
        if _compiling():
            return
        stack = _stack()
        if stack:
            stack[-1][1] = "output_layouts"

    def left(module: Any, args: Any, output: Any) -> None:
        if _compiling():
            return
        stack = _stack()
        if stack:
            stack.pop()

    module.register_forward_pre_hook(entered, prepend=True)
    module.register_forward_pre_hook(started)
    module.register_forward_hook(finishing, prepend=True)
    module.register_forward_hook(left, always_call=True)


# ----------------------------------------------------------------- FSDP2
def _hook_fsdp() -> None:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    original_init = FSDPParamGroup.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        frame_id = tracing.user_frame_id()
        self._tputrace_frame_id = frame_id
        self._tputrace_causes = {}
        module = self.modules[0] if self.modules else None
        for fsdp_param in self.fsdp_params:
            placements.note_owner(fsdp_param.sharded_param, "fsdp", module, frame_id)
            info = fsdp_param._module_info
            placements.note_sharded(info.module, info.param_name, fsdp_param.sharded_param)
        if module is not None:
            placements.note_model(module)

    FSDPParamGroup.__init__ = __init__  # type: ignore[method-assign]
    FSDPParamGroup.unshard = _group_collective(FSDPParamGroup.unshard, "fsdp_all_gather")
    FSDPParamGroup.post_backward = _group_collective(FSDPParamGroup.post_backward, "fsdp_reduce_scatter")
    original_prefetch = FSDPParamGroup._prefetch_unshard

    def _prefetch_unshard(target: Any, pass_type: str) -> None:
        if _compiling():
            original_prefetch(target, pass_type)
            return
        previous = _stack_state.prefetch
        _stack_state.prefetch = True
        try:
            original_prefetch(target, pass_type)
        finally:
            _stack_state.prefetch = previous

    FSDPParamGroup._prefetch_unshard = staticmethod(_prefetch_unshard)


def _group_collective(original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = tracing.active_recorder()
        if recorder is None or _compiling():
            return original(self, *args, **kwargs)
        with causes.caused_by(_group_cause(recorder, self, kind)):
            return original(self, *args, **kwargs)

    return run


def _group_cause(recorder: Recording, group: Any, kind: str) -> causes.Cause:
    prefetch = int(_stack_state.prefetch) if kind == "fsdp_all_gather" else None
    phase = causes.phase()
    known: dict[tuple[Any, ...], causes.Cause] = getattr(group, "_tputrace_causes", None) or {}
    key = (id(recorder), phase, prefetch)
    cause = known.get(key)
    if cause is None:
        module = group.modules[0] if group.modules else None
        names = [fsdp_param._param_fqn or "" for fsdp_param in group.fsdp_params]
        group_bytes = sum(fsdp_param.sharded_param.numel() * fsdp_param.sharded_param.element_size() for fsdp_param in group.fsdp_params)
        mesh = getattr(group.mesh_info, "mesh", None)
        cause = causes.make(
            kind, module=_module_path(recorder, module), tensor=_first_names(names), mesh_id=placements.mesh_id(recorder, mesh),
            bucket_bytes=int(group_bytes * max(getattr(mesh, "size", lambda: 1)(), 1)), prefetch=prefetch,
            origin_frame_id=getattr(group, "_tputrace_frame_id", None),
        )
        known[key] = cause
        group._tputrace_causes = known
    return cause


_first_names = causes.first_names


# ----------------------------------------------------------------- DDP
def _hook_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    @functools.wraps(original)
    def __init__(self: DistributedDataParallel, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        frame_id = tracing.user_frame_id()
        recorder = tracing.active_recorder()
        cause = None if recorder is None else causes.make("ddp_init", op="DistributedDataParallel", origin_frame_id=frame_id)
        with causes.caused_by(cause):
            original(self, module, *args, **kwargs)
        self._tputrace_frame_id = frame_id
        if not any(parameter.device.type == "tpu" for parameter in module.parameters()):
            return
        group_name = _group_name(self.process_group)
        if group_name is not None:
            causes.data_parallel_models[group_name] = causes.DataParallelModel(self, frame_id, int(self.bucket_bytes_cap))
        for parameter in module.parameters():
            placements.note_owner(parameter, "ddp", self, frame_id)
        placements.note_model(self)

    DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign]
    DistributedDataParallel._pre_forward = _ddp_forward_part(DistributedDataParallel._pre_forward)
    DistributedDataParallel._post_forward = _ddp_forward_part(DistributedDataParallel._post_forward)


def _ddp_forward_part(original: Callable[..., Any]) -> Callable[..., Any]:
    """DDP's work around each forward: the broadcast of rebuilt bucket indices and of buffers."""

    @functools.wraps(original)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = tracing.active_recorder()
        if recorder is None or _compiling():
            return original(self, *args, **kwargs)
        cause = causes.make("ddp_forward", module=recorder.module_names.get(id(self)), op="DistributedDataParallel.forward",
                            origin_frame_id=getattr(self, "_tputrace_frame_id", None))
        with causes.caused_by(cause):
            result = original(self, *args, **kwargs)
        data_parallel = causes.data_parallel_models.get(_group_name(self.process_group) or "")
        if data_parallel is not None and data_parallel.model is self:
            data_parallel.read_buckets()
        return result

    return run


def _group_name(group: Any) -> str | None:
    try:
        return group.group_name
    except (AttributeError, RuntimeError):
        return None
