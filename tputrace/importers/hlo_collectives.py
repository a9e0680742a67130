"""What a program's HLO says of each collective instruction: its message size and element type, read from the
shapes of its operands and result in the program's `HloModuleProto` (an XProf capture holds one per program). The
size is the larger of what the instruction reads and what it writes, as torch.profiler's collectives are sized: an
all-gather's output, a reduce-scatter's input, an all-reduce's operands (all of them, where XLA combined several
into one instruction with a tuple result). An asynchronous `-start` instruction's tuple mixes its operands, its
results and context buffers, so it is not sized here."""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.dtypes import PRIMITIVE_TYPES, element_bytes
from tputrace.importers.hlo_shapes import Fields, computations, varints

_NAME, _OPCODE, _SHAPE, _ID, _OPERAND_IDS = 1, 2, 3, 35, 36  # HloInstructionProto
_ELEMENT_TYPE, _DIMENSIONS, _TUPLE_SHAPES = 2, 3, 4  # ShapeProto
# Synchronous collective opcodes: their operands and result are the data they move.
SIZED_OPCODES = frozenset((b"all-reduce", b"all-gather", b"reduce-scatter", b"all-to-all", b"collective-permute"))


@dataclass(frozen=True)
class CollectiveSize:
    """A collective instruction's message size (bytes) and element type (`f32`; None where its arrays mix types)."""

    nbytes: int
    dtype: str | None


def collective_sizes(module: bytes, fields: Fields) -> dict[str, CollectiveSize]:
    """Per synchronous collective instruction (by name) of a serialized `HloModuleProto`, its message size; an
    instruction whose shapes hold an element type of no whole byte size is left out."""
    sizes: dict[str, CollectiveSize] = {}
    for instructions in computations(module, fields):
        shapes: dict[int, list[tuple[int, int]]] = {}  # instruction id -> its arrays' (element type, element count)
        collectives: list[tuple[str, list[tuple[int, int]], list[int]]] = []
        for instruction in instructions:
            name, opcode, arrays, ident, operands = "", b"", [], None, []
            for part, value in fields(instruction):
                if part == _NAME and isinstance(value, bytes):
                    name = value.decode(errors="replace")
                elif part == _OPCODE and isinstance(value, bytes):
                    opcode = value
                elif part == _SHAPE and isinstance(value, bytes):
                    arrays = _arrays(value, fields)
                elif part == _ID and isinstance(value, int):
                    ident = value
                elif part == _OPERAND_IDS:
                    operands += varints(value)
            if ident is not None:
                shapes[ident] = arrays
            if opcode in SIZED_OPCODES and name:
                collectives.append((name, arrays, operands))
        for name, result, operands in collectives:
            read = [array for operand in operands for array in shapes.get(operand, [])]
            size = _size(read, result) if all(operand in shapes for operand in operands) else _size([], result)
            if size is not None:
                sizes[name] = size
    return sizes


def _size(read: list[tuple[int, int]], written: list[tuple[int, int]]) -> CollectiveSize | None:
    arrays = read + written
    sizes = {element: element_bytes(PRIMITIVE_TYPES.get(element)) for element, _ in arrays}
    if not written or None in sizes.values():
        return None
    nbytes = max(sum((sizes[element] or 0) * count for element, count in side) for side in (read, written))
    types = {element for element, _ in arrays}
    return CollectiveSize(nbytes, PRIMITIVE_TYPES.get(types.pop()) if len(types) == 1 else None)


def _arrays(shape: bytes, fields: Fields) -> list[tuple[int, int]]:
    """A `ShapeProto`'s arrays as (element type, element count): one for an array, its elements' for a tuple."""
    element_type, count, tuple_shapes = 0, 1, []
    for number, value in fields(shape):
        if number == _ELEMENT_TYPE and isinstance(value, int):
            element_type = value
        elif number == _DIMENSIONS:
            for size in varints(value):
                count *= size
        elif number == _TUPLE_SHAPES and isinstance(value, bytes):
            tuple_shapes += _arrays(value, fields)
    return tuple_shapes if element_type == 13 else [(element_type, count)]
