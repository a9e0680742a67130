"""Host staging for collectives: tpu tensors travel through host tensors that gloo moves between ranks.

A `Staging` collects the host copies of one collective's inputs and the host buffers its results land
in, and writes those results back into the tpu (or non-contiguous CPU) tensors when the transport has
finished. Reading a tpu tensor here waits for its value (running pending deferred work) without being
recorded as a user-visible host sync or transfer: it is part of the collective, whose row covers it.

When the chips are XLA CPU devices (no TPU on the host), an input the transport only reads is handed
over without a copy (a DLPack view of the chip's array), and a result goes back to the chip without
one (`jax.device_put` of host memory aliases it); a buffer the transport writes in place is a copy.
As with any collective, an input must not be changed until its work has completed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tputrace.backend.core import chips, hooks, routing, transfers
from tputrace.backend.core.tensor import TpuTensor


class StagingError(RuntimeError):
    """Tensors a collective cannot move (mixed devices or dtypes where one buffer is needed)."""


class Staging:
    """The host side of one collective: host inputs, host outputs, and where the outputs go back."""

    def __init__(self, tensors: Sequence[torch.Tensor], kind: str) -> None:
        self.kind = kind
        self.writes: list[tuple[torch.Tensor, torch.Tensor]] = []
        if any(isinstance(tensor, TpuTensor) for tensor in tensors):
            hooks.flush_pending("collective")

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous host tensor holding `tensor`'s current value, for the transport to read only
        (the tensor itself for contiguous CPU tensors, a view of the chip's memory where it is host memory)."""
        return self._read(tensor)[0]

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor of `tensor`'s value that the transport may write into."""
        host, shared = self._read(tensor)
        return host.clone() if shared else host

    def inout(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host buffer that starts with `tensor`'s value and whose final value goes back into it
        (a contiguous CPU tensor is its own buffer)."""
        host, shared = self._read(tensor)
        if host is tensor:
            return host
        if shared:
            host = host.clone()
        self.written(tensor, host)
        return host

    def _read(self, tensor: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The host value and whether it shares memory with the tensor or its chip array."""
        if isinstance(tensor, TpuTensor):
            dispatcher = routing.active()
            value, _ = dispatcher.executor.concrete(dispatcher.read(tensor), "collective")
            host = _host_view(value, tensor.dtype)
            if host is not None:
                return host.reshape(tensor.shape), True
            return transfers.array_to_torch(value, tensor.dtype).reshape(tensor.shape), False
        if tensor.device.type != "cpu":
            raise StagingError(f"a tpu process group cannot move a tensor on {tensor.device}; use tpu or cpu tensors")
        return (tensor, True) if tensor.is_contiguous() else (tensor.contiguous(), False)

    def output(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host buffer whose final value goes back into `tensor` (its starting contents are undefined)."""
        if not isinstance(tensor, TpuTensor) and tensor.device.type == "cpu" and tensor.is_contiguous():
            return tensor
        if not isinstance(tensor, TpuTensor) and tensor.device.type != "cpu":
            raise StagingError(f"a tpu process group cannot move a tensor on {tensor.device}; use tpu or cpu tensors")
        host = torch.empty(tuple(tensor.shape), dtype=tensor.dtype)
        self.written(tensor, host)
        return host

    def written(self, tensor: torch.Tensor, host: torch.Tensor) -> None:
        if host is not tensor:
            self.writes.append((tensor, host))

    def flat_inout(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """One host buffer holding all `tensors` back to back (one transport call for a coalesced op)."""
        if len(tensors) == 1:
            return self.inout(tensors[0]).view(-1)
        dtype = _one_dtype(tensors)
        flat = torch.cat([self.read(tensor).reshape(-1) for tensor in tensors]) if tensors else torch.empty(0, dtype=dtype)
        self._written_in_pieces(tensors, flat)
        return flat

    def flat_output(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """One 1-D host buffer whose consecutive pieces go back into `tensors` (starting contents undefined)."""
        flat = torch.empty(sum(tensor.numel() for tensor in tensors), dtype=_one_dtype(tensors))
        self._written_in_pieces(tensors, flat)
        return flat

    def _written_in_pieces(self, tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
        """Each of `tensors` takes back its consecutive piece of `flat` at the write-back."""
        offset = 0
        for tensor in tensors:
            count = tensor.numel()
            self.written(tensor, flat[offset : offset + count].view(tuple(tensor.shape)))
            offset += count

    def write_back(self) -> None:
        """Put every host result into its tensor (tpu: a new array on its chip, written as `copy_` would)."""
        for tensor, host in self.writes:
            if isinstance(tensor, TpuTensor):
                array = transfers.torch_to_array(host.reshape(tuple(tensor.shape)), chips.device(tensor._buf.chip))
                routing.active().write(tensor, array)
            else:
                with torch.no_grad():
                    tensor.copy_(host.view(tuple(tensor.shape)))
        self.writes.clear()


def _host_view(value: object, dtype: torch.dtype) -> torch.Tensor | None:
    """A CPU tensor sharing the memory of a chip array on an XLA CPU device (None on other devices)."""
    try:
        if any(device.platform != "cpu" for device in value.devices()):  # type: ignore[attr-defined]
            return None
        host = torch.from_dlpack(value)
    except (AttributeError, BufferError, RuntimeError, TypeError):
        return None
    return host if host.dtype == dtype and host.is_contiguous() else None


def _one_dtype(tensors: Sequence[torch.Tensor]) -> torch.dtype:
    dtypes = {tensor.dtype for tensor in tensors}
    if len(dtypes) > 1:
        names = ", ".join(sorted(str(dtype).removeprefix("torch.") for dtype in dtypes))
        raise StagingError(f"a coalesced collective needs one dtype, got {names}")
    return next(iter(dtypes))
