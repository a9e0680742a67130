"""The `tpu` device: registration, torch.tpu names, chips, transfers, and one-line errors."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch

from backend_helpers import host
from tputrace.backend.core.arguments import DeviceMismatchError
from tputrace.backend.core.chips import ChipError
from tputrace.backend.core.dtypes import UnsupportedDtypeError


def test_nothing_is_registered_before_the_import() -> None:
    code = "import torch; import tputrace; print(torch._C._get_privateuse1_backend_name())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "privateuseone"


def test_device_identity_and_transfers() -> None:
    cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    tpu = cpu.to("tpu")
    assert tpu.device == torch.device("tpu:0")
    assert tpu.is_tpu and not cpu.is_tpu
    assert cpu.tpu().device.type == "tpu"
    assert torch.equal(host(tpu), cpu)
    assert torch.randn(3, device="tpu").device.type == "tpu"
    assert torch.tensor([1.0, 2.0], device="tpu").tolist() == [1.0, 2.0]


def test_module_to_tpu_moves_parameters_and_buffers() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("tpu")
    assert all(parameter.device.type == "tpu" for parameter in model.parameters())
    assert all(buffer.device.type == "tpu" for buffer in model.buffers())
    assert isinstance(model[0].weight, torch.nn.Parameter)


def test_the_class_of_a_tpu_parameter_rebuilds_a_parameter() -> None:
    """Libraries rebuild a parameter as `type(parameter)(data, requires_grad=...)` (accelerate's
    offload hooks put weights back on meta that way): on tpu as with torch.nn.Parameter."""
    weight = torch.nn.Linear(3, 2).to("tpu").weight
    on_meta = type(weight)(weight.to("meta"), requires_grad=False)
    assert type(on_meta) is torch.nn.Parameter and on_meta.device.type == "meta" and not on_meta.requires_grad
    rebuilt = type(weight)(weight.detach() * 2)
    assert isinstance(rebuilt, torch.nn.Parameter) and rebuilt.device == torch.device("tpu", 0) and rebuilt.requires_grad
    assert torch.equal(host(rebuilt), host(weight) * 2)


def test_torch_tpu_module_names() -> None:
    tpu = torch.tpu
    for name in (
        "is_available", "device_count", "current_device", "set_device", "device", "synchronize", "manual_seed",
        "manual_seed_all", "initial_seed", "get_rng_state", "set_rng_state", "get_device_name",
        "get_device_properties", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
        "Stream", "Event", "current_stream", "EagerMode", "set_eager_mode", "eager_mode",
    ):
        assert hasattr(tpu, name), name
    assert tpu.is_available() and tpu.device_count() >= 1 and tpu.current_device() == 0
    assert {mode.name for mode in tpu.EagerMode} == {"DEFER_AND_FUSE", "DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING"}
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert "tpu" in tpu.get_device_name()
    tpu.current_stream().synchronize()
    start, end = tpu.Event(enable_timing=True), tpu.Event(enable_timing=True)
    start.record()
    end.record()
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)


def test_memory_counters_follow_live_tensors() -> None:
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    big = torch.zeros(1024, 1024, device="tpu")
    assert torch.tpu.memory_allocated() - before == 4 * 1024 * 1024
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del big
    assert torch.tpu.memory_allocated() == before
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()


def test_cuda_style_memory_names_and_torch_accelerator() -> None:
    """Names a ported script calls (`torch.cuda.memory_reserved` -> `torch.tpu...`) and device-generic
    code's `torch.accelerator` functions, which torch would answer from a C++ allocator we lack."""
    gc.collect()
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    big = torch.zeros(256, 1024, device="tpu")
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated() == before + 1024 * 1024
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total and total - free == torch.tpu.memory_allocated()
    accelerator = torch.accelerator
    torch.ones(3, device="tpu").add_(1)
    accelerator.synchronize()
    accelerator.synchronize("tpu:0")
    accelerator.empty_cache()
    assert accelerator.memory_allocated() == torch.accelerator.memory.memory_allocated(0) == torch.tpu.memory_allocated()
    assert accelerator.max_memory_allocated() >= accelerator.memory_allocated()
    assert accelerator.memory_stats()["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert accelerator.get_memory_info() == torch.tpu.mem_get_info()
    assert {torch.bfloat16, torch.float32, torch.int64} <= accelerator.get_device_capability()["supported_dtypes"]
    del big
    accelerator.reset_peak_memory_stats()
    assert accelerator.max_memory_allocated() == torch.tpu.memory_allocated() == before


def test_rng_is_reproducible_per_seed_and_never_fixed() -> None:
    torch.manual_seed(7)
    first = host(torch.randn(5, device="tpu"))
    second = host(torch.randn(5, device="tpu"))
    torch.manual_seed(7)
    again = host(torch.randn(5, device="tpu"))
    assert torch.equal(first, again) and not torch.equal(first, second)
    state = torch.tpu.get_rng_state()
    a = host(torch.rand(3, device="tpu"))
    torch.tpu.set_rng_state(state)
    assert torch.equal(a, host(torch.rand(3, device="tpu")))
    assert torch.tpu.initial_seed() == 7


def test_chip_index_past_the_count_is_a_one_line_error() -> None:
    with pytest.raises(ChipError, match=r"tpu:99 does not exist: this process has 1 chip"):
        torch.ones(2).to("tpu:99")


def test_unsupported_dtype_is_a_one_line_error() -> None:
    with pytest.raises(UnsupportedDtypeError, match="not supported on tpu; use one of"):
        torch.ones(2, dtype=torch.complex32).to("tpu")
    with pytest.raises(UnsupportedDtypeError, match="float8_e8m0fnu is not supported on tpu"):
        torch.ones(2).to(torch.float8_e8m0fnu).to("tpu")


def test_mixing_devices_is_a_one_line_error() -> None:
    with pytest.raises(DeviceMismatchError, match=r"move the cpu tensor with \.to\('tpu'\)"):
        torch.ones(2, device="tpu") + torch.ones(2)


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_assigning_data_shares_the_new_tensor(mode: str) -> None:
    previous = torch.tpu.eager_mode()
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    try:
        target, source = torch.zeros(3, device="tpu"), torch.ones(3, device="tpu")
        target.data = source
        target.add_(1)
        assert target.cpu().tolist() == source.cpu().tolist() == [2.0, 2.0, 2.0]
        resized = torch.zeros(2, device="tpu")
        resized.data = torch.arange(4.0, device="tpu", dtype=torch.float16)
        resized.mul_(2)
        assert resized.shape == (4,) and resized.dtype == torch.float16
        assert resized.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
        layer = torch.nn.Linear(2, 2, device="tpu")
        layer.weight.data = torch.eye(2, device="tpu")
        layer(torch.ones(1, 2, device="tpu")).sum().backward()
        assert layer.weight.cpu().tolist() == [[1.0, 0.0], [0.0, 1.0]]
        assert layer.weight.grad.cpu().tolist() == [[1.0, 1.0], [1.0, 1.0]]
        with pytest.raises(RuntimeError, match="incompatible tensor type"):
            target.data = torch.ones(3)
    finally:
        torch.tpu.set_eager_mode(previous)


def test_chip_platform_is_chosen_by_environment() -> None:
    code = """
import torch, tputrace.backend
from tputrace.backend.core import chips
try:
    torch.ones(2, device="tpu")
except chips.ChipError as error:
    print(error)
"""
    environ = __import__("os").environ
    missing = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**environ, "TPUTRACE_PLATFORM": "gpu"})
    assert missing.returncode == 0, missing.stderr[-2000:]
    assert missing.stdout.strip().splitlines() == [
        "TPUTRACE_PLATFORM=gpu but this JAX has no gpu devices; unset TPUTRACE_PLATFORM to use TPUs where there "
        "are some and virtual chips on the CPU elsewhere"
    ]
    chosen = subprocess.run([sys.executable, "-c", "import torch, tputrace.backend\n"
                             "print(torch.tpu.get_device_properties(0).name, (torch.ones(2, device='tpu') * 2).tolist())"],
                            capture_output=True, text=True, env={**environ, "TPUTRACE_PLATFORM": "cpu", "TPUTRACE_CHIPS": "2"})
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.stdout.strip() == "tpu (virtual, on XLA cpu: cpu) [2.0, 2.0]"


