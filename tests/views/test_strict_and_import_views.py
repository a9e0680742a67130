"""Figures the views label as projected or as measured tell exactly that: a strict-mode (DEFER_NEVER) run's chip
time share is each op's own program projected on the target by a roofline (not its host dispatch), and an
imported XProf capture's Overview leaves out what the capture cannot tell, as the summary does."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import pytest

import tputrace
from fixtures.make_tui_fixture import make_session, settle
from test_tui import table_rows
from test_views_on_varied_runs import _run_tui, imported_jax_trace, strict_trace
from tputrace.analysis.target import DEFAULT_TARGET, target_chip
from tputrace.derived.op_cost import op_cost
from tputrace.derived.op_ranking import rank_ops, rank_ops_by_rows
from tputrace.summary import render_text, summarize

__all__ = ["imported_jax_trace", "strict_trace"]  # fixtures shared with the varied-runs tests


def _projected_by_op(trace: tputrace.Trace) -> dict[str, float]:
    """Per op name, its programs' roofline on the default target: XLA's FLOPs at the chip's peak (fp32 peak for
    fp32 inputs) or XLA's bytes at its HBM bandwidth, whichever is longer, summed over its calls."""
    chip = target_chip(DEFAULT_TARGET)
    projected: dict[str, float] = {}
    for op, inputs, flops, bytes_accessed in trace.sql(
            "SELECT s.text, i.text, p.flops, p.bytes_accessed FROM ops o JOIN programs p ON p.id = o.program_id "
            "JOIN strings s ON s.id = o.op_sid LEFT JOIN strings i ON i.id = o.inputs_sid WHERE o.chip >= 0"):
        wide = op_cost(op, inputs, None).wide_floats
        peak = chip.fp32_peak_flops_per_ns if wide else chip.peak_flops_per_ns
        roofline = max(flops / peak, bytes_accessed / chip.hbm_bytes_per_ns)
        if roofline:
            projected[op] = projected.get(op, 0.0) + roofline
    return projected


def test_a_strict_runs_chip_time_share_is_each_ops_program_projected(strict_trace: Path) -> None:
    """Each strict op is an XLA program of its own: its chip time share is its program's roofline on the target,
    in the ranking (over columns and row by row), the summary's top ops and the TUI's Ops view alike."""
    chip = target_chip(DEFAULT_TARGET)
    with tputrace.open(strict_trace) as trace:
        assert trace.run.eager_mode == "DEFER_NEVER" and not trace.count("executions")
        assert not trace.sql("SELECT 1 FROM programs WHERE kind = 'op' AND (flops IS NULL OR bytes_accessed IS NULL)")
        expected = _projected_by_op(trace)
        ranking = rank_ops(trace, 0, chip)
        by_rows = rank_ops_by_rows(trace, 0, chip)
        summary = summarize(trace)
    total = sum(expected.values())
    assert total > 0
    for ranked in (ranking, by_rows):
        assert ranked.chip_ns == pytest.approx(total, rel=1e-9)
        assert {op.op: op.chip_ns for op in ranked.ops if op.chip_ns} == pytest.approx(expected, rel=1e-9)
    # Not the host dispatch share under another name.
    assert any(abs(op.chip_share - op.self_dispatch_share) > 0.02 for op in ranking.ops)
    text = render_text(summary)
    assert f"chip time share, projected for {chip.name} by a roofline" in text
    for op in summary.top_ops:
        row = next(line for line in text.splitlines() if line.strip().startswith(op.op + " "))
        assert row.rstrip().endswith(f"{100 * expected.get(op.op, 0.0) / total:.1f}%"), row
    tui = _run_tui(strict_trace, "3")
    assert f"chip time share, projected for {chip.name}" in tui["3"]
    shown = _ops_table(strict_trace)
    for op in ranking.ops:
        if op.op in shown:
            assert f"{100 * expected.get(op.op, 0.0) / total:.1f}%" in shown[op.op], (op.op, shown[op.op])


def _ops_table(trace_path: Path) -> dict[str, list[str]]:
    """The TUI Ops view's rows (grouped by op) by op name."""
    from tputrace.tui.app import TraceApp

    async def drive() -> list[list[str]]:
        app = TraceApp(make_session(trace_path))
        async with app.run_test(size=(200, 60)) as pilot:
            await settle(pilot)
            await pilot.press("3")
            await settle(pilot)
            return table_rows(app, "#ops-groups")

    return {row[0]: row for row in asyncio.run(drive())}


def test_an_imported_captures_overview_leaves_out_what_it_cannot_tell(imported_jax_trace: Path) -> None:
    """A `jax.profiler` capture records no compiles, syncs or fallbacks: the summary leaves those rows out, and the
    TUI Overview does not show them as 0 ns."""
    with tputrace.open(imported_jax_trace) as trace:
        text = render_text(summarize(trace))
    overview = _run_tui(imported_jax_trace, "1")["1"]
    split = overview[overview.index("Where the time went"):overview.index("Top findings")]
    split_rows = [line.strip() for line in split.splitlines()[1:] if line.strip()]
    summary_rows = text[text.index("time split"):text.index("top ops")]
    for label in ("compile", "sync stalls", "fallbacks"):
        assert f"  {label} " not in summary_rows
        assert not any(row.startswith(label) for row in split_rows), split_rows
        assert label in split_rows[-1] and split_rows[-1].startswith("none in the capture:"), split_rows
    assert "program execution" in summary_rows and any(row.startswith("program execution") for row in split_rows)
    assert "compiles in 0 ns" not in overview


def test_a_strict_op_with_nothing_to_project_from_says_so(strict_trace: Path, tmp_path: Path) -> None:
    """A strict op whose programs carry no XLA costs and whose shapes were not recorded (a file written without
    them) has no projection: the summary and the TUI's Ops view say "not projected" rather than a share."""
    edited = tmp_path / "no_costs.tptrace"
    shutil.copyfile(strict_trace, edited)
    with sqlite3.connect(edited) as db:
        (op_sid, op), = db.execute(
            "SELECT o.op_sid, s.text FROM ops o JOIN strings s ON s.id = o.op_sid WHERE o.program_id IS NOT NULL "
            "GROUP BY o.op_sid ORDER BY SUM(o.dur_ns) DESC LIMIT 1").fetchall()
        db.execute("UPDATE programs SET flops = NULL, bytes_accessed = NULL WHERE id IN "
                   "(SELECT program_id FROM ops WHERE op_sid = ?)", (op_sid,))
        db.execute("UPDATE ops SET inputs_sid = NULL, outputs_sid = NULL WHERE op_sid = ?", (op_sid,))
    db.close()
    chip = target_chip(DEFAULT_TARGET)
    with tputrace.open(edited) as trace:
        rankings = (rank_ops(trace, 0, chip), rank_ops_by_rows(trace, 0, chip))
        text = render_text(summarize(trace))
    for ranking in rankings:
        unprojected = {ranked.op for ranked in ranking.ops if not ranked.projected}
        assert unprojected == {op}
        assert ranking.chip_ns > 0
    row = next(line for line in text.splitlines() if line.strip().startswith(op + " "))
    assert row.rstrip().endswith("not projected"), row
    assert _ops_table(edited)[op][-2:].count("not projected") == 1, _ops_table(edited)[op]
