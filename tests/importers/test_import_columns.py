"""What an XProf import keeps per step and per program run lives in compact columns (so that memory stays flat as a
capture grows): placed and merged, they give what the Python objects they replace gave."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tputrace.importers.sink import StepClock
from tputrace.importers.step_markers import StepMarkers, place_markers
from tputrace.importers.xplane_runs import U64, LaunchTimes, RunSpans, launched_at

MARKER_SETS = {
    "numbered": [(10, 20, 1), (20, 30, 2), (30, 45, 3)],
    "numbered out of order in the file": [(30, 45, 7), (10, 20, 5), (20, 30, 6)],
    "a marker without a number": [(10, 20, 1), (20, 30, None), (30, 45, 3)],
    "numbers that do not increase": [(10, 20, 4), (20, 30, 4), (30, 45, 5)],
    "markers that start together": [(10, 25, 1), (10, 20, 2), (30, 45, 3)],
    "a first step numbered 0": [(10, 20, 0), (20, 30, 1)],
    "a number beyond int64": [(10, 20, 1), (20, 30, (1 << 64) - 1)],
    "none": [],
}


@pytest.mark.parametrize("name", MARKER_SETS)
def test_step_markers_in_columns_place_the_steps_the_tuples_do(name: str) -> None:
    markers = MARKER_SETS[name]
    columns = StepMarkers()
    for start, end, number in markers:
        columns.add(start, end, number)
    expected_clock = StepClock()
    expected = expected_clock.place([(start - 5, end - 5, number) for start, end, number in markers])
    clock = StepClock()
    assert list(place_markers(clock, columns, -5)) == expected
    assert (list(clock.starts), list(clock.labels)) == (list(expected_clock.starts), list(expected_clock.labels))
    assert [clock.step_at(t) for t in range(0, 50, 5)] == [expected_clock.step_at(t) for t in range(0, 50, 5)]


def test_step_markers_of_several_files_move_by_each_files_offset() -> None:
    first, second, both = StepMarkers(), StepMarkers(), StepMarkers()
    first.add(10, 20, 1)
    second.add(10, 20, 2)
    both.extend(first, 0)
    both.extend(second, 100)
    assert both.tuples() == [(10, 20, 1), (110, 120, 2)]


def test_program_runs_in_columns_merge_into_one_record_per_run() -> None:
    """Enough records that the columns are merged several times on the way; the runs come out as a dict of runs
    keyed by (chip, run id) gives them: the first record's program, the earliest start, the latest end, sorted by
    start with ties in the order first met; a run without an id is one of its own."""
    rng = random.Random(7)
    runs = RunSpans()
    expected: dict[tuple[int, int], list[int | None]] = {}
    for index in range(300_000):
        chip = rng.randrange(4)
        run_id: int | None = rng.choice((None, rng.randrange(-3, 40_000), (1 << 64) - 2))
        program_id = rng.randrange(5)
        start = rng.randrange(0, 10_000_000, 1000)  # coarse: many runs start together
        end = start + rng.randrange(1, 5000)
        runs.add(chip, run_id, program_id, start, end)
        key = (chip, -index - 1) if run_id is None else (chip, run_id % U64)
        run = expected.get(key)
        if run is None:
            expected[key] = [program_id, chip, None if run_id is None else run_id % U64, start, end]
        else:
            run[3], run[4] = min(run[3], start), max(run[4], end)  # type: ignore[type-var]
    got = [row for programs, chips, run_ids, starts, ends in runs.blocks_in_start_order()
           for row in zip(programs, chips, run_ids, starts.tolist(), ends.tolist())]
    assert got == [tuple(run) for run in sorted(expected.values(), key=lambda run: run[3])]  # type: ignore[arg-type,return-value]


def test_launch_times_keep_each_runs_earliest_launch() -> None:
    rng = random.Random(3)
    files = [LaunchTimes(), LaunchTimes()]
    expected: dict[int, int] = {}
    files[0].add(-1, 500)  # an id written as int64: the same run as uint64 2^64 - 1
    expected[(1 << 64) - 1] = 500
    for offset, launches in zip((0, 1_000_000), files):
        for _ in range(150_000):
            run_id = rng.choice((rng.randrange(-5, 50_000), (1 << 64) - 3))
            start = rng.randrange(0, 1_000_000)
            launches.add(run_id, start)
            expected[run_id % U64] = min(expected.get(run_id % U64, start + offset), start + offset)
    merged = LaunchTimes()
    for offset, launches in zip((0, 1_000_000), files):
        merged.extend(launches, offset)
    run_ids, starts = merged.sorted(-7)
    assert dict(zip(run_ids.tolist(), starts.tolist())) == {run_id: start - 7 for run_id, start in expected.items()}
    assert run_ids.tolist() == sorted(expected)
    # no run id, an int64 id, a known one, an unknown one, a uint64 one, and a known one asked before its launch (an
    # event of the run's id before the run was launched is no launch of it: it keeps its own time)
    asked = [None, -1, 12, 60_000, (1 << 64) - 3, 12]
    late = 10_000_000
    times = np.array([1, late, late, 4, late, expected[12] - 8], dtype=np.int64)
    assert launched_at(run_ids, starts, asked, times).tolist() == [
        1, expected[(1 << 64) - 1] - 7, expected[12] - 7, 4, expected[(1 << 64) - 3] - 7, expected[12] - 8]
