"""Shared fixtures. Fixture traces come from tests/fixtures/make_traces.py (see its docstring)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.make_traces import build_sample_trace

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def sample_trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-rank sample trace, built once per session. Read-only: copy it before changing it."""
    return build_sample_trace(tmp_path_factory.mktemp("traces") / "sample.tptrace")


@pytest.fixture(scope="session")
def gpt_train_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/gpt_train.py --steps 4, recorded once per session by `tputrace run` in a subprocess. Read-only."""
    pytest.importorskip("torch", reason="recording an example needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording an example needs jax (pip install -e .[backend])")
    trace_path = tmp_path_factory.mktemp("gpt_train") / "gpt_train.tptrace"
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "run", "-o", str(trace_path),
         str(REPO_ROOT / "examples" / "gpt_train.py"), "--steps", "4"],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


@pytest.fixture(scope="session")
def gpt_train_windowed_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/gpt_train.py --steps 6 recorded with `tputrace run --schedule wait=1,warmup=1,active=3` (steps
    2-4 kept), once per session in a subprocess. Read-only."""
    pytest.importorskip("torch", reason="recording an example needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording an example needs jax (pip install -e .[backend])")
    trace_path = tmp_path_factory.mktemp("gpt_train_windowed") / "gpt_train_windowed.tptrace"
    result = subprocess.run(
        [sys.executable, "-m", "tputrace.cli.main", "run", "--schedule", "wait=1,warmup=1,active=3", "-o", str(trace_path),
         str(REPO_ROOT / "examples" / "gpt_train.py"), "--steps", "6"],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return trace_path


@pytest.fixture(scope="module", autouse=True)
def _compiled_programs_dropped_after_each_module() -> Iterator[None]:
    """After each test file that used the tpu device, its compiled programs go: one process runs the whole
    suite, and XLA:CPU maps memory regions per program it keeps, up to Linux's per-process cap."""
    yield
    if "tputrace.backend.core.executor" in sys.modules:
        from tputrace.backend.core.executor import forget_compiled_programs

        forget_compiled_programs()


@pytest.fixture(scope="session")
def transformer_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tests/fixtures/transformer_train.py recorded once per session in strict and DeferAndFuse mode by
    `tputrace run` in a subprocess, by mode ('strict', 'defer'). Read-only."""
    pytest.importorskip("torch", reason="recording a script needs torch (pip install -e .[backend])")
    pytest.importorskip("jax", reason="recording a script needs jax (pip install -e .[backend])")
    folder = tmp_path_factory.mktemp("transformer")
    traces = {}
    for mode in ("strict", "defer"):
        trace_path = traces[mode] = folder / f"transformer-{mode}.tptrace"
        result = subprocess.run(
            [sys.executable, "-m", "tputrace.cli.main", "run", "--quiet", "--mode", mode, "-o", str(trace_path),
             str(REPO_ROOT / "tests" / "fixtures" / "transformer_train.py")],
            capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    return traces
