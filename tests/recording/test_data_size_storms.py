"""Recompilation storms whose changing size the data chose (`x[mask]`, nonzero) name the line that made
the size and give a fixed-shape fix; a size from the script's inputs (a sequence length per batch) keeps
the collate_fn padding advice.

Each trace comes from a real `tputrace run` of a small script in a subprocess; the counts its masks
select span many length buckets, so the run recompiles however finely the backend buckets lengths.
The analysis runs here (it imports neither torch nor jax).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tputrace.analysis import Finding, Report, analyze_path
from tputrace.analysis.data_sizes import explains, result_length
from tputrace.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

# Each step's mask selects `count` of 64 rows: counts far apart, so no two share a padded length.
MASKED_LOSS = """
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 5).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
features = torch.randn(64, 8).to("tpu")
labels = torch.randint(0, 5, (64,)).to("tpu")
scores = torch.arange(64, device="tpu")
for count in (5, 19, 23, 27, 31, 38, 46, 55, 63):
    mask = scores < count
    loss = F.cross_entropy(model(features)[mask], labels[mask])  # the size: mask's count
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(float(loss))
"""

NONZERO_GATHER = """
import torch
from torch import nn

model = nn.Linear(4, 4).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
values = torch.arange(128, device="tpu")
table = torch.randn(128, 4).to("tpu")
for count in (9, 21, 26, 30, 37, 45, 53, 61, 77):
    picked = torch.nonzero(values < count).squeeze(1)  # the size: nonzero's count
    loss = model(table[picked]).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(float(loss))
"""

# The sequence length comes from the batch itself: the data pipeline decides it.
VARIABLE_LENGTH = """
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50)).to("tpu")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for length in (12, 20, 28, 36, 44, 52, 60):
    tokens = torch.randint(0, 50, (4, length)).to("tpu")  # the size: each batch's length
    loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(float(loss))
