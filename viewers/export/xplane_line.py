"""One XLine of an XProf export, kept in files while the trace is read and written in start order.

A line of a big trace holds millions of events: more than an export may keep in memory. So a `Line`
buffers at most `CHUNK_EVENTS` events and then appends them to a file in the export's spill folder
as four columns (metadata id, offset, duration, where the event's stats are); stats, which only some
lines' events carry, go to a second file in a small format of their own (`_pack_stats`).

When its plane is written, a line is encoded into a third file in start order, since its length
prefix comes before its bytes: chunk by chunk when the events came in order, else through a merge of
the chunks each sorted by start (longer first among equal starts; ties keep their arrival order, as
a stable sort would). Event stats are given stat ids as they are encoded, in the order written, so
the plane's stat metadata numbers them as a whole-line encoding would.
"""

from __future__ import annotations

import heapq
import itertools
import operator
import os
import struct
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from tputrace import xplane_proto

# Events a line holds in memory before it appends them to its file (32 bytes each), and events read
# back at a time when it is encoded (a merge shares them among the sorted chunks).
CHUNK_EVENTS = 1 << 17
MERGE_EVENTS = 1 << 17

_COLUMNS = 4  # metadata id, offset (ps), duration (ps), position of the stats in the stats file (-1: none)
_RUN_COLUMNS = 6  # a sorted chunk's rows: offset, -duration, arrival index, metadata id, duration, stats position
_ITEM = 8
_NO_STATS = -1

# Kinds of a packed stat value.
_STR, _INT, _FLOAT, _BOOL, _BYTES, _REF = range(6)
_DOUBLE = struct.Struct("<d")


@dataclass(frozen=True, slots=True)
class Ref:
    """A string stat stored once in the plane's stat metadata and referred to by id (`ref_value`):
    for a long string that many events or metadata repeat."""

    text: str


Stats = Sequence[tuple[str, Any]]


class StatEncoder(Protocol):
    """What a line needs of its plane (`xplane_builder.PlaneBuilder`): its stats encoded as XStat messages."""

    def encode_stats(self, stats: Stats) -> list[bytes]: ...


