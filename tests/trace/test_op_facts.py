"""What the analyzers read of the ops in one pass is what their own SQL queries read, on real recordings
(examples/gpt_train.py whole and windowed, a transformer in strict and DeferAndFuse mode), the committed
TUI fixtures and synthetic traces: ops per step and their dispatch, the (module, outputs) pairs, the op
count, the module each sync line's reads were made in, and the whole report. A small trace reads them with
SQL and never imports numpy (`test_analysis_never_imports_torch_or_jax`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fixtures.named_traces import FIXTURES, RECORDED, named_trace
from tputrace.analysis import op_facts, op_facts_columns, sync_modules
from tputrace.analysis.chips import chip
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.report import analyze
from tputrace.store.reader import Trace, open_trace


@pytest.fixture(params=[*RECORDED, "tui_small", "tui_markup", "sample", "large"])
def trace_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return named_trace(request, tmp_path, request.param)


@pytest.fixture(autouse=True)
def columns_for_every_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The traces here are small: read their ops over columns as a large trace's are."""
    monkeypatch.setattr(op_facts, "COLUMNS_FROM_ROWS", 1)


def _context(trace: Trace, rank: int, *, columns: bool) -> AnalysisContext:
    context = AnalysisContext.build(trace, chip(None), True, rank)
    if not columns:
        context.cache[op_facts.CACHE_KEY] = None  # as without numpy: every figure from its SQL query
    return context


def _module_of_read_per_sample(context: AnalysisContext, frame_id: int | None, kind: str) -> str | None:
    """The module of a sync line's reads found as before they were found together: one query per sampled sync."""
    trace = context.trace
    starts = [start for (start,) in trace.sql(
        "SELECT start_ns FROM syncs WHERE rank = ? AND frame_id = ? AND kind = ? ORDER BY start_ns LIMIT ?",
        (context.rank, frame_id, kind, sync_modules.SAMPLED_SYNCS))]
    modules: Counter[str] = Counter()
    for start in starts:
        rows = trace.sql("SELECT module_sid FROM ops WHERE rank = ? AND frame_id = ? AND start_ns <= ? "
                         "ORDER BY start_ns DESC, seq DESC LIMIT 1", (context.rank, frame_id, start))
        module = trace.string(rows[0][0]) if rows and rows[0][0] is not None else None
        if module:
            modules[module] += 1
    if not modules or modules.most_common(1)[0][1] * 2 <= len(starts):
        return None
    return modules.most_common(1)[0][0]


def test_op_facts_over_columns_are_the_sql_figures(trace_path: Path) -> None:
    with open_trace(trace_path) as trace:
        for rank in trace.ranks:
            by_columns, by_sql = _context(trace, rank, columns=True), _context(trace, rank, columns=False)
            assert op_facts.op_facts(by_columns) is not None
            assert op_facts.op_count(by_columns) == op_facts.op_count(by_sql) == trace.count("ops", where="rank = ?", params=(rank,))
            assert op_facts.module_outputs(by_columns) == op_facts.module_outputs(by_sql)
            steps = [step for (step,) in trace.sql("SELECT DISTINCT step FROM ops WHERE rank = ?", (rank,)) if step is not None]
            for first, last in ((min(steps, default=0), max(steps, default=0)), (1, 2), (3, 3)):
                assert op_facts.dispatch_by_step(by_columns, first, last) == op_facts.dispatch_by_step(by_sql, first, last)


@pytest.mark.parametrize("lines_per_scan", [sync_modules.LINES_PER_SCAN, 2])
def test_modules_of_reads_found_together_are_those_found_one_by_one(trace_path: Path, lines_per_scan: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_modules, "LINES_PER_SCAN", lines_per_scan)
    with open_trace(trace_path) as trace:
        for rank in trace.ranks:
            context = _context(trace, rank, columns=True)
            lines = [(frame_id, kind) for frame_id, kind in trace.sql(
                "SELECT DISTINCT frame_id, kind FROM syncs WHERE rank = ? ORDER BY frame_id, kind", (rank,))]
            lines += [(None, "item")]
            modules = sync_modules.modules_of_reads(context, lines)
            assert modules == {line: _module_of_read_per_sample(context, *line) for line in lines}
            assert sync_modules.module_of_read(context, *lines[0]) == modules[lines[0]]


def test_the_report_over_columns_is_the_report_over_sql(trace_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_trace(trace_path) as trace:
        for rank in trace.ranks:
            by_columns = analyze(trace, rank=rank).to_dict()
            with monkeypatch.context() as patched:
                patched.setattr(op_facts_columns, "read_op_facts", lambda *_: None)
                by_sql = analyze(trace, rank=rank).to_dict()
            assert by_columns == by_sql


def test_a_trace_with_fewer_ops_than_the_threshold_is_read_with_sql(monkeypatch: pytest.MonkeyPatch) -> None:
    with open_trace(FIXTURES / "tui_small.tptrace") as trace:
        rows = trace.count("ops")
        monkeypatch.setattr(op_facts, "COLUMNS_FROM_ROWS", rows + 1)
        assert op_facts.op_facts(_context(trace, 0, columns=True)) is None
        monkeypatch.setattr(op_facts, "COLUMNS_FROM_ROWS", rows)
        assert op_facts.op_facts(_context(trace, 0, columns=True)) is not None
