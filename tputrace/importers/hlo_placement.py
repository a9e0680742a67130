"""Where a program's data lives, read from its `HloModuleProto`: each parameter's sharding
(`spmd_parameters_shardings`, as XLA's HLO text writes an `OpSharding`: `{devices=[2,1]<=[2]}`, `{replicated}`), the
devices it was compiled for (`device_assignment`), and the chips each collective instruction joins (its replica groups
as devices). A jitted function called with arrays placed another way (another sharding, other devices) compiles a
program of its own: these tell that change from a new shape. A partitioned program's parameter shapes are a device's
share: `global_signature` gives the arrays' shapes the function was called with."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tputrace.importers.hlo_shapes import Fields, computations, signature_diff, varints

_OUTPUT_SHARDING, _PARAMETER_SHARDINGS, _DEVICE_ASSIGNMENT = 12, 14, 15  # HloModuleProto
_NAME, _CHANNEL_ID, _REPLICA_GROUPS, _GLOBAL_IDS, _DEVICE_LIST = 1, 26, 49, 71, 87  # HloInstructionProto
_GROUP_LIST, _IOTA_GROUPS = 1, 2  # CollectiveDeviceListProto
_REPLICA_COUNT, _COMPUTATION_COUNT, _COMPUTATION_DEVICES = 1, 2, 3  # DeviceAssignmentProto
# OpSharding: type (REPLICATED 0, MAXIMAL 1, TUPLE 2, OTHER 3, MANUAL 4), tile dims, devices, replicated last tile dim,
# last tile dims' types, iota devices' reshape and transpose.
_TYPE, _TILE_DIMS, _TILE_DEVICES, _LAST_REPLICATED, _LAST_TILE_DIMS, _IOTA_DIMS, _IOTA_PERM = 1, 3, 4, 6, 8, 9, 10


@dataclass(frozen=True)
class ProgramPlacement:
    """A program's parameter shardings (empty where it is not partitioned), the devices it runs on (in the device
    assignment's order), and per collective instruction the groups of devices it joins."""

    shardings: tuple[str, ...] = ()
    devices: tuple[int, ...] = ()
    groups: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    tiles: tuple[tuple[int, ...], ...] = ()  # per parameter, how many pieces each dim is cut into


def program_placement(module: bytes, fields: Fields) -> ProgramPlacement:
    """The placement of a serialized `HloModuleProto`; raises IndexError or ValueError on bytes that are not one."""
    shardings: list[str] = []
    tiles: list[tuple[int, ...]] = []
    assignment: list[list[int]] = []
    replicas = 1
    for number, value in fields(module):
        if number == _PARAMETER_SHARDINGS and isinstance(value, bytes):
            text, cut = _sharding(value, fields)
            shardings.append(text)
            tiles.append(cut)
        elif number == _DEVICE_ASSIGNMENT and isinstance(value, bytes):
            replicas, assignment = _assignment(value, fields)
    devices = tuple(device for replica in range(replicas) for computation in assignment
                    for device in computation[replica:replica + 1])
    groups = {}
    for instructions in computations(module, fields):
        for instruction in instructions:
            found = _collective_groups(instruction, fields, assignment, replicas)
            if found is not None:
                groups[found[0]] = found[1]
    return ProgramPlacement(tuple(shardings), devices, groups, tuple(tiles))


def _sharding(data: bytes, fields: Fields) -> tuple[str, tuple[int, ...]]:
    """An `OpSharding` as HLO text writes it, and how many pieces it cuts each of the array's dims into."""
    kind, dims, devices, last_replicated, last_dims, iota_dims = 0, [], [], False, 0, []
    for number, value in fields(data):
        if number == _TYPE and isinstance(value, int):
            kind = value
        elif number == _TILE_DIMS:
            dims += varints(value)
        elif number == _TILE_DEVICES:
            devices += varints(value)
        elif number == _LAST_REPLICATED and isinstance(value, int):
            last_replicated = bool(value)
        elif number == _LAST_TILE_DIMS:
            last_dims += len(varints(value))
        elif number == _IOTA_DIMS:
            iota_dims += varints(value)
    if kind == 0:
        return "{replicated}", ()
    if kind == 1:
        return "{maximal device=" + (str(devices[0]) if devices else "?") + "}", ()
    if kind == 4:
        return "{manual}", ()
    if kind != 3:
        return f"{{type {kind}}}", ()
    kept = len(dims) - (1 if last_replicated else last_dims)
    order = f"<=[{','.join(map(str, iota_dims))}]" if iota_dims else ",".join(map(str, devices))
    text = f"{{devices=[{','.join(map(str, dims))}]{order}" + (" last_tile_dim_replicate" if last_replicated else "")
    return text + "}", tuple(dims[:max(kept, 0)])


def _assignment(data: bytes, fields: Fields) -> tuple[int, list[list[int]]]:
    """A `DeviceAssignmentProto`'s replica count and, per computation (partition), its device per replica."""
    replicas, computations = 1, []
    for number, value in fields(data):
        if number == _REPLICA_COUNT and isinstance(value, int):
            replicas = value
        elif number == _COMPUTATION_DEVICES and isinstance(value, bytes):
            computations.append([device for key, part in fields(value) if key == 1 for device in varints(part)])
    return replicas, computations