"""


Recorded = tuple[Path, Report]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Recorded]:
    """Write a script, run it under `tputrace run --mode mode` and analyse its trace (once per script and mode)."""
    runs: dict[tuple[str, str], Recorded] = {}

    def run(source: str, mode: str) -> Recorded:
        if (source, mode) not in runs:
            folder = tmp_path_factory.mktemp("storms")
            script, trace = folder / "train.py", folder / "train.tptrace"
            script.write_text(source)
            command = [sys.executable, "-m", "tputrace.cli.main", "run", "--mode", mode, "-o", str(trace), str(script)]
            completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
            assert completed.returncode == 0, completed.stderr[-3000:]
            runs[source, mode] = script, analyze_path(trace)
        return runs[source, mode]

    return run


def line_of(script: Path, marker: str) -> int:
    (line,) = [number for number, text in enumerate(script.read_text().splitlines(), 1) if marker in text]
    return line


def storm_findings(report: Report) -> list[Finding]:
    return [finding for finding in report.findings if finding.analyzer == "recompiles"]


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_a_storm_of_mask_counts_names_the_mask_line_and_the_mask_fix(record: Callable[[str, str], Recorded], mode: str) -> None:
    script, report = record(MASKED_LOSS, mode)
    mask_line = line_of(script, "the size: mask's count")
    storms = storm_findings(report)
    assert storms, [finding.title for finding in report.findings]
    # Every program the count reached (forward and backward; each op's in strict mode) is one finding.
    (finding,) = storms
    assert finding.file == str(script) and finding.line == mask_line
    assert f"the count of a boolean mask at train.py:{mask_line}" in finding.title
    assert "weight by the mask" in finding.suggestion and "torch.where(mask, x, 0)" in finding.suggestion
    assert "collate_fn" not in finding.suggestion
    assert finding.cost_total_ns > 0
    data = report.results["recompiles"].data.storms
    assert all(storm.size_from is not None and storm.size_from.where == f"train.py:{mask_line}" for storm in data)
    assert all(storm.proposed is None for storm in data)  # no bucket proposal for the HTML report either
    # The finding's cost: its storms' recompiles, counted once, and the programs compiled again only for
    # new lengths (same signature: no storm sees them; in DEFER_AND_FUSE the fused program takes the
    # padded length as a non-tensor argument, so there may be no storm at all).
    (size_storm,) = report.results["recompiles"].data.data_size_storms
    assert size_storm.where == f"train.py:{mask_line}" and size_storm.what == "the count of a boolean mask"
    assert data or size_storm.length_recompiles >= 3
    expected_ns = sum(storm.recompile_ns for storm in data) + size_storm.length_recompile_ns
    assert finding.cost_total_ns == pytest.approx(expected_ns)


def test_a_storm_of_nonzero_counts_names_the_nonzero_line(record: Callable[[str, str], Recorded]) -> None:
    script, report = record(NONZERO_GATHER, "strict")
    (finding,) = storm_findings(report)
    nonzero_line = line_of(script, "the size: nonzero's count")
    assert finding.line == nonzero_line
    assert f"the count of nonzero elements at train.py:{nonzero_line}" in finding.title
    assert "nonzero_static" in finding.suggestion and "collate_fn" not in finding.suggestion
    (size_storm,) = report.results["recompiles"].data.data_size_storms
    assert size_storm.length_recompiles >= 1  # nonzero's own program, compiled for the counts' lengths


def test_fragmented_fusion_by_a_mask_leaves_the_compiles_to_the_storm(record: Callable[[str, str], Recorded]) -> None:
    """In DEFER_AND_FUSE the mask's count cuts each step's graph, and the host waits while the new program
    for each count compiles: those compiles are the storm's cost, not the fusion finding's as well."""
    _, report = record(MASKED_LOSS, "defer")
    (storm,) = storm_findings(report)
    compile_ns = report.results["recompiles"].data.compile_ns
    fusion = [finding for finding in report.findings if finding.analyzer == "fusion"]
    for finding in fusion:
        assert finding.cost_total_ns + storm.cost_total_ns <= report.wall_ns
        assert finding.cost_total_ns < compile_ns


def test_the_html_report_proposes_no_bucketing_for_a_mask_count(record: Callable[[str, str], Recorded], tmp_path: Path) -> None:
    script, report = record(MASKED_LOSS, "strict")  # per-op programs: the count is an input dim of each
    output = tmp_path / "report.html"
    assert main(["plot", report.trace_path, "-o", str(output)]) == 0
    page = output.read_text()
    mask_line = line_of(script, "the size: mask's count")
    assert f"the size is the count of a boolean mask at train.py:{mask_line}, which no padding fixes" in page
    assert "collate_fn" not in page


def test_an_input_sequence_length_keeps_the_padding_advice(record: Callable[[str, str], Recorded]) -> None:
    _, report = record(VARIABLE_LENGTH, "defer")
    storms = storm_findings(report)
    assert storms, [finding.title for finding in report.findings]
    for finding in storms:
        assert "collate_fn" in finding.suggestion
        assert "boolean mask" not in finding.title
    assert all(storm.size_from is None for storm in report.results["recompiles"].data.storms)


def test_result_lengths_read_from_recorded_shapes() -> None:
    assert result_length("aten.index.Tensor", "f32[4,16,100], bool[4,16]", "f32[20,100]") == 20
    assert result_length("aten.index.Tensor", "f32[4,16,100], bool[16]", "f32[4,7,100]") == 7  # x[:, mask]
    assert result_length("aten.index.Tensor", "f32[4,16,100], i64[9]", "f32[9,16,100]") is None  # an index list
    assert result_length("aten.nonzero.default", "bool[4,16]", "i64[9,2]") == 9
    assert result_length("aten._unique2.default", "i64[64]", "i64[11], i64[0], i64[0]") == 11
    assert result_length("aten.masked_select.default", "f32[8], bool[8]", "f32[]") is None


def test_a_size_explains_its_padded_length_and_no_other() -> None:
    assert explains(29, 32) and explains(32, 29)  # 29 padded to 32, either side recorded padded
    assert explains(5, 16)  # short results are all compiled at 16
    assert not explains(20, 32) and not explains(40, 64)
