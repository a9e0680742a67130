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


def _fill(track: Track, bounds: list[tuple[int, int]]) -> Track:
    for index, (start, end) in enumerate(bounds):
        track.add(start, end, index % 2, f'"extra":{index}' if index % 4 == 0 else "", (index,))
    return track


def _overlapping(count: int) -> list[tuple[int, int]]:
    """Slices in start order, some nested, some overlapping the next partly: several lanes."""
    return [(index * 1000, index * 1000 + (2500 if index % 3 == 0 else 1200 if index % 3 == 1 else 300))
            for index in range(count)]


@pytest.mark.parametrize("spill_slices", [1, 3, CHUNK + 1])
def test_spilled_track_writes_what_the_in_memory_one_does(spill_slices: int) -> None:
    bounds = _overlapping(4 * CHUNK + 5)
    in_memory = _fill(Track(1, 3, "Python dispatch", ("seq",)), bounds)
    spilled = Track(1, 3, "Python dispatch", ("seq",), spill_slices=spill_slices)
    spilled.watched.update({0, 5, len(bounds) - 1})  # flow sources: what they need outlives the spill
    _fill(spilled, bounds)
    assert spilled.base > 0 and len(spilled.starts) < len(bounds) and len(spilled) == len(bounds)

    lanes = in_memory.assign_lanes()
    assert lanes > 1 and spilled.assign_lanes() == lanes
    points = [spilled.flow_point(index) for index in (5, len(bounds) - 1)]
    assert points == [in_memory.flow_point(index) for index in (5, len(bounds) - 1)]
    written = [line for chunk in spilled.lines(*_fragments()) for line in chunk]
    assert written == [line for chunk in in_memory.lines(*_fragments()) for line in chunk]
    assert len({json.loads(line)["tid"] for line in written}) == lanes


def test_spilled_track_out_of_start_order_comes_back_to_memory_and_is_sorted() -> None:
    bounds = _overlapping(3 * CHUNK)
    bounds[2 * CHUNK] = (500, 700)  # starts before slices spilled already
    in_memory = _fill(Track(1, 6, "Syncs", ("seq",)), bounds)
    spilled = _fill(Track(1, 6, "Syncs", ("seq",), spill_slices=4), bounds)
    assert not spilled.ordered and spilled.base == 0 and len(spilled.starts) == len(bounds)

    assert spilled.assign_lanes() == in_memory.assign_lanes()
    written = [line for chunk in spilled.lines(*_fragments()) for line in chunk]
    assert written == [line for chunk in in_memory.lines(*_fragments()) for line in chunk]
    events = [json.loads(line) for line in written]
    assert sorted(event["args"]["seq"] for event in events) == list(range(len(bounds)))
    by_lane: dict[int, list[tuple[float, float]]] = {}
    for event in sorted(events, key=lambda event: (event["ts"], -event["dur"])):
        stack = by_lane.setdefault(event["tid"], [])
        while stack and stack[-1][1] <= event["ts"]:
            stack.pop()
        assert not stack or event["ts"] + event["dur"] <= stack[-1][1]  # nests in what is open on its lane
        stack.append((event["ts"], event["ts"] + event["dur"]))