def _collective_groups(instruction: bytes, fields: Fields, assignment: list[list[int]],
                       replicas: int) -> tuple[str, tuple[tuple[int, ...], ...]] | None:
    """A collective instruction's name and the devices of each group it joins (its replica groups, read as global
    device ids, partition ids or replica ids as the instruction's fields say, put through the device assignment);
    None for an instruction that names no groups."""
    name, channel, global_ids = "", False, False
    ids: list[list[int]] = []
    for number, value in fields(instruction):
        if number == _NAME and isinstance(value, bytes):
            name = value.decode(errors="replace")
        elif number == _CHANNEL_ID and isinstance(value, int):
            channel = value > 0
        elif number == _GLOBAL_IDS and isinstance(value, int):
            global_ids = bool(value)
        elif number == _REPLICA_GROUPS and isinstance(value, bytes):
            ids.append([member for key, part in fields(value) if key == 1 for member in varints(part)])
        elif number == _DEVICE_LIST and isinstance(value, bytes):
            for key, part in fields(value):
                if key == _GROUP_LIST and isinstance(part, bytes):
                    ids.append([member for inner, members in fields(part) if inner == 1 for member in varints(members)])
                elif key == _IOTA_GROUPS and isinstance(part, bytes):
                    ids += _iota_groups(part, fields)
    if not ids or not name:
        return None
    partitions = len(assignment)

    def device(member: int) -> int:
        if not assignment:
            return member
        if global_ids:
            replica, partition = divmod(member, partitions)
        elif channel:
            replica, partition = 0, member
        else:
            replica, partition = member, 0
        if partition < partitions and replica < min(replicas, len(assignment[partition])):
            return assignment[partition][replica]
        return member

    return name, tuple(tuple(device(member) for member in group) for group in ids if group)


def _iota_groups(data: bytes, fields: Fields) -> list[list[int]]:
    """An `IotaReplicaGroupListProto`'s groups: the ids 0.. reshaped, transposed and cut into groups."""
    parts = list(fields(data))
    count = next((value for key, value in parts if key == 1 and isinstance(value, int)), 0)
    size = next((value for key, value in parts if key == 2 and isinstance(value, int)), 0)
    dims = [dim for key, value in parts if key == 3 for dim in varints(value)]
    perm = [axis for key, value in parts if key == 4 for axis in varints(value)]
    if count <= 0 or size <= 0 or int(np.prod(dims or [count * size])) != count * size:
        return []
    ids = np.arange(count * size).reshape(dims or [count * size])
    if perm and sorted(perm) == list(range(ids.ndim)):
        ids = ids.transpose(perm)
    return [list(map(int, group)) for group in ids.reshape(count, size)]


_SHAPE = re.compile(r"^(?P<dtype>\w+)\[(?P<dims>[\d,]*)\]$")


def global_signature(signature: str, placement: ProgramPlacement) -> str:
    """A partitioned program's signature (its parameters' per-device shapes) as the shapes of the arrays it was
    called with: each dim times the pieces its parameter's sharding cuts it into (an uneven split's padded size)."""
    parameters = signature.split(", ")
    if not placement.tiles or len(placement.tiles) != len(parameters):
        return signature
    shapes = []
    for parameter, tiles in zip(parameters, placement.tiles):
        shape = _SHAPE.match(parameter)
        dims = shape["dims"].split(",") if shape and shape["dims"] else []
        if shape is None or not tiles or len(tiles) != len(dims):
            shapes.append(parameter)
            continue
        shapes.append(f"{shape['dtype']}[{','.join(str(int(dim) * tile) for dim, tile in zip(dims, tiles))}]")
    return ", ".join(shapes)


def placement_diff(before: ProgramPlacement, after: ProgramPlacement) -> str | None:
    """What changed in where a function's arrays live between two of its programs (`arg 1 sharding: {devices=[2,1]<=[2]}
    -> {replicated}`, `devices: [0] -> [1]`, joined by `; `); None where nothing did."""
    changes = []
    if len(before.shardings) == len(after.shardings):
        changes += [f"arg {index} sharding: {was} -> {now}"
                    for index, (was, now) in enumerate(zip(before.shardings, after.shardings)) if was != now]
    elif before.shardings or after.shardings:
        changes.append(f"shardings: {', '.join(before.shardings) or 'none'} -> {', '.join(after.shardings) or 'none'}")
    if before.devices and after.devices and before.devices != after.devices:
        changes.append(f"devices: {_devices(before.devices)} -> {_devices(after.devices)}")
    return "; ".join(changes) or None


def _devices(devices: tuple[int, ...]) -> str:
    return f"[{','.join(map(str, devices))}]"


def recompile_diff(before: tuple[str | None, ProgramPlacement | None] | None, signature: str | None,
                   placement: ProgramPlacement | None) -> str | None:
    """A recompile's diff from the function's last program (`before`: its signature and placement): the shapes that
    changed (`hlo_shapes.signature_diff`), then where the arrays live; None where neither tells a change."""
    if before is None:
        return None
    changes = [signature_diff(before[0], signature) if before[0] and signature else None,
               placement_diff(before[1], placement) if before[1] and placement else None]
    return "; ".join(change for change in changes if change) or None
