"""The chip cost model: an op's FLOPs and bytes from its shape strings, and how a program's measured
time and XLA costs are shared out among its ops by a roofline on a target chip.

The trace records when each program ran on a chip, not when each op inside it ran, so a program's
time is split among its ops in proportion to their roofline time on the target chip (XLA's FLOPs and
bytes for the program, split by each op's FLOPs and bytes derived from its shapes).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from tputrace.dtypes import DTYPE_BYTES

TIME_ESTIMATE_NOTE = "estimate: the program's measured time split by a roofline estimate of each op on the target chip"


@dataclass(frozen=True)
class TargetChip:
    """The peaks of the chip a device timeline is drawn for (made from `tputrace.analysis.chips` by the
    views): XProf's utilisation figures and the op time estimate use them. Peaks per ns: FLOPs and bytes."""

    name: str
    device_type: str
    peak_teraflops_per_second: float
    fp32_peak_teraflops_per_second: float
    hbm_gigabytes_per_second: float
    hbm_bytes: int
    source: str

    @property
    def peak_flops_per_ns(self) -> float:
        return self.peak_teraflops_per_second * 1e3

    @property
    def fp32_peak_flops_per_ns(self) -> float:
        return self.fp32_peak_teraflops_per_second * 1e3

    @property
    def hbm_bytes_per_ns(self) -> float:
        return self.hbm_gigabytes_per_second


# -- op cost from shapes ----------------------------------------------------------------------------

_TENSOR = re.compile(r"([a-z][a-z0-9]*)\[([0-9, ]*)\](?:\s*x(\d+))?")
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "dot", "mv", "addmv", "einsum"})
ATTENTION_MARK = "scaled_dot_product"

@dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor of an op's shape string, e.g. `f32[8,128]`; `count` for `... x14` lists."""

    dtype: str
    dims: tuple[int, ...]
    count: int = 1

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return self.elements * DTYPE_BYTES.get(self.dtype, 4) * self.count


@functools.lru_cache(maxsize=65536)
def parse_tensors(text: str | None) -> tuple[Tensor, ...]:
    """The tensors in a shape string like `'f32[64,128], f32[128]'` (scalars like `float` are skipped)."""
    if not text:
        return ()
    tensors = []
    for match in _TENSOR.finditer(text):
        dtype, dims_text, count = match.groups()
        dims = tuple(int(part) for part in dims_text.replace(" ", "").split(",") if part)
        tensors.append(Tensor(dtype, dims, int(count) if count else 1))
    return tuple(tensors)


def aten_base_name(op: str | None) -> str:
    """`aten.addmm.default` -> `addmm`; other namespaces keep only the op name too."""
    if not op:
        return ""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


class OpCost(NamedTuple):
    """An op's work estimated from its shapes: FLOPs, bytes read (inputs) and written (outputs), and
    whether it computes in 32 or 64-bit floats (slower on the MXU)."""

    flops: float
    read_bytes: float
    write_bytes: float
    wide_floats: bool = False

    @property
    def bytes_accessed(self) -> float:
        return self.read_bytes + self.write_bytes


@functools.lru_cache(maxsize=65536)
def op_cost(op: str | None, inputs: str | None, outputs: str | None) -> OpCost:
    """FLOPs and bytes of one ATen op from its shape strings: 2·M·N·K for matmuls, 4·L·S·E per head for
    attention (forward; twice that backward), one FLOP per output element otherwise."""
    input_tensors = parse_tensors(inputs)
    output_tensors = parse_tensors(outputs)
    read_bytes = float(sum(tensor.nbytes for tensor in input_tensors))
    write_bytes = float(sum(tensor.nbytes for tensor in output_tensors))
    output_elements = sum(tensor.elements * tensor.count for tensor in output_tensors)
    base = aten_base_name(op)
    flops = float(output_elements)
    if base in MATMUL_OPS and input_tensors:
        operand = input_tensors[1] if base in ("addmm", "baddbmm", "addbmm", "addmv") and len(input_tensors) > 1 else input_tensors[0]
        if operand.dims:
            flops = 2.0 * output_elements * operand.dims[-1]
    elif ATTENTION_MARK in base and len(input_tensors) >= 2 and len(input_tensors[1].dims) >= 2:
        query, key = input_tensors[0], input_tensors[1]
        flops = 4.0 * query.elements * key.dims[-2]
        if base.endswith("backward"):
            flops *= 2
    wide_floats = bool(input_tensors) and input_tensors[0].dtype in ("f32", "f64", "tf32")
    return OpCost(flops, read_bytes, write_bytes, wide_floats)


@dataclass(frozen=True, slots=True)
class RunLayout:
    """What every run of one program with the same ops shares: the op keys, each op's share of the
    program's FLOPs and bytes, and each op's roofline time (their sum is `total_ns`)."""

    id: int
    op_keys: list[tuple[Any, ...]]
    op_flops: list[float]
    op_read_bytes: list[float]
    op_write_bytes: list[float]
    roofline_ns: list[float]
    total_ns: float


def make_layout(layout_id: int, op_keys: list[tuple[Any, ...]], program_flops: float | None,
                program_bytes: float | None, chip: TargetChip, costs: list[OpCost]) -> RunLayout:
    """Share the program's XLA FLOPs and bytes (None: not known, the ops' estimates stand) among its ops
    by their estimates, and time each op by its roofline on the target chip."""
    count = len(costs)
    flops_estimates, read_estimates, write_estimates, wide_floats = zip(*costs)
    flops_estimate = sum(flops_estimates)
    bytes_estimate = sum(read_estimates) + sum(write_estimates)
    program_flops = program_flops if program_flops is not None else flops_estimate
    program_bytes = program_bytes if program_bytes is not None else bytes_estimate
    if flops_estimate:
        scale = program_flops / flops_estimate
        flops = [value * scale for value in flops_estimates]
    else:
        flops = [program_flops / count] * count
    if bytes_estimate:
        scale = program_bytes / bytes_estimate
        read_bytes = [value * scale for value in read_estimates]
        write_bytes = [value * scale for value in write_estimates]
    else:
        read_bytes = write_bytes = [program_bytes / count / 2] * count
    ns_per_flop, ns_per_wide_flop = 1.0 / chip.peak_flops_per_ns, 1.0 / chip.fp32_peak_flops_per_ns
    ns_per_byte = 1.0 / chip.hbm_bytes_per_ns
    compute_ns = [value * (ns_per_wide_flop if wide else ns_per_flop) for value, wide in zip(flops, wide_floats)]
    memory_ns = [(read + write) * ns_per_byte for read, write in zip(read_bytes, write_bytes)]
    roofline_ns = [compute if compute > memory else memory for compute, memory in zip(compute_ns, memory_ns)]
    return RunLayout(layout_id, op_keys, flops, read_bytes, write_bytes, roofline_ns, sum(roofline_ns))
