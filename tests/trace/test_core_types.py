"""The core's types check: mypy, configured in pyproject.toml, finds no error in the trace format's
constants and the analyzers (the store is checked by `mypy` with the configured files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]


def test_the_analyzers_and_the_schema_type_check() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "tputrace/schema.py", "tputrace/analysis"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-5000:] + completed.stderr[-2000:]
    assert "Success: no issues found" in completed.stdout
