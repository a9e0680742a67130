"""Tensor constants of `torch.export.export` on tpu modules, strict and non-strict, in both eager
modes: a tensor attribute that is neither parameter nor buffer, `torch.tensor(data,
device=x.device)` inside forward (lifted constants, kept on tpu) and `torch.arange`/`torch.zeros`
with `device=x.device` (ops of the graph). The program has the CPU's signature, and its
`.module()`, its decomposed program's and the program's after `torch.export.save`/`load` run new tpu
inputs and match the CPU."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch.export import export

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.backend.core.tensor import TpuTensor

MODES = [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE]


class _ScaledByAttribute(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.scale = torch.randn(4)  # neither parameter nor buffer: a constant of the program

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


class _ShiftedByLiteral(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.tensor([1.0, -2.0, 3.0, 0.5], device=x.device)


class _ShiftedByFactories(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.arange(4, device=x.device) + torch.zeros(x.shape[0], 4, device=x.device)


class _Combined(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.scale = torch.randn(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)


CASES = {
    "attribute": _ScaledByAttribute,
    "literal": _ShiftedByLiteral,
    "factories": _ShiftedByFactories,
    "attribute_and_literal": _Combined,
}


def _on_tpu(module: torch.nn.Module) -> torch.nn.Module:
    """The module on tpu, its plain tensor attributes too (`.to` moves parameters and buffers only)."""
    moved = copy.deepcopy(module).to("tpu")
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor):
            setattr(moved, name, value.to("tpu"))
    return moved


def _signature(program: torch.export.ExportedProgram) -> list[tuple[str, str | None]]:
    return [(spec.kind.name, spec.target) for spec in program.graph_signature.input_specs]


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
@pytest.mark.parametrize("case", list(CASES))
def test_program_with_tensor_constants_runs_new_inputs_and_matches_the_cpu(case: str, strict: bool, mode: EagerMode) -> None:
    torch.manual_seed(0)
    reference, example = CASES[case](), torch.randn(2, 4)
    with eager(mode):
        program = export(_on_tpu(reference), (example.to("tpu"),), strict=strict)
        on_cpu = export(reference, (example,), strict=strict)
        assert _signature(program) == _signature(on_cpu)
        assert {name: type(value) for name, value in program.constants.items()} == dict.fromkeys(on_cpu.constants, TpuTensor)
        decomposed = program.run_decompositions()
        for x in (torch.randn(2, 4), torch.randn(2, 4)):  # new values (the batch size is static)
            for exported in (program, decomposed):
                got = exported.module()(x.to("tpu"))
                assert got.device.type == "tpu" and torch.allclose(host(got), reference(x), atol=1e-5)


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
def test_lifted_constant_holds_the_literal_and_stays_unchanged_by_runs(strict: bool) -> None:
    torch.manual_seed(0)
    reference, x = _Combined(), torch.randn(2, 4)
    program = export(_on_tpu(reference), (x.to("tpu"),), strict=strict)
    module = program.module()
    module(x.to("tpu"))
    literal = [value for name, value in program.constants.items() if name != "scale"]
    assert len(literal) == 1 and torch.equal(host(literal[0]), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(host(program.constants["scale"]), reference.scale)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", ["attribute_and_literal", "factories"])
def test_saved_program_loads_with_its_tpu_state_and_matches_the_cpu(case: str, mode: EagerMode) -> None:
    torch.manual_seed(0)
    reference, example = CASES[case](), torch.randn(2, 4)
    with eager(mode):
        program = export(_on_tpu(reference), (example.to("tpu"),))
        saved = io.BytesIO()
        torch.export.save(program, saved)
        saved.seek(0)
        loaded = torch.export.load(saved)
        assert _signature(loaded) == _signature(program)
        for name, value in [*loaded.state_dict.items(), *loaded.constants.items()]:
            original = program.state_dict.get(name, program.constants.get(name))
            assert type(value) is TpuTensor and torch.equal(host(value), host(original)), name
        assert all(isinstance(value, torch.nn.Parameter) for value in loaded.parameters())
        x = torch.randn(2, 4)
        got = loaded.module()(x.to("tpu"))
        assert got.device.type == "tpu" and torch.allclose(host(got), reference(x), atol=1e-5)
