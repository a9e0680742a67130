"""The XPlane protobuf messages that XProf (TensorBoard's profile plugin) reads, defined here: the XProf
export writes them and `tputrace import` reads them.

No package ships an importable `xplane_pb2`, so the messages are described in Python with
`descriptor_pb2` and turned into classes at first use, in a private descriptor pool (so they never
clash with a pool that another library fills). The field numbers are those of XProf's
`xplane.proto` and `op_metrics.proto` (package `tensorflow.profiler`); see
`shared/notes/xprof-format.md` for how they were checked.

Messages: `XSpace`, `XPlane`, `XLine`, `XEvent`, `XStat`, `XEventMetadata`, `XStatMetadata`, and
`MemoryAccessBreakdown` (with its `MemoryAccessed` entries), which an op's `memory_access_breakdown`
stat holds serialized.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

PACKAGE = "tensorflow.profiler"

# MemoryAccessed.operation_type
OPERATION_UNKNOWN = 0
OPERATION_READ = 1
OPERATION_WRITE = 2
# MemoryAccessed.memory_space: XProf's MemorySpace enum (1 is HBM)
MEMORY_SPACE_HBM = 1

# FieldDescriptorProto types and labels, spelled out so this module reads without the enum table.
_INT64 = 3
_UINT64 = 4
_DOUBLE = 1
_STRING = 9
_MESSAGE = 11
_BYTES = 12
_ENUM = 14
_OPTIONAL = 1
_REPEATED = 3

# (field name, number, type, label, message type name or None, oneof index or None)
_Field = tuple[str, int, int, int, str | None, int | None]


def _field(name: str, number: int, kind: int, *, repeated: bool = False, message: str | None = None,
           oneof: int | None = None) -> _Field:
    return (name, number, kind, _REPEATED if repeated else _OPTIONAL, message, oneof)


# (message, fields, oneof names, map fields as (entry message, value message))
_XPLANE_MESSAGES: list[tuple[str, list[_Field], list[str], list[tuple[str, str]]]] = [
    (
        "XSpace",
        [
            _field("planes", 1, _MESSAGE, repeated=True, message="XPlane"),
            _field("errors", 2, _STRING, repeated=True),
            _field("warnings", 3, _STRING, repeated=True),
            _field("hostnames", 4, _STRING, repeated=True),
        ],
        [],
        [],
    ),
    (
        "XPlane",
        [
            _field("id", 1, _INT64),
            _field("name", 2, _STRING),
            _field("lines", 3, _MESSAGE, repeated=True, message="XLine"),
            _field("event_metadata", 4, _MESSAGE, repeated=True, message="XPlane.EventMetadataEntry"),
            _field("stat_metadata", 5, _MESSAGE, repeated=True, message="XPlane.StatMetadataEntry"),
            _field("stats", 6, _MESSAGE, repeated=True, message="XStat"),
        ],
        [],
        [("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata")],
    ),
    (
        "XLine",
        [
            _field("id", 1, _INT64),
            _field("display_id", 10, _INT64),
            _field("name", 2, _STRING),
            _field("display_name", 11, _STRING),
            _field("timestamp_ns", 3, _INT64),
            _field("duration_ps", 9, _INT64),
            _field("events", 4, _MESSAGE, repeated=True, message="XEvent"),
        ],
        [],
        [],
    ),
    (
        "XEvent",
        [
            _field("metadata_id", 1, _INT64),
            _field("offset_ps", 2, _INT64, oneof=0),
            _field("num_occurrences", 5, _INT64, oneof=0),
            _field("duration_ps", 3, _INT64),
            _field("stats", 4, _MESSAGE, repeated=True, message="XStat"),
        ],
        ["data"],
        [],
    ),
    (
        "XStat",
        [
            _field("metadata_id", 1, _INT64),
            _field("double_value", 2, _DOUBLE, oneof=0),
            _field("uint64_value", 3, _UINT64, oneof=0),
            _field("int64_value", 4, _INT64, oneof=0),
            _field("str_value", 5, _STRING, oneof=0),
            _field("bytes_value", 6, _BYTES, oneof=0),
            _field("ref_value", 7, _UINT64, oneof=0),
        ],
        ["value"],
        [],
    ),
    (
        "XEventMetadata",
        [
            _field("id", 1, _INT64),
            _field("name", 2, _STRING),
            _field("display_name", 4, _STRING),
            _field("metadata", 3, _BYTES),
            _field("stats", 5, _MESSAGE, repeated=True, message="XStat"),
            _field("child_id", 6, _INT64, repeated=True),
        ],
        [],
        [],
    ),
    (
        "XStatMetadata",
        [
            _field("id", 1, _INT64),
            _field("name", 2, _STRING),
            _field("description", 3, _STRING),
        ],
        [],
        [],
    ),
]


def _add_fields(message: Any, fields: list[_Field]) -> None:
    for name, number, kind, label, type_name, oneof in fields:
        field = message.field.add(name=name, number=number, type=kind, label=label)
        if type_name is not None:
            field.type_name = f".{PACKAGE}.{type_name}"
        if oneof is not None:
            field.oneof_index = oneof


def _xplane_file() -> Any:
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto(name="tputrace/xplane.proto", package=PACKAGE, syntax="proto3")
    for name, fields, oneofs, maps in _XPLANE_MESSAGES:
        message = file.message_type.add(name=name)
        _add_fields(message, fields)
        for oneof in oneofs:
            message.oneof_decl.add(name=oneof)
        for entry_name, value_type in maps:
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            _add_fields(entry, [_field("key", 1, _INT64), _field("value", 2, _MESSAGE, message=value_type)])
    return file


def _op_metrics_file() -> Any:
    from google.protobuf import descriptor_pb2

    file = descriptor_pb2.FileDescriptorProto(name="tputrace/op_metrics.proto", package=PACKAGE, syntax="proto3")
    op_metrics = file.message_type.add(name="OpMetrics")
    accessed = op_metrics.nested_type.add(name="MemoryAccessed")
    operation_type = accessed.enum_type.add(name="OperationType")
    for value_name, number in (("UNKNOWN", OPERATION_UNKNOWN), ("READ", OPERATION_READ), ("WRITE", OPERATION_WRITE)):
        operation_type.value.add(name=value_name, number=number)
    field = accessed.field.add(name="operation_type", number=1, type=_ENUM, label=_OPTIONAL)
    field.type_name = f".{PACKAGE}.OpMetrics.MemoryAccessed.OperationType"
    _add_fields(accessed, [_field("memory_space", 2, _UINT64), _field("bytes_accessed", 3, _UINT64)])
    breakdown = file.message_type.add(name="MemoryAccessBreakdown")
    _add_fields(breakdown, [_field("memory_accessed", 1, _MESSAGE, repeated=True, message="OpMetrics.MemoryAccessed")])
    return file


@functools.cache
def messages() -> dict[str, type]:
    """The message classes by name: XSpace, XPlane, ..., MemoryAccessBreakdown, MemoryAccessed."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    pool.Add(_xplane_file())
    pool.Add(_op_metrics_file())
    names = [name for name, *_ in _XPLANE_MESSAGES] + ["MemoryAccessBreakdown", "OpMetrics.MemoryAccessed"]
    classes = {}
    for name in names:
        classes[name.rsplit(".", 1)[-1]] = _message_class(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
    return classes


def _message_class(descriptor: Any) -> type:
    from google.protobuf import message_factory

    get_message_class = getattr(message_factory, "GetMessageClass", None)
    if get_message_class is not None:
        return get_message_class(descriptor)
    return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


def memory_access_breakdown(read_bytes: int, write_bytes: int) -> bytes:
    """A serialized `MemoryAccessBreakdown` with HBM reads and writes (what XProf counts as TPU bytes).

    Written field by field (one per op of a trace: a message object each would cost more); a test
    checks it against the message class."""
    out = b""
    for operation, nbytes in ((OPERATION_READ, read_bytes), (OPERATION_WRITE, write_bytes)):
        if nbytes > 0:
            # MemoryAccessed{operation_type = 1, memory_space = 2, bytes_accessed = 3}, all varints.
            accessed = b"\x08" + encode_varint(operation) + b"\x10" + encode_varint(MEMORY_SPACE_HBM) + b"\x18" + encode_varint(int(nbytes))
            out += length_delimited(1, len(accessed)) + accessed
    return out


# -- writing big messages without a message object per event ---------------------------------------
#
# A protobuf object per event makes a big XLine slow to build. Protobuf's wire format
# lets a message be written as the concatenation of its fields, so a line is written as its header
# fields (serialized by protobuf) followed by its events, encoded here in bulk; planes and the space
# are framed the same way.

_WIRE_VARINT = 0
_WIRE_LENGTH = 2
XSPACE_PLANES_FIELD = 1
XPLANE_LINES_FIELD = 3
XLINE_EVENTS_FIELD = 4


def _slow_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Varints 14 bits at a time: whole varints below 2**14, and each lower 14-bit group of a bigger value
# as its two bytes (both with the continuation bit).
_SMALL_VARINTS = [_slow_varint(value) for value in range(1 << 14)]
_CONTINUED_PAIRS = [bytes(((value & 0x7F) | 0x80, (value >> 7) | 0x80)) for value in range(1 << 14)]


def encode_varint(value: int) -> bytes:
    """`value` as a protobuf varint (a negative one as its 64-bit two's complement, as int64 fields are)."""
    if value < 16384:
        if value < 0:
            return encode_varint(value & ((1 << 64) - 1))
        return _SMALL_VARINTS[value]
    out = _CONTINUED_PAIRS[value & 0x3FFF]
    value >>= 14
    while value >= 16384:
        out += _CONTINUED_PAIRS[value & 0x3FFF]
        value >>= 14
    return out + _SMALL_VARINTS[value]


class WireError(ValueError):
    """Bytes that are not well-formed protobuf wire data (a cut varint, a field past its end, ...)."""


def decode_varint(data: bytes | memoryview, position: int) -> tuple[int, int]:
    """The varint at `position` of `data` and the position after it; `WireError` where `data` ends inside it."""
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise WireError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def length_delimited(field_number: int, payload_size: int) -> bytes:
    """The tag and length that precede a length-delimited field (an embedded message) of `payload_size` bytes."""
    return encode_varint(field_number << 3 | _WIRE_LENGTH) + encode_varint(payload_size)


def encode_events(metadata_ids: Any, offsets_ps: Any, durations_ps: Any) -> bytes | None:
    """Events without stats as the `events` field entries of an XLine, in the given order.

    Each becomes `XEvent{metadata_id, offset_ps, duration_ps}`. Encoded with numpy, all events at
    once; returns None when numpy is not installed (the caller then builds message objects).
    """
    try:
        import numpy
    except ImportError:
        return None
    count = len(metadata_ids)
    if count == 0:
        return b""
    blocks = []
    masks = []
    payload_sizes = numpy.zeros(count, dtype=numpy.int64)
    for field_number, values in ((1, metadata_ids), (2, offsets_ps), (3, durations_ps)):
        groups, mask, sizes = _varint_columns(numpy, numpy.asarray(values, dtype=numpy.int64))
        blocks += [numpy.full((count, 1), field_number << 3 | _WIRE_VARINT, dtype=numpy.uint8), groups]
        masks += [numpy.ones((count, 1), dtype=bool), mask]
        payload_sizes += 1 + sizes
    # An event's payload is at most 3 tags and 3 ten-byte varints (33 bytes): its length is one byte.
    header = numpy.empty((count, 2), dtype=numpy.uint8)
    header[:, 0] = XLINE_EVENTS_FIELD << 3 | _WIRE_LENGTH
    header[:, 1] = payload_sizes
    matrix = numpy.concatenate([header, *blocks], axis=1)
    keep = numpy.concatenate([numpy.ones((count, 2), dtype=bool), *masks], axis=1)
    return matrix[keep].tobytes()


def _varint_columns(numpy: Any, values: Any) -> tuple[Any, Any, Any]:
    """Each value's varint bytes as a row of 10 columns, which of them are used, and how many."""
    if len(values) and values.min() < 0:
        raise ValueError("negative values cannot be encoded as varints here")
    unsigned = values.astype(numpy.uint64)
    width = len(encode_varint(int(unsigned.max()))) if len(values) else 1
    groups = numpy.empty((len(values), width), dtype=numpy.uint8)
    sizes = numpy.ones(len(values), dtype=numpy.int64)
    rest = unsigned
    for index in range(width):
        groups[:, index] = (rest & numpy.uint64(0x7F)).astype(numpy.uint8)
        rest = rest >> numpy.uint64(7)
        if index + 1 < width:
            sizes += rest > 0
    columns = numpy.arange(width)
    used = columns[None, :] < sizes[:, None]
    groups |= (columns[None, :] < (sizes - 1)[:, None]).astype(numpy.uint8) << numpy.uint8(7)
    return groups, used, sizes



def encode_stat(metadata_id: int, value: Any, ref_id: int | None = None) -> bytes:
    """One `XStat` (as the message's bytes): str, int (int64, or uint64 above its range), float,
    bool (as int64), bytes, or with `ref_id` a `ref_value` to the stat metadata naming a string."""
    head = b"\x08" + encode_varint(metadata_id)
    if ref_id is not None:
        return head + b"\x38" + encode_varint(ref_id)
    kind = type(value)
    if kind is str:
        data = value.encode("utf-8", "surrogateescape")
        return head + b"\x2a" + encode_varint(len(data)) + data
    if kind is int or kind is bool:
        if value >= 1 << 63:
            return head + b"\x18" + encode_varint(value)
        return head + b"\x20" + encode_varint(int(value))
    if kind is float:
        return head + b"\x11" + struct.pack("<d", value)
    if kind is bytes:
        return head + b"\x32" + encode_varint(len(value)) + value
    data = str(value).encode("utf-8", "surrogateescape")
    return head + b"\x2a" + encode_varint(len(data)) + data


def encode_event_metadata_entry(metadata_id: int, name: str, stats: list[bytes]) -> bytes:
    """One entry of `XPlane.event_metadata` (a map field): key `metadata_id`, value
    `XEventMetadata{id, name, stats}`, with `stats` from `encode_stat`."""
    name_bytes = name.encode("utf-8", "surrogateescape")
    parts = [b"\x08", encode_varint(metadata_id), b"\x12", encode_varint(len(name_bytes)), name_bytes]
    for stat in stats:
        parts += [b"\x2a", encode_varint(len(stat)), stat]
    value = b"".join(parts)
    key = encode_varint(metadata_id)
    entry = b"\x08" + key + b"\x12" + encode_varint(len(value)) + value
    return b"\x22" + encode_varint(len(entry)) + entry
