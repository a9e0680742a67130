"""An op's or view's record starts its line lookup above the backend's dispatch entry, where its caller last found
the entry: the lines it records are those of a walk of the whole stack, for ops and views from several depths of
the user's code, on the main thread and on autograd's (the backward's records take the line of backward())."""

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


    def shallow(x):
        return (x + x).view(-1)


    def deep(x, depth):
        if depth == 0:
            return shallow(x).sum()
        return deep(x * 2, depth - 1)


    def run(size):
        weight = torch.ones(3, size, device="tpu", requires_grad=True)
        for _ in range(2):
            loss = deep(weight, 2) + shallow(weight).t().sum()
            loss.backward()
        return float(weight.grad.sum())
    """
)


def _record(script: Any, path: Path, mode: str, size: int, skipping: bool) -> dict[int, tuple[int, ...]]:
    """Record `run`; the dispatch entry's depths the lookups found (none when `skipping` is off)."""
    from tputrace.recording import lifecycle

    recorder = lifecycle.start(str(path), script="entry", argv=[], mode=mode)
    if not skipping:
        recorder._dispatch_entry = None
    try:
        script.run(size)
        return {site: tuple(depths) for site, depths in enumerate(recorder._entry_depths) if depths}
    finally:
        lifecycle.stop(0)


def _op_sites(path: Path) -> list[tuple[str, int | None, str | None]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT s.text, f.line, fn.text FROM ops o JOIN strings s ON s.id = o.op_sid LEFT JOIN frames f ON f.id = o.frame_id"
            " LEFT JOIN strings fn ON fn.id = f.function_sid ORDER BY o.seq"
        ).fetchall()


@pytest.fixture
def script(tmp_path: Path) -> Any:
    source = tmp_path / "entry_script.py"
    source.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("entry_script", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line_of(text: str) -> int:
    return SCRIPT.splitlines().index(text) + 1


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_lookups_above_the_dispatch_entry_give_the_whole_walks_lines(script: Any, tmp_path: Path, mode: str) -> None:
    learned = _record(script, tmp_path / "skipping.tptrace", mode, 5, skipping=True)
    assert _record(script, tmp_path / "walking.tptrace", mode, 6, skipping=False) == {}
    assert learned  # the lookups started above the entry
    skipping, walking = _op_sites(tmp_path / "skipping.tptrace"), _op_sites(tmp_path / "walking.tptrace")
    assert skipping == walking
    lines = {(line, function) for _, line, function in skipping}
    assert {(_line_of("    return (x + x).view(-1)"), "shallow"), (_line_of("    return deep(x * 2, depth - 1)"), "deep"),
            (_line_of("        loss.backward()"), "run")} <= lines
    assert any(name.startswith("aten.view") and function == "shallow" for name, _, function in skipping)
