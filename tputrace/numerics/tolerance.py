"""How far a value may leave its reference before it counts as divergent: a relative tolerance per dtype."""

from __future__ import annotations

import math

RELATIVE_TOLERANCE: dict[str, float] = {
    "bfloat16": 1e-2,
    "float16": 1e-3,
    "float32": 1e-4,
    "float64": 1e-9,
}
DEFAULT_TOLERANCE = 1e-4
_TINY = 1e-30


def tolerance_for(dtype: str) -> float:
    """The relative tolerance for values of `dtype` (a torch dtype's short name, e.g. "float32")."""
    return RELATIVE_TOLERANCE.get(dtype, DEFAULT_TOLERANCE)


def relative_difference(difference_norm: float, reference_norm: float) -> float:
    """`difference_norm / reference_norm`, 0 when both are 0, inf when only the reference is 0."""
    if difference_norm == 0.0:
        return 0.0
    if reference_norm <= _TINY:
        return math.inf
    return difference_norm / reference_norm


def digest_difference(norm: float, sample: list[float], reference_norm: float, reference_sample: list[float]) -> float:
    """The relative difference of two digests of the same tensor: the larger of the norms' and the fixed
    samples' (each sample value against the largest reference sample magnitude)."""
    norm_difference = relative_difference(abs(norm - reference_norm), reference_norm)
    if len(sample) != len(reference_sample):
        return math.inf
    pairs = [
        (value, reference)
        for value, reference in zip(sample, reference_sample)
        if math.isfinite(value) and math.isfinite(reference)
    ]
    if not pairs:
        return norm_difference
    largest = max(abs(reference) for _, reference in pairs)
    sample_difference = relative_difference(max(abs(value - reference) for value, reference in pairs), largest)
    return max(norm_difference, sample_difference)
