"""Reading an `XSpace` file (`xplane.pb`) a piece at a time, so that memory stays bounded by a read window
however big the file, its planes or their lines are.

The file is read with plain reads (a memory map would count every page read toward the process's
resident size). The top level and each plane's fields are walked with a hand-written varint reader: a
plane's lines are skipped over, its other fields (name, metadata maps, stats) parsed with the generated
message classes as one `XPlane` without lines. A line's events are walked one field at a time, and each
run of consecutive events, up to a window's worth, is handed on as the window's bytes with where each
event's field starts (`event_runs`, decoded into columns by `xevents`) or parsed as one `XLine` holding
only those events (`events`).
Messages are assumed to be written in field-number order (as every protobuf serializer does): a line's
name and timestamp before its events; a line that has them after its events is an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tputrace.importers.sources import CaptureError
from tputrace.xplane_proto import WireError, decode_varint, encode_varint

_WIRE_VARINT = 0
_WIRE_FIXED64 = 1
_WIRE_LENGTH = 2
_WIRE_FIXED32 = 5
_WINDOW = 1 << 20
_XSPACE_PLANES = 1
_XPLANE_LINES = 3
_XLINE_NAME = 2
_XLINE_TIMESTAMP = 3
_XLINE_EVENTS = 4
_EVENT_KEY = (_XLINE_EVENTS << 3) | _WIRE_LENGTH
_FIELD_HEAD = 20  # a key and a length varint fit in this many bytes
# Appended to a window of a line's events: a byte that is no field key, then an unfinished varint.
_SENTINEL = b"\x00\xff"


@dataclass(frozen=True)
class Span:
    """Where a length-delimited field's payload lies in the file."""

    start: int
    end: int


@dataclass(frozen=True)
class EventRun:
    """Consecutive events of a line: the bytes read, where each event's `events` field starts in them, and
    where the last one ends. The fields are well-formed: each one's length is within the bytes read."""

    data: bytes
    fields: list[int]
    end: int


@dataclass
class LineHead:
    """A line's name and timestamp, and where its fields lie."""

    name: str
    timestamp_ns: int
    span: Span
    has_events: bool


