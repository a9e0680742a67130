"""FSDP2's own ops (`torch.ops.fsdp.*`) on tpu tensors: copying shards into the all-gather buffer,
splitting it back into parameters, and packing gradients for the reduce-scatter.

Each writes its results straight into the buffers FSDP2 allocated for them, as the CUDA kernels do:
no whole intermediate (a concatenation, a chunked copy) is built first. The flat all-gather output
and the packed gradients are freed after their last use (the copy-out; the reduce-scatter's staging
to the host) although FSDP2 keeps references to them, which exist only to pace CUDA's caching
allocator against side streams. So the peak memory of a rank holds the shards, the blocks in use, and
what the model itself allocates.

FSDP2 also frees each unsharded parameter between uses by resizing its storage to 0; that is
`TpuTensor.untyped_storage()` and `Buffer.release()`/`restore()` in `tputrace.backend.core.tensor`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.core import routing
from tputrace.backend.core.buffers import Buffer
from tputrace.backend.core.tensor import TpuTensor

# The gradient buffers chunk_cat packed for a reduce-scatter (see `release_reduce_scatter_input`).
_reduce_scatter_inputs: "weakref.WeakSet[Buffer]" = weakref.WeakSet()


def write_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """`target.copy_(source)` without a counted result: the source's value goes straight into the
    target's buffer (a view's is scattered into it), as an `out=` kernel writes into its output.
    Mixed dtypes, shapes or chips take the ordinary `copy_`."""
    if (
        isinstance(target, TpuTensor)
        and isinstance(source, TpuTensor)
        and target.dtype == source.dtype
        and tuple(target.shape) == tuple(source.shape)
        and target._buf.chip == source._buf.chip
    ):
        dispatcher = routing.active()
        dispatcher.write(target, dispatcher.read(source))
        return
    with torch.no_grad():
        target.copy_(source)


def all_gather_copy_in(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shards, back to back, in its slot of the all-gather output."""
    inputs, output, split_sizes, input_numel, rank = args
    storage = output.untyped_storage()
    if storage.size() == 0:  # a reused output whose storage the last copy-out freed
        storage.resize_(output.numel() * output.element_size())
    slot = output.narrow(0, int(input_numel) * int(rank), int(input_numel))
    offset = 0
    for tensor, size in zip(inputs, split_sizes):
        write_into(slot.narrow(0, offset, int(size)), tensor.reshape(-1).to(output.dtype))
        offset += int(size)
    return slot, output


def split_with_sizes_copy(args: tuple, kwargs: dict) -> None:
    """Split the all-gather output along `dim` into the parameters' buffers, then free its storage.

    The copy-out is the all-gather output's last use, but FSDP2 keeps a reference to it beyond that
    (in forward, until the next block's copy-out has finished, so that CUDA's caching allocator does
    not hand the memory to the next all-gather while a side stream still reads it). A tpu chip has
    no side streams: the storage is freed here, as FSDP2 frees unsharded parameters (resized to 0)."""
    output = args[0]
    split_sizes = [int(size) for size in args[1]]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    for target, piece in zip(kwargs["out"], torch.split(output, split_sizes, dim=dim)):
        write_into(target, piece)
    if _is_whole_buffer(output) and sum(split_sizes) == output.shape[dim]:
        output.untyped_storage().resize_(0)


def chunk_cat(args: tuple, kwargs: dict) -> None:
    """`torch._chunk_cat(tensors, dim, num_chunks, out=out)`: each tensor split into `num_chunks`
    chunks along `dim` (zero-padded to equal chunks), chunk i of every tensor side by side in row i
    of `out`. FSDP2 packs a block's gradients this way for the reduce-scatter."""
    tensors, dim, num_chunks = args
    out = kwargs["out"]
    rows = _chunk_rows(out, tensors, int(dim), int(num_chunks))
    offset = 0
    for tensor in tensors:
        chunked = _chunked(tensor, int(dim), int(num_chunks)).to(out.dtype)
        width = chunked.shape[-1]
        write_into(rows.narrow(-1, offset, width), chunked)
        offset += width
    if _is_whole_buffer(out):  # FSDP2 passes a (world size, -1) view of the buffer it reduce-scatters
        _reduce_scatter_inputs.add(out._buf)


def release_reduce_scatter_input(tensor: torch.Tensor) -> None:
    """Free the storage of a gradient buffer chunk_cat packed, once a reduce-scatter has staged it to
    the host (called by the process group). FSDP2 does not read it again but keeps a reference until
    the next block's reduce-scatter, so that CUDA's caching allocator does not reuse the memory while
    a side stream still reads it; here the transport reads the host copy, so nothing needs it."""
    if _is_whole_buffer(tensor) and tensor._buf in _reduce_scatter_inputs:
        _reduce_scatter_inputs.discard(tensor._buf)
        tensor.untyped_storage().resize_(0)


def _is_whole_buffer(tensor: torch.Tensor) -> bool:
    """A tpu tensor that covers all of its buffer (the buffer itself, or a reshaped view of it)."""
    if not isinstance(tensor, TpuTensor) or tensor.storage_offset() != 0 or not tensor.is_contiguous():
        return False
    return tensor.numel() * tensor.element_size() == tensor.untyped_storage().size()


def _chunk_rows(out: torch.Tensor, tensors: Sequence[torch.Tensor], dim: int, num_chunks: int) -> torch.Tensor:
    """`out` seen as (*the tensors' leading dims, num_chunks, the chunks' elements side by side)."""
    leading = tuple(tensors[0].shape[:dim])
    return out.view(*leading, num_chunks, -1)


def _chunked(tensor: torch.Tensor, dim: int, num_chunks: int) -> torch.Tensor:
    """`tensor` as (*leading dims, num_chunks, one chunk's elements), zero-padded along `dim` to a
    multiple of `num_chunks` (a view when no padding is needed)."""
    size = tensor.shape[dim]
    chunk = -(-size // num_chunks)
    if chunk * num_chunks != size:
        padding = [0, 0] * (tensor.dim() - dim - 1) + [0, chunk * num_chunks - size]
        tensor = torch.nn.functional.pad(tensor, padding)
    leading = tuple(tensor.shape[:dim])
    return tensor.reshape(*leading, num_chunks, -1)


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
        routing.register_special(op, handler)
