"""Step times projected for a target chip from the programs' XLA costs, beside the measured ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tputrace.analysis.target import target_chip
from tputrace.derived.projection import projected_steps
from tputrace.derived.steps import loop_step_durations
from tputrace.store.reader import open_trace
from tputrace.summary import render_text, summarize


def test_projection_is_the_programs_roofline_per_step(sample_trace_path: Path) -> None:
    chip = target_chip("v5e")
    with open_trace(sample_trace_path) as trace:
        projected = projected_steps(trace, 0, chip)
        expected: dict[int, float] = {}
        for step, flops, bytes_accessed in trace.sql(
            "SELECT e.step, p.flops, p.bytes_accessed FROM executions e JOIN programs p ON p.id = e.program_id "
            "WHERE e.rank = 0 AND (p.flops IS NOT NULL OR p.bytes_accessed IS NOT NULL)"):
            roofline = max((flops or 0) / chip.peak_flops_per_ns, (bytes_accessed or 0) / chip.hbm_bytes_per_ns)
            expected[step] = expected.get(step, 0.0) + roofline
        loop_steps = len(loop_step_durations(trace, 0))
    assert projected.programs_costed > 0 and len(projected.by_step) == loop_steps
    for step, value in projected.by_step.items():
        assert value == pytest.approx(expected.get(step, 0.0))


def test_a_faster_chip_projects_a_shorter_step(sample_trace_path: Path) -> None:
    with open_trace(sample_trace_path) as trace:
        slow, fast = (projected_steps(trace, 0, target_chip(name)) for name in ("v5e", "v7"))
    assert slow.median_ns is not None and fast.median_ns is not None and fast.median_ns < slow.median_ns


def test_summary_puts_measured_and_projected_side_by_side(sample_trace_path: Path) -> None:
    with open_trace(sample_trace_path) as trace:
        summary = summarize(trace)
    text = render_text(summary)
    assert summary.projected is not None
    assert "measured on this host" in text and f"projected for {summary.projected.target}" in text
