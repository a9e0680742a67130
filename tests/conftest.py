"""Shared fixtures. Fixture traces come from tests/fixtures/make_traces.py (see its docstring)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.make_traces import build_sample_trace


@pytest.fixture(scope="session")
def sample_trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-rank sample trace, built once per session. Read-only: copy it before changing it."""
    return build_sample_trace(tmp_path_factory.mktemp("traces") / "sample.tptrace")
