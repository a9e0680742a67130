"""The pieces of a Chrome trace-event JSON file: tracks of slices kept as columns of arrays and written
by one template per track (which keeps a million slices fast), JSON fragments, and a background
compressing writer."""

from __future__ import annotations

import gzip
import json
import queue
import tempfile
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

LANE_STRIDE = 100  # tid of lane k of a thread: base tid + k * LANE_STRIDE
CHUNK_EVENTS = 20_000
NULL = -(1 << 63)  # a missing value in an int column


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def int_json(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def microseconds_text(ns: int) -> str:
    """Whole nanoseconds as microseconds with three decimals (exact: no float rounding)."""
    if ns < 0:
        return "-" + microseconds_text(-ns)
    return f"{ns // 1000}.{ns % 1000:03d}"



class Track:
    """The slices of one thread kind of one process, gathered in any order and written on as few
    threads as keep them nested or disjoint.

    A slice refers to a shared fragment (name, category and args as JSON text), may have values in
    the track's int `columns` (per-slice args such as `seq`), and a few slices carry more args as
    JSON members (`extras`). Columns of arrays keep a million slices cheap.
    """

    __slots__ = ("pid", "tid", "name", "columns", "nested", "starts", "ends", "fragments", "values", "extras", "lanes")

    def __init__(self, pid: int, tid: int, name: str, columns: tuple[str, ...] = (), *, nested: bool = False) -> None:
        self.pid, self.tid, self.name, self.columns = pid, tid, name, columns
        self.nested = nested  # the builder guarantees nesting: skip the lane search
        self.clear()

    def clear(self) -> None:
        """Drop every slice (in place: appends bound before stay valid)."""
        if hasattr(self, "starts"):
            for column in (self.starts, self.ends, self.fragments, *self.values):
                del column[:]
        else:
            self.starts, self.ends, self.fragments = array("q"), array("q"), array("q")
            self.values = [array("q") for _ in self.columns]
        self.extras: dict[int, str] = {}
        self.lanes: array[int] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, start_ns: int, end_ns: int, fragment: int, extra: str = "", values: tuple[int | None, ...] = ()) -> int:
        """Add a slice; `extra` is more args as JSON members (`"flush_id":3`), `values` its column
        values. Returns the slice's index."""
        index = len(self.starts)
        self.starts.append(start_ns)
        self.ends.append(end_ns if end_ns > start_ns else start_ns)
        self.fragments.append(fragment)
        for column, value in zip(self.values, values):
            column.append(NULL if value is None else value)
        if extra:
            self.extras[index] = extra
        return index

    def order(self) -> list[int] | None:
        """Slice indexes by start, enclosing slices first; None when they already are in that order."""
        starts, ends = self.starts, self.ends
        try:
            import numpy
        except ImportError:
            if all(map(int.__lt__, starts[:-1], starts[1:])):
                return None
            return sorted(range(len(starts)), key=lambda index: (starts[index], -ends[index]))
        begin = numpy.frombuffer(starts, dtype=numpy.int64)
        if len(begin) < 2 or bool((begin[1:] > begin[:-1]).all()):
            return None
        return numpy.lexsort((-numpy.frombuffer(ends, dtype=numpy.int64), begin)).tolist()

    def assign_lanes(self) -> int:
        """Give each slice a lane (0 for most) so that slices on one lane nest or are disjoint;
        returns the number of lanes."""
        if self.nested:
            return 1
        starts, ends = self.starts, self.ends
        order = self.order()
        if order is None and _disjoint(starts, ends):
            return 1
        lanes = array("q", bytes(8 * len(starts)))
        open_ends: list[list[int]] = [[]]
        for index in order if order is not None else range(len(starts)):
            start, end = starts[index], ends[index]
            for lane, stack in enumerate(open_ends):
                while stack and stack[-1] <= start:
                    stack.pop()
                if not stack or end <= stack[-1]:
                    stack.append(end)
                    lanes[index] = lane
                    break
            else:
                open_ends.append([end])
                lanes[index] = len(open_ends) - 1
        self.lanes = lanes if len(open_ends) > 1 else None
        return len(open_ends)

    def tid_of(self, index: int) -> int:
        return self.tid + (self.lanes[index] * LANE_STRIDE if self.lanes is not None else 0)

    def lines(self, heads: list[str], fragment_args: list[str], fragment_tails: list[str]) -> Iterator[list[str]]:
        """The slices as JSON objects, in lists of `CHUNK_EVENTS` (`assign_lanes` first), given each
        fragment's head, args, and both as the end of a slice without per-slice args (`tails`).
        Formatted by one template per track over columns, which keeps a million slices fast; the
        per-slice text is made one list at a time, so memory stays bounded by a list, not a track."""
        tid = "%d" if self.lanes is not None else str(self.tid)  # one thread: its tid is part of the template
        if self.columns:
            members = ",".join(f'"{name}":%s' for name in self.columns)
            leading = [("," + args) if args else "" for args in fragment_args]
            template = '{"ph":"X","pid":%d,"tid":%s,"ts":%%.3f,"dur":%%.3f,%%s,"args":{%s%%s}}' % (self.pid, tid, members)
        else:
            template = '{"ph":"X","pid":%d,"tid":%s,"ts":%%.3f,"dur":%%.3f,%%s' % (self.pid, tid)
        extra_indexes = sorted(self.extras)
        for first in range(0, len(self.starts), CHUNK_EVENTS):
            last = min(first + CHUNK_EVENTS, len(self.starts))
            timestamps, durations = _microseconds(self.starts[first:last], self.ends[first:last])
            fragments = self.fragments[first:last]
            extras = [(index - first, self.extras[index])
                      for index in extra_indexes[bisect_left(extra_indexes, first):bisect_left(extra_indexes, last)]]
            fields: tuple[list[Any], ...]
            if self.columns:
                slice_heads = list(map(heads.__getitem__, fragments))
                columns = [list(map(str, column)) if min(column, default=0) != NULL
                           else [("null" if value == NULL else str(value)) for value in column]
                           for column in (values[first:last] for values in self.values)]
                args = list(map(leading.__getitem__, fragments))
                for index, extra in extras:
                    args[index] = "," + extra + args[index]
                fields = (timestamps, durations, slice_heads, *columns, args)
            else:
                tails = list(map(fragment_tails.__getitem__, fragments))
                for index, extra in extras:
                    fragment = fragments[index]
                    shared = fragment_args[fragment]
                    tails[index] = f'{heads[fragment]},"args":{{{extra}{"," + shared if shared else ""}}}}}'
                fields = (timestamps, durations, tails)
            if self.lanes is not None:
                fields = ([self.tid + lane * LANE_STRIDE for lane in self.lanes[first:last]], *fields)
            yield list(map(template.__mod__, zip(*fields)))


