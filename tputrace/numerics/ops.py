"""Per-op digests inside one module call (`tputrace numerics --ops`): the call runs again on the tpu and on its CPU
copy under a dispatch mode that keeps each op's floating output, and the ops are paired by name in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tputrace.numerics.digests import difference, dtype_name
from tputrace.numerics.store import OpRow
from tputrace.numerics.tolerance import tolerance_for


class _OpOutputs(TorchDispatchMode):
    """Keeps (op name, host copy of the first floating output) for every op dispatched under it."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[tuple[str, torch.Tensor]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if tensors:
            self.outputs.append((str(func.overloadpacket.__name__), tensors[0].detach().cpu()))
        return result


def op_outputs(run: Callable[[], Any]) -> list[tuple[str, torch.Tensor]]:
    """The ops `run` dispatches, each with a host copy of its first floating output."""
    mode = _OpOutputs()
    with mode, torch.no_grad():
        run()
    return mode.outputs


def compare_ops(tpu_ops: list[tuple[str, torch.Tensor]], cpu_ops: list[tuple[str, torch.Tensor]]) -> list[OpRow]:
    """Pair each tpu op with the next CPU op of the same name (in order) and compare their outputs: per tpu op, how
    far its first floating output left the CPU's (None for an op the CPU run does not have, such as autocast's
    casts)."""
    comparisons = []
    cpu_position = 0
    for index, (name, tpu_value) in enumerate(tpu_ops):
        match = next((j for j in range(cpu_position, len(cpu_ops)) if cpu_ops[j][0] == name), None)
        if match is None:
            comparisons.append(OpRow(index, name, dtype_name(tpu_value.dtype), None, None, None))
            continue
        cpu_position = match + 1
        cpu_value = cpu_ops[match][1]
        reference_dtype = dtype_name(cpu_value.dtype)
        comparisons.append(
            OpRow(
                index,
                name,
                dtype_name(tpu_value.dtype),
                reference_dtype,
                difference(tpu_value, cpu_value)[0],
                tolerance_for(reference_dtype),
            )
        )
    return comparisons
