"""Building XPlane protobuf bytes: a plane's interned metadata and stats, and its lines of events.

Lines hold their events as arrays and are written field by field (`xplane_proto`'s encoders), which is
what a million events cost least as; the plane message itself goes through the protobuf classes.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tputrace import xplane_proto

PS_PER_NS = 1000


@dataclass(frozen=True, slots=True)
class Ref:
    """A string stat stored once in the plane's stat metadata and referred to by id (`ref_value`):
    for a long string that many events or metadata repeat."""

    text: str


Stats = Sequence[tuple[str, Any]]


class PlaneBuilder:
    """One XPlane: its name, plane stats and metadata (interned: stats by name, events by key) live in
    a protobuf message; its lines are `Line`s, written after it by `serialize`."""

    def __init__(self, plane: Any, plane_id: int, name: str) -> None:
        self.plane = plane
        plane.id = plane_id
        plane.name = name
        self._stat_ids: dict[str, int] = {}
        self._event_ids: dict[Any, int] = {}
        self._event_metadata: list[bytes] = []  # encoded map entries, written after the plane message
        # Encoded stats of metadata: the `metadata_id` field of each stat name, and whole stats whose
        # value (a string, mostly) many metadata repeat.
        self._stat_heads: dict[str, bytes] = {}
        self._encoded_stats: dict[tuple[str, type, Any], bytes] = {}
        # An op's name and encoded stats besides its costs (see `xplane_device`), by what identifies it.
        self.op_descriptions: dict[tuple[Any, ...], tuple[str, list[bytes]]] = {}
        self.lines: list[Line] = []

    def stat_id(self, name: str) -> int:
        stat_id = self._stat_ids.get(name)
        if stat_id is None:
            stat_id = self._stat_ids[name] = len(self._stat_ids) + 1
            metadata = self.plane.stat_metadata[stat_id]
            metadata.id = stat_id
            metadata.name = name
        return stat_id

    def add_stats(self, container: Any, stats: Stats) -> None:
        for name, value in stats:
            if value is None:
                continue
            stat = container.add(metadata_id=self.stat_id(name))
            kind = type(value)
            if kind is str:
                stat.str_value = value
            elif kind is int:
                if value >= 1 << 63:
                    stat.uint64_value = value
                else:
                    stat.int64_value = value
            elif kind is float:
                stat.double_value = value
            elif kind is bool:
                stat.int64_value = int(value)
            elif kind is bytes:
                stat.bytes_value = value
            elif kind is Ref:
                stat.ref_value = self.stat_id(value.text)
            else:
                stat.str_value = str(value)

    @property
    def event_ids(self) -> dict[Any, int]:
        """Event metadata ids by key (read-only use: add through `add_event_metadata`)."""
        return self._event_ids

    def add_event_metadata(self, key: Any, name: str, stats: Stats = ()) -> int:
        """The id of the event metadata for `key`, created with `name` and `stats` the first time."""
        metadata_id = self._event_ids.get(key)
        if metadata_id is not None:
            return metadata_id
        return self.add_encoded_metadata(key, name, self.encode_stats(stats))

    def add_encoded_metadata(self, key: Any, name: str, encoded_stats: list[bytes]) -> int:
        """The id of new event metadata for `key` (not added before), with stats from `encode_stats`."""
        metadata_id = self._event_ids[key] = len(self._event_ids) + 1
        self._event_metadata.append(xplane_proto.encode_event_metadata_entry(metadata_id, name, encoded_stats))
        return metadata_id

    def encode_stats(self, stats: Stats) -> list[bytes]:
        """`stats` (None values left out) as XStat messages of this plane."""
        encoded = []
        cache, varint = self._encoded_stats, xplane_proto.encode_varint
        for stat, value in stats:
            if value is None:
                continue
            kind = type(value)
            if kind is int and 0 <= value < 1 << 63:
                # int64_value (field 4): most stats are counts, each different.
                encoded.append(self._stat_head(stat) + b"\x20" + varint(value))
                continue
            cache_key = (stat, kind, value)
            stat_bytes = cache.get(cache_key)
            if stat_bytes is None:
                stat_bytes = xplane_proto.encode_stat(self.stat_id(stat), value, self.stat_id(value.text) if kind is Ref else None)
                if kind is str or kind is Ref or kind is bool:
                    cache[cache_key] = stat_bytes
            encoded.append(stat_bytes)
        return encoded

    def _stat_head(self, name: str) -> bytes:
        """An XStat's `metadata_id` field for stat `name`, which every stat of that name starts with."""
        head = self._stat_heads.get(name)
        if head is None:
            head = self._stat_heads[name] = b"\x08" + xplane_proto.encode_varint(self.stat_id(name))
        return head

    def add_line(self, name: str) -> Line:
        line = Line(name)
        self.lines.append(line)
        return line

    def serialize(self, timestamp_ns: int, *, keep_empty_lines: bool) -> list[bytes]:
        """The plane's bytes, in pieces: its message, then each line as a `lines` field."""
        pieces = [self.plane.SerializeToString(), *self._event_metadata]
        line_id = 0
        for line in self.lines:
            if len(line) or keep_empty_lines:
                line_id += 1
                line_pieces = line.serialize(self, line_id, timestamp_ns)
                pieces.append(xplane_proto.length_delimited(xplane_proto.XPLANE_LINES_FIELD, sum(map(len, line_pieces))))
                pieces.extend(line_pieces)
        return pieces