class Line:
    """One XLine's events, added in any order and written sorted by start: XProf walks each line in
    time order (to nest ops in programs and programs in steps) and gets them wrong when it is not.
    Times are ps from the line's timestamp; events may carry stats."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self._path = path  # the prefix of the line's files
        self._stat_names: dict[str, int] = {}
        self.clear()

    def clear(self) -> None:
        """Drop every event added so far."""
        self._metadata_ids = array("q")
        self._offsets_ps = array("q")
        self._durations_ps = array("q")
        self._stats_positions = array("q")
        self._stats_buffer = bytearray()
        self._stats_size = 0
        self._chunks: list[int] = []  # events per chunk in the events file
        self._count = 0
        self._end_ps = 0
        self._in_order = True
        self._last_offset: int | None = None
        self.has_stats = False
        for suffix in (".events", ".stats"):
            self._file(suffix).unlink(missing_ok=True)

    def __len__(self) -> int:
        return self._count + len(self._offsets_ps)

    def add(self, metadata_id: int, offset_ps: int, duration_ps: int, stats: Stats | None = None) -> None:
        """One event (a negative duration counts as 0), with its stats."""
        if stats:
            self.has_stats = True
            packed = _pack_stats(self._stat_names, stats)
            self._stats_positions.append(self._stats_size + len(self._stats_buffer))
            self._stats_buffer += packed
        else:
            self._stats_positions.append(_NO_STATS)
        self._metadata_ids.append(metadata_id)
        self._offsets_ps.append(offset_ps)
        self._durations_ps.append(duration_ps if duration_ps > 0 else 0)
        if len(self._offsets_ps) >= CHUNK_EVENTS:
            self._spill()

    def extend(self, metadata_ids: Sequence[int], offsets_ps: Sequence[int], durations_ps: Sequence[int]) -> None:
        """Events without stats, as columns of equal length (durations taken as they are)."""
        self._metadata_ids.extend(metadata_ids)
        self._offsets_ps.extend(offsets_ps)
        self._durations_ps.extend(durations_ps)
        self._stats_positions.extend(itertools.repeat(_NO_STATS, len(offsets_ps)))
        if len(self._offsets_ps) >= CHUNK_EVENTS:
            self._spill()

    def _file(self, suffix: str) -> Path:
        return self._path.with_name(self._path.name + suffix)

    def _spill(self) -> None:
        """Append the buffered events to the line's file, noting their end and whether they keep start order."""
        count = len(self._offsets_ps)
        if not count:
            return
        offsets, durations = self._offsets_ps, self._durations_ps
        end_ps, in_order = _end_and_order(offsets, durations)
        self._end_ps = max(self._end_ps, end_ps)
        if self._last_offset is not None and offsets[0] < self._last_offset:
            in_order = False
        self._in_order = self._in_order and in_order
        self._last_offset = offsets[-1]
        with self._file(".events").open("ab") as file:
            for column in (self._metadata_ids, offsets, durations, self._stats_positions):
                column.tofile(file)
        if self._stats_buffer:
            with self._file(".stats").open("ab") as file:
                file.write(self._stats_buffer)
        self._stats_size += len(self._stats_buffer)
        self._chunks.append(count)
        self._count += count
        self._metadata_ids, self._offsets_ps, self._durations_ps = array("q"), array("q"), array("q")
        self._stats_positions, self._stats_buffer = array("q"), bytearray()

    # -- writing ----------------------------------------------------------------------------------

    def write(self, builder: StatEncoder, line_id: int, timestamp_ns: int) -> tuple[bytes, Path]:
        """The line's header (an `XLine` message without events) and a file with its events encoded
        in start order; the line is left empty.

        A line without stats is encoded in bulk (`xplane_proto.encode_events`, which needs numpy);
        otherwise event by event, `XEvent{metadata_id = 1, offset_ps = 2, duration_ps = 3 (left out
        when 0), stats = 4}`, with the stats encoded for `builder`'s plane as they are written.
        """
        self._spill()
        header = xplane_proto.messages()["XLine"](id=line_id, display_id=line_id, name=self.name,
                                                  timestamp_ns=timestamp_ns, duration_ps=self._end_ps)
        encoded_path = self._file(".encoded")
        stats_fd = os.open(self._file(".stats"), os.O_RDONLY) if self._stats_size else None
        try:
            with encoded_path.open("wb") as out, self._columns_file() as columns:
                blocks = self._chunk_blocks(columns) if self._in_order else self._merged_blocks(columns)
                bulk = not self.has_stats and _numpy() is not None
                for metadata_ids, offsets, durations, stats_positions in blocks:
                    if bulk:
                        out.write(xplane_proto.encode_events(metadata_ids, offsets, durations) or b"")
                    else:
                        out.write(self._encode_each(builder, stats_fd, metadata_ids, offsets, durations, stats_positions))
        finally:
            if stats_fd is not None:
                os.close(stats_fd)
        self.clear()
        return header.SerializeToString(), encoded_path

    def _columns_file(self) -> BinaryIO:
        path = self._file(".events")
        if not path.exists():
            path.touch()
        return path.open("rb")

    def _chunk_blocks(self, columns: BinaryIO) -> Iterator[tuple[array[int], ...]]:
        """The events in the order they came, a chunk at a time."""
        for count in self._chunks:
            yield tuple(_read_column(columns, count) for _ in range(_COLUMNS))

    def _merged_blocks(self, columns: BinaryIO) -> Iterator[tuple[array[int], ...]]:
        """The events sorted by start, longer first among equal starts, else in arrival order: each
        chunk sorted into a runs file, then the runs merged, `MERGE_EVENTS` at a time."""
        runs_path = self._file(".runs")
        runs: list[tuple[int, int]] = []  # (first row, rows) in the runs file
        with runs_path.open("wb") as runs_file:
            first_arrival = 0
            for count in self._chunks:
                metadata_ids, offsets, durations, stats_positions = (_read_column(columns, count) for _ in range(_COLUMNS))
                rows = _sorted_rows(first_arrival, metadata_ids, offsets, durations, stats_positions)
                runs_file.write(rows)
                runs.append((first_arrival, count))
                first_arrival += count
        fd = os.open(runs_path, os.O_RDONLY)
        try:
            per_run = max(MERGE_EVENTS // max(len(runs), 1), 16)
            numpy = _numpy()
            if numpy is not None:
                for rows in _merge_runs(numpy, fd, runs, per_run):
                    yield tuple(array("q", numpy.ascontiguousarray(rows[:, column]).tobytes()) for column in (3, 0, 4, 5))
                return
            merged = heapq.merge(*(_run_rows(fd, first, count, per_run) for first, count in runs))
            while True:
                block = list(itertools.islice(merged, MERGE_EVENTS))
                if not block:
                    break
                yield tuple(array("q", map(operator.itemgetter(column), block)) for column in (3, 0, 4, 5))
        finally:
            os.close(fd)
            runs_path.unlink(missing_ok=True)

    def _encode_each(self, builder: StatEncoder, stats_fd: int | None, metadata_ids: array[int], offsets: array[int],
                     durations: array[int], stats_positions: array[int]) -> bytes:
        varint, names = xplane_proto.encode_varint, list(self._stat_names)
        pieces = []
        for metadata_id, offset, duration, stats_position in zip(metadata_ids, offsets, durations, stats_positions):
            event = b"\x08" + varint(metadata_id) + b"\x10" + varint(offset)
            if duration:
                event += b"\x18" + varint(duration)
            if stats_position != _NO_STATS and stats_fd is not None:
                event_stats = _unpack_stats(names, _read_packed(stats_fd, stats_position))
                event += b"".join([b"\x22" + varint(len(stat)) + stat for stat in builder.encode_stats(event_stats)])
            pieces.append(b"\x22" + varint(len(event)) + event)
        return b"".join(pieces)


# -- columns and their order ----------------------------------------------------------------------


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _read_column(file: BinaryIO, count: int) -> array[int]:
    column = array("q")
    column.frombytes(file.read(count * _ITEM))
    return column


def _end_and_order(offsets: array[int], durations: array[int]) -> tuple[int, bool]:
    """The latest end among events, and whether their starts never decrease."""
    numpy = _numpy()
    if numpy is None:
        return max(map(int.__add__, offsets, durations)), all(map(int.__le__, offsets[:-1], offsets[1:]))
    starts = numpy.frombuffer(offsets, dtype=numpy.int64)
    end = int((starts + numpy.frombuffer(durations, dtype=numpy.int64)).max())
    return end, len(starts) < 2 or bool((starts[1:] >= starts[:-1]).all())


def _sorted_rows(first_arrival: int, metadata_ids: array[int], offsets: array[int], durations: array[int],
                 stats_positions: array[int]) -> bytes:
    """A chunk's events as rows of the runs file (see `_RUN_COLUMNS`), sorted by start, longer first
    among equal starts, else in arrival order (`first_arrival` is the arrival index of the first)."""
    numpy = _numpy()
    if numpy is None:
        order = sorted(range(len(offsets)), key=lambda index: (offsets[index], -durations[index]))
        rows = array("q", bytes(len(order) * _RUN_COLUMNS * _ITEM))
        columns = (offsets, [-duration for duration in durations], range(first_arrival, first_arrival + len(order)),
                   metadata_ids, durations, stats_positions)
        for column, values in enumerate(columns):
            rows[column::_RUN_COLUMNS] = array("q", [values[index] for index in order])
        return rows.tobytes()
    starts, lengths = numpy.frombuffer(offsets, dtype=numpy.int64), numpy.frombuffer(durations, dtype=numpy.int64)
    order = numpy.lexsort((-lengths, starts))
    rows = numpy.empty((len(order), _RUN_COLUMNS), dtype=numpy.int64)
    rows[:, 0], rows[:, 1], rows[:, 2] = starts[order], -lengths[order], order + first_arrival
    rows[:, 3] = numpy.frombuffer(metadata_ids, dtype=numpy.int64)[order]
    rows[:, 4] = lengths[order]
    rows[:, 5] = numpy.frombuffer(stats_positions, dtype=numpy.int64)[order]
    encoded: bytes = rows.tobytes()
    return encoded


def _run_rows(fd: int, first: int, count: int, per_read: int) -> Iterator[tuple[int, ...]]:
    """The rows of one sorted run of the runs file, as tuples, read `per_read` at a time."""
    row_bytes = _RUN_COLUMNS * _ITEM
    for start in range(first, first + count, per_read):
        rows = array("q")
        rows.frombytes(os.pread(fd, min(per_read, first + count - start) * row_bytes, start * row_bytes))
        yield from zip(*(rows[column::_RUN_COLUMNS] for column in range(_RUN_COLUMNS)))


def _merge_runs(numpy: Any, fd: int, runs: list[tuple[int, int]], per_read: int) -> Iterator[Any]:
    """The rows of the sorted runs of the runs file merged, in blocks: each round reads `per_read` more
    rows of every run whose read rows are used up, and hands on every read row up to the smallest
    last read key of the runs that have more to read (keys are (offset, -duration, arrival index),
    all different), sorted."""
    row_bytes = _RUN_COLUMNS * _ITEM
    empty = numpy.empty((0, _RUN_COLUMNS), dtype=numpy.int64)
    next_rows = [first for first, _ in runs]
    ends = [first + count for first, count in runs]
    buffers = [empty] * len(runs)
    while True:
        for index, buffer in enumerate(buffers):
            if not len(buffer) and next_rows[index] < ends[index]:
                count = min(per_read, ends[index] - next_rows[index])
                data = os.pread(fd, count * row_bytes, next_rows[index] * row_bytes)
                buffers[index] = numpy.frombuffer(data, dtype=numpy.int64).reshape(count, _RUN_COLUMNS)
                next_rows[index] += count
        limits = [tuple(buffer[-1, :3]) for index, buffer in enumerate(buffers) if next_rows[index] < ends[index]]
        start, negative_duration, arrival = min(limits) if limits else (0, 0, 0)
        taken = []
        for index, buffer in enumerate(buffers):
            if not len(buffer):
                continue
            if limits:
                offsets, negative_durations, arrivals = buffer[:, 0], buffer[:, 1], buffer[:, 2]
                before = (offsets < start) | ((offsets == start) & ((negative_durations < negative_duration) | (
                    (negative_durations == negative_duration) & (arrivals <= arrival))))
                count = int(before.sum())  # a prefix: the buffer is sorted
            else:
                count = len(buffer)
            taken.append(buffer[:count])
            buffers[index] = buffer[count:]
        if not taken:
            return
        rows = numpy.concatenate(taken)
        yield rows[numpy.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))]


