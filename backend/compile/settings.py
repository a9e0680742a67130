"""What `torch.compile(..., backend="tpu", mode=..., options=...)` can ask of the backend.

`mode`: torch's modes are accepted so that code written for Inductor runs unchanged; XLA has no CUDA
graphs or autotuning, so every mode compiles the same programs (the mode is recorded in the trace).

`options`:
- `shape_buckets`: pad dynamic dims to buckets so that XLA compiles once per bucket instead of once
  per size: a list of sizes (a size above the largest is not padded) or an int (round up to a
  multiple of it). Applies to inference graphs whose marked dims pass the padding-safety check (see
  `buckets.py`); every other graph compiles per concrete shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OPTIONS = ("shape_buckets",)


@dataclass(frozen=True)
class CompileSettings:
    """One `torch.compile` call's settings for the tpu backend."""

    mode: str = "default"
    shape_buckets: tuple[int, ...] | int | None = None

    @classmethod
    def from_torch(cls, mode: str | None, options: dict[str, Any] | None) -> "CompileSettings":
        """Validate torch.compile's `mode` and `options` as Inductor would: unknown ones are errors."""
        mode = mode or "default"
        if mode not in MODES:
            raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(MODES)}")
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise RuntimeError(f"Unexpected optimization option {unknown[0]!r} for backend='tpu'; known options: {', '.join(OPTIONS)}")
        return cls(mode, _buckets(options.get("shape_buckets")))

    def bucket(self, size: int) -> int:
        """The padded size for `size` (the size itself when no bucket applies)."""
        buckets = self.shape_buckets
        if buckets is None:
            return size
        if isinstance(buckets, int):
            return -(-size // buckets) * buckets
        for bucket in buckets:
            if bucket >= size:
                return bucket
        return size


def _buckets(value: Any) -> tuple[int, ...] | int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise RuntimeError("shape_buckets is a list of sizes or an int multiple, not a bool")
    if isinstance(value, int):
        if value < 1:
            raise RuntimeError(f"shape_buckets multiple must be at least 1, not {value}")
        return value
    if isinstance(value, Sequence) and value and all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in value):
        return tuple(sorted(set(value)))
    raise RuntimeError(f"shape_buckets must be a list of positive sizes or a positive int, not {value!r}")