def test_multiple_chips_and_copies_between_them() -> None:
    code = """
import torch, tputrace.backend
assert torch.tpu.device_count() == 2
a = torch.arange(4.0).to("tpu:1")
assert a.device == torch.device("tpu:1")
b = a.to("tpu:0") * 2
assert b.device == torch.device("tpu:0") and b.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
try:
    a + b
except RuntimeError as error:
    assert "tpu:1" in str(error) and "tpu:0" in str(error), error
else:
    raise AssertionError("mixing chips did not raise")
weight = torch.ones(2, device="tpu:1", requires_grad=True)
(weight * 2).sum().backward()
assert weight.grad.device == torch.device("tpu:1") and weight.grad.cpu().tolist() == [2.0, 2.0]
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**__import__("os").environ, "TPUTRACE_CHIPS": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_an_in_place_result_counts_toward_the_peak_while_it_exists_beside_its_target() -> None:
    """Strict eager: `add_` computes its result beside the target before writing it in, so the peak
    holds both, as a device allocator sees them; the live bytes stay the target's."""
    target = torch.zeros(256, 256, device="tpu")
    update = torch.ones(256, 256, device="tpu")
    live = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    target.add_(update)
    assert torch.tpu.memory_allocated() == live
    assert torch.tpu.max_memory_allocated() >= live + target.numel() * target.element_size()
    assert host(target).eq(1).all()
