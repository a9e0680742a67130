"""The line that made each host tensor copied to the chip (`transfers.origin_frame_id`), recorded in-process:
watched makers while recording, nothing changed after it, and `TPUTRACE_HOST_ORIGINS=0` turning it off."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import tputrace
from tputrace import settings

torch = pytest.importorskip("torch")

from tputrace.recording import lifecycle  # noqa: E402


def _copy_batches() -> dict[str, int]:
    """Copies three made batches and one tensor no watched function made; returns the line of each maker."""
    lines = {}
    rows = torch.tensor([[1, 2, 3], [4, 5, 0]]); lines["tensor"] = inspect.currentframe().f_lineno  # noqa: E702
    padded = torch.nn.utils.rnn.pad_sequence([torch.ones(2), torch.ones(5)], batch_first=True); lines["pad_sequence"] = inspect.currentframe().f_lineno  # noqa: E702, E501
    stacked = torch.stack([torch.ones(3), torch.zeros(3)]); lines["stack"] = inspect.currentframe().f_lineno  # noqa: E702
    derived = rows + 1  # an op's result: no watched function made it
    for tensor in (rows, padded, stacked, derived):
        tensor.to("tpu")
    return lines


def _record(path: Path) -> dict[str, int]:
    lifecycle.start(str(path), script="test_host_origins", argv=[], mode="defer")
    try:
        return _copy_batches()
    finally:
        lifecycle.stop(0)


def _origins(path: Path) -> list[tuple[int, int | None]]:
    with tputrace.open(path) as trace:
        return [(record.bytes, record.origin.line if record.origin else None)
                for record in trace.records("transfers", where="direction = 'h2d'")]


def test_copies_record_the_line_that_made_them(tmp_path: Path) -> None:
    original = torch.tensor
    lines = _record(tmp_path / "origins.tptrace")
    assert _origins(tmp_path / "origins.tptrace") == [
        (6 * 8, lines["tensor"]), (2 * 5 * 4, lines["pad_sequence"]), (2 * 3 * 4, lines["stack"]), (6 * 8, None),
    ]
    assert torch.tensor is original  # the makers are put back when the recording stops
    with tputrace.open(tmp_path / "origins.tptrace") as trace:
        (file, function), = {tuple(row) for row in trace.sql(
            "SELECT origin_file, origin_function FROM transfers_v WHERE origin_frame_id IS NOT NULL")}
    assert (file, function) == (__file__, "_copy_batches")


def test_host_origins_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.HOST_ORIGINS, "0")
    _record(tmp_path / "off.tptrace")
    assert [origin for _, origin in _origins(tmp_path / "off.tptrace")] == [None] * 4


def test_a_bad_host_origins_value_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.HOST_ORIGINS, "yes")
    with pytest.raises(settings.SettingError, match=r"TPUTRACE_HOST_ORIGINS='yes' must be 0 \(off\) or 1"):
        settings.check()


def _padded(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.stack([x, x]), (0, 2)) + torch.zeros(2, 5)


def test_watched_makers_work_where_torch_knows_them_by_identity(tmp_path: Path) -> None:
    """TorchScript compiles a call of a watched maker as its op; `with torch.device("tpu")` still places factories."""
    lifecycle.start(str(tmp_path / "identity.tptrace"), script="test_host_origins", argv=[], mode="defer")
    try:
        scripted = torch.jit.script(_padded)(torch.ones(3))
        with torch.device("tpu"):
            placed = torch.nn.Linear(4, 2).weight.device.type, torch.zeros(3).device.type
        padded = torch.nn.utils.rnn.pad_sequence([torch.ones(1), torch.ones(3)])
    finally:
        lifecycle.stop(0)
    assert scripted.tolist() == [[1.0, 1.0, 1.0, 0.0, 0.0]] * 2
    assert placed == ("tpu", "tpu")
    assert padded.shape == (3, 2)


def test_torchscript_forgets_the_wrappers_when_they_are_removed() -> None:
    """TorchScript compiles a call of a wrapped maker as the op it wraps, knowing the wrapper by its id. Once the
    wrappers are removed, no id of theirs may stay in that table: a function made later at a freed wrapper's
    address would compile as `aten::pad_sequence` or `aten::zeros` (torch's jvp decompositions failed so)."""
    from torch.jit import _builtins

    from tputrace.backend.core import host_origins

    was_installed = bool(host_origins._originals)
    host_origins.install()
    wrappers = [torch.zeros, torch._C._nn.pad_sequence]
    if not all(hasattr(wrapper, "__wrapped__") for wrapper in wrappers):
        pytest.skip("host origins are off (TPUTRACE_HOST_ORIGINS=0)")
    assert all(_builtins._find_builtin(wrapper) is not None for wrapper in wrappers)
    host_origins.uninstall()
    try:
        assert [wrapper.__name__ for wrapper in wrappers if _builtins._find_builtin(wrapper) is not None] == []
    finally:
        if was_installed:
            host_origins.install()
