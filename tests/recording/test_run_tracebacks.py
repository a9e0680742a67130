"""A script's traceback under `tputrace run` reads as on torch's CPU device: an error the tpu backend raised for the
user's call ends at the user's line (the backend's frames hidden and counted; `TPUTRACE_BACKEND_FRAMES=1` keeps
them), and a user's function the backend called (a gradient hook) keeps every frame down to it. The report's header
says how a run that did not end well ended: what it raised, at which user line, or its exit status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tputrace
from tputrace.analysis import analyze_path

pytest.importorskip("torch")
pytest.importorskip("jax")

_SHAPES = textwrap.dedent("""
    import torch

    def project(x, w):
        return x @ w

    x = torch.ones(4, 8, device="tpu")
    w = torch.ones(3, 8, device="tpu")
    project(x, w)
""")

_HOOK = textwrap.dedent("""
    import torch

    def check_gradient(grad):
        raise ValueError("gradient rejected")

    w = torch.ones(4, device="tpu", requires_grad=True)
    w.register_hook(check_gradient)
    (w * 2).sum().backward()
""")


def _run(tmp_path: Path, body: str, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "train.py"
    script.write_text(body)
    trace_path = tmp_path / "run.tptrace"
    result = subprocess.run([str(Path(sys.executable).parent / "tputrace"), "run", "-o", str(trace_path), str(script)],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, **env})
    return result, trace_path


def _traceback(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    return [line for line in lines[start:] if line.startswith("  File ")]


def test_a_shape_error_ends_at_the_users_line(tmp_path: Path) -> None:
    result, trace_path = _run(tmp_path, _SHAPES)
    assert result.returncode == 1
    script = str(tmp_path / "train.py")
    assert _traceback(result.stderr) == [f'  File "{script}", line 9, in <module>', f'  File "{script}", line 5, in project']
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x8 and 3x8)" in result.stderr
    assert "frames inside tputrace's tpu backend hidden; TPUTRACE_BACKEND_FRAMES=1 shows them" in result.stderr
    with tputrace.open(trace_path) as trace:
        assert "backend" not in (trace.run.error or "").replace("tpu backend hidden", "")
    assert analyze_path(trace_path).ending == (
        "the script raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x8 and 3x8) at train.py:5 in "
        "project() (exit 1): findings cover the run up to there")


def test_backend_frames_are_kept_when_asked(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, _SHAPES, TPUTRACE_BACKEND_FRAMES="1")
    frames = _traceback(result.stderr)
    assert len(frames) > 2 and any("/backend/" in frame for frame in frames[2:])
    assert "hidden" not in result.stderr


def test_a_users_hook_the_backend_called_keeps_its_frames(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, _HOOK)
    assert result.returncode == 1
    assert "ValueError: gradient rejected" in result.stderr
    assert _traceback(result.stderr)[-1] == f'  File "{tmp_path / "train.py"}", line 5, in check_gradient'


@pytest.mark.parametrize(("ending", "expected"), [("raise SystemExit(3)", "exit 3"), ("print('done')", None)])
def test_the_reports_header_says_an_exit_status_other_than_0(tmp_path: Path, ending: str, expected: str | None) -> None:
    result, trace_path = _run(tmp_path, f"import torch\ntorch.ones(2, device='tpu').sum().item()\n{ending}\n")
    assert result.returncode == (3 if expected else 0), result.stderr[-2000:]
    assert analyze_path(trace_path).ending == expected
