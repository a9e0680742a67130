"""The on-disk compile cache (`tputrace run --compile-cache DIR`): a second run of a script loads its
programs instead of compiling them, computes the same values, and its trace says which compiles were
loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tputrace import open as open_trace
from tputrace.analysis import analyze
from tputrace.analysis.render import finding_lines
from tputrace.schema import COMPILE_CACHE_META_KEY

SCRIPT = textwrap.dedent(
    """
    import torch
    weights = torch.arange(64, dtype=torch.float32, device="tpu").reshape(8, 8) / 64
    for step in range(3):
        total = (weights @ weights).relu().sum() + step
        print(f"{float(total):.6f}")
    """
)


# Strict mode, a length that changes each step: a recompile storm, and compiling most of the run.
STORM_SCRIPT = textwrap.dedent(
    """
    import torch
    import tputrace
    weights = torch.ones(16, 16, device="tpu")
    for step in range(5):
        batch = torch.ones(8 + 4 * step, 16, device="tpu")
        print(float((batch @ weights).relu().sum()))
        tputrace.step()
    """
)


def _run(script: Path, trace: Path, mode: str, cache: Path | str | None) -> subprocess.CompletedProcess[str]:
    caching = [] if cache is None else ["--compile-cache", str(cache)]
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--mode", mode, *caching, "-o", str(trace), str(script)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=script.parent)


def _compile_details(trace: Path) -> list[dict]:
    with open_trace(trace) as opened:
        return [json.loads(record.detail) if record.detail else {} for record in opened.records("compiles")]


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_second_run_loads_every_program_from_the_cache(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "matmuls.py"
    script.write_text(SCRIPT)
    cache = tmp_path / "programs"
    first = _run(script, tmp_path / "first.tptrace", mode, cache)
    second = _run(script, tmp_path / "second.tptrace", mode, cache)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert second.stdout == first.stdout and len(first.stdout.split()) == 3

    first_details = _compile_details(tmp_path / "first.tptrace")
    second_details = _compile_details(tmp_path / "second.tptrace")
    assert first_details and not any(detail.get("loaded_from_disk") for detail in first_details)
    assert len(second_details) == len(first_details)
    assert all(detail.get("loaded_from_disk") is True for detail in second_details)
    with open_trace(tmp_path / "second.tptrace") as opened:
        assert opened.compile_stats().loaded_from_disk == len(second_details)
    assert f"{len(second_details)} loaded from the compile cache" in second.stderr
    assert "loaded from the compile cache" not in first.stderr


def test_unusable_cache_directory_is_a_one_line_error(tmp_path: Path) -> None:
    script = tmp_path / "matmuls.py"
    script.write_text(SCRIPT)
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    result = _run(script, tmp_path / "trace.tptrace", "defer", not_a_directory / "cache")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"tputrace: error: --compile-cache {not_a_directory / 'cache'} cannot be used as a directory (Not a directory)\n"
    assert not (tmp_path / "trace.tptrace").exists()
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(tmp_path / "trace.tptrace"), str(script)]
    environment = {**os.environ, "TPUTRACE_COMPILE_CACHE": str(not_a_directory / "cache")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environment)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("tputrace: error: TPUTRACE_COMPILE_CACHE="), result.stderr
    assert not (tmp_path / "trace.tptrace").exists()


def test_the_report_counts_loads_and_suggests_the_cache_only_to_a_run_without_it(tmp_path: Path) -> None:
    script = tmp_path / "lengths.py"
    script.write_text(STORM_SCRIPT)
    cache = tmp_path / "programs"
    # The filling run names the cache relative to its working directory, as a user may.
    given = {"uncached": None, "filling": cache.name, "loading": cache}
    runs = {name: _run(script, tmp_path / f"{name}.tptrace", "strict", directory) for name, directory in given.items()}
    assert all(run.returncode == 0 for run in runs.values()), [run.stderr for run in runs.values()]
    assert runs["loading"].stdout == runs["uncached"].stdout
    reports = {}
    for name in runs:
        with open_trace(tmp_path / f"{name}.tptrace") as opened:
            reports[name] = (analyze(opened), opened.compile_stats(), opened.meta.get(COMPILE_CACHE_META_KEY))

    report, stats, directory = reports["uncached"]
    (suggestion,) = report.results["compile_cache"].findings
    assert directory is None and stats.loaded_from_disk == 0
    assert "--compile-cache DIR" in suggestion.suggestion
    assert suggestion.severity == "info" and suggestion.cost_total_ns == 0  # it shortens later runs, not this one
    assert finding_lines(1, suggestion)[1].text.startswith("no cost to this run")
    assert report.results["compile_cache"].data.compiled_share >= 0.25

    report, stats, directory = reports["filling"]  # the cache is on but empty: nothing to load, nothing to suggest
    assert directory == str(cache) and stats.loaded_from_disk == 0  # the trace names the directory absolutely
    assert not report.results["compile_cache"].findings

    report, stats, _ = reports["loading"]
    assert not report.results["compile_cache"].findings and stats.loaded_from_disk == stats.count
    # The batch's one changing size drives every op's storm: one finding covers their compiles.
    (storm,) = [finding for finding in report.results["recompiles"].findings if "aten.mm" in finding.explanation]
    compiles = int(storm.title.split(" compiled ")[1].split()[0])
    assert compiles >= sum(data.compiles for data in report.results["recompiles"].data.storms if data.name == "aten.mm.default")
    assert f"all {compiles} were loads from the compile cache (--compile-cache)" in storm.explanation
