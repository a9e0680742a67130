"""Diagnoses: from a trace to ranked findings tied to source lines.

`analyze(trace, target=None)` runs every analyzer (each a pure function of the trace reader, the rank
and the target chip; see `ANALYZERS`) and returns a `Report`: the findings ranked by estimated cost,
and each analyzer's `AnalysisResult` (its typed data and findings). Rendering lives in
`tputrace.analysis.render`. Nothing here imports torch or jax.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from tputrace.analysis.chips import CHIPS, DEFAULT_TARGET, Chip, chip
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.analysis.render import print_report
from tputrace.analysis.report import ANALYZERS, Analyzer, Report, analyze, analyze_path

__all__ = [
    "ANALYZERS", "CHIPS", "DEFAULT_TARGET", "AnalysisResult", "Analyzer", "Chip", "Evidence", "Finding", "Report",
    "analyze", "analyze_path", "chip", "print_top_findings",
]


def print_top_findings(trace_path: str | os.PathLike[str], file: TextIO | None = None, *, limit: int = 3,
                       target: str | None = None) -> None:
    """Print the top `limit` findings of a saved trace (the end of `tputrace run`). Never raises for a
    bad analysis: the run has already finished, so a failure here is one line of output."""
    stream = file if file is not None else sys.stderr
    try:
        report = analyze_path(trace_path, target)
    except Exception as error:  # noqa: BLE001 - the recorded run must still end cleanly
        print(f"tputrace: could not analyse the trace: {error}", file=stream)
        return
    print_report(report, stream, top=limit, brief=True)
