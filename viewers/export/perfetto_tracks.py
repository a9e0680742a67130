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
CHUNK_EVENTS = 5_000
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
    JSON members (`extras`). Columns of arrays keep a million slices cheap. With `spill_slices`, a
    track whose slices come in start order (enclosing slices first) gives them lanes as they come and
    moves its columns to a temporary file every `spill_slices` slices, which bounds its memory; slices
    out of that order bring the columns back into memory, to be sorted when written.
    """

    __slots__ = ("pid", "tid", "name", "columns", "nested", "spill_slices", "starts", "ends", "fragments", "values",
                 "extras", "lanes", "lane_count", "base", "ordered", "watched", "kept", "_open_ends", "_file",
                 "_chunk_sizes", "_last")

    def __init__(self, pid: int, tid: int, name: str, columns: tuple[str, ...] = (), *, nested: bool = False,
                 spill_slices: int | None = None) -> None:
        self.pid, self.tid, self.name, self.columns = pid, tid, name, columns
        self.nested = nested  # the builder guarantees nesting: skip the lane search
        self.spill_slices = spill_slices
        self._file: IO[bytes] | None = None
        self.clear()

    def clear(self) -> None:
        """Drop every slice (in place: appends bound before stay valid)."""
        if hasattr(self, "starts"):
            for column in (self.starts, self.ends, self.fragments, *self.values):
                del column[:]
        else:
            self.starts, self.ends, self.fragments = array("q"), array("q"), array("q")
            self.values = [array("q") for _ in self.columns]
        if self._file is not None:
            self._file.close()
        self._file, self._chunk_sizes = None, []
        self.extras: dict[int, str] = {}
        self.lanes: array[int] | None = None
        self.lane_count = 1
        self.base = 0  # slices moved to the file: the columns in memory hold the slices from `base` on
        self.ordered = True  # every slice so far in start order, enclosing slices first
        self.watched: set[int] = set()  # slices whose flow point (`flow_point`) outlives their spill
        self.kept: dict[int, tuple[int, int]] = {}
        self._open_ends: list[list[int]] = [[]]
        self._last: tuple[int, int] | None = None  # the last spilled slice's start and end

    def __len__(self) -> int:
        return self.base + len(self.starts)

    def add(self, start_ns: int, end_ns: int, fragment: int, extra: str = "", values: tuple[int | None, ...] = ()) -> int:
        """Add a slice; `extra` is more args as JSON members (`"flush_id":3`), `values` its column
        values. Returns the slice's index."""
        index = len(self)
        self.starts.append(start_ns)
        self.ends.append(end_ns if end_ns > start_ns else start_ns)
        self.fragments.append(fragment)
        for column, value in zip(self.values, values):
            column.append(NULL if value is None else value)
        if extra:
            self.extras[index] = extra
        self.settle()
        return index

    def settle(self) -> None:
        """Move the columns in memory to the file once `spill_slices` are held there (a caller that
        appends to the columns directly calls this after)."""
        if self.spill_slices is None or len(self.starts) < self.spill_slices or not self.ordered:
            return
        if not self._follows_order():
            self._unspill()
            return
        lanes = _stack_lanes(self._open_ends, self.starts, self.ends, None)
        self._keep_watched(lanes)
        if self._file is None:
            self._file = tempfile.TemporaryFile()
        for column in (self.starts, self.ends, self.fragments, lanes, *self.values):
            column.tofile(self._file)
        self._chunk_sizes.append(len(self.starts))
        self.base += len(self.starts)
        for column in (self.starts, self.ends, self.fragments, *self.values):
            del column[:]

    def _follows_order(self) -> bool:
        """Whether the slices in memory are in start order, enclosing slices first, after the last one spilled."""
        starts, ends = self.starts, self.ends
        if self._last is not None and starts and (starts[0], -ends[0]) < (self._last[0], -self._last[1]):
            return False
        if not _sorted(starts, ends):
            return False
        if starts:
            self._last = (starts[-1], ends[-1])
        return True

    def _keep_watched(self, lanes: array[int]) -> None:
        base, starts, ends = self.base, self.starts, self.ends
        for index in [index for index in self.watched if base <= index < base + len(starts)]:
            local = index - base
            self.kept[index] = (self.tid + lanes[local] * LANE_STRIDE, (starts[local] + ends[local]) // 2)
            self.watched.discard(index)

    def _unspill(self) -> None:
        """Bring the spilled columns back in front of those in memory, and spill no more."""
        self.ordered = False
        columns = [array("q") for _ in range(4 + len(self.columns))]
        if self._file is not None:
            self._file.seek(0)
            for size in self._chunk_sizes:
                for column in columns:
                    column.fromfile(self._file, size)
            self._file.close()
        self._file, self._chunk_sizes = None, []
        for spilled, current in zip(columns[:3] + columns[4:], (self.starts, self.ends, self.fragments, *self.values)):
            spilled.extend(current)
            current[:] = spilled
        self.base = 0
        self.kept.clear()

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
        if self._file is not None and self.ordered and self._follows_order():
            self.lanes = _stack_lanes(self._open_ends, self.starts, self.ends, None)
            self.lane_count = len(self._open_ends)
            return self.lane_count
        if self._file is not None:
            self._unspill()
        starts, ends = self.starts, self.ends
        order = self.order()
        if order is None and _disjoint(starts, ends):
            return 1
        open_ends: list[list[int]] = [[]]
        lanes = _stack_lanes(open_ends, starts, ends, order)
        self.lane_count = len(open_ends)
        self.lanes = lanes if self.lane_count > 1 else None
        return self.lane_count

    def tid_of(self, index: int) -> int:
        local = index - self.base
        return self.tid + (self.lanes[local] * LANE_STRIDE if self.lanes is not None else 0)

    def flow_point(self, index: int) -> tuple[int, int]:
        """Slice `index`'s thread id and middle time (`assign_lanes` first; a spilled slice must have
        been `watched` before it spilled)."""
        if index < self.base:
            return self.kept[index]
        local = index - self.base
        return self.tid_of(index), (self.starts[local] + self.ends[local]) // 2

    def _column_chunks(self) -> Iterator[tuple[int, array[int], array[int], array[int], array[int] | None, list[array[int]]]]:
        """(first index, starts, ends, fragments, lanes, values) of the spilled chunks, then of the columns in memory."""
        first = 0
        if self._file is not None:
            self._file.seek(0)
            for size in self._chunk_sizes:
                columns = [array("q") for _ in range(4 + len(self.columns))]
                for column in columns:
                    column.fromfile(self._file, size)
                yield first, columns[0], columns[1], columns[2], columns[3], columns[4:]
                first += size
        yield first, self.starts, self.ends, self.fragments, self.lanes, self.values

    def lines(self, heads: list[str], fragment_args: list[str], fragment_tails: list[str]) -> Iterator[list[str]]:
        """The slices as JSON objects, in lists of `CHUNK_EVENTS` (`assign_lanes` first), given each
        fragment's head, args, and both as the end of a slice without per-slice args (`tails`).
        Formatted by one template per track over columns, which keeps a million slices fast; the
        per-slice text is made one list at a time, so memory stays bounded by a list, not a track."""
        laned = self.lane_count > 1
        tid = "%d" if laned else str(self.tid)  # one thread: its tid is part of the template
        if self.columns:
            members = ",".join(f'"{name}":%s' for name in self.columns)
            leading = [("," + args) if args else "" for args in fragment_args]
            template = '{"ph":"X","pid":%d,"tid":%s,"ts":%%.3f,"dur":%%.3f,%%s,"args":{%s%%s}}' % (self.pid, tid, members)
        else:
            template = '{"ph":"X","pid":%d,"tid":%s,"ts":%%.3f,"dur":%%.3f,%%s' % (self.pid, tid)
        extra_indexes = sorted(self.extras)
        for offset, starts, ends, fragment_ids, lanes, values in self._column_chunks():
            for first in range(0, len(starts), CHUNK_EVENTS):
                last = min(first + CHUNK_EVENTS, len(starts))
                timestamps, durations = _microseconds(starts[first:last], ends[first:last])
                fragments = fragment_ids[first:last]
                extras = [(index - offset - first, self.extras[index]) for index in
                          extra_indexes[bisect_left(extra_indexes, offset + first):bisect_left(extra_indexes, offset + last)]]
                fields: tuple[list[Any], ...]
                if self.columns:
                    slice_heads = list(map(heads.__getitem__, fragments))
                    columns = [list(map(str, column)) if min(column, default=0) != NULL
                               else [("null" if value == NULL else str(value)) for value in column]
                               for column in (column_values[first:last] for column_values in values)]
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
                if laned and lanes is not None:
                    fields = ([self.tid + lane * LANE_STRIDE for lane in lanes[first:last]], *fields)
                yield list(map(template.__mod__, zip(*fields)))
        if self._file is not None:
            self._file.close()
            self._file = None


def _stack_lanes(open_ends: list[list[int]], starts: array[int], ends: array[int], order: list[int] | None) -> array[int]:
    """Lanes for slices taken in `order` (None: as they are, already in start order, enclosing slices
    first), each on the first lane where it nests in or follows the slices open there; `open_ends`
    (each lane's stack of open slices' ends) carries on from the slices before, and gains lanes."""
    lanes = array("q", bytes(8 * len(starts)))
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
    return lanes


def _sorted(starts: array[int], ends: array[int]) -> bool:
    """Whether slices are in start order, enclosing slices (later ends) first among equal starts."""
    try:
        import numpy
    except ImportError:
        pairs = [(start, -end) for start, end in zip(starts, ends)]
        return all(map(tuple.__le__, pairs[:-1], pairs[1:]))
    begin, end = numpy.frombuffer(starts, dtype=numpy.int64), numpy.frombuffer(ends, dtype=numpy.int64)
    rising = begin[1:] > begin[:-1]
    return bool((rising | ((begin[1:] == begin[:-1]) & (end[1:] <= end[:-1]))).all())


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
