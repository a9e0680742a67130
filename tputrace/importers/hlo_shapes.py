"""The shapes of a program's parameters, read from its `HloModuleProto`'s `host_program_shape` (the entry computation's
`ProgramShapeProto`), written as the trace writes an input signature: `f32[32,32], f32[8,32]`. A jitted function
compiled again for new input shapes has a program per shape: their signatures say which sizes changed."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from tputrace.dtypes import PRIMITIVE_TYPES
from tputrace.xplane_proto import decode_varint

_MODULE_COMPUTATIONS, _HOST_PROGRAM_SHAPE = 3, 4  # HloModuleProto
_COMPUTATION_INSTRUCTIONS = 2  # HloComputationProto
_PARAMETERS = 1  # ProgramShapeProto
_ELEMENT_TYPE, _DIMENSIONS = 2, 3  # ShapeProto

Fields = Callable[[bytes], Iterator[tuple[int, int | bytes]]]


def program_signature(module: bytes, fields: Fields) -> str | None:
    """The parameters of a serialized `HloModuleProto` (`module`, read by `fields`, `hlo_metadata`'s wire reader) as
    `f32[32,32], f32[8,32]`; None where it holds no program shape."""
    shape = next((value for number, value in fields(module) if number == _HOST_PROGRAM_SHAPE
                  and isinstance(value, bytes)), None)
    if shape is None:
        return None
    parameters = [value for number, value in fields(shape) if number == _PARAMETERS and isinstance(value, bytes)]
    return ", ".join(_shape_text(parameter, fields) for parameter in parameters)


def _shape_text(shape: bytes, fields: Fields) -> str:
    element_type = 0
    dims: list[int] = []
    for number, value in fields(shape):
        if number == _ELEMENT_TYPE and isinstance(value, int):
            element_type = value
        elif number == _DIMENSIONS:
            dims += varints(value)
    dtype = PRIMITIVE_TYPES.get(element_type, f"type{element_type}")
    if dtype in ("tuple", "token", "opaque"):
        return dtype
    return f"{dtype}[{','.join(str(size) for size in dims)}]"


def computations(module: bytes, fields: Fields) -> Iterator[list[bytes]]:
    """Each computation of a serialized `HloModuleProto`, as its serialized `HloInstructionProto`s in order."""
    for number, computation in fields(module):
        if number == _MODULE_COMPUTATIONS and isinstance(computation, bytes):
            yield instructions(computation, fields)


def instructions(computation: bytes, fields: Fields) -> list[bytes]:
    """A serialized `HloComputationProto`'s serialized `HloInstructionProto`s, in order."""
    return [instruction for number, instruction in fields(computation)
            if number == _COMPUTATION_INSTRUCTIONS and isinstance(instruction, bytes)]


def varints(value: int | bytes) -> list[int]:
    """A repeated varint field's values: one unpacked value, or a packed run."""
    return [value] if isinstance(value, int) else packed_varints(value)


def packed_varints(data: bytes) -> list[int]:
    """A packed repeated varint field's values."""
    values, offset = [], 0
    while offset < len(data):
        value, offset = decode_varint(data, offset)
        values.append(value)
    return values


_SHAPE = re.compile(r"^(?P<dtype>\w+)\[(?P<dims>[\d,]*)\]$")


def signature_diff(before: str, after: str) -> str | None:
    """What changed from one signature of a program to the next, as a recompile's diff reads (`arg 1 dim 0: 64 -> 5`,
    changes joined by `; `); None where the parameters differ in number, rank or dtype, or not at all."""
    old, new = before.split(", "), after.split(", ")
    if len(old) != len(new):
        return None
    changes = []
    for index, (was, now) in enumerate(zip(old, new)):
        was_shape, now_shape = _SHAPE.match(was), _SHAPE.match(now)
        if was_shape is None or now_shape is None:
            if was != now:
                return None
            continue
        was_dims, now_dims = was_shape["dims"].split(","), now_shape["dims"].split(",")
        if was_shape["dtype"] != now_shape["dtype"] or len(was_dims) != len(now_dims):
            return None
        changes += [f"arg {index} dim {dim}: {a} -> {b}" for dim, (a, b) in enumerate(zip(was_dims, now_dims)) if a != b]
    return "; ".join(changes) or None

