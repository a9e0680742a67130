"""The core's types check: mypy, configured in pyproject.toml, finds no error in the trace format's
constants, the store, the derived figures and the analyzers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]
CORE = ("tputrace/schema.py", "tputrace/store", "tputrace/derived", "tputrace/analysis")


def test_the_core_type_checks() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", *CORE],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-5000:] + completed.stderr[-2000:]
    assert "Success: no issues found" in completed.stdout
