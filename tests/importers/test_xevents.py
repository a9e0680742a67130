"""The column decoder of XProf events: its columns are what the protobuf classes read, on a real capture and
on events of every shape, and an import through the protobuf classes alone is the same trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from test_import_streaming import _dump, _import, _xplane
from tputrace.importers import xevents, xplane
from tputrace.importers.wire import XSpaceFile
from tputrace.importers.xevents import EventColumns, decode_run
from tputrace.importers.xstats import StatDecoder, stat_numbers
from tputrace.xplane_proto import encode_varint, messages

CLASSES = messages()


def _runs(path: Path) -> list[EventColumns]:
    columns = []
    with XSpaceFile(path) as space:
        for span in space.planes():
            _, lines = space.plane(span, CLASSES["XPlane"])
            for line in map(space.line_head, lines):
                columns += [decode_run(run, CLASSES["XLine"], CLASSES["XEvent"]) for run in space.event_runs(line)]
    return columns


def _as_read_by_protobuf(columns: EventColumns) -> dict[str, Any]:
    events = [columns.message(index) for index in range(len(columns))]
    return {
        "metadata_id": [event.metadata_id for event in events],
        "offset_ps": [event.offset_ps for event in events],
        "duration_ps": [event.duration_ps for event in events],
        "stats": [(index, stat.metadata_id) for index, event in enumerate(events) for stat in event.stats],
    }


def _as_decoded(columns: EventColumns) -> dict[str, Any]:
    return {
        "metadata_id": columns.metadata_id.tolist(),
        "offset_ps": columns.offset_ps.tolist(),
        "duration_ps": columns.duration_ps.tolist(),
        "stats": list(zip(columns.stat_event.tolist(), columns.stat_id.tolist())),
    }


def test_the_columns_of_a_real_capture_are_what_protobuf_reads(captures: dict[str, Path]) -> None:
    runs = _runs(_xplane(captures))
    assert all(run.stat_value_at is not None for run in runs)  # decoded from the wire, not through protobuf
    assert [_as_decoded(run) for run in runs] == [_as_read_by_protobuf(run) for run in runs]
    assert sum(len(run) for run in runs) > 50 and any(len(run.stat_id) for run in runs)


def _space_file(path: Path, events: list[dict[str, Any]]) -> Path:
    space = CLASSES["XSpace"]()
    line = space.planes.add(name="/host:CPU").lines.add(name="thread", timestamp_ns=10**18)
    for fields in events:
        event = line.events.add()
        for name, value in fields.items():
            if name == "stats":
                for stat_fields in value:
                    event.stats.add(**stat_fields)
            else:
                setattr(event, name, value)
    path.write_bytes(space.SerializeToString())
    return path


def test_events_of_every_shape_decode_as_protobuf_reads_them(tmp_path: Path) -> None:
    events = [
        {},  # every field zero, so absent
        {"metadata_id": 3, "offset_ps": 5, "duration_ps": 7},
        {"metadata_id": 300, "offset_ps": -1, "duration_ps": 2**62},  # ten-byte and nine-byte varints
        {"metadata_id": 4, "num_occurrences": 9, "duration_ps": 1},
        {"metadata_id": 5, "offset_ps": 1, "stats": [{"metadata_id": 1, "int64_value": -5},
                                                     {"metadata_id": 2, "uint64_value": 2**64 - 1},
                                                     {"metadata_id": 3, "ref_value": 7},
                                                     {"int64_value": 1}]},
        {"metadata_id": 6, "stats": [{"metadata_id": 9, "str_value": "x" * 300}], "num_occurrences": 2},
    ]
    (columns,) = _runs(_space_file(tmp_path / "shapes.xplane.pb", events))
    assert columns.stat_value_at is not None
    assert _as_decoded(columns) == _as_read_by_protobuf(columns)
    table = columns.stat_values([1, 2, 3])
    assert table is not None
    stat_events, stat_ids, kinds, numbers = (part.tolist() for part in table)
    assert (stat_events, stat_ids, numbers) == ([4, 4, 4], [1, 2, 3], [-5, -1, 7])
    assert kinds == [xevents.INT64_VALUE, xevents.UINT64_VALUE, xevents.REF_VALUE]
    assert columns.stat_values([9]) is None  # a string value: read through the message


def _field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def test_events_out_of_field_order_are_read_through_protobuf(tmp_path: Path) -> None:
    # An event whose offset (field 2) follows its duration (field 3): protobuf reads it, the columns do not.
    event = CLASSES["XEvent"](metadata_id=2, duration_ps=8).SerializeToString() + bytes([0x10, 0x05])
    line = CLASSES["XLine"](name="thread", timestamp_ns=1).SerializeToString() + _field(4, event)
    plane = CLASSES["XPlane"](name="/host:CPU").SerializeToString() + _field(3, line)
    path = tmp_path / "order.xplane.pb"
    path.write_bytes(_field(1, plane))
    (columns,) = _runs(path)
    assert columns.stat_value_at is None  # read through protobuf
    assert _as_decoded(columns) == _as_read_by_protobuf(columns)
    assert columns.offset_ps.tolist() == [5] and columns.duration_ps.tolist() == [8]


@pytest.mark.parametrize("fallback", ["whole runs", "stat values"])
def test_an_import_through_protobuf_alone_is_the_same_trace(captures: dict[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, fallback: str) -> None:
    usual = _dump(_import(captures["jax"], tmp_path / "usual.tptrace"))
    if fallback == "whole runs":
        monkeypatch.setattr(xevents, "_decode_wire", lambda run, event_class, stats=True: None)
    else:
        monkeypatch.setattr(EventColumns, "stat_values", lambda self, stat_ids: None)
    assert _dump(_import(captures["jax"], tmp_path / "protobuf.tptrace")) == usual
    assert len(usual["ops"]) > 0 and len(usual["annotations"]) > 0


def test_host_lines_without_xla_ops_are_read_again_without_their_stats_and_make_the_same_trace(
        captures: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_stats = []
    decode = xevents.decode_run

    def recording_decode(run: Any, line_class: type, event_class: type, stats: bool = True) -> EventColumns:
        with_stats.append(stats)
        return decode(run, line_class, event_class, stats)

    monkeypatch.setattr(xplane, "decode_run", recording_decode)
    usual = _dump(_import(captures["jax"], tmp_path / "usual.tptrace"))
    assert False in with_stats  # the Python tracer's line (no XLA op) in the second pass
    monkeypatch.setattr(xplane, "decode_run", lambda run, line_class, event_class, stats=True: decode(
        run, line_class, event_class))
    assert _dump(_import(captures["jax"], tmp_path / "with-stats.tptrace")) == usual
    assert len(usual["ops"]) > 0 and len(usual["annotations"]) > 0


def test_stat_values_of_mixed_kinds_convert_as_protobuf_values_do() -> None:
    plane = CLASSES["XPlane"]()
    plane.stat_metadata[7].name = "jit_step"
    decoder = StatDecoder(plane)
    kinds = np.array([xevents.REF_VALUE, xevents.UINT64_VALUE, xevents.INT64_VALUE, xevents.REF_VALUE], dtype=np.uint8)
    numbers = np.array([7, -1, -1, 8], dtype=np.int64)
    assert stat_numbers(decoder, kinds, numbers) == ["jit_step", 2**64 - 1, -1, ""]
    assert stat_numbers(decoder, kinds[[0, 3]], numbers[[0, 3]]) == ["jit_step", ""]
    assert stat_numbers(decoder, kinds[[2]], numbers[[2]]) == [-1]


def test_int_stats_read_from_the_columns_are_what_each_event_message_says(tmp_path: Path) -> None:
    events = [
        {"metadata_id": 1, "stats": [{"metadata_id": 1, "int64_value": -5}, {"metadata_id": 2, "int64_value": 4}]},
        {"metadata_id": 1},  # no stat
        {"metadata_id": 2, "stats": [{"metadata_id": 2, "uint64_value": 2**64 - 1}]},
        {"metadata_id": 3, "stats": [{"metadata_id": 3, "ref_value": 7}, {"metadata_id": 1, "int64_value": 8}]},
        {"metadata_id": 4, "stats": [{"metadata_id": 4, "int64_value": 2**40}, {"metadata_id": 1, "uint64_value": 6}]},
    ]
    (columns,) = _runs(_space_file(tmp_path / "ints.xplane.pb", events))
    every = np.arange(len(columns))
    for stat_ids in ({1}, {2}, {1, 2}, {3}, {1, 3}, {4}, {5}, set()):
        expected = [xevents.int_stat(columns, index, stat_ids) for index in range(len(columns))]
        assert xevents.int_stats(columns, every, stat_ids) == expected
        some = np.array([0, 3, 4])
        assert xevents.int_stats(columns, some, stat_ids) == [expected[index] for index in some.tolist()]
    assert xevents.int_stats(columns, every, {1, 2}) == [-5, None, 2**64 - 1, 8, 6]
    for stat_ids in ({1}, {2}, {1, 2}, {3, 4}, {5}):
        carrying = [index for index in range(len(columns))
                    if any(stat.metadata_id in stat_ids for stat in columns.message(index).stats)]
        assert columns.with_stat(stat_ids).tolist() == carrying
