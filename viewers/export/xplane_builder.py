"""Building XPlane protobuf bytes: a plane's interned metadata and stats, and its lines of events.

A plane's name, stats and stat metadata are a protobuf message (small); its event metadata are encoded
as they are made (`xplane_proto`'s encoders). Its lines keep their events in files (`xplane_line`),
and `write` copies them into the output after the plane's other fields, field by field, so that a
plane of millions of events takes bounded memory.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, BinaryIO

from tputrace import xplane_proto
from tputrace.viewers.export.xplane_line import Line, Ref, Stats

__all__ = ["PS_PER_NS", "Line", "PlaneBuilder", "Ref", "Stats"]

PS_PER_NS = 1000
METADATA_BUFFER_BYTES = 1 << 20
MAX_CACHED_STATS = 1 << 14


class PlaneBuilder:
    """One XPlane: its name, plane stats and stat metadata (interned by name) live in a protobuf
    message, its event metadata (interned by key) are encoded, and its lines are `Line`s with files
    in `spill_folder`, written after the rest by `write`."""

    def __init__(self, plane_id: int, name: str, spill_folder: Path) -> None:
        self.plane = plane = xplane_proto.messages()["XPlane"]()
        self._spill_folder = spill_folder
        plane.id = plane_id
        plane.name = name
        self._stat_ids: dict[str, int] = {}
        self._event_ids: dict[Any, int] = {}
        # Encoded event metadata (map entries), written after the plane message: they wait in a file,
        # `METADATA_BUFFER_BYTES` at a time, since a trace whose ops seldom repeat has nearly one per op.
        self._event_metadata = bytearray()
        self._event_metadata_path = spill_folder / f"plane{plane_id}.metadata"
        self._event_metadata_size = 0
        # Encoded stats of metadata: the `metadata_id` field of each stat name, and whole stats whose
        # value (a string, mostly) many metadata repeat, up to `MAX_CACHED_STATS` of them (then the
        # cache starts again: a trace whose ops seldom repeat would otherwise hold a few per op).
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
        self._event_metadata += xplane_proto.encode_event_metadata_entry(metadata_id, name, encoded_stats)
        if len(self._event_metadata) >= METADATA_BUFFER_BYTES:
            self._spill_event_metadata()
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
                    if len(cache) >= MAX_CACHED_STATS:
                        cache.clear()
                    cache[cache_key] = stat_bytes
            encoded.append(stat_bytes)
        return encoded

    def _stat_head(self, name: str) -> bytes:
        """An XStat's `metadata_id` field for stat `name`, which every stat of that name starts with."""
        head = self._stat_heads.get(name)
        if head is None:
            head = self._stat_heads[name] = b"\x08" + xplane_proto.encode_varint(self.stat_id(name))
        return head

    def _spill_event_metadata(self) -> None:
        with self._event_metadata_path.open("ab") as file:
            file.write(self._event_metadata)
        self._event_metadata_size += len(self._event_metadata)
        self._event_metadata = bytearray()

    def add_line(self, name: str) -> Line:
        line = Line(name, self._spill_folder / f"plane{self.plane.id}-line{len(self.lines)}")
        self.lines.append(line)
        return line

    def write(self, file: BinaryIO, timestamp_ns: int, *, keep_empty_lines: bool) -> None:
        """Write the plane as an `XSpace.planes` field: its message, its event metadata, then each line
        as a `lines` field. The lines are encoded first: stats that only events carry get their ids
        then, and the message's stat metadata must name them."""
        self._spill_event_metadata()
        lines: list[tuple[bytes, Path]] = []
        try:
            lines_size = 0
            line_id = 0
            for line in self.lines:
                if len(line) or keep_empty_lines:
                    line_id += 1
                    header, events_path = line.write(self, line_id, timestamp_ns)
                    lines.append((header, events_path))
                    line_size = len(header) + events_path.stat().st_size
                    lines_size += len(xplane_proto.length_delimited(xplane_proto.XPLANE_LINES_FIELD, line_size)) + line_size
            head = self.plane.SerializeToString()
            size = len(head) + self._event_metadata_size + lines_size
            file.write(xplane_proto.length_delimited(xplane_proto.XSPACE_PLANES_FIELD, size))
            file.write(head)
            if self._event_metadata_size:
                with self._event_metadata_path.open("rb") as metadata:
                    shutil.copyfileobj(metadata, file, 1 << 20)
            for header, events_path in lines:
                line_size = len(header) + events_path.stat().st_size
                file.write(xplane_proto.length_delimited(xplane_proto.XPLANE_LINES_FIELD, line_size))
                file.write(header)
                with events_path.open("rb") as events:
                    shutil.copyfileobj(events, file, 1 << 20)
                events_path.unlink()
        finally:
            for _, events_path in lines:
                events_path.unlink(missing_ok=True)
