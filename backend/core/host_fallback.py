"""The CPU fallback: an op with no lowering (or whose lowering cannot take its inputs) runs on the host.

Inputs are copied out, outputs and written inputs copied back; each fallback warns once and is reported
to the recorder.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core import generators
from tputrace.backend.core.dtypes import short_name
from tputrace.backend.core.entries import OpEntry
from tputrace.backend.core.tensor import TpuTensor, geometry_of
from tputrace.backend.indexing import mask_indexing
from tputrace.recording.interface import Recording
from tputrace.performance_warnings import CpuFallbackWarning
from tputrace.sourceloc import first_user_location

_perf_ns = time.perf_counter_ns

# Ops whose output shape depends on the values: when one runs on the host (a call that `data_dependent`
# or `mask_indexing` leaves to it), reading its inputs is a data-dependent sync.
_DATA_DEPENDENT_OPS = frozenset(
    {"aten::nonzero", "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
     "aten::masked_select", "aten::bincount", "aten::histc", "aten::repeat_interleave", "aten::nonzero_static"}
)


class CpuFallback:
    """The Dispatcher's CPU fallback and its warnings (a mixin)."""

    recorder: Recording | None
    warned_keys: set[str]

    def fallback(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        """Run the op on the host CPU: inputs copied out, outputs (and mutated inputs) copied back."""
        if entry.op.namespace == "c10d":
            raise RuntimeError(
                f"{entry.name} on tpu tensors in a process group without the 'tpu' backend (made before "
                "`import tputrace.backend`?): import tputrace.backend before init_process_group/new_group, or pass backend='tpu'"
            )
        on_chip = mask_indexing.ROUTES.get(entry.op)
        if on_chip is not None and (selected := on_chip(self, args, kwargs)) is not None:
            return selected  # `x[mask]`: indexed on the chip by the mask's set positions
        self._warn_fallback(entry.name, "it has no lowering" if entry.lowering is None else "its lowering cannot take these inputs (e.g. a data-dependent shape)")
        sync_kind = "data_dependent" if entry.op._schema.name in _DATA_DEPENDENT_OPS else "fallback"
        start = _perf_ns()
        chip_box = [0]
        to_cpu = {}

        def host_of(value: Any) -> Any:
            if isinstance(value, TpuTensor):
                chip_box[0] = value._buf.chip
                host = self.to_host(value, sync_kind)
                memory_format = (value._geom or geometry_of(value)).memory_format
                if memory_format is not None:  # the CPU kernel's outputs follow its inputs' format
                    host = host.contiguous(memory_format=memory_format)
                to_cpu[id(host)] = value
                return host.requires_grad_(False)
            if isinstance(value, torch.Generator):
                return generators.host_generator(value)
            if isinstance(value, (list, tuple)):
                return type(value)(host_of(item) for item in value)
            return value

        host_args = host_of(args)
        host_kwargs = {name: host_of(value) for name, value in kwargs.items()}
        if "device" in host_kwargs:
            host_kwargs["device"] = torch.device("cpu")
        transferred = [host_kwargs[name] for name in entry.out_names if isinstance(host_kwargs.get(name), torch.Tensor)]
        for host in transferred:  # out= tensors the kernel may resize need storage torch owns
            if id(host) in to_cpu:
                resizable = host.clone()
                to_cpu[id(resizable)] = to_cpu[id(host)]
                host_kwargs[next(name for name in entry.out_names if host_kwargs.get(name) is host)] = resizable
        result = entry.op(*host_args, **host_kwargs)
        chip = chip_box[0]
        for host in _written_hosts(entry, host_args, host_kwargs):
            target = to_cpu.get(id(host))
            if target is not None:
                if tuple(host.shape) != tuple(target.shape):
                    target.resize_(host.shape)
                self.write(target, self.to_chip(host.to(target.dtype).contiguous(), target._buf.chip))

        def back(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                target = to_cpu.get(id(value))
                return target if target is not None else self.from_host(value, chip)
            if isinstance(value, (list, tuple)):
                return type(value)(back(item) for item in value)
            return value

        output = back(result)
        if self.recorder is not None:
            inputs = ", ".join(
                f"{short_name(value.dtype)}[{','.join(map(str, value.shape))}]" for value in args if isinstance(value, torch.Tensor)
            )
            self.recorder.fell_back(entry.name, inputs, chip, start, _perf_ns() - start)
        return output

    def _warn_fallback(self, op_name: str, why: str) -> None:
        self._warn_once(op_name, f"tputrace: {op_name} runs on the host CPU because {why}; it is counted as a CPU fallback",
                        CpuFallbackWarning)

    def _warn_once(self, key: str, message: str, category: type[Warning] = RuntimeWarning) -> None:
        """Warn once per key, at the user's line that led here."""
        if key in self.warned_keys:
            return
        self.warned_keys.add(key)
        location = first_user_location(2)
        if location is None:
            warnings.warn(message, category, stacklevel=3)
        else:
            warnings.warn_explicit(message, category, location[0], location[1])


def _written_hosts(entry: OpEntry, host_args: Sequence[Any], host_kwargs: dict) -> list[torch.Tensor]:
    written = []
    for position in entry.mutated_positions:
        if position < len(host_args):
            value = host_args[position]
            written.extend(value if isinstance(value, (list, tuple)) else [value])
    for name in entry.out_names:
        value = host_kwargs.get(name)
        if value is not None:
            written.extend(value if isinstance(value, (list, tuple)) else [value])
    return [value for value in written if isinstance(value, torch.Tensor)]
