"""`ReduceOp.PREMUL_SUM` (`dist._make_nccl_premul_sum(factor)`) on a tpu process group, which gloo
refuses: each rank multiplies its own contribution by the factor, then the ranks sum, as NCCL does.

As in NCCL, the factor (a Python number, or a one-element tensor on tpu or the CPU: torch refuses
others, and a PREMUL_SUM without a factor, when it makes the op) is first converted to the data's
dtype and the product is taken in that dtype; the data must be floating point or complex (NCCL takes
half, bfloat16, float and double, and complex ones as pairs of reals).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

PREMUL_SUM = dist.ReduceOp.RedOpType.PREMUL_SUM
SCALABLE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128})


class PremulSumError(TypeError):
    """A PREMUL_SUM over data of a dtype that NCCL refuses to scale."""


def is_premul_sum(op: dist.ReduceOp) -> bool:
    return op.op == PREMUL_SUM


def factor_of(op: dist.ReduceOp) -> float | torch.Tensor:
    """The factor `_make_nccl_premul_sum` stored in the op (its pickled state is `(op, factor)`)."""
    _, factor = op.__getstate__()
    return factor


def scaled_to_sum(op: dist.ReduceOp, host_buffers: Sequence[torch.Tensor], read: Callable[[torch.Tensor], torch.Tensor], kind: str) -> dist.ReduceOp:
    """The op the transport runs: for PREMUL_SUM, SUM after multiplying `host_buffers` (host tensors
    this collective owns, holding this rank's contribution) by the factor in place; any other op as it is.

    `read` gives a tensor factor's host value (a tpu factor is read as the collective's inputs are)."""
    if not is_premul_sum(op):
        return op
    factor = factor_of(op)
    host_factor = read(factor) if isinstance(factor, torch.Tensor) else factor
    refused = sorted({str(buffer.dtype).removeprefix("torch.") for buffer in host_buffers if buffer.dtype not in SCALABLE_DTYPES})
    if refused:
        raise PremulSumError(f"{kind} with ReduceOp.PREMUL_SUM takes floating-point or complex tensors, as NCCL does; got {', '.join(refused)}")
    for buffer in host_buffers:
        buffer.mul_(torch.as_tensor(host_factor, dtype=buffer.dtype).reshape(()))
    return dist.ReduceOp(dist.ReduceOp.SUM)
