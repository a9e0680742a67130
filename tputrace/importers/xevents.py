"""A run of XProf events decoded into numpy columns straight from their wire bytes, all events at once.

Reading each event's fields through the protobuf classes costs a Python object per event and per field;
here each field is read for every event of a run with a few array operations. An `XEvent` is decoded
as it is serialized (fields in number order): `metadata_id` (1), `offset_ps` (2) and `duration_ps` (3),
absent when zero, then its `stats` (4), of which only each stat's `metadata_id` is read. A run that does
not have that shape is read through the protobuf classes instead, into the same columns. The few events
whose stat values matter are parsed one by one (`EventColumns.message`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tputrace.importers.wire import EventRun

_METADATA_ID = 0x08
_OFFSET_PS = 0x10
_DURATION_PS = 0x18
_STATS = 0x22
_NUM_OCCURRENCES = 0x28
_PADDING = bytes(16)  # a varint cut at a run's end stops at a zero byte, past the event it was read for


@dataclass
class EventColumns:
    """Per event: `metadata_id`, `offset_ps`, `duration_ps` (int64); per stat: the event it belongs to
    (`stat_event`, an index) and its `stat_id` (its metadata id)."""

    metadata_id: np.ndarray
    offset_ps: np.ndarray
    duration_ps: np.ndarray
    stat_event: np.ndarray
    stat_id: np.ndarray
    _run: EventRun | None
    _messages: Any
    _event_class: type

    def __len__(self) -> int:
        return len(self.metadata_id)

    def with_stat(self, stat_ids: set[int] | frozenset[int]) -> np.ndarray:
        """Indices of the events that carry a stat whose metadata id is in `stat_ids` (ascending)."""
        if not stat_ids:
            return np.zeros(0, dtype=np.int64)
        return np.unique(self.stat_event[np.isin(self.stat_id, list(stat_ids))])

    def message(self, index: int) -> Any:
        """Event `index` as an `XEvent` message (for reading its stat values)."""
        if self._run is None:
            return self._messages[index]
        run = self._run
        return self._event_class.FromString(run.data[run.starts[index]:run.ends[index]])


def decode_run(run: EventRun, line_class: type, event_class: type) -> EventColumns:
    """The columns of a run's events (through the protobuf classes where the bytes are not as expected)."""
    columns = _decode_wire(run, event_class)
    if columns is not None:
        return columns
    line = line_class()
    line.ParseFromString(run.data)
    return _decode_messages(line.events, event_class)


def _decode_wire(run: EventRun, event_class: type) -> EventColumns | None:
    data = np.frombuffer(run.data + _PADDING, dtype=np.uint8)
    position = np.array(run.starts, dtype=np.int64)
    end = np.array(run.ends, dtype=np.int64)
    values = []
    for key in (_METADATA_ID, _OFFSET_PS, _DURATION_PS):
        present = np.flatnonzero((position < end) & (data[position] == key))
        value = np.zeros(len(position), dtype=np.uint64)
        if len(present):
            decoded = _varints(data, position[present] + 1)
            if decoded is None:
                return None
            value[present], position[present] = decoded
        values.append(value.view(np.int64))
    if (position > end).any():
        return None
    inside = position < end
    following = data[position]
    if (inside & ((following == _METADATA_ID) | (following == _OFFSET_PS) | (following == _DURATION_PS))).any():
        return None  # fields out of number order
    with_stats = np.flatnonzero(inside & (following == _STATS))
    stats = _stat_ids(data, with_stats, position[with_stats], end[with_stats])
    if stats is None:
        return None
    return EventColumns(*values, *stats, _run=run, _messages=None, _event_class=event_class)


def _stat_ids(data: np.ndarray, events: np.ndarray, position: np.ndarray,
              end: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """For every stat of `events` (whose stats start at `position`): its event and metadata id; walked one
    stat of every event at a time. None where a stat runs past its event or a field other than
    `num_occurrences` follows the stats."""
    stat_events: list[np.ndarray] = []
    stat_ids: list[np.ndarray] = []
    while len(events):
        decoded = _varints(data, position + 1)
        if decoded is None:
            return None
        size, body = decoded
        stat_end = body + size.view(np.int64)
        if ((stat_end > end) | (stat_end < body)).any():
            return None
        stat_id = np.zeros(len(events), dtype=np.uint64)
        keyed = np.flatnonzero((body < stat_end) & (data[body] == _METADATA_ID))
        if len(keyed):
            decoded = _varints(data, body[keyed] + 1)
            if decoded is None or (decoded[1] > stat_end[keyed]).any():
                return None
            stat_id[keyed] = decoded[0]
        stat_events.append(events)
        stat_ids.append(stat_id.view(np.int64))
        inside = stat_end < end
        following = data[stat_end]
        if (inside & (following != _STATS) & (following != _NUM_OCCURRENCES)).any():
            return None
        more = np.flatnonzero(inside & (following == _STATS))
        events, position, end = events[more], stat_end[more], end[more]
    if not stat_events:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(stat_events), np.concatenate(stat_ids)


def _varints(data: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The values (uint64) of the varints starting at `start`, and where each ends; None for one longer
    than ten bytes."""
    byte = data[start]
    value = (byte & 0x7F).astype(np.uint64)
    end = start + 1
    going = np.flatnonzero(byte >= 0x80)
    shift = 7
    while len(going):
        if shift > 63:
            return None
        byte = data[end[going]]
        value[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
        end[going] += 1
        going = going[byte >= 0x80]
        shift += 7
    return value, end


def _decode_messages(events: Any, event_class: type) -> EventColumns:
    """The columns read event by event through the protobuf classes."""
    stat_event = [index for index, event in enumerate(events) for _ in event.stats]
    stat_id = [stat.metadata_id for event in events for stat in event.stats]
    return EventColumns(
        metadata_id=np.array([event.metadata_id for event in events], dtype=np.int64),
        offset_ps=np.array([event.offset_ps for event in events], dtype=np.int64),
        duration_ps=np.array([event.duration_ps for event in events], dtype=np.int64),
        stat_event=np.array(stat_event, dtype=np.int64),
        stat_id=np.array(stat_id, dtype=np.int64),
        _run=None, _messages=events, _event_class=event_class,
    )