class XSpaceFile:
    """One `xplane.pb`, open for reading."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stream: IO[bytes] = path.open("rb")
        self.size = path.stat().st_size
        self._window = b""
        self._window_at = 0

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> XSpaceFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _error(self, error: Exception) -> CaptureError:
        return CaptureError(f"{self.path} is truncated or not an XSpace protobuf ({error})")

    def _bytes(self, start: int, end: int) -> bytes:
        if self._window_at <= start and end <= self._window_at + len(self._window):
            return self._window[start - self._window_at:end - self._window_at]
        self.stream.seek(start)
        data = self.stream.read(end - start)
        if len(data) != end - start:
            raise self._error(WireError("a field runs past the end of the file"))
        return data

    def _fields(self, span: Span) -> Iterator[tuple[int, int, int, int]]:
        """`(field number, wire type, value start, value end)` of each field in `span` (for a varint the value
        itself in place of its end)."""
        position = span.start
        try:
            while position < span.end:
                offset = position - self._window_at
                if offset < 0 or offset + _FIELD_HEAD > len(self._window) and \
                        self._window_at + len(self._window) < span.end:
                    self.stream.seek(position)
                    self._window = self.stream.read(min(_WINDOW, span.end - position))
                    self._window_at = position
                    offset = 0
                key, offset = decode_varint(self._window, offset)
                field, wire = key >> 3, key & 7
                if field == 0:
                    raise WireError("field number 0")
                if wire == _WIRE_VARINT:
                    value, offset = decode_varint(self._window, offset)
                    position = self._window_at + offset
                    yield field, wire, position, value
                    continue
                if wire == _WIRE_LENGTH:
                    size, offset = decode_varint(self._window, offset)
                elif wire in (_WIRE_FIXED64, _WIRE_FIXED32):
                    size = 8 if wire == _WIRE_FIXED64 else 4
                else:
                    raise WireError(f"wire type {wire}")
                start = self._window_at + offset
                position = start + size
                if position > span.end:
                    raise WireError("a field runs past the end of its message")
                yield field, wire, start, position
        except WireError as error:
            raise self._error(error) from None

    def planes(self) -> list[Span]:
        """Where each plane lies (the top level is walked, the planes are not read)."""
        spans = [Span(start, end) for field, wire, start, end in self._fields(Span(0, self.size))
                 if field == _XSPACE_PLANES and wire == _WIRE_LENGTH]
        if not spans:
            raise CaptureError(f"{self.path} holds no XPlane: not an XProf capture")
        return spans

    def plane(self, span: Span, plane_class: type) -> tuple[Any, list[Span]]:
        """The plane without its lines (name, metadata, stats) and where its lines lie."""
        lines: list[Span] = []
        rest = bytearray()
        for field, wire, start, end in self._fields(span):
            if field == _XPLANE_LINES and wire == _WIRE_LENGTH:
                lines.append(Span(start, end))
            elif wire == _WIRE_VARINT:
                rest += _key(field, wire) + encode_varint(end)
            else:
                data = self._bytes(start, end)
                rest += _key(field, wire) + (encode_varint(len(data)) if wire == _WIRE_LENGTH else b"") + data
        plane = plane_class()
        try:
            plane.ParseFromString(bytes(rest))
        except Exception as error:  # protobuf's DecodeError
            raise CaptureError(f"{self.path} holds a damaged XPlane ({error})") from None
        return plane, lines

    def line_head(self, span: Span) -> LineHead:
        """A line's name and timestamp: the fields before its first event."""
        name = ""
        timestamp_ns = 0
        for field, wire, start, end in self._fields(span):
            if field == _XLINE_EVENTS:
                return LineHead(name, timestamp_ns, span, True)
            if field == _XLINE_NAME and wire == _WIRE_LENGTH:
                name = self._bytes(start, end).decode("utf-8", errors="replace")
            elif field == _XLINE_TIMESTAMP and wire == _WIRE_VARINT:
                timestamp_ns = end - (1 << 64) if end >= 1 << 63 else end
        return LineHead(name, timestamp_ns, span, False)

    def events(self, line: LineHead, line_class: type) -> Iterator[Any]:
        """A line's events, a window's worth at a time (each an `XLine`'s repeated `events`)."""
        for run in self.event_runs(line):
            yield _parse_line(line_class, run.data[run.fields[0]:run.end], self.path).events

    def event_runs(self, line: LineHead) -> Iterator[EventRun]:
        """A line's events, a window's worth at a time, as wire bytes with where each event lies."""
        if not line.has_events:
            return
        seen_events = False
        stream = self.stream
        event_key = _EVENT_KEY
        position = line.span.start
        end = line.span.end
        try:
            while position < end:
                stream.seek(position)
                window = stream.read(min(_WINDOW, end - position))
                if len(window) < min(_WINDOW, end - position):
                    raise WireError("a line runs past the end of the file")
                window_end = len(window)
                window += _SENTINEL
                offset = 0
                fields: list[int] = []
                add_field = fields.append
                while offset < window_end:
                    if window[offset] == event_key:
                        # The events that follow one another, up to another field or the window's end (the
                        # sentinel is no event key, and a length read from it runs past the window).
                        while True:
                            size = window[offset + 1]
                            field_end = offset + 2 + size if size < 0x80 else _field_end(window, offset + 1)
                            if field_end > window_end:
                                break
                            add_field(offset)
                            offset = field_end
                            if window[offset] != event_key:
                                break
                        break
                    key, after_key = decode_varint(window, offset)
                    field, wire = key >> 3, key & 7
                    if seen_events and field in (_XLINE_NAME, _XLINE_TIMESTAMP):
                        raise CaptureError(f"{self.path}: an XLine has its name or timestamp after its events "
                                           "(fields out of the usual order), which this importer cannot stream")
                    field_end = _skip(window, after_key, wire)
                    if field_end > window_end:
                        if window_end == end - position:
                            raise WireError("a field runs past the end of its line")
                        break
                    offset = field_end
                if fields:
                    seen_events = True
                    yield EventRun(window, fields, offset)
                    position += offset
                elif offset == 0:
                    raise WireError("a field runs past the end of its line" if window_end == end - position
                                   else "a field longer than the read window")
                else:
                    position += offset
        except WireError as error:
            raise self._error(error) from None


def _field_end(window: bytes, offset: int) -> int:
    """End of a length-delimited field whose length varint starts at `offset` (past the window if cut)."""
    try:
        size, offset = decode_varint(window, offset)
    except WireError:
        return len(window) + 1
    return offset + size


def _skip(window: bytes, offset: int, wire: int) -> int:
    """End of a field's value that starts at `offset` (past the window if it is cut)."""
    try:
        if wire == _WIRE_VARINT:
            return decode_varint(window, offset)[1]
        if wire == _WIRE_LENGTH:
            size, offset = decode_varint(window, offset)
            return offset + size
    except WireError:
        return len(window) + 1
    if wire == _WIRE_FIXED64:
        return offset + 8
    if wire == _WIRE_FIXED32:
        return offset + 4
    raise WireError(f"wire type {wire}")


def _parse_line(line_class: type, data: bytes, path: Path) -> Any:
    line = line_class()
    try:
        line.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError
        raise CaptureError(f"{path} holds a damaged XLine ({error})") from None
    return line


def _key(field: int, wire: int) -> bytes:
    return encode_varint((field << 3) | wire)
