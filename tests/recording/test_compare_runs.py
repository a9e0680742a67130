"""A recompile introduced by a one-line change, caught the ways CI would: the pytest plugin's marker,
`tputrace diff` of the two runs, and `-W error::tputrace.RecompileWarning`. Real runs in strict mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="recording needs torch (pip install -e .[backend])")

LOOP = """import torch
import tputrace

def train(sizes):
    for size in sizes:
        x = torch.ones(size, device="tpu")
        (x * 2).sum()
        tputrace.step()

SIZES = {sizes}
"""
STABLE = "(4, 4, 4)"
GROWING = "(4, 4, 8)"


def _plugin_args() -> list[str]:
    """Load the plugin from this checkout whether or not the installed metadata registers its entry point."""
    return ["-p", "no:tputrace", "-p", "tputrace.pytest_plugin"]


def _project(tmp_path: Path, sizes: str) -> Path:
    (tmp_path / "loop.py").write_text(LOOP.format(sizes=sizes))
    (tmp_path / "test_loop.py").write_text(
        "import pytest\nimport loop\n\n\n@pytest.mark.tputrace(max_recompiles=0)\n"
        "def test_train():\n    loop.train(loop.SIZES)\n"
    )
    return tmp_path


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_plugin_args(), *args],
                          cwd=project, capture_output=True, text=True, timeout=600)


def test_marker_fails_the_test_with_the_line_and_reason(tmp_path: Path) -> None:
    project = _project(tmp_path, GROWING)
    result = _pytest(project, "--tputrace=traces", "test_loop.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "max_recompiles = 0 exceeded" in result.stdout
    assert f"input 0 dim 0: 4 -> 8) at {project / 'loop.py'}:6" in result.stdout
    assert "== tputrace ==" in result.stdout.replace("=" * 10, "==")
    assert list((project / "traces").glob("*.tptrace"))


def test_marker_passes_a_stable_loop(tmp_path: Path) -> None:
    result = _pytest(_project(tmp_path, STABLE), "--tputrace=traces", "test_loop.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_the_option_the_plugin_records_nothing(tmp_path: Path) -> None:
    project = _project(tmp_path, GROWING)
    (project / "test_plain.py").write_text(
        "import sys\n\n\ndef test_plain():\n    assert 'torch' not in sys.modules\n"
        "    assert 'tputrace.backend' not in sys.modules\n"
    )
    result = _pytest(project, "test_plain.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (project / ".tputrace").exists()


def _record(project: Path, sizes: str, name: str, *python_args: str) -> subprocess.CompletedProcess[str]:
    (project / "run.py").write_text(LOOP.format(sizes=sizes) + "\ntrain(SIZES)\n")
    return subprocess.run([sys.executable, *python_args, "-m", "tputrace.cli.main", "run", "--mode", "strict",
                           "-o", str(project / name), "--force", "run.py"],
                          cwd=project, capture_output=True, text=True, timeout=600)


def test_diff_names_the_changed_line_first(tmp_path: Path) -> None:
    assert _record(tmp_path, STABLE, "before.tptrace").returncode == 0
    assert _record(tmp_path, GROWING, "after.tptrace").returncode == 0
    result = subprocess.run([sys.executable, "-m", "tputrace.cli.main", "diff", "before.tptrace", "after.tptrace"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    first_line = result.stdout.splitlines()[0]
    assert first_line.startswith(f"regression: new recompile at {tmp_path / 'run.py'}:6")
    assert "input 0 dim 0: 4 -> 8" in first_line


def test_recompile_warning_as_error_stops_at_the_line(tmp_path: Path) -> None:
    result = _record(tmp_path, GROWING, "after.tptrace", "-W", "error::tputrace.RecompileWarning")
    assert result.returncode != 0
    assert "RecompileWarning: tputrace: aten.fill.Scalar recompiled (input 0 dim 0: 4 -> 8)" in result.stderr
    assert f'File "{tmp_path / "run.py"}", line 6' in result.stderr


def test_marker_under_xdist_records_per_worker_and_fails_the_test(tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is in the test extra")
    project = _project(tmp_path, GROWING)
    (project / "test_other.py").write_text(
        "import pytest\nimport loop\n\n\n@pytest.mark.tputrace(max_recompiles=0)\n"
        "def test_stable():\n    loop.train((4, 4, 4))\n"
    )
    result = _pytest(project, "-n", "2", "--tputrace=traces", "test_loop.py", "test_other.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed" in result.stdout
    assert "max_recompiles = 0 exceeded" in result.stdout
    assert f"input 0 dim 0: 4 -> 8) at {project / 'loop.py'}:6" in result.stdout
    summary = result.stdout[result.stdout.index("tputrace ==="):]  # the controller's summary has every worker's tests
    assert "test_loop.py::test_train: " in summary and "test_other.py::test_stable: " in summary
    workers = sorted(path.name for path in (project / "traces").iterdir() if path.is_dir())
    assert workers and all(name.startswith("gw") for name in workers)
    traces = sorted(path.name for path in (project / "traces").glob("gw*/*.tptrace"))
    assert len(traces) == 2 and any("test_train" in name for name in traces) and any("test_stable" in name for name in traces)
