"""Where each XLA instruction came from, read from the HLO protos an XProf capture keeps in `/host:metadata`.

JAX writes the optimized `HloProto` of every program it ran into the plane's event metadata (stat `Hlo Proto`).
Each instruction's `OpMetadata` holds its `op_name` (the `jax.named_scope`s and primitive:
`jit(step)/backward/dot_general`) and its source: a `stack_frame_id` into the module's stack frame index (the
innermost frame of the call stack that traced it), or `source_file` and `source_line`. XLA:CPU's op events carry
neither (a TPU's carry `source` and `tf_op` stats): this is where their line and scope come from.

The protos are read at the wire level (varints and length-delimited fields) for the few fields used.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from tputrace.importers.hlo_body import ProgramBody, program_body
from tputrace.importers.hlo_placement import global_signature
from tputrace.importers.hlo_shapes import instructions, program_signature
from tputrace.xplane_proto import decode_varint

_T = TypeVar("_T")

# Field numbers (xla/service/hlo.proto, xla/xla_data.proto).
_HLO_MODULE = 1  # HloProto.hlo_module
_MODULE_NAME, _MODULE_COMPUTATIONS, _MODULE_FRAMES = 1, 3, 17  # HloModuleProto
_INSTRUCTION_NAME, _INSTRUCTION_METADATA = 1, 7  # HloInstructionProto
_OP_NAME, _SOURCE_FILE, _SOURCE_LINE, _STACK_FRAME = 2, 3, 4, 15  # OpMetadata
_FILE_NAMES, _FUNCTION_NAMES, _FILE_LOCATIONS, _STACK_FRAMES = 1, 2, 3, 4  # StackFrameIndexProto
_LOCATION_FILE, _LOCATION_FUNCTION, _LOCATION_LINE = 1, 2, 3  # FileLocation (ids are 1-based)
_FRAME_LOCATION, _FRAME_PARENT = 1, 2  # StackFrame (ids are 1-based, 0: none)


@dataclass(frozen=True)
class InstructionSource:
    """An instruction's `op_name` and the user's line that traced it (file, line, function), where known."""

    op_name: str | None
    file: str | None
    line: int | None
    function: str


# A program's metadata event name: its module's name and XLA's unique id of the module (`jit_step(12)`).
_VERSION = re.compile(r"\((\d+)\)$")
# Module name -> each of its protos as (XLA's id of the module, its instructions' sources), by id: in compile order.
HloVersions = dict[str, list[tuple[int, dict[str, "InstructionSource"]]]]
# A user's file (its full path) -> the functions its programs' stacks pass through (each frame's function, its
# qualified name's last part) and the last line they name in it.
UserFileFrames = dict[str, tuple[set[str], int]]
# What a damaged proto names: no module, no instructions.
_NO_SOURCES: tuple[str, dict[str, InstructionSource]] = ("", {})


def read_hlo(plane: Any, first: dict[str, dict[str, InstructionSource]], versions: HloVersions,
             signatures: dict[tuple[str, int], str] | None = None,
             bodies: dict[tuple[str, int], ProgramBody] | None = None,
             user_frames: UserFileFrames | None = None) -> None:
    """The instructions' sources of each program's HLO proto in the `/host:metadata` plane: in `first` those of the
    first proto of each module name, in `versions` those of every proto of it (a name compiled again, as `jit_f` for
    new shapes, or a library's `jit_broadcast_in_dim` called from several lines, has a proto each); in `signatures`,
    by (module name, XLA's id of the module), its parameters' shapes (`hlo_shapes`; a partitioned program's as the
    arrays it was called with, `hlo_placement`); in `bodies`, so keyed, what it
    computes (`hlo_body`); in `user_frames`, what every stack frame of the user's files names (`UserFileFrames`)."""
    names = {key: meta.name for key, meta in plane.stat_metadata.items()}
    for key, metadata in sorted(plane.event_metadata.items()):
        for stat in metadata.stats:
            if names.get(stat.metadata_id) == "Hlo Proto" and stat.WhichOneof("value") == "bytes_value":
                module_bytes = _hlo_module(stat.bytes_value)
                module, sources = _parsed(module_bytes, _module_sources, _NO_SOURCES)
                first.setdefault(module, sources)
                number = _VERSION.search(metadata.name)
                version = int(number.group(1)) if number else key
                if number and any(seen == version for seen, _ in versions.get(module, ())):
                    continue  # written again by a later profiling session of the process
                versions.setdefault(module, []).append((version, sources))
                signature = _parsed(module_bytes, lambda data: program_signature(data, _fields), None)
                body = _parsed(module_bytes, lambda data: program_body(data, _fields), None) if module_bytes else None
                if signatures is not None and signature is not None:
                    signatures[(module, version)] = global_signature(signature, body.placement) if body else signature
                if bodies is not None and body is not None:
                    bodies[(module, version)] = body
                if user_frames is not None:
                    _parsed(module_bytes, lambda data: _note_user_frames(data, user_frames), None)
    for protos in versions.values():
        protos.sort(key=lambda proto: proto[0])


def hlo_sources(data: bytes) -> tuple[str, dict[str, InstructionSource]]:
    """The module name of a serialized `HloProto` and, per instruction name, its source; empty where the bytes are
    not one (a damaged proto names nothing rather than failing the import)."""
    return _parsed(_hlo_module(data), _module_sources, _NO_SOURCES)


def _hlo_module(data: bytes) -> bytes:
    """The `HloModuleProto` of a serialized `HloProto` (empty where the bytes are not one)."""
    try:
        return next((value for field, value in _fields(data) if field == _HLO_MODULE and isinstance(value, bytes)),
                    b"")
    except (IndexError, ValueError):
        return b""


def _parsed(data: bytes, parse: Callable[[bytes], _T], damaged: _T) -> _T:
    """`parse(data)`, or `damaged` where the bytes are not the message it reads."""
    try:
        return parse(data)
    except (IndexError, ValueError, UnicodeDecodeError):
        return damaged


def _module_sources(module: bytes) -> tuple[str, dict[str, InstructionSource]]:
    name = ""
    computations: list[bytes] = []
    frames: bytes = b""
    for field, value in _fields(module):
        if field == _MODULE_NAME and isinstance(value, bytes):
            name = value.decode()
        elif field == _MODULE_COMPUTATIONS and isinstance(value, bytes):
            computations.append(value)
        elif field == _MODULE_FRAMES and isinstance(value, bytes):
            frames = value
    stack = _StackFrames(frames)
    sources: dict[str, InstructionSource] = {}
    for computation in computations:
        for instruction in instructions(computation, _fields):
            parts = dict(_fields(instruction))
            metadata = parts.get(_INSTRUCTION_METADATA)
            instruction_name = parts.get(_INSTRUCTION_NAME)
            if isinstance(instruction_name, bytes) and isinstance(metadata, bytes):
                sources[instruction_name.decode()] = _source(metadata, stack)
    return name, sources


def _note_user_frames(module: bytes, user_frames: UserFileFrames) -> None:
    """Add the functions and lines of a module's stack frame index in the user's files to `user_frames`."""
    frames = next((value for field, value in _fields(module) if field == _MODULE_FRAMES and isinstance(value, bytes)),
                  b"")
    stack = _StackFrames(frames)
    for file_id, function_id, line in stack.locations:
        if not 0 < file_id <= len(stack.files) or is_library(file := stack.files[file_id - 1]):
            continue
        functions, last = user_frames.get(file, (set(), 0))
        if 0 < function_id <= len(stack.functions):
            functions.add(stack.functions[function_id - 1].rsplit(".", 1)[-1])
        user_frames[file] = (functions, max(last, line))


def _source(metadata: bytes, stack: _StackFrames) -> InstructionSource:
    fields = dict(_fields(metadata))
    op_name = fields.get(_OP_NAME)
    frame_id = fields.get(_STACK_FRAME)
    place = stack.user_frame(frame_id) if isinstance(frame_id, int) and frame_id > 0 else None
    if place is None:
        file, line = fields.get(_SOURCE_FILE), fields.get(_SOURCE_LINE)
        if isinstance(file, bytes) and file and isinstance(line, int) and line > 0:
            place = (file.decode(), line, "")
    op_text = op_name.decode() if isinstance(op_name, bytes) and op_name else None
    if place is None:
        return InstructionSource(op_text, None, None, "")
    return InstructionSource(op_text, *place)


class _StackFrames:
    """A module's stack frame index: a frame id's innermost frame in the user's code (not a library's)."""

    def __init__(self, data: bytes) -> None:
        self.files: list[str] = []
        self.functions: list[str] = []
        self.locations: list[tuple[int, int, int]] = []
        self.frames: list[tuple[int, int]] = []
        for field, value in _fields(data):
            if not isinstance(value, bytes):
                continue
            if field == _FILE_NAMES:
                self.files.append(value.decode())
            elif field == _FUNCTION_NAMES:
                self.functions.append(value.decode())
            elif field == _FILE_LOCATIONS:
                parts = dict(_fields(value))
                self.locations.append((_int(parts.get(_LOCATION_FILE)), _int(parts.get(_LOCATION_FUNCTION)),
                                       _int(parts.get(_LOCATION_LINE))))
            elif field == _STACK_FRAMES:
                parts = dict(_fields(value))
                self.frames.append((_int(parts.get(_FRAME_LOCATION)), _int(parts.get(_FRAME_PARENT))))

    def user_frame(self, frame_id: int) -> tuple[str, int, str] | None:
        innermost = None
        seen = 0
        while 0 < frame_id <= len(self.frames) and seen < len(self.frames):
            location_id, frame_id = self.frames[frame_id - 1]
            seen += 1
            if not 0 < location_id <= len(self.locations):
                continue
            file_id, function_id, line = self.locations[location_id - 1]
            if not 0 < file_id <= len(self.files) or line <= 0:
                continue
            file = self.files[file_id - 1]
            function = self.functions[function_id - 1] if 0 < function_id <= len(self.functions) else ""
            innermost = innermost or (file, line, function)
            if not is_library(file):
                return file, line, function
        return innermost


def is_library(file: str) -> bool:
    """Whether a file is an installed library's or the interpreter's, not the user's."""
    return any(part in file for part in ("site-packages", "dist-packages", "/lib/python")) or file.startswith("<")


def _int(value: int | bytes | None) -> int:
    return value if isinstance(value, int) else 0


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """A message's fields: (number, value), a varint's value or a length-delimited field's bytes (fixed-width
    fields are skipped). Raises IndexError or ValueError on bytes that are not a message."""
    offset, end = 0, len(data)
    while offset < end:
        key, offset = decode_varint(data, offset)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, offset = decode_varint(data, offset)
            yield field, value
        elif wire == 2:
            length, offset = decode_varint(data, offset)
            if offset + length > end:
                raise ValueError("field runs past its message")
            yield field, data[offset:offset + length]
            offset += length
        elif wire == 1:
            offset += 8
        elif wire == 5:
            offset += 4
        else:
            raise ValueError(f"wire type {wire}")

