"""Transfers and syncs: copies between the host and a chip or between chips, `.to()`, `copy_` and `.item()`.

Each is reported to the recorder: a read to the host is a sync (the host waits for the chip) and a transfer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import torch

from tputrace.backend.core import arg_checks, chips, host_origins, sparse, transfers
from tputrace.backend.core.buffers import CountedBuffer
from tputrace.backend.core.dtypes import cast, to_jax
from tputrace.backend.core.executor import Executor
from tputrace.backend.core.memory_formats import storage_order
from tputrace.backend.core.plan_building import internal_entry
from tputrace.backend.core.tensor import TpuTensor, channels_last_tensor, geometry_of
from tputrace.backend.core.thread_state import sync_hint
from tputrace.backend.indexing import index_checks, padded_reads
from tputrace.recording.interface import Recording

aten = torch.ops.aten
_perf_ns = time.perf_counter_ns


class HostTransfers:
    """The Dispatcher's transfers and syncs (a mixin)."""

    executor: Executor
    recorder: Recording | None

    def _to_copy(self, args: Sequence[Any], kwargs: dict) -> torch.Tensor:
        source = args[0]
        device = kwargs.get("device")
        dtype = kwargs.get("dtype") or source.dtype
        if device is not None and torch.device(device).type == "meta":
            return _meta_copy(source, kwargs)
        memory_format = kwargs.get("memory_format")
        if device is not None and torch.device(device).type == "cpu":
            host = self.to_host(source, sync_hint() or "cpu")
            host = host if host.dtype == dtype else host.to(dtype)
            if memory_format is not None or (source._geom or geometry_of(source)).memory_format is not None:
                host = _with_host_layout(host, source, kwargs)
            return host
        target_chip = source._buf.chip if device is None or torch.device(device).index is None else torch.device(device).index
        if target_chip != source._buf.chip:
            source = self.copy_to_chip(source, target_chip)
            if dtype == source.dtype and memory_format in (None, torch.preserve_format, torch.contiguous_format):
                return source
        convert_kwargs = {"dtype": dtype} if memory_format is None else {"dtype": dtype, "memory_format": memory_format}
        return self.compute(_CONVERT_ENTRY, (source,), convert_kwargs, record_as="aten._to_copy.default")

    def _copy_(self, args: Sequence[Any], kwargs: dict) -> torch.Tensor:
        target, source = args[0], args[1]
        if not isinstance(target, TpuTensor):
            host = self.to_host(source, sync_hint() or "cpu")
            with torch._C._DisableTorchDispatch():
                target.copy_(host)
            return target
        if not isinstance(source, TpuTensor):
            host = source.detach().to(target.dtype).expand(target.shape).contiguous()
            self.write(target, self.to_chip(host, target._buf.chip, made_as=source))
            return target
        arg_checks.check_write(target, (source,), aten.copy_.default)
        if source._buf.chip != target._buf.chip:
            source = self.copy_to_chip(source, target._buf.chip)
        if source.dtype == target.dtype and tuple(source.shape) == tuple(target.shape):
            self.write(target, self.read(source))
        else:
            self.write(target, self.read(self._cast_broadcast(source, target)))
        return target

    def _local_scalar_dense(self, args: Sequence[Any], kwargs: dict) -> Any:
        tensor = args[0]
        host = self.to_host(tensor, sync_hint() or "item")
        return host.item()

    def to_host(self, tensor: TpuTensor, sync_kind: str) -> torch.Tensor:
        """A CPU copy of a tpu tensor: the host waits for the chip (a sync) and copies (a transfer);
        an index out of range on the chip since the last sync raises here (see `index_checks`)."""
        self.raise_worker_errors()
        start = _perf_ns()
        cut = padded_reads.host_cut(tensor)  # a data-dependent output: its padded buffer, cut here
        value, pending = self.executor.concrete(self.read(tensor) if cut is None else tensor._buf.array, sync_kind)
        jax.block_until_ready(value)
        index_checks.raise_if_out_of_range(self.recorder, tensor._buf.chip)
        stall_end = _perf_ns()
        host = transfers.array_to_torch(value, tensor.dtype, cut)
        end = _perf_ns()
        if self.recorder is not None:
            nbytes = host.numel() * host.element_size() if cut is None else value.nbytes
            self.recorder.synced(sync_kind, tensor._buf.chip, start, stall_end - start, pending)
            self.recorder.transferred("d2h", nbytes, tensor._buf.chip, -1, stall_end, end - stall_end)
        return host

    def to_chip(self, host: torch.Tensor, chip: int, made_as: torch.Tensor | None = None) -> Any:
        """A chip array holding `host`; `made_as` is the user's tensor that `host` copies (its origin is recorded)."""
        start = _perf_ns()
        array = transfers.torch_to_array(host, chips.device(chip))
        if self.recorder is not None:
            origin = host_origins.origin_of(host if made_as is None else made_as)
            self.recorder.transferred("h2d", host.numel() * host.element_size(), -1, chip, start, _perf_ns() - start, origin)
        if self.executor.deferred:
            self.executor.arrived(array)
        return array

    def copy_to_chip(self, tensor: TpuTensor, chip: int) -> TpuTensor:
        """A copy on another chip; the transfer's time starts after the pending work that makes the
        value has run (its flush and compile are recorded as such, not as transfer time)."""
        value = self.executor.concrete(self.read(tensor), "transfer")[0]
        start = _perf_ns()
        array = jax.device_put(value, chips.device(chip))
        nbytes = tensor.numel() * tensor.element_size()
        if self.recorder is not None:
            self.recorder.transferred("d2d", nbytes, tensor._buf.chip, chip, start, _perf_ns() - start)
        return TpuTensor(CountedBuffer(array, chip, nbytes), tuple(tensor.shape), tensor.dtype)

    def from_host(self, host: torch.Tensor, chip: int) -> TpuTensor:
        """A new tpu tensor holding a copy of a CPU tensor (a sparse one densified: see `sparse`); a
        channels-last one stays channels-last."""
        made_as = host
        if host.layout != torch.strided:
            sparse.warn_dense(host.layout)
            host = host.to_dense()
        order = storage_order(tuple(host.shape), tuple(host.stride())) if host.dim() in (4, 5) else None
        if order is not None:
            stored = host.detach().permute(order)  # contiguous: the host tensor's own storage order
            buf = CountedBuffer(self.to_chip(stored, chip, made_as), chip, host.numel() * host.element_size())
            return channels_last_tensor(buf, tuple(host.shape), tuple(host.stride()), host.dtype, order)
        host = host.detach().contiguous()
        array = self.to_chip(host, chip, made_as)
        return TpuTensor(CountedBuffer(array, chip, host.numel() * host.element_size()), tuple(host.shape), host.dtype)


