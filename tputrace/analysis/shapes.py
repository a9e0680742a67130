"""Shapes as the trace writes them (`'f32[64,128], f32[128], int'`) and the matmuls they describe."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tputrace.dtypes import DTYPE_BYTES

_TENSOR = re.compile(r"([a-z]+[0-9]*)\[([0-9,\s]*)\]")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's dtype (short name, e.g. f32) and shape."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(size) for size in self.shape)}]"


def parse_specs(text: str | None) -> list[TensorSpec | None]:
    """One entry per comma-separated argument: a `TensorSpec`, or None for a non-tensor (`int`, `float`)."""
    if not text:
        return []
    specs: list[TensorSpec | None] = []
    for part in _split_top_level(text):
        match = _TENSOR.fullmatch(part.strip().split(" ")[0])
        if match is None:
            specs.append(None)
            continue
        dims = match.group(2).replace(" ", "")
        try:
            shape = tuple(int(size) for size in dims.split(",")) if dims else ()
        except ValueError:
            specs.append(None)
            continue
        specs.append(TensorSpec(match.group(1), shape))
    return specs


def tensors(text: str | None) -> list[TensorSpec]:
    """The tensor arguments of a signature, in order."""
    return [spec for spec in parse_specs(text) if spec is not None]


def total_bytes(text: str | None) -> int:
    return sum(spec.nbytes for spec in tensors(text))


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if current:
        parts.append("".join(current))
    return parts


@dataclass(frozen=True)
class Matmul:
    """One matrix product inside an op: `batch` products of (m, k) @ (k, n) with inputs of `dtype`."""

    batch: int
    m: int
    k: int
    n: int
    dtype: str

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n

    @property
    def bytes(self) -> float:
        """Bytes read and written at least once (inputs and output), at the input dtype."""
        size = DTYPE_BYTES.get(self.dtype, 4)
        return float(self.batch * (self.m * self.k + self.k * self.n + self.m * self.n) * size)


# ATen ops (without overload) whose work is matrix products, and how to read their operands.
MATMUL_OPS = (
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear", "aten.addbmm",
    "aten.convolution", "aten.convolution_backward", "aten._convolution",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_attention_math", "aten.scaled_dot_product_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_cudnn_attention",
)


def op_family(op: str | None) -> str | None:
    """`aten.addmm.default` -> `aten.addmm` when that is a matmul op, else None."""
    if not op:
        return None
    for family in MATMUL_OPS:
        if op == family or op.startswith(family + "."):
            return family
    return None


def matmuls_of(op: str | None, inputs: str | None) -> list[Matmul]:
    """The matrix products an op performs, read from its input shapes (empty when unknown)."""
    family = op_family(op)
    if family is None:
        return []
    specs = tensors(inputs)
    if family in ("aten.addmm", "aten.baddbmm", "aten.addbmm"):
        specs = specs[1:]
    if family in ("aten.mm", "aten.addmm"):
        return _plain(specs)
    if family in ("aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.matmul"):
        return _batched(specs)
    if family == "aten.linear":
        if len(specs) >= 2 and len(specs[0].shape) >= 1 and len(specs[1].shape) == 2:
            x, weight = specs[0], specs[1]
            rows = math.prod(x.shape[:-1]) if len(x.shape) > 1 else 1
            return [Matmul(1, rows, weight.shape[1], weight.shape[0], x.dtype)]
        return []
    if family.startswith("aten._conv") or family.startswith("aten.conv"):
        return _convolution(family, specs)
    return _attention(specs)


def _plain(specs: list[TensorSpec]) -> list[Matmul]:
    if len(specs) < 2 or len(specs[0].shape) != 2 or len(specs[1].shape) != 2:
        return []
    (m, k), (_, n) = specs[0].shape, specs[1].shape
    return [Matmul(1, m, k, n, specs[0].dtype)]


def _batched(specs: list[TensorSpec]) -> list[Matmul]:
    if len(specs) < 2 or len(specs[0].shape) < 2 or len(specs[1].shape) < 2:
        return _plain(specs)
    a, b = specs[0].shape, specs[1].shape
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]), 1)
    return [Matmul(batch, a[-2], a[-1], b[-1], specs[0].dtype)]


def _convolution(family: str, specs: list[TensorSpec]) -> list[Matmul]:
    """A convolution as the products the MXU runs: one per window position (kh x kw of them), each
    contracting the input features (k) into the output features (n) over batch x spatial rows. The
    spatial size is taken from the input (an estimate: strides shrink it)."""
    if family == "aten.convolution_backward":
        specs = specs[1:]  # grad_output, input, weight -> input, weight
    if len(specs) < 2 or len(specs[0].shape) < 3 or len(specs[1].shape) < 3:
        return []
    x, weight = specs[0].shape, specs[1].shape
    rows = x[0] * math.prod(x[2:])
    return [Matmul(math.prod(weight[2:]), rows, weight[1], weight[0], specs[0].dtype)]


def _attention(specs: list[TensorSpec]) -> list[Matmul]:
    """Attention as two products: scores = q @ k^T (t x d by d x s), out = p @ v (t x s by s x dv)."""
    if len(specs) < 3 or len(specs[0].shape) < 2:
        return []
    q, k, v = specs[0].shape, specs[1].shape, specs[2].shape
    if len(k) < 2 or len(v) < 2:
        return []
    batch = math.prod(q[:-2])
    t, d, s, dv = q[-2], q[-1], k[-2], v[-1]
    dtype = specs[0].dtype
    return [Matmul(batch, t, d, s, dtype), Matmul(batch, t, s, dv, dtype)]
