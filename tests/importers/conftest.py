"""Real captures shared by the importer tests, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from captures import jax_capture, torch_profiler_capture, torch_trace_capture


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("captures")
    torch_trace, script = torch_trace_capture(folder)
    return {"jax": jax_capture(folder), "torch_trace": torch_trace, "script": script,
            "profiler": torch_profiler_capture(folder)}
