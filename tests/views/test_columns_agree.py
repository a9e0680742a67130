"""The views' figures computed over the ops' columns (numpy) are the figures the row-by-row and SQL code
computes, on real recordings (examples/gpt_train.py whole and windowed, a transformer in strict and
DeferAndFuse mode), the committed TUI fixtures and synthetic traces: the op ranking, the Ops view's
groups and the Timeline's lanes and longest events."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fixtures.named_traces import FIXTURES, RECORDED, named_trace
from tputrace.analysis.target import DEFAULT_TARGET, target_chip
from tputrace.derived.op_ranking import OpRanking, _Covered, nested_intervals, rank_ops, rank_ops_by_rows
from tputrace.derived.steps import step_rows
from tputrace.store.reader import Trace, open_trace
from tputrace.tui import queries
from tputrace.tui.queries.ops import _GROUP_COLUMNS, MAX_GROUPS, _groups


@pytest.fixture(params=[*RECORDED, "tui_small", "tui_markup", "sample", "flush_inside_op", "large"])
def trace_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return named_trace(request, tmp_path, request.param)


def _assert_same_ranking(columns: OpRanking, rows: OpRanking) -> None:
    assert [(op.op, op.calls, op.dispatch_ns, op.self_dispatch_ns, op.self_dispatch_share) for op in columns.ops] == [
        (op.op, op.calls, op.dispatch_ns, op.self_dispatch_ns, op.self_dispatch_share) for op in rows.ops]
    assert (columns.self_dispatch_ns, columns.nested_ns, columns.target) == (rows.self_dispatch_ns, rows.nested_ns, rows.target)
    # Chip time is summed in another order: equal but for the last bits of a float.
    assert math.isclose(columns.chip_ns, rows.chip_ns, rel_tol=1e-12, abs_tol=1e-6)
    for by_columns, by_rows in zip(columns.ops, rows.ops):
        assert math.isclose(by_columns.chip_ns, by_rows.chip_ns, rel_tol=1e-12, abs_tol=1e-6), by_columns.op
        assert math.isclose(by_columns.chip_share, by_rows.chip_share, rel_tol=1e-12, abs_tol=1e-15), by_columns.op


def _sql_groups(trace: Trace, grouping: queries.OpGrouping, rank: int) -> list[queries.OpGroup]:
    """The Ops view's groups made row by row: each op's dispatch less the flushes and compiles that ran inside its
    call (`_Covered`, as `rank_ops_by_rows` counts it), summed per key."""
    key_count = len(_GROUP_COLUMNS[grouping])
    covered = _Covered(nested_intervals(trace, rank))
    sums: dict[tuple[object, ...], list[int]] = {}
    for row in trace.sql(f"SELECT {', '.join(_GROUP_COLUMNS[grouping])}, start_ns, COALESCE(dur_ns, 0) FROM ops "
                         "WHERE rank = ?", (rank,)):
        key, start, duration = tuple(row[:key_count]), row[key_count], row[key_count + 1]
        own = duration - (covered.within(start, start + duration) if covered.starts and start is not None else 0)
        entry = sums.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += own
    rows = sorted(((*key, count, total) for key, (count, total) in sums.items()), key=lambda row: -row[-1])
    return _groups(trace, grouping, rank, rows[:MAX_GROUPS], None)


def test_figures_over_columns_are_the_row_by_row_figures(trace_path: Path) -> None:
    chip = target_chip(DEFAULT_TARGET)
    with open_trace(trace_path) as trace:
        for rank in trace.ranks:
            _assert_same_ranking(rank_ops(trace, rank, chip), rank_ops_by_rows(trace, rank, chip))
            _assert_same_ranking(rank_ops(trace, rank), rank_ops_by_rows(trace, rank))
            read = queries.ops_read(trace, rank)
            assert read.by_op == queries.op_groups(trace, "op", rank)
            grouped = queries.op_groups_by(trace, ["op_shapes", "source", "module"], rank)
            assert read.by_op_shapes == grouped["op_shapes"]
            with_durations = queries.op_groups_by(trace, ["source", "module"], rank, read.durs_ns)
            assert with_durations == {grouping: grouped[grouping] for grouping in ("source", "module")}
            for grouping, groups in grouped.items():
                expected = _sql_groups(trace, grouping, rank)
                assert sorted(groups, key=lambda group: (group.label, str(group.key))) == sorted(
                    expected, key=lambda group: (group.label, str(group.key))), grouping
                assert queries.sort_groups(groups, "total") == queries.sort_groups(expected, "total")


def test_timeline_windows_from_the_ops_times_are_the_sql_windows(trace_path: Path) -> None:
    with open_trace(trace_path) as trace:
        for rank in trace.ranks:
            times = queries.op_times(trace, rank)
            kept = queries.ops_read(trace, rank).times  # what the Ops view's read keeps for the Timeline
            assert times is not None and kept is not None
            assert (kept.starts_ns == times.starts_ns).all() and (kept.durs_ns == times.durs_ns).all()
            wall = trace.wall_ns(rank=rank)
            windows = [(0, max(wall, 1_000)), (wall // 3, wall // 3 + wall // 7 + 1), (0, 1_000)]
            windows += [(step.start_ns, step.end_ns) for step in step_rows(trace, rank)[:4] if step.end_ns is not None]
            for start_ns, end_ns in windows:
                for columns in (138, 7):
                    assert queries.timeline_lanes(trace, rank, start_ns, end_ns, columns, times) == queries.timeline_lanes(
                        trace, rank, start_ns, end_ns, columns)
                by_times = queries.window_events(trace, rank, start_ns, end_ns, times=times)
                by_sql = queries.window_events(trace, rank, start_ns, end_ns)
                assert [(event.lane, event.dur_ns) for event in by_times] == [(event.lane, event.dur_ns) for event in by_sql]


def test_ops_with_values_that_are_not_integers_are_read_row_by_row(tmp_path: Path) -> None:
    import shutil
    import sqlite3

    path = tmp_path / "odd.tptrace"
    shutil.copy(FIXTURES / "tui_small.tptrace", path)
    connection = sqlite3.connect(path)
    connection.execute("UPDATE ops SET dur_ns = dur_ns + 0.5 WHERE rowid = (SELECT MIN(rowid) FROM ops)")
    connection.commit()
    connection.close()
    with open_trace(path) as trace:
        assert queries.op_times(trace, 0) is None
        ranking = rank_ops(trace, 0, target_chip(DEFAULT_TARGET))
        assert ranking == rank_ops_by_rows(trace, 0, target_chip(DEFAULT_TARGET))
        assert sum(op.dispatch_ns for op in ranking.ops) % 1 == 0.5


def test_ops_with_dangling_string_ids_are_read_row_by_row(tmp_path: Path) -> None:
    import shutil
    import sqlite3

    path = tmp_path / "dangling.tptrace"
    shutil.copy(FIXTURES / "tui_small.tptrace", path)
    connection = sqlite3.connect(path)
    connection.execute("UPDATE ops SET inputs_sid = (SELECT MAX(id) + 5 FROM strings) WHERE rowid = (SELECT MIN(rowid) FROM ops)")
    connection.commit()
    connection.close()
    chip = target_chip(DEFAULT_TARGET)
    with open_trace(path) as trace:
        rank = trace.sql("SELECT rank FROM ops WHERE rowid = (SELECT MIN(rowid) FROM ops)")[0][0]
        assert rank_ops(trace, rank, chip) == rank_ops_by_rows(trace, rank, chip)
        assert sorted(queries.op_groups(trace, "op_shapes", rank), key=lambda group: (group.label, str(group.key))) == sorted(
            _sql_groups(trace, "op_shapes", rank), key=lambda group: (group.label, str(group.key)))
