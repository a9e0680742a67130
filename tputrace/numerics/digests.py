"""Digests of tensors and the difference of a tpu tensor from its CPU reference (torch, inside the recorded run)."""

from __future__ import annotations

import math

import torch

from tputrace.numerics.store import TensorDigest
from tputrace.numerics.tolerance import relative_difference

SAMPLE_SIZE = 8


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _sample_indices(numel: int, device: torch.device) -> torch.Tensor:
    count = min(SAMPLE_SIZE, numel)
    return torch.linspace(0, max(numel - 1, 0), count, dtype=torch.float64).round().long().to(device)


def digest(tensor: torch.Tensor) -> TensorDigest:
    """The digest of `tensor`, computed where it lives and read with one transfer of a few numbers."""
    values = tensor.detach().reshape(-1)
    wide = values.double() if values.device.type == "cpu" else values.float()
    finite = torch.isfinite(wide)
    finite_values = torch.where(finite, wide, torch.zeros((), dtype=wide.dtype, device=wide.device))
    numel = values.numel()
    parts = [
        torch.linalg.vector_norm(finite_values).reshape(1),
        finite_values.abs().amax().reshape(1) if numel else finite_values.new_zeros(1),
    ]
    parts.append((~finite).sum().to(wide.dtype).reshape(1))
    if numel:
        parts.append(wide[_sample_indices(numel, wide.device)])
    numbers = torch.cat(parts).cpu().double().tolist()
    return TensorDigest(
        dtype=dtype_name(tensor.dtype),
        shape=tuple(tensor.shape),
        l2_norm=numbers[0],
        max_abs=numbers[1],
        nonfinite=int(numbers[2]),
        sample=numbers[3:],
    )


def difference(tpu_values: torch.Tensor, cpu_values: torch.Tensor, floor_norm: float = 0.0) -> tuple[float, float]:
    """(relative L2 difference, largest absolute difference) of two host tensors over the elements finite in
    both, relative to the reference's norm or `floor_norm`, whichever is larger; inf when their NaN/Inf
    positions differ or their shapes do."""
    if tpu_values.shape != cpu_values.shape:
        return math.inf, math.inf
    a = tpu_values.detach().double().reshape(-1)
    b = cpu_values.detach().double().reshape(-1)
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(finite_a, finite_b):
        return math.inf, math.inf
    a, b = a[finite_a], b[finite_b]
    if a.numel() == 0:
        return 0.0, 0.0
    delta = a - b
    reference_norm = max(float(torch.linalg.vector_norm(b)), floor_norm)
    relative = relative_difference(float(torch.linalg.vector_norm(delta)), reference_norm)
    return relative, float(delta.abs().max())


def finite_norm_and_count(values: torch.Tensor) -> tuple[float, int]:
    """The L2 norm of `values`' finite elements and how many there are."""
    flat = values.detach().double().reshape(-1)
    finite = flat[torch.isfinite(flat)]
    return float(torch.linalg.vector_norm(finite)), finite.numel()
