"""A Perfetto track writes its slices chunk by chunk: every slice comes out once, whole and right,
across chunk boundaries, with its lane, per-slice column values and extra args."""

from __future__ import annotations

import json

import pytest

from tputrace.viewers.export import perfetto_tracks
from tputrace.viewers.export.perfetto_tracks import LANE_STRIDE, Track

CHUNK = 7


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfetto_tracks, "CHUNK_EVENTS", CHUNK)


def _fragments() -> tuple[list[str], list[str], list[str]]:
    heads = ['"name":"a","cat":"dispatch"', '"name":"b","cat":"dispatch"']
    args = ['"module":"m"', ""]
    tails = [f'{head},"args":{{{arg}}}}}' for head, arg in zip(heads, args)]
    return heads, args, tails


def _written(track: Track) -> tuple[list[list[str]], list[dict[str, object]]]:
    track.assign_lanes()
    chunks = list(track.lines(*_fragments()))
    return chunks, [json.loads(line) for chunk in chunks for line in chunk]


def test_column_track_keeps_values_and_extras_across_chunks() -> None:
    track = Track(1, 3, "Python dispatch", ("seq",))
    count = 3 * CHUNK + 2
    for index in range(count):
        seq = None if index == CHUNK else index + 1
        track.add(index * 1000, index * 1000 + 500, index % 2, f'"extra":{index}' if index % 5 == 0 else "", (seq,))

    chunks, events = _written(track)

    assert [len(chunk) for chunk in chunks] == [CHUNK, CHUNK, CHUNK, 2]
    assert [event["ts"] for event in events] == [index for index in range(count)]
    assert all(event["dur"] == 0.5 and event["tid"] == 3 for event in events)
    assert [event["args"]["seq"] for event in events] == [None if index == CHUNK else index + 1 for index in range(count)]
    assert [event["name"] for event in events] == ["a" if index % 2 == 0 else "b" for index in range(count)]
    assert [index for index, event in enumerate(events) if "extra" in event["args"]] == list(range(0, count, 5))
    assert all(event["args"].get("module") == "m" for event in events[::2])


def test_overlapping_slices_keep_their_lanes_across_chunks() -> None:
    track = Track(1, 6, "Syncs")
    count = 2 * CHUNK + 3
    for index in range(count):  # each slice overlaps the next one partly: lanes alternate
        track.add(index * 1000, index * 1000 + 1500, 0, f'"extra":{index}' if index == CHUNK else "")

    chunks, events = _written(track)

    assert [len(chunk) for chunk in chunks] == [CHUNK, CHUNK, 3]
    assert [event["tid"] for event in events] == [6 + (index % 2) * LANE_STRIDE for index in range(count)]
    assert [event["ts"] for event in events] == [index for index in range(count)]
    assert events[CHUNK]["args"] == {"extra": CHUNK, "module": "m"}
    assert all(event["args"] == {"module": "m"} for index, event in enumerate(events) if index != CHUNK)
