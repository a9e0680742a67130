"""FSDP2's own ops (`torch.ops.fsdp.*`) on tpu tensors: copying shards into the all-gather buffer,
splitting it back into parameters, and packing gradients for the reduce-scatter.

FSDP2 also frees each unsharded parameter between uses by resizing its storage to 0; that is
`TpuTensor.untyped_storage()` and `Buffer.release()`/`restore()` in `tputrace.backend.tensor`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tputrace.backend.dispatch import dispatcher


def all_gather_copy_in(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shards, back to back, in its slot of the all-gather output."""
    inputs, output, split_sizes, input_numel, rank = args
    slot = output.narrow(0, int(input_numel) * int(rank), int(input_numel))
    with torch.no_grad():
        slot.copy_(torch.cat([tensor.reshape(-1).to(output.dtype) for tensor in inputs]) if len(inputs) > 1 else inputs[0].reshape(-1))
    return slot, output


def split_with_sizes_copy(args: tuple, kwargs: dict) -> None:
    """Split the all-gather output along `dim` into the parameters' buffers."""
    output = args[0]
    split_sizes = args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    with torch.no_grad():
        for target, piece in zip(kwargs["out"], torch.split(output, [int(size) for size in split_sizes], dim=dim)):
            target.copy_(piece)


def chunk_cat(args: tuple, kwargs: dict) -> None:
    tensors, dim, num_chunks = args
    with torch.no_grad():
        kwargs["out"].copy_(torch._chunk_cat(list(tensors), dim, num_chunks))


def copy_(args: tuple, kwargs: dict) -> None:
    tensor, data = args
    with torch.no_grad():
        tensor.copy_(data)


def _handlers() -> dict[Any, Callable[[tuple, dict], Any]]:
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401 - defines torch.ops.fsdp
    import torch.distributed.fsdp._fully_shard._fsdp_param  # noqa: F401 - defines fsdp::copy_

    fsdp = torch.ops.fsdp
    return {
        fsdp.all_gather_copy_in.default: all_gather_copy_in,
        fsdp.split_with_sizes_copy.default: split_with_sizes_copy,
        fsdp.chunk_cat.default: chunk_cat,
        fsdp.copy_.default: copy_,
    }


def register() -> None:
    for op, handler in _handlers().items():
        dispatcher.register_special(op, handler)
