"""Argument flattening: a call's arguments split into a constant template and dynamic inputs.

The template (constants, with `Slot`s where inputs go) and the inputs' specs key a call's plan; the
dynamic values are what the plan's program is called with. `_flatten_positional` is every op's hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.core.dtypes import short_name
from tputrace.backend.core.entries import OpEntry
from tputrace.backend.core.plans import Slot, TensorList
from tputrace.backend.core.tensor import TpuTensor, geometry_of

UNFLATTENED = object()  # `_run`'s marker: the arguments were not flattened yet

_SLOTS = tuple(Slot(index) for index in range(1024))  # a foreach call over 76 parameters reads ~300 values

_N_SLOTS = len(_SLOTS)

_SLOT_TEMPLATES = tuple(_SLOTS[:count] for count in range(65))  # all-dynamic templates of positional calls

_NUMBER_TYPES = (int, float, bool, complex)

_SCALAR_SPECS = {kind: (kind.__name__,) for kind in _NUMBER_TYPES}


class DeviceMismatchError(RuntimeError):
    """Tensors on different chips (or the host) mixed in one op."""


class ArgumentFlattening:
    """The Dispatcher's argument flattening (a mixin: `read` and `from_host` are the dispatcher's)."""

    def _flatten_general(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> tuple[tuple, tuple, list, list, list, int]:
        """Split any call (keyword arguments, lists, host scalars; mixed chips are an error) into
        (template args, template kwargs, dynamic values, input specs, originals, chip)."""
        dynamic: list[Any] = []
        specs: list[tuple] = []
        originals: list[Any] = []
        chip_box = [-1]
        template_args = tuple(
            self._flatten_value(value, position in entry.scalar_positions, position in entry.scalar_list_positions, dynamic, specs, originals, chip_box)
            for position, value in enumerate(args)
        )
        template_kwargs = tuple(
            (name, self._flatten_value(value, name in entry.scalar_names, name in entry.scalar_list_names, dynamic, specs, originals, chip_box))
            for name, value in kwargs.items()
        )
        return template_args, template_kwargs, dynamic, specs, originals, chip_box[0]

    def _flatten_positional(self, args: Sequence[Any], scalar_positions: frozenset[int]) -> tuple[tuple, list, tuple, int] | None:
        """The common case: positional tpu tensors, Python scalars, constants and lists of constants
        (None if anything else). Returns (template args, dynamic values, input specs, chip). A call
        whose arguments are all dynamic shares one template; others build theirs from the first constant.
        Every op's hot path: a tensor is added as `_append_tensor` adds it, inline (no call per argument),
        and an argument's position is counted from what is built (no `enumerate` tuple per argument)."""
        dynamic: list[Any] = []
        specs: list[tuple] = []
        template: list[Any] | None = None
        chip = -1
        for value in args:
            value_type = type(value)
            if value_type is TpuTensor:
                buf = value._buf
                if chip != buf.chip:
                    if chip != -1:
                        return None
                    chip = buf.chip
                if value._view is None:
                    dynamic.append(buf.array)
                    spec = buf.spec
                    if spec is None:
                        spec = buf.spec = (value.shape, value.dtype)
                    specs.append(spec)
                else:
                    dynamic.append(self.read(value))
                    specs.append((value._geom or geometry_of(value)).spec)
            elif value_type in _NUMBER_TYPES and (len(dynamic) if template is None else len(template)) in scalar_positions:
                dynamic.append(value)  # the position: every argument so far is dynamic, or has its template entry
                specs.append(_SCALAR_SPECS[value_type])
            elif isinstance(value, torch.Tensor):
                return None
            else:
                if value_type is list:
                    if any(isinstance(item, torch.Tensor) for item in value):
                        return None
                    value = tuple(value)
                if template is None:
                    template = list(_SLOTS[: len(dynamic)])  # every earlier argument was dynamic
                template.append(value)
                continue
            if template is not None:
                template.append(_SLOTS[len(dynamic) - 1])
        return _SLOT_TEMPLATES[len(dynamic)] if template is None else tuple(template), dynamic, tuple(specs), chip

    def _flatten_value(self, value: Any, is_scalar: bool, is_scalar_list: bool, dynamic: list, specs: list, originals: list, chip_box: list) -> Any:
        if isinstance(value, TpuTensor):
            chip = value._buf.chip
            if chip_box[0] == -1:
                chip_box[0] = chip
            elif chip != chip_box[0]:
                raise DeviceMismatchError(
                    f"Expected all tensors to be on the same device, but found tpu:{chip_box[0]} and tpu:{chip}; "
                    f"move one with .to('tpu:{chip_box[0]}')"
                )
            slot = _SLOTS[len(dynamic)] if len(dynamic) < _N_SLOTS else Slot(len(dynamic))
            self._append_tensor(value, dynamic, specs)
            originals.append(value)
            return slot
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 and value.device.type == "cpu":
                slot = Slot(len(dynamic))
                scalar = value.item()
                dynamic.append(scalar)
                specs.append((f"{type(scalar).__name__}:{short_name(value.dtype)}",))
                originals.append(value)
                return slot
            raise DeviceMismatchError(
                f"Expected all tensors to be on the same device, but found tpu and {value.device}; "
                f"move the {value.device} tensor with .to('tpu')"
            )
        if is_scalar and isinstance(value, (int, float, bool, complex)):
            slot = Slot(len(dynamic))
            dynamic.append(value)
            specs.append((type(value).__name__,))
            originals.append(value)
            return slot
        if isinstance(value, (list, tuple)):
            if is_scalar_list:
                return self._flatten_scalar_list(value, dynamic, specs, originals, chip_box)
            if (value and type(value[0]) is TpuTensor) or any(isinstance(item, torch.Tensor) for item in value):
                return self._flatten_tensor_list(value, dynamic, specs, originals, chip_box)
            return tuple(value)
        return value

    def _append_tensor(self, tensor: TpuTensor, dynamic: list, specs: list) -> None:
        """Add a tpu tensor's current value and its (shape, dtype) spec to a call's dynamic inputs."""
        if tensor._view is None:
            buf = tensor._buf
            dynamic.append(buf.array)
            spec = buf.spec
            if spec is None:
                spec = buf.spec = (tensor.shape, tensor.dtype)
            specs.append(spec)
        else:
            dynamic.append(self.read(tensor))
            specs.append((tensor._geom or geometry_of(tensor)).spec)

    def _flatten_tensor_list(self, items: Sequence[Any], dynamic: list, specs: list, originals: list, chip_box: list) -> TensorList:
        """A list of tensors (a `_foreach_*` list, `cat`'s inputs, indices): tpu tensors on the call's
        chip are taken directly; anything else (host tensors, copied to the chip; None; another
        chip's tensor, an error) goes through `_flatten_value`."""
        host_chip = max(chip_box[0], 0)
        slots = []
        for item in items:
            if type(item) is TpuTensor and (chip_box[0] == item._buf.chip or chip_box[0] == -1):
                buf = item._buf
                chip_box[0] = buf.chip
                index = len(dynamic)
                slots.append(_SLOTS[index] if index < _N_SLOTS else Slot(index))
                originals.append(item)
                if item._view is None:  # `_append_tensor`'s first case, inline: every element of a `_foreach_*` list
                    dynamic.append(buf.array)
                    spec = buf.spec
                    if spec is None:
                        spec = buf.spec = (item.shape, item.dtype)
                    specs.append(spec)
                else:
                    self._append_tensor(item, dynamic, specs)
            else:
                slots.append(self._flatten_value(self._index_on_chip(item, host_chip), False, False, dynamic, specs, originals, chip_box))
        return TensorList(slots)

    def _flatten_scalar_list(self, items: Sequence[Any], dynamic: list, specs: list, originals: list, chip_box: list) -> tuple:
        """A list of Scalars (e.g. a `_foreach_*` ScalarList): Python numbers become dynamic inputs."""
        slots = []
        for item in items:
            spec = _SCALAR_SPECS.get(type(item))
            if spec is None:
                slots.append(self._flatten_value(item, True, False, dynamic, specs, originals, chip_box))
                continue
            index = len(dynamic)
            slots.append(_SLOTS[index] if index < _N_SLOTS else Slot(index))
            dynamic.append(item)
            specs.append(spec)
            originals.append(item)
        return tuple(slots)

    def _index_on_chip(self, value: Any, chip: int) -> Any:
        """Tensors in a list argument (e.g. the indices of `x[idx]`) may live on the host, as torch
        allows for accelerators: they are copied to the chip."""
        if isinstance(value, torch.Tensor) and not isinstance(value, TpuTensor) and value.dim() > 0 and value.device.type == "cpu":
            return self.from_host(value, chip)
        return value


def positional_originals(args: Sequence[Any], scalar_positions: frozenset[int]) -> list[Any]:
    """The arguments behind `_flatten_positional`'s dynamic values, in order (for meta kernels)."""
    return [
        value for position, value in enumerate(args)
        if type(value) is TpuTensor or (type(value) in _NUMBER_TYPES and position in scalar_positions)
    ]
