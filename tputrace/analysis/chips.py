"""Target chips: the TPU generations a trace is judged against, with where every figure comes from.

A trace recorded anywhere (a TPU host, or virtual chips on a CPU) is analysed *for* a target chip:
its tiles and MXU decide what counts as padding, its peak FLOP/s and HBM bandwidth give roofline
estimates, its HBM size bounds memory. Figures are per chip, in SI units (FLOP/s, bytes, bytes/s).

Sources (Google Cloud TPU documentation; the page names as published):
- "TPU v5e" (cloud.google.com/tpu/docs/v5e): 197 TFLOPs bf16 peak per chip; 16 GB HBM2 at 819 GBps;
  400 GBps bidirectional ICI per chip; one TensorCore with four MXUs.
- "TPU v5p" (cloud.google.com/tpu/docs/v5p): 459 TFLOPs bf16 peak per chip; 95 GiB HBM2e at
  2765 GBps; 1200 GBps bidirectional ICI per chip; two TensorCores per chip, four MXUs each.
- "TPU v6e" (cloud.google.com/tpu/docs/v6e): 918 TFLOPs bf16 peak per chip; 32 GB HBM (32 GiB in the
  TPU7x page's comparison table, used here) at 1638 GBps;
  800 GBps bidirectional ICI per chip; one TensorCore with two 256x256 MXUs.
- "TPU7x (Ironwood)" (cloud.google.com/tpu/docs/tpu7x): 2307 TFLOPs bf16 peak per chip; 192 GiB HBM
  at 7380 GB/s; 1200 GB/s bidirectional ICI per chip; two TensorCores per chip.
- "System architecture" (cloud.google.com/tpu/docs/system-architecture-tpu-vm): an MXU is 128 x 128
  multiply-accumulators; multiplies take bfloat16 inputs and accumulate in float32. That page covers
  the generations before v6e, so v5e and v5p use 128.
- "Cloud TPU performance guide" (cloud.google.com/tpu/docs/performance-guide): data is tiled in
  8 x 128 chunks (XLA pads tensors whose last two dims do not fill them) for 32-bit types. 16-bit
  types pack two rows per sublane, 8-bit types four, so their native tiles are (16, 128) and (32, 128)
  (JAX documentation, "Pallas TPU details", on array layouts and packed types).

Not published, so estimated here and labelled as such wherever used:
- float32 peak. The MXU multiplies bfloat16; a float32 matmul at PyTorch's default precision
  ("highest") runs as six bfloat16 passes (XLA's dot algorithm BF16_BF16_F32_X6, see the JAX
  documentation, "Matmul precision"), so float32 peak is estimated as bf16 peak / 6. At
  `torch.set_float32_matmul_precision("high")` the backend asks XLA for `HIGH` (bf16_3x, three passes:
  bf16 peak / 3), at "medium" for `DEFAULT` (one pass: bf16 peak).
- TPU7x MXU size: the TPU7x page does not state it; 256 (as v6e) is an assumption.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from tputrace.dtypes import DTYPE_BYTES
from tputrace.store.errors import TputraceError

TERA = 1e12
GIGA = 1e9
GIB = 1 << 30
FP32_PASSES = 6  # bfloat16 passes per float32 matmul at "highest" precision (see module docstring)
# bfloat16 passes per float32 matmul at each torch.set_float32_matmul_precision setting.
PRECISION_PASSES = {"highest": FP32_PASSES, "high": 3, "medium": 1}


@dataclass(frozen=True)
class Chip:
    """One TPU generation, per chip. `sources` says where each figure comes from."""

    name: str
    label: str
    peak_bf16_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    ici_bandwidth: float
    mxu: int
    tensorcores: int
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    estimated: tuple[str, ...] = ()

    @property
    def peak_fp32_flops(self) -> float:
        """Estimated float32 matmul peak: bf16 peak over the passes a float32 matmul takes (an estimate)."""
        return self.peak_bf16_flops / FP32_PASSES

    def peak_flops(self, dtype: str, precision: str = "highest") -> float:
        """Peak matmul FLOP/s for inputs of `dtype` (a short name: f32, bf16, ...); float32 products at
        float32 matmul precision setting `precision` (an estimate)."""
        if dtype == "f32":
            return self.peak_bf16_flops / PRECISION_PASSES.get(precision, FP32_PASSES)
        if dtype == "f64":
            return self.peak_fp32_flops
        return self.peak_bf16_flops

    def tile(self, dtype: str) -> tuple[int, int]:
        """Native (sublane, lane) tile of a 2-D array of `dtype` in HBM."""
        return self.tile_of_size(DTYPE_BYTES.get(dtype, 4))

    def tile_of_size(self, size: int) -> tuple[int, int]:
        """Native (sublane, lane) tile of a 2-D array of `size`-byte elements in HBM."""
        if size >= 4:
            return (8, 128)
        if size == 2:
            return (16, 128)
        return (32, 128)

    def roofline_ns(self, flops: float, bytes_accessed: float, dtype: str = "bf16", precision: str = "highest") -> float:
        """Estimated time on this chip: the larger of compute time and HBM time (an estimate)."""
        compute_s = flops / self.peak_flops(dtype, precision) if flops else 0.0
        memory_s = bytes_accessed / self.hbm_bandwidth if bytes_accessed else 0.0
        return max(compute_s, memory_s) * 1e9

    def describe(self) -> dict[str, object]:
        """The figures as plain data, for JSON output."""
        return {
            "name": self.name,
            "label": self.label,
            "peak_bf16_flops": self.peak_bf16_flops,
            "peak_fp32_flops_estimate": self.peak_fp32_flops,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bandwidth": self.hbm_bandwidth,
            "ici_bandwidth": self.ici_bandwidth,
            "mxu": self.mxu,
            "tensorcores": self.tensorcores,
            "tiles": {dtype: list(self.tile(dtype)) for dtype in ("f32", "bf16", "i8")},
            "sources": dict(self.sources),
            "estimated": list(self.estimated),
        }


_ARCH_PAGE = 'Google Cloud TPU documentation, "System architecture" (MXU of 128 x 128 multiply-accumulators)'
_PAGE_FIGURES = ("peak_bf16_flops", "hbm_bytes", "hbm_bandwidth", "ici_bandwidth", "tensorcores")


def _documented(name: str, label: str, page: str, *, peak_bf16_tflops: float, hbm_bytes: float, hbm_gbps: float,
                ici_gbps: float, tensorcores: int, mxu: int, mxu_source: str, mxu_estimated: bool = False) -> Chip:
    """A chip whose figures come from its own documentation page, except the MXU size (`mxu_source`)."""
    return Chip(
        name=name, label=label,
        peak_bf16_flops=peak_bf16_tflops * TERA, hbm_bytes=hbm_bytes, hbm_bandwidth=hbm_gbps * GIGA,
        ici_bandwidth=ici_gbps * GIGA, mxu=mxu, tensorcores=tensorcores,
        sources={**dict.fromkeys(_PAGE_FIGURES, page), "mxu": mxu_source},
        estimated=("peak_fp32_flops", "mxu") if mxu_estimated else ("peak_fp32_flops",),
    )


_V6E_PAGE = 'Google Cloud TPU documentation, "TPU v6e"'
CHIPS: dict[str, Chip] = {
    "v5e": _documented("v5e", "TPU v5e", 'Google Cloud TPU documentation, "TPU v5e"', peak_bf16_tflops=197,
                       hbm_bytes=16 * GIGA, hbm_gbps=819, ici_gbps=400, tensorcores=1, mxu=128, mxu_source=_ARCH_PAGE),
    "v5p": _documented("v5p", "TPU v5p", 'Google Cloud TPU documentation, "TPU v5p"', peak_bf16_tflops=459,
                       hbm_bytes=95 * GIB, hbm_gbps=2765, ici_gbps=1200, tensorcores=2, mxu=128, mxu_source=_ARCH_PAGE),
    "v6e": _documented("v6e", "TPU v6e (Trillium)", _V6E_PAGE, peak_bf16_tflops=918,
                       hbm_bytes=32 * GIB, hbm_gbps=1638, ici_gbps=800, tensorcores=1,
                       mxu=256, mxu_source=f"{_V6E_PAGE} (two 256x256 MXUs per TensorCore)"),
    "v7": _documented("v7", "TPU7x (Ironwood)", 'Google Cloud TPU documentation, "TPU7x (Ironwood)"',
                      peak_bf16_tflops=2307, hbm_bytes=192 * GIB, hbm_gbps=7380, ici_gbps=1200, tensorcores=2,
                      mxu=256, mxu_source="assumed equal to v6e (not stated on the TPU7x page)", mxu_estimated=True),
}

# The default target when none is given; every report says which target it used.
DEFAULT_TARGET = "v6e"

_ALIASES = {"tpu7x": "v7", "ironwood": "v7", "trillium": "v6e", "v6": "v6e", "v5litepod": "v5e", "v5lite": "v5e"}


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def chip(name: str | None) -> Chip:
    """The chip called `name` (case-insensitive; e.g. v6e, TPU7x); the default target for None.

    `NAME:SIZE` (e.g. `v5e:24MiB`) is that chip with `SIZE` of HBM: a chip scaled down to what a small
    run would fill, so whether it fits (and what would fit it) can be tried on a small model."""
    if name is None:
        return CHIPS[DEFAULT_TARGET]
    base, _, size = name.partition(":")
    if size:
        return replace(chip(base), label=f"{chip(base).label} (HBM scaled to {size.strip()})", hbm_bytes=float(_size_bytes(size)))
    key = name.strip().lower().removeprefix("tpu-").removeprefix("tpu ")
    key = _ALIASES.get(key, key)
    found = CHIPS.get(key)
    if found is None:
        raise TputraceError(f"unknown target chip {name!r}; choose one of: {', '.join(CHIPS)}")
    return found


def _size_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise TputraceError(f"unreadable HBM size {text!r} in a target; write it as e.g. 24MiB, 2GB or 16GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
