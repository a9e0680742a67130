"""The Compare view's data: `tputrace diff` of a baseline run (before) against the trace on show (after)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tputrace.compare.diff import RunDiff, compare
from tputrace.compare.figures import run_figures
from tputrace.compare.sites import unreadable_files

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


def comparison(trace: Trace, baseline_path: Path, rank: int) -> RunDiff:
    """How `rank` of `trace` differs from the same rank of the baseline (its first rank when it has not that
    one)."""
    from tputrace.store.reader import open_trace

    with open_trace(baseline_path) as baseline:
        baseline_rank = rank if rank in baseline.ranks else baseline.ranks[0]
        by_number = unreadable_files(baseline) | unreadable_files(trace)
        before = run_figures(baseline, baseline_rank, by_line_number=by_number)
    return compare(before, run_figures(trace, rank, by_line_number=by_number))