def _disjoint(starts: array[int], ends: array[int]) -> bool:
    """Whether slices in start order each end before the next starts."""
    try:
        import numpy
    except ImportError:
        return all(map(int.__le__, ends[:-1], starts[1:]))
    begin, end = numpy.frombuffer(starts, dtype=numpy.int64), numpy.frombuffer(ends, dtype=numpy.int64)
    return bool((end[:-1] <= begin[1:]).all())


def _microseconds(starts: array[int], ends: array[int]) -> tuple[list[float], list[float]]:
    """Starts and durations in microseconds (three decimals of them are whole nanoseconds)."""
    try:
        import numpy
    except ImportError:
        return [start / 1000 for start in starts], [(end - start) / 1000 for start, end in zip(starts, ends)]
    begin, end = numpy.frombuffer(starts, dtype=numpy.int64), numpy.frombuffer(ends, dtype=numpy.int64)
    return (begin / 1000).tolist(), ((end - begin) / 1000).tolist()


class BackgroundWriter:
    """A text stream whose bytes are compressed (gzip, when `compresslevel` is given) and written by
    a thread, so that compressing one chunk overlaps formatting the next (zlib runs without the GIL)."""

    def __init__(self, path: Path, compresslevel: int | None) -> None:
        self._file = path.open("wb")
        self._sink: IO[bytes] = (gzip.GzipFile(fileobj=self._file, mode="wb", compresslevel=compresslevel, mtime=0)
                                 if compresslevel is not None else self._file)
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="perfetto-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            if self._error is None:
                try:
                    self._sink.write(chunk)
                except BaseException as error:  # raised again in the caller's thread, on close
                    self._error = error

    def write(self, text: str) -> None:
        if self._error is not None:
            raise self._error
        self._chunks.put(text.encode("utf-8"))

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._chunks.put(None)
        self._thread.join()
        try:
            if self._sink is not self._file:
                self._sink.close()
        finally:
            self._file.close()
        if self._error is not None and exc_info[0] is None:
            raise self._error



SPILL_LINES = 20_000  # a `TextTrack` keeps this many slices as text in memory before moving them to a file


def slice_json(pid: int, tid: int, start_ns: int, end_ns: int, tail: str) -> str:
    """One slice as `Track.lines` writes it: `tail` is its name, category and args, as JSON members and the
    closing brace."""
    end_ns = end_ns if end_ns > start_ns else start_ns
    return '{"ph":"X","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f,%s' % (pid, tid, start_ns / 1000, (end_ns - start_ns) / 1000, tail)


class TextTrack:
    """The slices of one thread whose slices nest as they come (a chip's programs with their ops): they
    need no lanes, so each is formatted as it is added, and past `spill_lines` the text moves to a
    temporary file, which bounds the memory a track takes whatever the trace's size."""

    def __init__(self, pid: int, tid: int, name: str, spill_lines: int = SPILL_LINES) -> None:
        self.pid, self.tid, self.name = pid, tid, name
        self.spill_lines = spill_lines
        self._buffer: list[str] = []
        self._file: IO[str] | None = None
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add_lines(self, lines: list[str]) -> None:
        self._buffer.extend(lines)
        self._count += len(lines)
        if len(self._buffer) >= self.spill_lines:
            if self._file is None:
                self._file = tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n")
            self._file.write("".join(line + "\n" for line in self._buffer))
            self._buffer.clear()

    def clear(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._buffer.clear()
        self._count = 0

    def assign_lanes(self) -> int:
        return 1

    def tid_of(self, index: int) -> int:
        return self.tid

    def lines(self, *_: object) -> Iterator[list[str]]:
        """The slices' JSON objects in order, in lists of at most `CHUNK_EVENTS`; the file goes after."""
        if self._file is not None:
            self._file.seek(0)
            chunk: list[str] = []
            for line in self._file:
                chunk.append(line[:-1])
                if len(chunk) >= CHUNK_EVENTS:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk
            self._file.close()
            self._file = None
        for first in range(0, len(self._buffer), CHUNK_EVENTS):
            yield self._buffer[first:first + CHUNK_EVENTS]
