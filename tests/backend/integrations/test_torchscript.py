"""TorchScript on tpu: scripted and traced modules and functions run, differentiate, save, load and
freeze as on the CPU, keep the device's error messages, and their ops are recorded like eager ops."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch

import tputrace
from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode
from tputrace.cli.main import main

MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _eval_net() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    net[1].running_mean.uniform_(-1, 1)
    net[1].running_var.uniform_(0.5, 2)
    return net


@torch.jit.script
def _halve_until_small(values: torch.Tensor, rounds: int) -> torch.Tensor:
    for _ in range(rounds):
        if bool(values.abs().sum() > 4.0):
            values = values * 0.5
        else:
            values = values + 1.0
    return values.relu()


def _assert_parameters_on_tpu(module: torch.nn.Module) -> None:
    assert [parameter.device.type for parameter in module.parameters()] == ["tpu"] * len(list(module.parameters()))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_scripted_module_forward_and_backward_match_cpu(mode: EagerMode) -> None:
    cpu_net = _net()
    with eager(mode):
        scripted = torch.jit.script(copy.deepcopy(cpu_net)).to("tpu")
        _assert_parameters_on_tpu(scripted)
        for step in range(4):  # the profiling executor specialises the graph after the first runs
            torch.manual_seed(step)
            inputs = torch.randn(5, 3, requires_grad=True)
            chip_inputs = inputs.detach().to("tpu").requires_grad_()
            cpu_net.zero_grad()
            scripted.zero_grad()
            expected, result = cpu_net(inputs), scripted(chip_inputs)
            expected.pow(2).sum().backward()
            result.pow(2).sum().backward()
            torch.testing.assert_close(host(result), expected.detach())
            torch.testing.assert_close(host(chip_inputs.grad), inputs.grad)
            for cpu_parameter, chip_parameter in zip(cpu_net.parameters(), scripted.parameters()):
                torch.testing.assert_close(host(chip_parameter.grad), cpu_parameter.grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_scripted_module_moves_back_to_cpu(mode: EagerMode) -> None:
    cpu_net = _net()
    inputs = torch.randn(4, 3)
    with eager(mode):
        scripted = torch.jit.script(copy.deepcopy(cpu_net)).to("tpu").to("cpu")
        assert {parameter.device.type for parameter in scripted.parameters()} == {"cpu"}
        torch.testing.assert_close(scripted(inputs), cpu_net(inputs))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_traced_module_reruns_on_new_inputs_and_gradients_match(mode: EagerMode) -> None:
    cpu_net = _net()
    with eager(mode):
        chip_net = copy.deepcopy(cpu_net).to("tpu")
        traced = torch.jit.trace(chip_net, torch.randn(5, 3).to("tpu"))
        for step in range(3):
            torch.manual_seed(10 + step)
            inputs = torch.randn(7, 3)
            cpu_net.zero_grad()
            chip_net.zero_grad()
            expected, result = cpu_net(inputs), traced(inputs.to("tpu"))
            expected.sum().backward()
            result.sum().backward()
            torch.testing.assert_close(host(result), expected.detach())
            for cpu_parameter, chip_parameter in zip(cpu_net.parameters(), chip_net.parameters()):
                torch.testing.assert_close(host(chip_parameter.grad), cpu_parameter.grad)


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_scripted_function_with_control_flow_matches_cpu(mode: EagerMode) -> None:
    values = torch.randn(6, 4) * 3
    with eager(mode):
        for rounds in (0, 3, 6):
            torch.testing.assert_close(host(_halve_until_small(values.to("tpu"), rounds)), _halve_until_small(values, rounds))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("map_location", [None, "tpu", "cpu"], ids=["saved_device", "tpu", "cpu_then_to_tpu"])
@pytest.mark.parametrize("to_path", [False, True], ids=["buffer", "path"])
def test_saved_scripted_tpu_module_loads_and_matches_cpu(mode: EagerMode, map_location: str | None, to_path: bool, tmp_path: Path) -> None:
    cpu_net = _eval_net()
    inputs = torch.randn(5, 3)
    with eager(mode):
        scripted = torch.jit.script(copy.deepcopy(cpu_net)).to("tpu")
        if to_path:
            torch.jit.save(scripted, tmp_path / "scripted.pt")
            loaded = torch.jit.load(tmp_path / "scripted.pt", map_location=map_location)
        else:
            archive = io.BytesIO()
            torch.jit.save(scripted, archive)
            archive.seek(0)
            loaded = torch.jit.load(archive, map_location=map_location)
        expected_device = "cpu" if map_location == "cpu" else "tpu"
        assert {tensor.device.type for tensor in (*loaded.parameters(), *loaded.buffers())} == {expected_device}
        loaded = loaded.to("tpu")
        _assert_parameters_on_tpu(loaded)
        torch.testing.assert_close(host(loaded(inputs.to("tpu"))), cpu_net(inputs))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_cpu_saved_scripted_module_loads_onto_tpu(mode: EagerMode) -> None:
    cpu_net = _eval_net()
    inputs = torch.randn(5, 3)
    archive = io.BytesIO()
    torch.jit.save(torch.jit.script(copy.deepcopy(cpu_net)), archive)
    archive.seek(0)
    with eager(mode):
        loaded = torch.jit.load(archive, map_location="tpu")
        _assert_parameters_on_tpu(loaded)
        torch.testing.assert_close(host(loaded(inputs.to("tpu"))), cpu_net(inputs))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_frozen_and_inference_optimised_modules_match_cpu_and_save(mode: EagerMode) -> None:
    cpu_net = _eval_net()
    inputs = torch.randn(5, 3)
    expected = cpu_net(inputs)
    with eager(mode):
        frozen = torch.jit.freeze(torch.jit.script(copy.deepcopy(cpu_net)).to("tpu"))
        optimised = torch.jit.optimize_for_inference(torch.jit.script(copy.deepcopy(cpu_net)).to("tpu"))
        torch.testing.assert_close(host(frozen(inputs.to("tpu"))), expected)
        torch.testing.assert_close(host(optimised(inputs.to("tpu"))), expected)
        archive = io.BytesIO()
        torch.jit.save(frozen, archive)  # the weights are now constants of the graph
        archive.seek(0)
        torch.testing.assert_close(host(torch.jit.load(archive)(inputs.to("tpu"))), expected)


class _WithBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.zeros(3, 3))

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return values @ self.weight


@pytest.mark.parametrize("map_location", [None, "cpu"], ids=["saved_device", "cpu"])
def test_a_strided_view_buffer_saves_and_loads_with_its_strides(map_location: str | None) -> None:
    base = torch.arange(12.0).reshape(4, 3)
    scripted = torch.jit.script(_WithBuffer()).to("tpu")
    scripted.weight = base.to("tpu")[1:].t()  # storage offset 3, strides (1, 3)
    archive = io.BytesIO()
    torch.jit.save(scripted, archive)
    archive.seek(0)
    loaded = torch.jit.load(archive, map_location=map_location)
    assert (loaded.weight.stride(), loaded.weight.storage_offset()) == ((1, 3), 3)
    inputs = torch.randn(2, 3)
    torch.testing.assert_close(host(loaded.to("tpu")(inputs.to("tpu"))), inputs @ base[1:].t())


class _WithTable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.arange(6.0).reshape(2, 3)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return values * self.table


def test_saving_a_tpu_tensor_attribute_that_is_no_buffer_says_what_to_do() -> None:
    scripted = torch.jit.script(_WithTable())
    scripted.table = scripted.table.to("tpu")
    torch.testing.assert_close(host(scripted(torch.ones(2, 3, device="tpu"))), torch.arange(6.0).reshape(2, 3))
    with pytest.raises(RuntimeError, match=r"keep other tensor attributes on the CPU \(or register them as buffers\)"):
        torch.jit.save(scripted, io.BytesIO())


def test_an_error_inside_a_scripted_module_keeps_its_message() -> None:
    scripted = torch.jit.script(torch.nn.Linear(3, 4)).to("tpu")
    with pytest.raises(RuntimeError) as raised:
        scripted(torch.randn(2, 3))
    message = str(raised.value)
    assert "F.linear(input, self.weight, self.bias)" in message  # the interpreter's TorchScript traceback
    assert message.splitlines()[-1] == (
        "DeviceMismatchError: Expected all tensors to be on the same device, but found tpu and cpu; move the cpu tensor with .to('tpu')"
    )


def test_an_error_inside_a_scripted_function_keeps_its_message() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)TorchScript interpreter.*DeviceMismatchError: Expected all tensors"):
        torch.jit.script(_add)(torch.ones(2, device="tpu"), torch.ones(2))


def _add(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    return left + right


def test_ops_run_from_torchscript_are_recorded_at_the_calling_line(tmp_path: Path) -> None:
    script = tmp_path / "scripted.py"
    script.write_text(
        "import torch\n"
        "net = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))).to('tpu')\n"
        "x = torch.randn(5, 3, device='tpu')\n"
        "for step in range(3):\n"
        "    out = net(x)\n"
        "    out.sum().backward()\n"
        "print(out.sum().item())\n"
    )
    trace_path = tmp_path / "scripted.tptrace"
    assert main(["run", "-o", str(trace_path), str(script)]) == 0
    with tputrace.open(trace_path) as trace:
        forward_ops = dict(
            trace.sql(
                "SELECT s.text, COUNT(*) FROM ops o JOIN strings s ON s.id = o.op_sid JOIN frames f ON f.id = o.frame_id "
                "JOIN strings fs ON fs.id = f.file_sid WHERE fs.text = ? AND f.line = 5 GROUP BY s.text",
                (str(script),),
            )
        )
        assert forward_ops["aten.addmm.default"] == 6 and forward_ops["aten.relu.default"] == 3
