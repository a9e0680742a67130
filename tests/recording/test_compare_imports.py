"""Comparing a recorded run with an imported capture: what the capture does not record (syncs, transfers,
compiles, a chip's memory) is shown as not recorded on its side and never counted as a change, in `tputrace diff`
(text and JSON) and in budgets; torch.profiler's host memory samples are host memory, not a chip's HBM. Real runs:
`tputrace run` of a small script and `tputrace import` of a torch.profiler capture made here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="recording needs torch (pip install -e .[backend])")

from importers.captures import torch_profiler_capture  # noqa: E402

import tputrace  # noqa: E402
from tputrace.analysis.memory import MemoryData  # noqa: E402
from tputrace.analysis.report import analyze  # noqa: E402

# Three steps, each reading a value from the chip: host syncs, transfers, a recompile (a second shape).
LOOP = """import torch
import tputrace

w = torch.ones(16, 4, device="tpu")
for size in (8, 8, 6):
    x = torch.ones(size, 16, device="tpu")
    print(float((x @ w).relu().sum()))
    tputrace.step()
"""


def tputrace_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tputrace.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def recorded_and_imported(folder: Path) -> tuple[Path, Path]:
    """A trace `tputrace run` recorded of `LOOP`, and one imported from a torch.profiler capture (with its
    host memory samples) made in `folder`."""
    (folder / "loop.py").write_text(LOOP)
    result = tputrace_cli(folder, "run", "--quiet", "-o", "recorded.tptrace", "loop.py")
    assert result.returncode == 0, result.stdout + result.stderr
    capture = torch_profiler_capture(folder)
    result = tputrace_cli(folder, "import", str(capture), "-o", "imported.tptrace")
    assert result.returncode == 0, result.stdout + result.stderr
    return folder / "recorded.tptrace", folder / "imported.tptrace"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return recorded_and_imported(tmp_path_factory.mktemp("compare_imports"))


def _figures(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert result.returncode == 0, result.stdout + result.stderr
    return {figure["name"]: figure for figure in json.loads(result.stdout)["figures"]}


def test_diff_shows_what_the_import_lacks_as_not_recorded(traces: tuple[Path, Path]) -> None:
    recorded, imported = traces
    result = tputrace_cli(recorded.parent, "diff", str(recorded), str(imported))
    assert result.returncode == 0, result.stderr
    lines = {line.split("  ")[1]: line for line in result.stdout.splitlines() if line.startswith("  ") and "  " in line[2:]}
    assert result.stdout.splitlines()[0] == "no regression"
    assert "improved:" not in result.stdout
    for name in ("host syncs", "transfers", "recompiles after warm-up"):
        assert "-> not recorded (B: the capture has no" in lines[name], lines[name]
    assert "-> not recorded (B: the capture records host memory only" in lines["peak memory"]
    assert " -> 0" not in result.stdout.replace(" -> 0 ns", "")
    assert "fixed finding" not in result.stdout and "fixed recompile" not in result.stdout


def test_diff_json_has_no_value_where_a_run_records_none(traces: tuple[Path, Path]) -> None:
    recorded, imported = traces
    for before, after, side in ((recorded, imported, "B"), (imported, recorded, "A")):
        result = tputrace_cli(recorded.parent, "diff", "--json", str(before), str(after))
        document = json.loads(result.stdout)
        figures = _figures(result)
        for name in ("host syncs", "transfers", "compiles", "peak memory"):
            figure = figures[name]
            recorded_value, unrecorded_value = ((figure["before"], figure["after"]) if side == "B"
                                                else (figure["after"], figure["before"]))
            assert unrecorded_value is None and isinstance(recorded_value, int) and recorded_value > 0, figure
            assert not figure["worse"] and side in figure["not_recorded"], figure  # type: ignore[operator]
        assert document["headline"] == "no regression" and document["improved"] is None
        assert not document["findings"] and not document["recompiles"] and not document["programs"]


def test_a_budget_on_what_the_import_lacks_cannot_pass(traces: tuple[Path, Path]) -> None:
    recorded, imported = traces
    budget = recorded.parent / "budget.toml"
    budget.write_text("max_syncs_per_step = 100\nmax_peak_memory_bytes = 1000000000\nmax_cpu_fallbacks = 5\n")
    result = tputrace_cli(recorded.parent, "check", str(imported), "--budget", str(budget))
    assert result.returncode == 1, result.stdout
    assert "max_syncs_per_step = 100 cannot be checked: the trace does not record host syncs" in result.stdout
    assert "max_peak_memory_bytes = 1e+09 cannot be checked: the trace does not record peak memory" in result.stdout
    assert "within budget" not in result.stdout
    assert tputrace_cli(recorded.parent, "check", str(recorded), "--budget", str(budget)).returncode == 0


def test_host_memory_samples_are_labelled_host_memory_not_weighed_against_hbm(traces: tuple[Path, Path]) -> None:
    _, imported = traces
    with tputrace.open(imported) as trace:
        report = analyze(trace, "v5e:1KiB")  # a target whose HBM the host memory's peak would exceed
    memory = report.data(MemoryData)
    assert memory is not None and memory.chips
    host = [chip for chip in memory.chips if chip.chip < 0]
    assert host and all(chip.label == "host memory" and chip.hbm_share is None and chip.peak_bytes > 1024 for chip in host)
    assert [peak.chip for peak in memory.peaks] == [-1] and not memory.fits  # broken down, never fitted to HBM
    assert memory.out_of_memory is None
    assert not any("HBM" in finding.title for finding in report.findings if finding.analyzer == "memory")
