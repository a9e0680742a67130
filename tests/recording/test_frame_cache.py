"""The recorder finds each op's user line once per call site (code object and instruction) and keeps it: a
recording with that cache gives every op and every compile the same frame as a recording that walks and
interns the stack anew for each op, through recursion and with several calls on one line."""

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


    def descend(x, depth):
        if depth == 0:
            return x
        return descend(x * 2, depth - 1) + 1


    def both(x):
        return torch.sin(x) + torch.cos(x)


    def run(size):
        x = torch.ones(3, size, device="tpu")
        for _ in range(3):
            total = descend(x, 3) + both(x)
        return float(total.sum())
    """
)
RECURSIVE_LINE = "    return descend(x * 2, depth - 1) + 1"
BOTH_LINE = "    return torch.sin(x) + torch.cos(x)"


class _Forgetful(dict):
    """A cache that keeps nothing: every lookup misses, so each op's frame is found from its stack."""

    def __setitem__(self, key: Any, value: Any) -> None:
        return None


def _record(script: Any, path: Path, mode: str, size: int, cached: bool) -> None:
    from tputrace.recording import lifecycle

    recorder = lifecycle.start(str(path), script="sites", argv=[], mode=mode)
    if not cached:
        recorder._line_frame_ids = _Forgetful()
        recorder._call_frame_ids = _Forgetful()
    try:
        script.run(size)
    finally:
        lifecycle.stop(0)


def _op_sites(path: Path) -> list[tuple[str, int, str]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT s.text, f.line, fn.text FROM ops o JOIN strings s ON s.id = o.op_sid LEFT JOIN frames f ON f.id = o.frame_id"
            " LEFT JOIN strings fn ON fn.id = f.function_sid ORDER BY o.seq"
        ).fetchall()


def _compile_sites(path: Path) -> list[tuple[str, int, int | None, int | None]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT s.text, f.line, f.col, f.end_col FROM compiles c JOIN strings s ON s.id = c.name_sid JOIN frames f ON f.id = c.frame_id"
            " WHERE c.kind = 'op' ORDER BY c.id"
        ).fetchall()


@pytest.fixture
def script(tmp_path: Path) -> Any:
    source = tmp_path / "sites_script.py"
    source.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("sites_script", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line_of(text: str) -> int:
    return SCRIPT.splitlines().index(text) + 1


@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_cached_frames_match_the_stack_walk(script: Any, tmp_path: Path, mode: str) -> None:
    # Each recording uses shapes of its own, so each compiles its own programs (and records their sites).
    _record(script, tmp_path / "cached.tptrace", mode, 7, cached=True)
    _record(script, tmp_path / "walked.tptrace", mode, 8, cached=False)
    cached, walked = _op_sites(tmp_path / "cached.tptrace"), _op_sites(tmp_path / "walked.tptrace")
    assert cached == walked
    recursive, both = _line_of(RECURSIVE_LINE), _line_of(BOTH_LINE)
    lines_by_function = {(line, function) for _, line, function in cached}
    assert {(recursive, "descend"), (both, "both")} <= lines_by_function
    # Three steps, three levels of recursion: a multiply and an add at each, all on the one line.
    assert sum(1 for name, line, _ in cached if line == recursive and name.startswith("aten.mul")) == 9
    assert {name for name, line, _ in cached if line == both} >= {"aten.sin.default", "aten.cos.default", "aten.add.Tensor"}

    if mode == "strict":
        cached_compiles = _compile_sites(tmp_path / "cached.tptrace")
        assert cached_compiles == _compile_sites(tmp_path / "walked.tptrace")
        columns = {name: (col, end_col) for name, line, col, end_col in cached_compiles if line == both}
        assert columns["aten.sin.default"] == (BOTH_LINE.index("torch.sin"), BOTH_LINE.index(" + torch.cos"))
        assert columns["aten.cos.default"] == (BOTH_LINE.index("torch.cos"), len(BOTH_LINE))
