"""`nn.DataParallel` over tpu chips: the copies of `torch.nn.parallel.comm`, for tpu tensors.

DataParallel replicates the module with `comm.broadcast_coalesced`, splits the batch with
`comm.scatter`, joins the outputs with `comm.gather` and sums the replicas' gradients with
`comm.reduce_add`. torch implements the first three in C++ for CUDA only (`torch._C._scatter` and
the like, absent from CPU builds), and `reduce_add` asks NCCL first. For tpu tensors they are
chip-to-chip copies and one sum; every other call goes to torch's own functions.

As torch's kernels do, the copy for the source chip is the tensor itself (a scattered chunk is a
view of the input), and the device indices these functions take name tpu chips.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._utils
from torch._utils import _get_device_index
from torch.nn.parallel import comm

from tputrace.backend.core.tensor import TpuTensor

_installed = False


def _tpu(index: int) -> torch.device:
    return torch.device("tpu", index)


def _for_tpu(tensors: Sequence[Any]) -> bool:
    """Whether a comm call is ours: it moves tpu tensors, or host tensors while tpu is the accelerator
    DataParallel runs on (device indices then name tpu chips)."""
    if any(type(tensor) is TpuTensor for tensor in tensors):
        return True
    return bool(tensors) and all(tensor.device.type == "cpu" for tensor in tensors) and torch._utils._get_available_device_type() == "tpu"


def broadcast(tensor: torch.Tensor, devices: Sequence[Any] | None = None, *, out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    if (devices is None) == (out is None):
        raise RuntimeError(f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}")
    if out is not None:
        for target in out:
            target.copy_(tensor)
        return tuple(out)
    return tuple(tensor.to(_tpu(_get_device_index(device))) for device in devices)


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[Any], buffer_size: int = 10485760) -> list[list[torch.Tensor]]:
    """A copy of `tensors` per device; the first device's are the tensors themselves (they must live there)."""
    indices = [_get_device_index(device) for device in devices]
    for tensor in tensors:
        if tensor.device != _tpu(indices[0]):
            raise RuntimeError(f"broadcast_coalesced: all tensors must be on devices[0] (tpu:{indices[0]}), found one on {tensor.device}")
    return [list(tensors)] + [[tensor.to(_tpu(index)) for tensor in tensors] for index in indices[1:]]


def scatter(
    tensor: torch.Tensor,
    devices: Sequence[Any] | None = None,
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams: Any = None,
    *,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    if out is not None:
        if devices is not None or chunk_sizes is not None:
            raise RuntimeError("'devices' and 'chunk_sizes' must not be given with 'out'")
        chunks = tensor.split_with_sizes([target.size(dim) for target in out], dim)
        for target, chunk in zip(out, chunks):
            target.copy_(chunk)
        return tuple(out)
    if devices is None:
        raise RuntimeError("Exactly one of 'devices' and 'out' must be specified")
    indices = [_get_device_index(device) for device in devices]
    if chunk_sizes is None:
        chunks = tensor.chunk(len(indices), dim)
    else:
        if sum(chunk_sizes) != tensor.size(dim):
            raise RuntimeError(f"Expected chunk sizes {list(chunk_sizes)} to sum to {tensor.size(dim)} (the size of dim {dim})")
        chunks = tensor.split_with_sizes(list(chunk_sizes), dim)
    return tuple(chunk.to(_tpu(index)) for chunk, index in zip(chunks, indices))


def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    if out is not None:
        if destination is not None:
            raise RuntimeError("'destination' must not be given with 'out'")
        return torch.cat([tensor.to(out.device) for tensor in tensors], dim, out=out)
    index = _get_device_index(destination, allow_cpu=True, optional=True)
    target = torch.device("cpu") if index == -1 else _tpu(index)
    return torch.cat([tensor.to(target) for tensor in tensors], dim)


def reduce_add(inputs: Sequence[torch.Tensor], destination: Any = None) -> torch.Tensor:
    """The sum of `inputs`, on `destination` (one of their chips), with no NCCL to ask."""
    index = _get_device_index(destination, optional=True)
    root = next((position for position, tensor in enumerate(inputs) if tensor.get_device() == index), None)
    if root is None:
        raise RuntimeError("reduce_add expects destination to be on the same chip as one of the tensors")
    if len(inputs) == 1:
        return inputs[0]
    target = _tpu(index)
    result = inputs[root] + 0
    for position, tensor in enumerate(inputs):
        if position != root:
            result.add_(tensor.to(target))
    return result


def _routed(original: Callable[..., Any], ours: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def routed(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs) if _for_tpu(_first(args, kwargs)) else original(*args, **kwargs)

    return routed


def _first(args: tuple, kwargs: dict) -> Sequence[Any]:
    """The tensors of a comm call's first argument (a tensor, or a sequence of them)."""
    first = args[0] if args else next(iter(kwargs.values()))
    return [first] if isinstance(first, torch.Tensor) else list(first)


def install() -> None:
    """Route `torch.nn.parallel.comm`'s copies for tpu tensors to the functions above (once)."""
    global _installed
    if _installed:
        return
    for name, ours in (
        ("broadcast", broadcast),
        ("broadcast_coalesced", broadcast_coalesced),
        ("scatter", scatter),
        ("gather", gather),
        ("reduce_add", reduce_add),
    ):
        setattr(comm, name, _routed(getattr(comm, name), ours))
    _installed = True
