"""Dynamic dims of tpu inputs under torch.export and torch.compile: `Dim`, `Dim.AUTO` and
`Dim.DYNAMIC` stay symbolic (the program runs on other sizes and matches the CPU, out-of-range
sizes are refused as on the CPU), and `dynamic=True` / `mark_dynamic` compile a frame once for a
sequence length that changes every step, with one XLA compile per length in the trace."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch.export import Dim, export

import tputrace
from backend_helpers import host


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2, dim=-1).sum(0)


def _encoder_layer() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()


def _range_bounds(program: torch.export.ExportedProgram) -> list[tuple[int, int]]:
    return sorted((int(bounds.lower), int(min(bounds.upper, 2**31))) for bounds in program.range_constraints.values())


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
@pytest.mark.parametrize("dim", [Dim("rows"), Dim("rows", min=2, max=64), Dim.AUTO, Dim.DYNAMIC], ids=["named", "named_range", "auto", "dynamic"])
def test_exported_dynamic_dim_stays_symbolic_and_matches_the_cpu(dim: object, strict: bool) -> None:
    example = torch.randn(4, 3)
    spec = {"x": {0: dim}}
    program = export(_Scaled(), (example.to("tpu"),), dynamic_shapes=spec, strict=strict)
    on_cpu = export(_Scaled(), (example,), dynamic_shapes=spec, strict=strict)
    assert _range_bounds(program) == _range_bounds(on_cpu) and len(program.range_constraints) == 1
    for rows in (4, 6, 9):
        x = torch.randn(rows, 3)
        got = program.module()(x.to("tpu"))
        assert got.device.type == "tpu" and torch.allclose(host(got), _Scaled()(x), atol=1e-6)


def test_static_dims_and_ranges_of_an_exported_program_are_enforced_as_on_the_cpu() -> None:
    spec = {"x": {0: Dim("rows", min=2, max=8)}}
    program = export(_Scaled(), (torch.randn(4, 3).to("tpu"),), dynamic_shapes=spec)
    on_cpu = export(_Scaled(), (torch.randn(4, 3),), dynamic_shapes=spec)
    for outside in (torch.randn(9, 3), torch.randn(4, 5)):
        with pytest.raises(AssertionError) as on_cpu_error:
            on_cpu.module()(outside)
        with pytest.raises(AssertionError) as tpu_error:
            program.module()(outside.to("tpu"))
        assert str(tpu_error.value) == str(on_cpu_error.value)


def test_transformer_block_exported_with_a_dynamic_sequence_length_matches_the_cpu() -> None:
    layer = _encoder_layer()
    sequence = Dim("sequence", min=2, max=64)
    program = export(copy.deepcopy(layer).to("tpu"), (torch.randn(2, 7, 16).to("tpu"),), dynamic_shapes={"src": {1: sequence}})
    assert _range_bounds(program) == [(2, 64)]
    for length in (3, 7, 12):
        src = torch.randn(2, length, 16)
        got = program.module()(src.to("tpu"))
        assert got.shape == (2, length, 16) and torch.allclose(host(got), layer(src), atol=1e-5)


def test_export_with_dynamic_dims_leaves_the_input_unmarked_for_torch_compile() -> None:
    x = torch.randn(4, 3).to("tpu")
    export(_Scaled(), (x,), dynamic_shapes={"x": {0: Dim("rows")}})
    assert not hasattr(x._inner, "_dynamo_weak_dynamic_indices")


def _frames_and_xla(trace_path: Path) -> tuple[list, list]:
    with tputrace.open(trace_path) as trace:
        compiles = list(trace.records("compiles"))
    return [row for row in compiles if row.kind == "dynamo_frame"], [row for row in compiles if row.kind == "xla"]


@pytest.mark.parametrize("how", ["dynamic_true", "mark_dynamic"])
def test_transformer_block_compiles_once_for_a_changing_sequence_length(tmp_path: Path, how: str) -> None:
    from tputrace.recording import lifecycle

    layer = _encoder_layer()
    model = copy.deepcopy(layer).to("tpu")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tpu", dynamic=True if how == "dynamic_true" else None)
    lengths = (5, 9, 13)
    trace_path = tmp_path / f"{how}.tptrace"
    lifecycle.start(str(trace_path), script=how, argv=[], mode="compile")
    try:
        with torch.no_grad():
            for length in lengths:
                src = torch.randn(2, length, 16)
                tpu_src = src.to("tpu")
                if how == "mark_dynamic":
                    torch._dynamo.mark_dynamic(tpu_src, 1)
                assert torch.allclose(host(compiled(tpu_src)), layer(src), atol=1e-5)
    finally:
        lifecycle.stop(0)
    frames, xla = _frames_and_xla(trace_path)
    assert [row.reason for row in frames] == ["first"]
    assert [row.reason for row in xla] == ["first", "recompile", "recompile"]
    assert "dim 1: 5 -> 9" in xla[1].diff and "dim 1: 9 -> 13" in xla[2].diff


def test_a_length_that_changes_recompiles_once_then_runs_dynamic(tmp_path: Path) -> None:
    from tputrace.recording import lifecycle

    torch._dynamo.reset()
    compiled = torch.compile(_Scaled(), backend="tpu")
    trace_path = tmp_path / "automatic.tptrace"
    lifecycle.start(str(trace_path), script="automatic", argv=[], mode="compile")
    try:
        for rows in (4, 6, 9):
            x = torch.randn(rows, 3)
            assert torch.allclose(host(compiled(x.to("tpu"))), _Scaled()(x), atol=1e-6)
    finally:
        lifecycle.stop(0)
    frames, _ = _frames_and_xla(trace_path)
    assert [row.reason for row in frames] == ["first", "guard_failure"]
    assert frames[1].diff.endswith("size mismatch at index 0. expected 4, actual 6")
    assert json.loads(frames[1].detail)["call_site"]


def test_a_recording_keeps_dynamo_metrics_of_an_earlier_recording_out(tmp_path: Path) -> None:
    """An eager `while_loop` compiles its wrapper with Dynamo; once `torch._dynamo.reset()` restarts
    the compile ids, that compile's metrics shared an id with the next recording's first frame, which
    was then written twice (once under the wrapper's name)."""
    from torch._higher_order_ops import while_loop

    from tputrace.recording import lifecycle

    lifecycle.start(str(tmp_path / "loop.tptrace"), script="loop", argv=[], mode="eager")
    try:
        steps = torch.zeros((), dtype=torch.int64, device="tpu")
        steps, _ = while_loop(lambda i, z: i < 3, lambda i, z: (i + 1, z * 0.5), (steps, torch.ones(4, device="tpu")))
    finally:
        lifecycle.stop(0)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: torch.softmax(x * 2, dim=-1), backend="tpu")
    trace_path = tmp_path / "compiled.tptrace"
    lifecycle.start(str(trace_path), script="compiled", argv=[], mode="compile")
    try:
        x = torch.randn(4, 3)
        assert torch.allclose(host(compiled(x.to("tpu"))), torch.softmax(x * 2, dim=-1), atol=1e-6)
    finally:
        lifecycle.stop(0)
    frames, _ = _frames_and_xla(trace_path)
    assert [row.reason for row in frames] == ["first"], [row.name for row in frames]
    assert "while_loop" not in frames[0].name
