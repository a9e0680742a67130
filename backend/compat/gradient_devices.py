"""A custom autograd Function's gradient on the wrong device raises torch's error on `tpu`, as on CUDA.

After each node's backward, torch's engine (`validate_outputs` in engine.cpp) checks every gradient
against the metadata of the input it flows into: a gradient on another device is an error, except a
0-dim one, which it moves to that device. It skips the device check where either side is a tensor
subclass or a Python-dispatch tensor (pytorch#65016), which every tpu tensor is. So a `backward` that
returned a CPU gradient for a tpu input made `x.grad` (or the gradient flowing on, or what
`autograd.grad` returned) a CPU tensor without a word, and a tpu gradient for a CPU input failed an
internal assert of the engine.

torch's own nodes compute gradients on their inputs' devices; a custom Function's `backward` is the
user's Python and can return any device. Its results are checked where the engine calls it,
`BackwardCFunction.apply` (and `apply_boxed`), against the same metadata the engine reads (the next
edges' `_input_metadata`), in torch's order: a gradient whose shape torch will refuse gets torch's
shape error, and one that torch reduces to 0-dim (the input is 0-dim) is left for torch to move.
Only pairs where one side is on `tpu` are checked; torch checks the others itself.

The error leaves the Function's backward as one the user's backward raised would: torch's `PyNode`
turns it into a C++ error and the engine raises it from `backward()` / `autograd.grad()`, so the
autograd worker does not abort and `worker_errors` is not needed. The check costs about two
microseconds per gradient a custom Function's backward returns (reading the next edges' metadata),
and nothing on ordinary ops or torch's own backward nodes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

_installed = False


def _expandable(shape: Sequence[int], to: Sequence[int]) -> bool:
    """Whether `shape` broadcasts to `to` (torch's `is_expandable_to`, its condition for `sum_to`)."""
    if len(shape) > len(to):
        return False
    return all(size == 1 or size == target for size, target in zip(reversed(shape), reversed(to)))


def check_gradient_devices(node: Any, grads: Any) -> None:
    """Raise torch's "invalid gradient ... expected device" error for a gradient that `node` (a custom
    Function's backward node) returned on a device other than that of the input it flows into."""
    edges = None
    for index, grad in enumerate(grads if type(grads) is tuple else (grads,)):
        if not isinstance(grad, torch.Tensor):
            continue
        if edges is None:
            edges = node.next_functions
        if index >= len(edges):
            return  # trailing gradients past the inputs: torch's PyNode checks they are None
        next_node, input_nr = edges[index]
        if next_node is None:
            continue  # an input that needs no gradient
        metadata = next_node._input_metadata[input_nr]
        expected, got = metadata.device, grad.device
        if got == expected or (expected.type != "tpu" and got.type != "tpu") or metadata.is_nested_tensor:
            continue
        shape = metadata.shape
        if not shape or not _expandable(shape, grad.shape):
            continue  # torch moves a gradient of a 0-dim input, and raises its shape error first
        raise RuntimeError(f"Function {node.name()} returned an invalid gradient at index {index} - expected device {expected} but got {got}")


def _checking(apply: Callable[..., Any]) -> Callable[..., Any]:
    """A backward node's `apply`, checking the devices of the gradients it returns."""

    @functools.wraps(apply)
    def checked(self: Any, *args: Any) -> Any:
        grads = apply(self, *args)
        check_gradient_devices(self, grads)
        return grads

    return checked


def install() -> None:
    """Check the gradients every custom Function's backward returns (once)."""
    global _installed
    if _installed:
        return
    BackwardCFunction.apply = _checking(BackwardCFunction.apply)
    BackwardCFunction.apply_boxed = _checking(BackwardCFunction.apply_boxed)
    _installed = True