def _with_host_layout(host: torch.Tensor, source: TpuTensor, kwargs: dict) -> torch.Tensor:
    """A contiguous host copy of `source` laid out as torch's `_to_copy` lays it out (a channels-last
    tensor stays channels-last on the CPU, as a CUDA one does)."""
    meta_kwargs = {name: value for name, value in kwargs.items() if name not in ("pin_memory", "non_blocking")}
    strides = _meta_copy(source, {**meta_kwargs, "device": torch.device("meta")}).stride()
    if tuple(strides) == tuple(host.stride()):
        return host
    return torch.empty_strided(tuple(host.shape), strides, dtype=host.dtype).copy_(host)


def _meta_copy(source: TpuTensor, kwargs: dict) -> torch.Tensor:
    """`.to("meta")`: a meta tensor with the source's sizes and strides, converted as torch converts
    (ZeroTensor's kernels and meta-device model code move tensors to meta to compute only shapes)."""
    meta_source = torch.empty_strided(tuple(source.shape), source.stride(), dtype=source.dtype, device="meta")
    return aten._to_copy.default(meta_source, **kwargs)


def _convert_lowering(source: Any, *, dtype: torch.dtype, memory_format: Any = None) -> Any:
    return cast(source, to_jax(dtype))


_CONVERT_ENTRY = internal_entry(aten._to_copy.default, _convert_lowering)
