"""A DDP run's fused program of view reads and writes only (its bucket views), named `fused_0_ops` in its
recompiles before."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_problems import ROOT, record

from tputrace.cli.main import main

pytest.importorskip("torch", reason="recording a run needs torch (pip install -e .[backend])")

def test_a_ddp_runs_view_only_program_is_named_by_its_views(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """DDP copies gradients into its buckets through views: the program of those view reads and writes alone,
    compiled again after the buckets' rebuild, is named by them in the summary's recompiles, not `fused_0_ops`."""
    trace = tmp_path / "ddp.tptrace"
    record(ROOT / "examples" / "ddp_train.py", trace, ["--steps", "3"], ("--nproc", "2"))
    capsys.readouterr()
    assert main(["summary", str(trace)]) == 0
    summary = capsys.readouterr().out
    recompiles = summary.split("recompiles:", 1)[1].split("\n\n", 1)[0]
    assert "fused_0_ops" not in summary, recompiles
    assert "view_write" in recompiles and "_view_read" in recompiles, recompiles
