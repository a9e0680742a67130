"""A run of XProf events decoded into numpy columns straight from their wire bytes, all events at once.

Reading each event's fields through the protobuf classes costs a Python object per event and per field;
here each field is read for every event of a run with a few array operations. An `XEvent` is decoded
as it is serialized (fields in number order): `metadata_id` (1), `offset_ps` (2) and `duration_ps` (3),
absent when zero, then its `stats` (4): each stat's `metadata_id`, and the integer values (`int64_value`,
`uint64_value`, `ref_value`) of the stats asked for. A run that does not have that shape is read through
the protobuf classes instead, into the same columns; so are the events whose stats hold other values
(`EventColumns.message`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tputrace.importers.wire import EventRun

_METADATA_ID = 0x08
_OFFSET_PS = 0x10
_DURATION_PS = 0x18
_STATS = 0x22
_NUM_OCCURRENCES = 0x28
# An XStat's value fields read here (their keys): the other kinds (double, string, bytes) are not.
UINT64_VALUE = 0x18
INT64_VALUE = 0x20
REF_VALUE = 0x38
_INTEGER_VALUES = (UINT64_VALUE, INT64_VALUE, REF_VALUE)
_PADDING = bytes(16)  # a varint cut at a run's end stops at a zero byte, past the event it was read for
_FEW_IDS = 16


def isin_few(values: np.ndarray, ids: Iterable[Any]) -> np.ndarray:
    """`np.isin(values, ids)`, made of one comparison per id where the ids are few: numpy's own builds a lookup
    table or sorts, ten to twenty times the cost for a handful of ids (the stats or metadata asked for)."""
    wanted = ids if isinstance(ids, np.ndarray) else list(ids)
    if len(wanted) > _FEW_IDS:
        return np.isin(values, wanted)
    found = np.zeros(len(values), dtype=bool)
    for key in wanted:
        found |= values == key
    return found


@dataclass
class EventColumns:
    """Per event: `metadata_id`, `offset_ps`, `duration_ps` (int64); per stat: the event it belongs to
    (`stat_event`, an index, ascending: each event's stats in its order), its `stat_id` (its metadata id), and
    where its value lies in the run."""

    metadata_id: np.ndarray
    offset_ps: np.ndarray
    duration_ps: np.ndarray
    stat_event: np.ndarray
    stat_id: np.ndarray
    stat_value_at: np.ndarray | None
    stat_end: np.ndarray | None
    _data: np.ndarray | None
    _bounds: tuple[np.ndarray, np.ndarray] | None
    _messages: Any
    _event_class: type

    def __len__(self) -> int:
        return len(self.metadata_id)

    @property
    def from_messages(self) -> bool:
        """Whether the events were read through the protobuf classes (their bytes not as expected)."""
        return self._data is None

    def with_stat(self, stat_ids: set[int] | frozenset[int]) -> np.ndarray:
        """Indices of the events that carry a stat whose metadata id is in `stat_ids` (ascending)."""
        if not stat_ids:
            return np.zeros(0, dtype=np.int64)
        events: np.ndarray = self.stat_event[isin_few(self.stat_id, stat_ids)]
        # `stat_event` ascends, so an event's stats are adjacent: its first one marks it.
        return events[np.concatenate(([True], events[1:] != events[:-1]))] if len(events) else events

    def stat_values(self, stat_ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The stats whose metadata id is in `stat_ids`, in each event's order: their events, ids, value kinds
        (`INT64_VALUE`, `UINT64_VALUE` or `REF_VALUE`) and values (int64; a `uint64` above 2^63 wraps). None
        where one holds a value of another kind (read those through `message`)."""
        if self._data is None or self.stat_value_at is None or self.stat_end is None:
            return None
        chosen = np.flatnonzero(isin_few(self.stat_id, stat_ids))
        at, end = self.stat_value_at[chosen], self.stat_end[chosen]
        kinds = self._data[at]
        if ((at >= end) | ~isin_few(kinds, _INTEGER_VALUES)).any():
            return None
        decoded = _varints(self._data, at + 1)
        if decoded is None or (decoded[1] != end).any():
            return None
        return self.stat_event[chosen], self.stat_id[chosen], kinds, decoded[0].view(np.int64)

    def message(self, index: int) -> Any:
        """Event `index` as an `XEvent` message (for reading its stat values)."""
        if self._data is None or self._bounds is None:
            return self._messages[index]
        starts, ends = self._bounds
        return self._event_class.FromString(self._data[int(starts[index]):int(ends[index])].tobytes())


def int_stat(columns: EventColumns, index: int, stat_ids: set[int]) -> int | None:
    """The integer value of event `index`'s first stat whose metadata id is in `stat_ids` (a step marker's
    `step_num`), where it has one."""
    for stat in columns.message(index).stats:
        if stat.metadata_id in stat_ids:
            kind = stat.WhichOneof("value")
            if kind in ("int64_value", "uint64_value"):
                return int(getattr(stat, kind))
    return None


def int_stats(columns: EventColumns, events: np.ndarray, stat_ids: set[int]) -> list[int | None]:
    """`int_stat` of each of `events` (ascending indices), read from the columns where every stat of those ids
    holds an integer or reference, else event by event."""
    if not stat_ids:
        return [None] * len(events)
    found = int_stat_columns(columns, events, stat_ids) if len(events) else None
    if found is None:
        return [int_stat(columns, index, stat_ids) for index in events.tolist()]
    kinds, numbers, has = found
    values: list[int | None] = [None] * len(events)
    for position, kind, number in zip(np.flatnonzero(has).tolist(), kinds[has].tolist(), numbers[has].tolist()):
        values[position] = number % (1 << 64) if kind == UINT64_VALUE else number
    return values


def int_stat_columns(columns: EventColumns, events: np.ndarray,
                     stat_ids: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`int_stats` as columns: per event of `events` (ascending indices), its value's kind (`INT64_VALUE` or
    `UINT64_VALUE`), the value (int64; a `uint64` above 2^63 wraps) and whether it has one. None where a stat of
    those ids holds a value that is no integer or reference."""
    table = columns.stat_values(list(stat_ids))
    if table is None:
        return None
    stat_events, _, kinds, numbers = table
    # Each event's first such stat that holds an integer (they come in each event's order); none without one.
    integers = kinds != REF_VALUE
    stat_events, kinds, numbers = stat_events[integers], kinds[integers], numbers[integers]
    firsts = np.flatnonzero(np.concatenate(([True], stat_events[1:] != stat_events[:-1]))) if len(stat_events) \
        else np.zeros(0, dtype=np.int64)
    positions = np.searchsorted(events, stat_events[firsts])
    inside = positions < len(events)
    inside[inside] = events[positions[inside]] == stat_events[firsts[inside]]
    has = np.zeros(len(events), dtype=bool)
    has[positions[inside]] = True
    event_kinds = np.zeros(len(events), dtype=np.uint8)
    event_kinds[positions[inside]] = kinds[firsts[inside]]
    event_numbers = np.zeros(len(events), dtype=np.int64)
    event_numbers[positions[inside]] = numbers[firsts[inside]]
    return event_kinds, event_numbers, has


def decode_run(run: EventRun, line_class: type, event_class: type, stats: bool = True) -> EventColumns:
    """The columns of a run's events (through the protobuf classes where the bytes are not as expected); without
    `stats`, their stats are left out (no stat columns) and the bytes after each event's head are not checked: only
    for a run that decoded with its stats before."""
    columns = _decode_wire(run, event_class, stats)
    if columns is not None:
        return columns
    line = line_class()
    line.ParseFromString(run.data[run.fields[0]:run.end])
    return _decode_messages(line.events, event_class)


def _decode_wire(run: EventRun, event_class: type, stats: bool = True) -> EventColumns | None:
    data = np.frombuffer(run.data + _PADDING, dtype=np.uint8)
    lengths = _varints(data, np.fromiter(run.fields, dtype=np.int64, count=len(run.fields)) + 1)
    if lengths is None:
        return None
    position = lengths[1]
    end = position + lengths[0].view(np.int64)
    bounds = (position.copy(), end)
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
    if not stats:
        none = np.zeros(0, dtype=np.int64)
        return EventColumns(metadata_id=values[0], offset_ps=values[1], duration_ps=values[2], stat_event=none,
                            stat_id=none, stat_value_at=none, stat_end=none, _data=data, _bounds=bounds,
                            _messages=None, _event_class=event_class)
    inside = position < end
    following = data[position]
    if (inside & ((following == _METADATA_ID) | (following == _OFFSET_PS) | (following == _DURATION_PS))).any():
        return None  # fields out of number order
    with_stats = np.flatnonzero(inside & (following == _STATS))
    stat_columns = _stat_ids(data, with_stats, position[with_stats], end[with_stats])
    if stat_columns is None:
        return None
    return EventColumns(*values, *stat_columns, _data=data, _bounds=bounds, _messages=None, _event_class=event_class)


def _stat_ids(data: np.ndarray, events: np.ndarray, position: np.ndarray,
              end: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """For every stat of `events` (whose stats start at `position`): its event, metadata id, and where its
    value starts and the stat ends; walked one stat of every event at a time, so that each event's stats
    come in its order. None where a stat runs past its event or a field other than `num_occurrences`
    follows the stats."""
    stat_events: list[np.ndarray] = []
    stat_ids: list[np.ndarray] = []
    value_starts: list[np.ndarray] = []
    stat_ends: list[np.ndarray] = []
    while len(events):
        decoded = _varints(data, position + 1)
        if decoded is None:
            return None
        size, body = decoded
        stat_end = body + size.view(np.int64)
        if ((stat_end > end) | (stat_end < body)).any():
            return None
        stat_id = np.zeros(len(events), dtype=np.uint64)
        value_start = body.copy()
        keyed = np.flatnonzero((body < stat_end) & (data[body] == _METADATA_ID))
        if len(keyed):
            decoded = _varints(data, body[keyed] + 1)
            if decoded is None or (decoded[1] > stat_end[keyed]).any():
                return None
            stat_id[keyed], value_start[keyed] = decoded
        stat_events.append(events)
        stat_ids.append(stat_id.view(np.int64))
        value_starts.append(value_start)
        stat_ends.append(stat_end)
        inside = stat_end < end
        following = data[stat_end]
        if (inside & (following != _STATS) & (following != _NUM_OCCURRENCES)).any():
            return None
        more = np.flatnonzero(inside & (following == _STATS))
        events, position, end = events[more], stat_end[more], end[more]
    if not stat_events:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
    order = np.argsort(np.concatenate(stat_events), kind="stable")
    return tuple(np.concatenate(parts)[order] for parts in (stat_events, stat_ids, value_starts, stat_ends))


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
        stat_value_at=None, stat_end=None, _data=None, _bounds=None, _messages=events, _event_class=event_class,
    )
