"""Reading the top level of a protobuf message one field at a time, so that an `XSpace` is parsed one
plane at a time (memory bounded by the largest plane, not the file)."""

from __future__ import annotations

from collections.abc import Iterator

from tputrace.importers.sources import CaptureError

_WIRE_VARINT = 0
_WIRE_FIXED64 = 1
_WIRE_LENGTH = 2
_WIRE_FIXED32 = 5


def _varint(data: memoryview, position: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if position >= end or shift > 63:
            raise ValueError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def top_level_fields(data: memoryview, what: str) -> Iterator[tuple[int, memoryview | int]]:
    """`(field number, value)` for each top-level field: a memoryview for length-delimited fields, an int
    for varints. A truncated or malformed message raises `CaptureError` naming `what`."""
    position = 0
    end = len(data)
    while position < end:
        try:
            key, position = _varint(data, position, end)
            field, wire = key >> 3, key & 7
            if field == 0:
                raise ValueError("field number 0")
            if wire == _WIRE_VARINT:
                value, position = _varint(data, position, end)
                yield field, value
            elif wire == _WIRE_LENGTH:
                size, position = _varint(data, position, end)
                if position + size > end:
                    raise ValueError("a field runs past the end of the file")
                yield field, data[position:position + size]
                position += size
            elif wire in (_WIRE_FIXED64, _WIRE_FIXED32):
                position += 8 if wire == _WIRE_FIXED64 else 4
                if position > end:
                    raise ValueError("a field runs past the end of the file")
            else:
                raise ValueError(f"wire type {wire}")
        except ValueError as error:
            raise CaptureError(f"{what} is truncated or not an XSpace protobuf ({error})") from None
