"""float8 tensors on `tpu` (float8_e4m3fn, float8_e5m2 and their fnuz variants): host copies, casts,
saving, and `torch._scaled_mm` on the chip, each compared bit for bit with the CPU."""

from __future__ import annotations

import io

import pytest
import torch
from backend_helpers import eager, host, recorded_fallbacks

from tputrace.backend.compat.device_module import EagerMode

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
MODES = (EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE)
# In range, subnormal, at and past each format's largest value, infinite and NaN.
VALUES = torch.tensor([0.0, 1e-9, 1e-3, 0.3, -1.7, 240.0, 448.0, 460.0, 500.0, 5.7e4, 6e4, -1e5, float("inf"), float("nan")])


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return host(tensor).view(torch.uint8)


def assert_same_values(result: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bit patterns, except that any NaN matches any NaN (XLA and torch pick different payloads)."""
    result_bits, expected_bits = bits(result), expected.view(torch.uint8)
    result_nan, expected_nan = host(result).float().isnan(), expected.float().isnan()
    assert torch.equal(result_nan, expected_nan)
    assert torch.equal(result_bits[~result_nan], expected_bits[~expected_nan])


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_casts_and_host_copies_match_the_cpu_bit_for_bit(dtype: torch.dtype, mode: EagerMode) -> None:
    with eager(mode):
        copied = VALUES.to(dtype).to("tpu")
        cast_on_chip = VALUES.to("tpu").to(dtype)
        from_bfloat16 = VALUES.to(torch.bfloat16).to("tpu").to(dtype)
        widened = copied.float()
    assert copied.dtype == cast_on_chip.dtype == dtype
    assert torch.equal(bits(copied), VALUES.to(dtype).view(torch.uint8))
    assert_same_values(cast_on_chip, VALUES.to(dtype))
    assert_same_values(from_bfloat16, VALUES.to(torch.bfloat16).to(dtype))
    assert torch.equal(host(widened).nan_to_num(7.0), VALUES.to(dtype).float().nan_to_num(7.0))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
def test_layout_ops_and_bit_views_match_the_cpu(mode: EagerMode) -> None:
    weights = (torch.randn(4, 6) * 100).to(torch.float8_e4m3fn)
    with eager(mode):
        on_chip = weights.to("tpu")
        results = {
            "view as uint8": on_chip.view(torch.uint8),
            "transposed copy": on_chip.t().contiguous(),
            "cat": torch.cat([on_chip, on_chip[1:]]),
            "slice": on_chip[1:3, ::2],
            "e5m2": on_chip.to(torch.float8_e5m2),
        }
    expected = {
        "view as uint8": weights.view(torch.uint8),
        "transposed copy": weights.t().contiguous(),
        "cat": torch.cat([weights, weights[1:]]),
        "slice": weights[1:3, ::2],
        "e5m2": weights.to(torch.float8_e5m2),
    }
    for name, result in results.items():
        assert result.dtype == expected[name].dtype, name
        assert torch.equal(host(result).view(torch.uint8), expected[name].view(torch.uint8)), name


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint64])
def test_dtypes_without_a_typed_storage_save_and_load(dtype: torch.dtype) -> None:
    """torch saves these dtypes' bytes untyped (`_rebuild_tensor_v3`); views keep sharing the storage."""
    values = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(dtype)
    tensor = values.to("tpu")
    file = io.BytesIO()
    torch.save({"tensor": tensor, "view": tensor[1:]}, file)
    file.seek(0)
    loaded = torch.load(file)
    file.seek(0)
    on_host = torch.load(file, map_location="cpu")
    assert loaded["tensor"].device == torch.device("tpu", 0) and loaded["tensor"].dtype == dtype
    assert torch.equal(host(loaded["tensor"]).view(torch.uint8), values.view(torch.uint8))
    assert loaded["view"].storage_offset() == 1
    assert loaded["view"].untyped_storage() is loaded["tensor"].untyped_storage()
    assert on_host["tensor"].device.type == "cpu" and torch.equal(on_host["tensor"].view(torch.uint8), values.view(torch.uint8))


@pytest.mark.parametrize("mode", MODES, ids=lambda mode: mode.name)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, None], ids=str)
def test_scaled_mm_runs_on_the_chip_as_on_the_cpu(out_dtype: torch.dtype | None, mode: EagerMode) -> None:
    """The product in float32, rounded once to the output dtype: bit for bit what torch's reference
    kernel gives. The expected values are that product computed exactly (float64), because torch's
    own CPU kernel on hosts with AVX512-FP16 (oneDNN's float8 path) rounds a float8 output through an
    intermediate type: 4.748 became 5.0 there, where float8_e4m3fn's nearest value is 4.5."""
    torch.manual_seed(0)
    mat1 = torch.randn(16, 32).to(torch.float8_e4m3fn)
    mat2 = torch.randn(48, 32).to(torch.float8_e4m3fn).t()
    scale_a, scale_b = torch.tensor(0.5), torch.tensor(2.0)
    bias = torch.randn(48).to(torch.bfloat16) if out_dtype is torch.bfloat16 else None
    exact = (mat1.double() * scale_a.double()) @ (mat2.double() * scale_b.double()) + (0 if bias is None else bias.double())
    expected = exact.float().to(out_dtype or mat1.dtype)
    assert torch._scaled_mm(mat1, mat2, scale_a, scale_b, bias=bias, out_dtype=out_dtype).dtype == expected.dtype
    chip = [value.to("tpu") if value is not None else None for value in (mat1, mat2, scale_a, scale_b, bias)]
    with eager(mode), recorded_fallbacks() as fallbacks:
        result = torch._scaled_mm(chip[0], chip[1], chip[2], chip[3], bias=chip[4], out_dtype=out_dtype)
        result_on_host = host(result)
    assert fallbacks == []
    assert result.dtype == expected.dtype
    assert torch.equal(result_on_host.view(torch.uint8), expected.view(torch.uint8))


def test_scaled_mm_of_other_dtypes_raises_torchs_error() -> None:
    matrix = torch.randn(16, 16)
    with pytest.raises(Exception) as on_cpu:  # noqa: PT011 - whatever torch raises, tpu raises too
        torch._scaled_mm(matrix, matrix, torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(Exception) as on_chip:  # noqa: PT011
        torch._scaled_mm(matrix.to("tpu"), matrix.to("tpu"), torch.tensor(1.0).to("tpu"), torch.tensor(1.0).to("tpu"))
    assert type(on_chip.value) is type(on_cpu.value) and str(on_chip.value) == str(on_cpu.value)
