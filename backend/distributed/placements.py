"""Device meshes and parameter placements, recorded once per run.

The hooks note each model that DDP, FSDP2 or a tensor-parallel plan takes over (`note_model`), with the
line that did it. The first collective after a model was noted records its parameters
(`record_pending`), once the recorder knows the module paths (named at the model's first forward): each
parameter's wrapper, mesh, placements, global and local shape, and bytes in all and on this rank. A
parameter that a later wrapper takes over again (FSDP2 over a tensor-parallel model) is recorded as
the last one left it (`fsdp+tp`); FSDP2's parameters are read as sharded even while their module runs. Meshes get a `device_meshes` row the first time a cause or a parameter names one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from tputrace.backend.core import memory
from tputrace.backend.core.dtypes import short_name
from tputrace.recording.interface import Recording


@dataclass
class _Owner:
    """Who placed a parameter: the wrapper, the module path that groups it, the line, and the style text."""

    wrapper: str
    group_module: Any
    origin_frame_id: int | None
    style: str | None = None


_mesh_ids: dict[tuple[int, int], tuple[Any, int]] = {}  # (id(recorder), id(mesh)) -> (mesh, mesh_id), the mesh kept alive
_mesh_ids_by_value: dict[tuple[int, str, str, str], int] = {}
_owners: dict[int, tuple[Any, _Owner]] = {}  # id(parameter) -> (parameter, owner)
_models: list[Any] = []  # modules whose parameters are still to be recorded
_recorded: set[int] = set()  # id(parameter) already recorded
_local_names: dict[int, tuple[Any, str]] = {}
# FSDP2 swaps a module's parameters for unsharded ones while it runs: its sharded ones, by (id(module), name)
_sharded: dict[tuple[int, str], Any] = {}
_styled: set[int] = set()  # id of each module a tensor-parallel style was applied to  # id(a DTensor parameter's local tensor) -> (that tensor, parameter path)


def placement_text(placement: Any) -> str:
    """`Shard(0)`, `StridedShard(0, split_factor=2)`, `Replicate()`, `Partial(sum)`."""
    split_factor = getattr(placement, "split_factor", None)
    if split_factor is not None:
        return f"StridedShard({placement.dim}, split_factor={split_factor})"
    if placement.is_shard():
        return f"Shard({placement.dim})"
    if placement.is_replicate():
        return "Replicate()"
    if placement.is_partial():
        return f"Partial({getattr(placement, 'reduce_op', 'sum')})"
    return str(placement)


def placements_text(placements: Any) -> str:
    return ",".join(placement_text(placement) for placement in placements)


def shape_text(shape: Any) -> str:
    return ",".join(str(int(size)) for size in shape)


def mesh_id(recorder: Recording, mesh: Any) -> int | None:
    """The `device_meshes` id of `mesh`, recording it the first time."""
    if mesh is None:
        return None
    key = (id(recorder), id(mesh))
    known = _mesh_ids.get(key)
    if known is not None and known[0] is mesh:
        return known[1]
    try:
        ranks = json.dumps(mesh.mesh.tolist())
        shape = "x".join(str(size) for size in mesh.mesh.shape)
        names = ",".join(mesh.mesh_dim_names or ())
    except (AttributeError, RuntimeError):
        return None
    same = (id(recorder), shape, names, ranks)  # equal meshes made apart (FSDP2 makes one per parameter) are one row
    new_id = _mesh_ids_by_value.get(same)
    if new_id is None:
        new_id = _mesh_ids_by_value[same] = recorder.device_mesh(shape, names, ranks, getattr(mesh, "_tputrace_frame_id", None))
    _mesh_ids[key] = (mesh, new_id)
    return new_id


def local_tensor_name(tensor: Any) -> str | None:
    """The parameter path of a DTensor parameter whose local tensor is `tensor` (None for any other tensor)."""
    known = _local_names.get(id(tensor))
    return known[1] if known is not None and known[0] is tensor else None


def note_owner(parameter: Any, wrapper: str, group_module: Any, origin_frame_id: int | None, style: str | None = None) -> None:
    """`parameter` is now placed by `wrapper` (the last wrapper to take a parameter over owns it)."""
    _owners[id(parameter)] = (parameter, _Owner(wrapper, group_module, origin_frame_id, style))


def note_sharded(module: Any, name: str, parameter: Any) -> None:
    """FSDP2's sharded parameter `name` of `module` (what the module holds between its forward and backward)."""
    _sharded[(id(module), name)] = parameter


