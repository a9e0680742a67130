"""The functional collectives (`torch.ops._c10d_functional.*`) on tpu tensors: what DTensor, tensor
parallelism and FSDP2's traced paths call.

Each op returns at once with its output tensor and leaves the collective running on the group's
transport; `wait_tensor(output)` waits for it. The pending works are kept per output buffer. Eager
funcol wraps outputs with `_wrap_tensor_autograd`, which waits (see `wrap_tensor_autograd`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives  # noqa: F401 - defines _c10d_functional._wrap_tensor_autograd
from torch.distributed.distributed_c10d import _resolve_process_group

from tputrace.backend.core import routing
from tputrace.backend.core.buffers import Buffer
from tputrace.backend.core.tensor import TpuTensor

ops = torch.ops._c10d_functional

REDUCE_OPS: dict[str, Any] = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}

_pending: "weakref.WeakKeyDictionary[Buffer, dist.Work]" = weakref.WeakKeyDictionary()


def _group(group_name: Any) -> dist.ProcessGroup:
    return group_name if isinstance(group_name, dist.ProcessGroup) else _resolve_process_group(group_name)


def _reduce_op(name: str) -> Any:
    try:
        return REDUCE_OPS[name.lower()]
    except KeyError:
        raise ValueError(f"reduce op {name!r} is not supported on tpu; use one of {', '.join(REDUCE_OPS)}") from None


def _remember(work: dist.Work, tensors: Sequence[torch.Tensor]) -> None:
    for tensor in tensors:
        if isinstance(tensor, TpuTensor):
            _pending[tensor._buf] = work


def _empty(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)


def _gathered_shape(tensor: torch.Tensor, group_size: int) -> tuple[int, ...]:
    return (tensor.shape[0] * group_size, *tensor.shape[1:]) if tensor.dim() else (group_size,)


def _scattered_shape(tensor: torch.Tensor, group_size: int) -> tuple[int, ...]:
    if tensor.shape[0] % group_size:
        raise ValueError(f"reduce_scatter_tensor: dim 0 ({tensor.shape[0]}) is not divisible by the group size ({group_size})")
    return (tensor.shape[0] // group_size, *tensor.shape[1:])


# ----------------------------------------------------------------- handlers (args, kwargs) -> result
def all_reduce(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, reduce_op, group_name = args
    output = tensor.clone()
    return all_reduce_((output, reduce_op, group_name), {})


def all_reduce_(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, reduce_op, group_name = args
    options = dist.AllreduceOptions()
    options.reduceOp = _reduce_op(reduce_op)
    _remember(_group(group_name).allreduce([tensor], options), [tensor])
    return tensor


def all_reduce_coalesced(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    tensors, reduce_op, group_name = args
    outputs = [tensor.clone() for tensor in tensors]
    return all_reduce_coalesced_((outputs, reduce_op, group_name), {})


def all_reduce_coalesced_(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    tensors, reduce_op, group_name = args
    options = dist.AllreduceOptions()
    options.reduceOp = _reduce_op(reduce_op)
    _remember(_group(group_name).allreduce(list(tensors), options), tensors)
    return list(tensors)


def all_gather_into_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, group_size, group_name = args
    output = kwargs.get("out")
    if output is None:
        output = _empty(_gathered_shape(tensor, group_size), tensor)
    _remember(_group(group_name).all_gather_single(output, tensor.contiguous()), [output])
    return output


def all_gather_into_tensor_coalesced(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    tensors, group_size, group_name = args
    outputs = [_empty(_gathered_shape(tensor, group_size), tensor) for tensor in tensors]
    _remember(_group(group_name).all_gather_single_coalesced(outputs, [tensor.contiguous() for tensor in tensors]), outputs)
    return outputs


def reduce_scatter_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, reduce_op, group_size, group_name = args
    output = kwargs.get("out")
    if output is None:
        output = _empty(_scattered_shape(tensor, group_size), tensor)
    options = dist.ReduceScatterOptions()
    options.reduceOp = _reduce_op(reduce_op)
    _remember(_group(group_name).reduce_scatter_single(output, tensor.contiguous(), options), [output])
    return output


def reduce_scatter_tensor_coalesced(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    tensors, reduce_op, group_size, group_name = args
    outputs = [_empty(_scattered_shape(tensor, group_size), tensor) for tensor in tensors]
    options = dist.ReduceScatterOptions()
    options.reduceOp = _reduce_op(reduce_op)
    _remember(_group(group_name).reduce_scatter_single_coalesced(outputs, [tensor.contiguous() for tensor in tensors], options), outputs)
    return outputs


def all_to_all_single(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, output_split_sizes, input_split_sizes, group_name = args
    rows = sum(int(size) for size in output_split_sizes) if output_split_sizes else tensor.shape[0]
    output = _empty((rows, *tensor.shape[1:]), tensor)
    work = _group(group_name).all_to_all_single(
        output, tensor.contiguous(), [int(size) for size in output_split_sizes or []], [int(size) for size in input_split_sizes or []], dist.AllToAllOptions()
    )
    _remember(work, [output])
    return output


def shard_dim_alltoall(args: tuple, kwargs: dict) -> torch.Tensor:
    """DTensor's Shard(a) -> Shard(b) on one mesh dim: each rank sends the i-th chunk of `shard_dim` to rank i
    and concatenates what it receives along `gather_dim`, as torch's CUDA kernel does, in one all_to_all
    (without this the op would run on the host as a CPU fallback)."""
    tensor, gather_dim, shard_dim, group_name = args
    group = _group(group_name)
    size = group.size()
    length = tensor.shape[shard_dim] // size
    send = torch.stack([tensor.narrow(shard_dim, index * length, length) for index in range(size)])
    received = torch.empty_like(send)
    group.all_to_all_single(received, send, [], [], dist.AllToAllOptions()).wait()
    return torch.cat(received.unbind(0), dim=gather_dim)


def broadcast(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, src, group_name = args
    return broadcast_((tensor.clone(), src, group_name), {})


def broadcast_(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, src, group_name = args
    options = dist.BroadcastOptions()
    options.rootRank = int(src)
    _remember(_group(group_name).broadcast([tensor], options), [tensor])
    return tensor


def isend(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, dst, tag, group_name = args
    _remember(_group(group_name).send([tensor], int(dst), int(tag)), [tensor])
    return tensor


def irecv(args: tuple, kwargs: dict) -> torch.Tensor:
    tensor, src, tag, group_name = args
    _remember(_group(group_name).recv([tensor], int(src), int(tag)), [tensor])
    return tensor


def wait_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    """Wait for the collective that produces this tensor (a no-op when there is none)."""
    tensor = args[0]
    work = _pending.pop(tensor._buf, None) if isinstance(tensor, TpuTensor) else None
    if work is not None:
        work.wait()
    return tensor


def wrap_tensor_autograd(args: tuple, kwargs: dict) -> torch.Tensor:
    """The op that wraps a functional collective's output for later waiting: here it waits now.

    Its own kernel returns an `AsyncCollectiveTensor`; mixed with tpu tensors in one op, that wrapper
    would reach the tpu dispatcher as a foreign tensor. Waiting here keeps every value a tpu tensor
    (the collective itself still ran asynchronously since it was issued)."""
    return wait_tensor(args, kwargs)


HANDLERS: dict[Any, Callable[[tuple, dict], Any]] = {
    ops.all_reduce.default: all_reduce,
    ops.all_reduce_.default: all_reduce_,
    ops.all_reduce_coalesced.default: all_reduce_coalesced,
    ops.all_reduce_coalesced_.default: all_reduce_coalesced_,
    ops.all_gather_into_tensor.default: all_gather_into_tensor,
    ops.all_gather_into_tensor_out.default: all_gather_into_tensor,
    ops.all_gather_into_tensor_coalesced.default: all_gather_into_tensor_coalesced,
    ops.reduce_scatter_tensor.default: reduce_scatter_tensor,
    ops.reduce_scatter_tensor_out.default: reduce_scatter_tensor,
    ops.reduce_scatter_tensor_coalesced.default: reduce_scatter_tensor_coalesced,
    ops.all_to_all_single.default: all_to_all_single,
    torch.ops._dtensor.shard_dim_alltoall.default: shard_dim_alltoall,
    ops.broadcast.default: broadcast,
    ops.broadcast_.default: broadcast_,
    ops.isend.default: isend,
    ops.irecv.default: irecv,
    ops.wait_tensor.default: wait_tensor,
    ops._wrap_tensor_autograd.default: wrap_tensor_autograd,
}


def register() -> None:
    """Route the functional collectives to these handlers."""
    for op, handler in HANDLERS.items():
        routing.register_special(op, handler)