class Line:
    """One XLine's events, gathered in any order and written sorted by start: XProf walks each line in
    time order (to nest ops in programs and programs in steps) and gets them wrong when it is not.
    Times are ps from the line's timestamp; events may carry stats."""

    __slots__ = ("name", "metadata_ids", "offsets_ps", "durations_ps", "stats")

    def __init__(self, name: str) -> None:
        self.name = name
        self.clear()

    def clear(self) -> None:
        self.metadata_ids = array("q")
        self.offsets_ps = array("q")
        self.durations_ps = array("q")
        self.stats: dict[int, Stats] = {}

    def __len__(self) -> int:
        return len(self.offsets_ps)

    def add(self, metadata_id: int, offset_ps: int, duration_ps: int, stats: Stats | None = None) -> None:
        if stats:
            self.stats[len(self.offsets_ps)] = stats
        self.metadata_ids.append(metadata_id)
        self.offsets_ps.append(offset_ps)
        self.durations_ps.append(duration_ps if duration_ps > 0 else 0)

    def _order(self) -> Sequence[int] | None:
        """The event indexes sorted by start (longer first among equal starts, so that an enclosing
        event precedes what it encloses), or None when the events already are in start order."""
        offsets, durations = self.offsets_ps, self.durations_ps
        try:
            import numpy
        except ImportError:
            if all(map(int.__le__, offsets[:-1], offsets[1:])):
                return None
            return sorted(range(len(offsets)), key=lambda index: (offsets[index], -durations[index]))
        starts = numpy.frombuffer(offsets, dtype=numpy.int64)
        if len(starts) < 2 or bool((starts[1:] >= starts[:-1]).all()):
            return None
        return numpy.lexsort((-numpy.frombuffer(durations, dtype=numpy.int64), starts)).tolist()

    def serialize(self, builder: PlaneBuilder, line_id: int, timestamp_ns: int) -> list[bytes]:
        """The line's bytes, in pieces: its header fields, then its events (in start order)."""
        messages = xplane_proto.messages()
        offsets, durations, metadata_ids = self.offsets_ps, self.durations_ps, self.metadata_ids
        header = messages["XLine"](id=line_id, display_id=line_id, name=self.name, timestamp_ns=timestamp_ns,
                                   duration_ps=_line_end_ps(offsets, durations))
        order = self._order()
        if not self.stats:
            if order is not None:
                metadata_ids = array("q", (metadata_ids[index] for index in order))
                offsets = array("q", (offsets[index] for index in order))
                durations = array("q", (durations[index] for index in order))
            encoded = xplane_proto.encode_events(metadata_ids, offsets, durations)
            if encoded is not None:
                return [header.SerializeToString(), encoded]
        # XEvent{metadata_id = 1, offset_ps = 2, duration_ps = 3, stats = 4}, written field by field.
        varint, stats = xplane_proto.encode_varint, self.stats
        pieces = [header.SerializeToString()]
        for index in order if order is not None else range(len(offsets)):
            duration = durations[index]
            event = b"\x08" + varint(metadata_ids[index]) + b"\x10" + varint(offsets[index])
            if duration:
                event += b"\x18" + varint(duration)
            event_stats = stats.get(index)
            if event_stats:
                event += b"".join([b"\x22" + varint(len(stat)) + stat for stat in builder.encode_stats(event_stats)])
            pieces.append(b"\x22" + varint(len(event)) + event)
        return pieces


def _line_end_ps(offsets: array[int], durations: array[int]) -> int:
    """When a line's last event ends (0 for none)."""
    if not offsets:
        return 0
    try:
        import numpy
    except ImportError:
        return max(map(int.__add__, offsets, durations))
    return int((numpy.frombuffer(offsets, dtype=numpy.int64) + numpy.frombuffer(durations, dtype=numpy.int64)).max())

