"""The on-disk compile cache (`tputrace run --compile-cache DIR`): a second run of a script loads its
programs instead of compiling them, computes the same values, and its trace says which compiles were
loads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tputrace import open as open_trace

SCRIPT = textwrap.dedent(
    """
    import torch
    weights = torch.arange(64, dtype=torch.float32, device="tpu").reshape(8, 8) / 64
    for step in range(3):
        total = (weights @ weights).relu().sum() + step
        print(f"{float(total):.6f}")
    """
)


def _run(script: Path, trace: Path, mode: str, cache: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tputrace.cli.main", "run", "--mode", mode, "--compile-cache", str(cache), "-o", str(trace), str(script)]
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
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("tputrace: error: TPUTRACE_COMPILE_CACHE="), result.stderr
    assert not (tmp_path / "trace.tptrace").exists()
