"""What a program's HLO computes, apart from its input shapes: the digest of its instructions' opcodes and shapes
(`structure`), of its opcodes alone, the digest of its constants' values, and its scalar constants as text. Two compiles of one jitted
function with the same parameters whose structure is the same but whose constants differ were traced with another
Python value (a `static_argnums` argument, a number the function closes over); with the same constants too, the same
program was compiled again (a new function object jitted on each call)."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field as dataclass_field

from tputrace.importers.hlo_collectives import CollectiveSize, collective_sizes
from tputrace.importers.hlo_placement import ProgramPlacement, program_placement
from tputrace.importers.hlo_shapes import Fields, instructions

_MODULE_COMPUTATIONS = 3  # HloModuleProto
_MODULE_ALIASES = frozenset((8, 18))  # HloModuleProto's input_output_alias and buffer_donor (donated arguments)
_OPCODE, _SHAPE, _LITERAL, _SHARDING = 2, 3, 8, 40  # HloInstructionProto
_LITERAL_SHAPE = 1  # LiteralProto
_DIMENSIONS = 3  # ShapeProto
# LiteralProto's packed fields of scalars worth showing: field -> struct format of one value (varints read apart).
_PACKED_FLOATS = {8: "<f", 9: "<d"}  # f32s, f64s
_VARINTS = {4: True, 5: True, 6: False, 7: False}  # s32s, s64s (signed), u32s, u64s
MAX_CONSTANTS = 16  # scalar constants kept per program


@dataclass(frozen=True)
class ProgramBody:
    structure: str  # digest of the instructions' opcodes, shapes and shardings, in order, and the donated arguments
    opcodes: str  # digest of the instructions' opcodes alone: the same where only the shapes inside changed
    constants: str  # digest of the constants' literals
    scalars: tuple[str, ...]  # the scalar constants' values, in order (at most MAX_CONSTANTS)
    placement: ProgramPlacement = dataclass_field(default_factory=ProgramPlacement)  # its parameters' shardings and devices
    collectives: dict[str, CollectiveSize] = dataclass_field(default_factory=dict)  # per collective, its message size


def program_body(module: bytes, fields: Fields) -> ProgramBody:
    """The body of a serialized `HloModuleProto`; raises IndexError or ValueError where the bytes are not one."""
    structure, opcodes, constants = (hashlib.blake2b(digest_size=8) for _ in range(3))
    scalars: list[str] = []
    for number, computation in fields(module):
        if number in _MODULE_ALIASES and isinstance(computation, bytes):
            structure.update(computation + b"\3")
        if number != _MODULE_COMPUTATIONS or not isinstance(computation, bytes):
            continue
        for instruction in instructions(computation, fields):
            opcode, shape, literal, sharding = b"", b"", b"", b""
            for part, value in fields(instruction):
                if part == _OPCODE and isinstance(value, bytes):
                    opcode = value
                elif part == _SHAPE and isinstance(value, bytes):
                    shape = value
                elif part == _LITERAL and isinstance(value, bytes):
                    literal = value
                elif part == _SHARDING and isinstance(value, bytes):
                    sharding = value
            structure.update(opcode + b"\0" + shape + b"\1" + sharding + b"\4")
            opcodes.update(opcode + b"\0")
            if opcode == b"constant" and literal:
                constants.update(literal + b"\2")
                scalar = _scalar(literal, fields)
                if scalar is not None and len(scalars) < MAX_CONSTANTS:
                    scalars.append(scalar)
    return ProgramBody(structure.hexdigest(), opcodes.hexdigest(), constants.hexdigest(), tuple(scalars),
                       program_placement(module, fields), collective_sizes(module, fields))


def _scalar(literal: bytes, fields: Fields) -> str | None:
    """A scalar literal's value as text (`0.05`, `3`); None for an array or a type not read."""
    parts = list(fields(literal))
    shape = next((value for number, value in parts if number == _LITERAL_SHAPE and isinstance(value, bytes)), b"")
    if any(number == _DIMENSIONS for number, _ in fields(shape)):
        return None
    for number, value in parts:
        if number in _PACKED_FLOATS and isinstance(value, bytes):
            size = struct.calcsize(_PACKED_FLOATS[number])
            if len(value) == size:
                return f"{struct.unpack(_PACKED_FLOATS[number], value)[0]:.6g}"
        elif number in _VARINTS and isinstance(value, bytes):
            decoded = _varint(value)
            if decoded is not None:
                return str(decoded - (1 << 64) if _VARINTS[number] and decoded >= 1 << 63 else decoded)
    return None


def _varint(data: bytes) -> int | None:
    """A packed field holding one varint: its value; None for several."""
    value = shift = 0
    for index, byte in enumerate(data):
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value if index == len(data) - 1 else None
    return None


def compile_detail(body: ProgramBody) -> str:
    """A compile's `detail` (JSON) of its program's body: the digests, the scalar constants and, for a program placed
    on several devices or partitioned, its devices and parameters' shardings."""
    placement = body.placement
    return json.dumps({"hlo_structure": body.structure, "hlo_opcodes": body.opcodes, "hlo_constants": body.constants,
                       "constants": list(body.scalars),
                       **({"devices": list(placement.devices)} if placement.devices else {}),
                       **({"shardings": list(placement.shardings)} if placement.shardings else {})})
