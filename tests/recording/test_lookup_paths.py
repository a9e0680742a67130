"""The backend reaches a deferred op's record along paths of different depths (a plain op, an in-place op, a list
op): its line lookup keeps the dispatch entry's depth of each path, so no lookup after the first of each path walks
the backend's frames, and the lines are those of the whole walk. A module call recorded with its path still runs
the module's compiled call where it has one (`module.compile()`)."""

from __future__ import annotations

import importlib.util
import sqlite3
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")

SCRIPT = textwrap.dedent(
    """
    import torch


    def run():
        x = torch.ones(4, device="tpu")
        ys = [torch.ones(4, device="tpu") for _ in range(2)]
        for _ in range(3):
            y = x * 2
            y.add_(1)
            torch._foreach_mul_(ys, 2.0)
            x = y.view(2, 2).view(-1)
        return float(x.sum()) + float(ys[0].sum())
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Any:
    source = tmp_path / "paths_script.py"
    source.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("paths_script", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(script: Any, path: Path, skipping: bool) -> list[list[int]]:
    from tputrace.recording import lifecycle

    recorder = lifecycle.start(str(path), script="paths", argv=[], mode="defer")
    if not skipping:
        recorder._dispatch_entry = None
    try:
        script.run()
        return [list(depths) for depths in recorder._entry_depths]
    finally:
        lifecycle.stop(0)


def _lines(path: Path) -> list[tuple[str, int | None]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT s.text, f.line FROM ops o JOIN strings s ON s.id = o.op_sid LEFT JOIN frames f ON f.id = o.frame_id ORDER BY o.seq"
        ).fetchall()


def test_each_path_to_a_deferred_record_keeps_its_entry_depth(script: Any, tmp_path: Path) -> None:
    from tputrace.recording.user_frames import OP_DEFERRED

    depths = _record(script, tmp_path / "skipping.tptrace", skipping=True)
    assert len(depths[OP_DEFERRED]) >= 2  # the plain op's and the in-place or list op's paths, both kept
    _record(script, tmp_path / "walking.tptrace", skipping=False)
    skipping, walking = _lines(tmp_path / "skipping.tptrace"), _lines(tmp_path / "walking.tptrace")
    assert skipping == walking
    assert {line for _, line in skipping} >= {SCRIPT.splitlines().index(text) + 1 for text in (
        "        y = x * 2", "        y.add_(1)", "        torch._foreach_mul_(ys, 2.0)", "        x = y.view(2, 2).view(-1)")}


def test_a_recorded_module_call_runs_its_compiled_call(tmp_path: Path) -> None:
    """`module.compile()` sets `_compiled_call_impl` (its compiled `_call_impl`), which torch's `__call__` runs
    instead of `_call_impl`: the recording's module call runs it too."""
    import torch

    from tputrace.recording import lifecycle

    module = torch.nn.Linear(3, 3)
    calls: list[int] = []

    def compiled_call(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args))
        return module._call_impl(*args, **kwargs)

    module._compiled_call_impl = compiled_call
    lifecycle.start(str(tmp_path / "compiled.tptrace"), script="compiled", argv=[], mode="defer")
    try:
        result = module(torch.ones(2, 3))
    finally:
        lifecycle.stop(0)
    assert calls == [1]
    torch.testing.assert_close(result, torch.nn.functional.linear(torch.ones(2, 3), module.weight, module.bias))