# -- event stats on file --------------------------------------------------------------------------


def _pack_stats(names: dict[str, int], stats: Stats) -> bytes:
    """`stats` (None values left out) as bytes: a count, then per stat its name's index in `names`
    (added as needed), its kind and its value. Values of other types are kept as their text, which
    is what encoding would make of them."""
    varint = xplane_proto.encode_varint
    parts = []
    count = 0
    for name, value in stats:
        if value is None:
            continue
        count += 1
        index = names.get(name)
        if index is None:
            index = names[name] = len(names)
        kind = type(value)
        if kind is int:
            text = str(value).encode()
            parts.append(varint(index) + bytes((_INT,)) + varint(len(text)) + text)
        elif kind is bool:
            parts.append(varint(index) + bytes((_BOOL, int(value))))
        elif kind is float:
            parts.append(varint(index) + bytes((_FLOAT,)) + _DOUBLE.pack(value))
        elif kind is bytes:
            parts.append(varint(index) + bytes((_BYTES,)) + varint(len(value)) + value)
        else:
            text = (value.text if kind is Ref else str(value)).encode("utf-8", "surrogatepass")
            parts.append(varint(index) + bytes((_REF if kind is Ref else _STR,)) + varint(len(text)) + text)
    body = varint(count) + b"".join(parts)
    return varint(len(body)) + body


def _read_packed(fd: int, position: int) -> memoryview:
    """The packed stats at `position` of a stats file (without their length)."""
    data = os.pread(fd, 4096, position)
    size, start = xplane_proto.decode_varint(data, 0)
    if start + size > len(data):
        data = os.pread(fd, start + size, position)
    return memoryview(data)[start:start + size]


def _unpack_stats(names: list[str], packed: memoryview) -> list[tuple[str, Any]]:
    count, position = xplane_proto.decode_varint(packed, 0)
    stats: list[tuple[str, Any]] = []
    for _ in range(count):
        index, position = xplane_proto.decode_varint(packed, position)
        kind = packed[position]
        position += 1
        value: Any
        if kind == _BOOL:
            value = bool(packed[position])
            position += 1
        elif kind == _FLOAT:
            value = _DOUBLE.unpack_from(packed, position)[0]
            position += _DOUBLE.size
        else:
            size, position = xplane_proto.decode_varint(packed, position)
            data = bytes(packed[position:position + size])
            position += size
            if kind == _INT:
                value = int(data)
            elif kind == _BYTES:
                value = data
            else:
                text = data.decode("utf-8", "surrogatepass")
                value = Ref(text) if kind == _REF else text
        stats.append((names[index], value))
    return stats