def note_styled(module: Any) -> None:
    _styled.add(id(module))


def note_model(module: Any) -> None:
    """Record `module`'s parameters at the next collective."""
    if all(model is not module for model in _models):
        _models.append(module)


def has_pending() -> bool:
    return bool(_models)


def record_pending(recorder: Recording) -> None:
    """Record the parameters of the models noted so far whose module paths the recorder knows."""
    names = recorder.module_names
    waiting = []
    for model in _models:
        path = names.get(id(model))
        if path is None:
            waiting.append(model)
            continue
        _record_model(recorder, model, path, names)
    _models[:] = waiting


def record_unheld(recorder: Recording, parameters: list[Any]) -> None:
    """Record the plain tpu tensors among one optimizer's `parameters` that no wrapper holds, when another of them is
    DDP's or FSDP2's: their gradients are never summed over the ranks (see `unsynced`)."""
    held, loose = False, []
    for parameter in parameters:
        owned = _owners.get(id(parameter))
        if owned is not None and owned[0] is parameter:
            held = held or owned[1].wrapper in ("ddp", "fsdp")
        elif getattr(parameter, "_local_tensor", None) is None and parameter.device.type == "tpu":
            loose.append(parameter)
    if not held or not loose:
        return
    record_pending(recorder)  # what the wrappers hold is recorded as theirs first
    modules: dict[int, str] = getattr(memory.tracker, "parameter_modules", None) or {}
    for parameter in loose:
        if id(parameter) not in _recorded:  # named by its module and shape: the optimizer does not know its name
            module_name = modules.get(id(parameter), "")
            _record_parameter(recorder, f"{module_name or 'a parameter'} ({shape_text(parameter.shape)})", module_name, 0, parameter, None, {})
            _recorded.add(id(parameter))


def _record_model(recorder: Recording, model: Any, path: str, names: dict[int, str]) -> None:
    owners = _owners
    for module_name, module in model.named_modules(prefix=path):
        for name, parameter in module.named_parameters(recurse=False):
            parameter = _sharded.get((id(module), name), parameter)
            if id(parameter) in _recorded:
                continue
            owned = owners.get(id(parameter))
            owner = owned[1] if owned is not None and owned[0] is parameter else None
            _record_parameter(recorder, f"{module_name}.{name}", module_name, id(module), parameter, owner, names)
            _recorded.add(id(parameter))


def _record_parameter(recorder: Recording, name: str, module_name: str, module_id: int, parameter: Any, owner: _Owner | None,
                      names: dict[int, str]) -> None:
    local = getattr(parameter, "_local_tensor", None)
    spec = getattr(parameter, "_spec", None)
    element_size = parameter.element_size()
    global_bytes = math.prod(parameter.shape) * element_size
    if local is not None and spec is not None:
        mesh = spec.mesh
        placements = placements_text(spec.placements)
        local_shape = tuple(local.shape)
        per_rank = math.prod(local_shape) * element_size
        mesh_row = mesh_id(recorder, mesh)
        _local_names[id(local)] = (local, name)
    else:
        placements, local_shape, per_rank, mesh_row = "Replicate()", tuple(parameter.shape), global_bytes, None
    if owner is None:
        wrapper, group, origin = "none", None, None
    else:
        wrapper, origin = owner.wrapper, owner.origin_frame_id
        group = owner.style if owner.style is not None else names.get(id(owner.group_module))
        if wrapper == "fsdp" and module_id in _styled:
            wrapper = "fsdp+tp"
    recorder.parameter_placement(
        name, module_name, wrapper, group, mesh_row, placements, shape_text(parameter.shape), shape_text(local_shape),
        short_name(parameter.dtype), int(global_bytes), int(per_rank), origin,
    )
