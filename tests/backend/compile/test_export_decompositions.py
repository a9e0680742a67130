"""`ExportedProgram.run_decompositions()` of programs exported from tpu modules: the default table
and a custom one, modules with parameters, running-stat buffers, tied weights and constants, in
both eager modes, static and dynamic input sizes; the decomposed program's `.module()` runs on
tpu and matches torch on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.export import Dim, export

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.tensor import TpuTensor

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


def _case(name: str) -> tuple[torch.nn.Module, torch.Tensor, torch._ops.OpOverload]:
    """A module, an input, and an op that the default table decomposes (a custom table keeps it)."""
    torch.manual_seed(0)
    if name == "linear_layer_norm":
        module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
        return module, torch.randn(2, 4), torch.ops.aten.linear.default
    if name == "batch_norm":
        module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        return module, torch.randn(2, 3, 8, 8), torch.ops.aten.conv2d.default
    module = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    return module, torch.randn(2, 7, 16), torch.ops.aten.linear.default


def _ops(program: torch.export.ExportedProgram) -> set:
    return {node.target for node in program.graph.nodes if node.op == "call_function"}


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("table", ["default", "custom"])
@pytest.mark.parametrize("name", ["linear_layer_norm", "batch_norm", "transformer_encoder_layer"])
def test_decomposed_program_of_a_tpu_module_matches_the_cpu(name: str, table: str, mode: EagerMode) -> None:
    reference, x, kept_op = _case(name)
    with eager(mode):
        program = export(copy.deepcopy(reference).to("tpu"), (x.to("tpu"),))
        if table == "default":
            decomposed = program.run_decompositions()
        else:
            decompositions = torch.export.default_decompositions()
            del decompositions[kept_op]
            decomposed = program.run_decompositions(decompositions)
        assert (kept_op in _ops(decomposed)) == (table == "custom")
        assert all(type(value) is TpuTensor for value in decomposed.state_dict.values())
        module = decomposed.module()
        got = module(x.to("tpu"))
        want = reference(x)
        assert got.device.type == "tpu" and torch.allclose(host(got), want.detach(), atol=1e-5)
        for buffer_name, buffer in reference.named_buffers():  # BatchNorm's running stats, updated in train mode
            assert torch.allclose(host(module.get_buffer(buffer_name)), buffer, atol=1e-6)


def test_decomposing_leaves_the_program_as_it_was_and_can_be_repeated() -> None:
    reference, x, _ = _case("linear_layer_norm")
    program = export(copy.deepcopy(reference).to("tpu"), (x.to("tpu"),))
    values = {node.name: node.meta["val"] for node in program.graph.nodes if "val" in node.meta}
    twice = program.run_decompositions().run_decompositions()
    assert {node.name: node.meta["val"] for node in program.graph.nodes if "val" in node.meta} == values
    assert all(type(value) is TpuTensor for value in program.state_dict.values())
    for result in (program, twice):
        assert torch.allclose(host(result.module()(x.to("tpu"))), reference(x), atol=1e-5)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids))


def test_tied_weights_stay_one_tpu_parameter() -> None:
    torch.manual_seed(0)
    reference, ids = _Tied(), torch.tensor([[1, 2, 3]])
    module = export(copy.deepcopy(reference).to("tpu"), (ids.to("tpu"),)).run_decompositions().module()
    assert module.embedding.weight is module.head.weight
    assert torch.allclose(host(module(ids.to("tpu"))), reference(ids), atol=1e-6)


class _Scaled(torch.nn.Module):
    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.scale = scale  # neither parameter nor buffer: a constant of the program

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_tensor_constant_of_a_strict_export_stays_on_tpu() -> None:
    torch.manual_seed(0)
    reference, x = _Scaled(torch.randn(3)), torch.randn(4, 3)
    on_tpu = copy.deepcopy(reference).to("tpu")
    on_tpu.scale = reference.scale.to("tpu")
    decomposed = export(on_tpu, (x.to("tpu"),), strict=True).run_decompositions()
    assert [type(value) for value in decomposed.constants.values()] == [TpuTensor]
    assert torch.allclose(host(decomposed.module()(x.to("tpu"))), reference(x), atol=1e-6)


_DIMS = {"named": (Dim("rows"), None), "named_range": (Dim("rows", min=2, max=8), 8), "auto": (Dim.AUTO, None)}  # the dim, its max


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
@pytest.mark.parametrize("dim_name", list(_DIMS))
def test_decomposed_program_with_a_dynamic_dim_runs_other_sizes_and_refuses_as_on_the_cpu(dim_name: str, strict: bool) -> None:
    dim, max_rows = _DIMS[dim_name]
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Softmax(-1))
    spec = {"input": {0: dim}}
    program = export(copy.deepcopy(reference).to("tpu"), (torch.randn(4, 3).to("tpu"),), dynamic_shapes=spec, strict=strict)
    decomposed = program.run_decompositions()
    on_cpu = export(reference, (torch.randn(4, 3),), dynamic_shapes=spec, strict=strict).run_decompositions()
    for rows in (4, 6, max_rows or 9):
        x = torch.randn(rows, 3)
        got = decomposed.module()(x.to("tpu"))
        assert got.device.type == "tpu" and torch.allclose(host(got), reference(x), atol=1e-6)
    for outside in [torch.randn(4, 5)] + ([torch.randn(max_rows + 1, 3)] if max_rows else []):
        with pytest.raises(AssertionError) as on_cpu_error:
            on_cpu.module()(outside)
        with pytest.raises(AssertionError) as tpu_error:
            decomposed.module()(outside.to("tpu"))
        assert str(tpu_error.value) == str(on_cpu_error.value)


def test_transformer_layer_decomposed_with_a_dynamic_sequence_length_matches_the_cpu() -> None:
    reference, _, _ = _case("transformer_encoder_layer")
    sequence = Dim("sequence", min=2, max=64)
    program = export(copy.deepcopy(reference).to("tpu"), (torch.randn(2, 7, 16).to("tpu"),), dynamic_shapes={"src": {1: sequence}})
    module = program.run_decompositions().module()
    for length in (3, 7, 12):
        src = torch.randn(2, length, 16)
        got = module(src.to("tpu"))
        assert got.shape == (2, length, 16) and torch.allclose(host(got), reference(src), atol=1e-5)
