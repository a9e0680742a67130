"""The memory analyzer on real runs of a model that does not fit a scaled-down target chip (strict and DeferAndFuse):
the peak's breakdown by kind, module and line sums to the measured peak, the report names the modules and lines
at the peak and a change that fits it; an out-of-memory failure leads the report with its live set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tputrace
from tputrace.analysis.chips import chip
from tputrace.analysis.memory import MemoryData
from tputrace.analysis.memory_fit import padded_bytes
from tputrace.analysis.report import analyze
from tputrace.cli.main import main

MODES = ("strict", "defer")
TARGET = "v5e:8MiB"


def _memory(path: Path, target: str = TARGET) -> MemoryData:
    with tputrace.open(path) as trace:
        return analyze(trace, target=target).data(MemoryData)


@pytest.mark.parametrize("mode", MODES)
def test_the_peak_breakdown_sums_to_the_measured_peak(transformer_traces: dict[str, Path], mode: str) -> None:
    peak = _memory(transformer_traces[mode]).peaks[0]
    assert abs(sum(part.bytes for part in peak.parts) - peak.measured_peak_bytes) <= 0.05 * peak.measured_peak_bytes
    assert sum(nbytes for _, nbytes in peak.by_kind) == sum(part.bytes for part in peak.parts)
    assert any(part.module is not None and part.module.startswith("TinyTransformer.blocks.") for part in peak.parts)


@pytest.mark.parametrize("mode", MODES)
def test_a_run_over_the_target_names_the_peak_and_a_change_that_fits(transformer_traces: dict[str, Path], mode: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fit = _memory(transformer_traces[mode]).fits[0]
    assert not fit.fits and fit.over_bytes == fit.padded_peak_bytes - fit.hbm_bytes
    fitting = [change for change in fit.changes if change.fits]
    assert fitting and all(change.peak_bytes <= fit.hbm_bytes for change in fitting)
    assert "batch" in {change.change for change in fitting}
    assert main(["report", str(transformer_traces[mode]), "--target", TARGET]) == 0
    first = capsys.readouterr().out.split("\n2. ")[0]
    assert "would not fit the 8.00 MiB HBM" in first
    assert "transformer_train.py:" in first and "TinyTransformer.blocks." in first
    assert "Changes that fit it" in first and "gradient-accumulation" in first


def test_checkpointing_estimates_bytes_saved_per_block(transformer_traces: dict[str, Path]) -> None:
    changes = _memory(transformer_traces["strict"]).fits[0].changes
    checkpoint = next(change for change in changes if change.change == "checkpoint")
    assert checkpoint.saves_bytes > 0 and "TinyTransformer.blocks.0" in checkpoint.description


def test_a_run_that_fits_the_target_has_no_memory_finding(transformer_traces: dict[str, Path]) -> None:
    with tputrace.open(transformer_traces["strict"]) as trace:
        report = analyze(trace, target="v5e")
    assert report.data(MemoryData).fits[0].fits
    assert not [finding for finding in report.findings if finding.analyzer == "memory"]


def test_padding_to_native_tiles() -> None:
    v5e = chip("v5e")
    assert padded_bytes((64, 64), "float32", v5e) == 64 * 128 * 4
    assert padded_bytes((3, 64), "bfloat16", v5e) == 16 * 128 * 2
    assert padded_bytes((2, 5, 200), "float32", v5e) == 2 * 8 * 256 * 4


def test_an_out_of_memory_failure_leads_the_report_with_its_live_set(tmp_path: Path) -> None:
    script = tmp_path / "too_big.py"
    script.write_text(
        "import torch\n"
        "kept = [torch.ones(256, 256, device='tpu') for _ in range(4)]\n"
        "huge = torch.ones(1 << 20, 1 << 20, device='tpu')\n"
    )
    trace_path = tmp_path / "too_big.tptrace"
    result = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "run", "--mode", "strict", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "ran out of memory on tpu:0 at too_big.py:3; most held by too_big.py:2" in result.stderr
    oom = _memory(trace_path).out_of_memory
    assert oom is not None and oom.cause == "error"
    assert (oom.file, oom.line) == (str(script), 3)
    assert oom.live.bytes >= 4 * 256 * 256 * 4
