"""`_foreach_*` calls whose lists mix tpu tensors with another tensor subclass.

Optimizers group their lists by device and dtype only, so in a tensor-parallel model a DTensor
parameter (whose local shard is on a tpu chip) and a plain tpu parameter land in one `_foreach_*`
call. The tpu elements run here as one op; the others go back to torch as their own `_foreach_*`
call, which their subclass dispatches (DTensor runs it shard by shard).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

Handler = Callable[[Any, Sequence[Any], dict], Any]


def route(handler: Handler, op: torch._ops.OpOverload) -> Handler:
    """The dispatcher's handler for `op`, splitting mixed lists first when `op` is a foreach op."""
    schema = op._schema
    if not schema.name.startswith("aten::_foreach_"):
        return handler
    from tputrace.backend.core.tensor import TpuTensor

    arguments = schema.arguments
    positional = [index for index, arg in enumerate(arguments) if not arg.kwarg_only]
    split_names = {
        arg.name for arg in arguments if str(arg.type).startswith("List[") or (arg.name == "scalars" and str(arg.type) == "Tensor")
    }
    tensor_lists = [index for index in positional if str(arguments[index].type) in ("List[Tensor]", "List[Optional[Tensor]]")]

    def foreign_positions(args: Sequence[Any]) -> list[int]:
        foreign: list[int] = []
        for list_index in tensor_lists:
            if list_index >= len(args):
                continue
            kinds = set(map(type, args[list_index]))  # one pass in C over a list that is usually all tpu tensors
            if not any(kind is not TpuTensor and kind is not torch.Tensor and issubclass(kind, torch.Tensor) for kind in kinds):
                continue
            for position, value in enumerate(args[list_index]):
                value_type = type(value)
                if value_type is not TpuTensor and value_type is not torch.Tensor and isinstance(value, torch.Tensor):
                    foreign.append(position)
            if foreign:
                break
        return foreign

    def select(value: Any, name: str, positions: list[int]) -> Any:
        if name not in split_names:
            return value
        if isinstance(value, torch.Tensor):
            return value.reshape(-1)[positions] if value.dim() > 0 else value
        return [value[position] for position in positions]

    def split_handler(entry: Any, args: Sequence[Any], kwargs: dict) -> Any:
        foreign = foreign_positions(args)
        if not foreign:
            return handler(entry, args, kwargs)
        length = len(args[tensor_lists[0]])
        foreign_set = set(foreign)
        own = [position for position in range(length) if position not in foreign_set]
        if not own:
            return NotImplemented

        def part(positions: list[int]) -> tuple[tuple, dict]:
            part_args = tuple(select(value, arguments[index].name, positions) for index, value in zip(positional, args))
            return part_args, {name: select(value, name, positions) for name, value in kwargs.items()}

        own_args, own_kwargs = part(own)
        own_result = handler(entry, own_args, own_kwargs)
        foreign_args, foreign_kwargs = part(foreign)
        foreign_result = op(*foreign_args, **foreign_kwargs)
        if own_result is None:
            return None
        merged: list[Any] = [None] * length
        for positions, results in ((own, own_result), (foreign, foreign_result)):
            for position, result in zip(positions, results):
                merged[position] = result
        return merged

    return split_handler
