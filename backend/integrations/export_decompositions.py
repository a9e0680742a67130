"""`ExportedProgram.run_decompositions()` of a program with tpu parameters, buffers or inputs.

torch decomposes a program by retracing `ep.module()` with AOT export, which takes a tensor
subclass apart: it reparametrizes each subclass parameter and buffer into its inner tensors (a tpu
one flattens to a `TpuData` handle, which it then tried to flatten again: "'TpuData' object has
no attribute '__tensor_flatten__'"), and it passes the sizes of a subclass input with dynamic dims
as extra graph inputs, then fails on its own count of them.

A tpu tensor is one tensor on the `tpu` device, so the retrace runs on what it holds instead:
while torch decomposes, the program's state is `TpuData` handles (real tpu tensors that are no
traceable subclass) and its graph's values are the fake inner tensors of its traced tpu tensors
(fake tensors on the `tpu` device), so the decomposed graph computes on plain tpu tensors as a CPU
program's does on CPU tensors. The decomposed program gets the original tpu tensors back under
their names, so `.module()` holds the same tpu parameters and buffers (tied ones stay tied) and
runs on tpu inputs. Tensor constants stay tpu tensors throughout: torch registers them as buffers
only after the reparametrization, and AOT export handles a subclass input of static sizes.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils._pytree import tree_leaves, tree_map

from tputrace.backend.core.tensor import TpuData, TpuTensor

_installed = False
# A guard on a tpu input's inner tensor (`L['x']._inner.size()[0] == 4`, export traced through it):
# the inner tensor has the input's sizes, and the retrace's inputs are inner tensors already.
_INNER_READ = re.compile(r"\._inner\b")


def _decomposing_tpu_state(run_decompositions: Any) -> Any:
    @functools.wraps(run_decompositions)
    def run(program: ExportedProgram, *args: Any, **kwargs: Any) -> ExportedProgram:
        if not _holds_tpu_tensors(program):
            return run_decompositions(program, *args, **kwargs)
        with _on_inner_tensors(program):
            decomposed = run_decompositions(program, *args, **kwargs)
        return _with_tpu_state_of(decomposed, program)

    return run


def _holds_tpu_tensors(program: ExportedProgram) -> bool:
    values = [*program.state_dict.values(), *(node.meta.get("val") for node in program.graph.nodes)]
    return any(type(value) is TpuTensor for value in tree_leaves(values))


@contextlib.contextmanager
def _on_inner_tensors(program: ExportedProgram) -> Iterator[None]:
    """While the block runs, `program` holds what its tpu tensors hold: `TpuData` handles for its
    state, fake tpu tensors for its graph's values. (A copy of its graph would rename nodes that
    export named after Python builtins, such as `input`, and fail the signature's check.)"""
    values = {node: node.meta["val"] for node in program.graph.nodes if "val" in node.meta}
    state, guards = program._state_dict, program._guards_code
    for node, value in values.items():
        node.meta["val"] = tree_map(_traced_inner, value)
    handles: dict[int, Any] = {}
    program._state_dict = {name: _handle(value, handles) for name, value in state.items()}
    program._guards_code = [_INNER_READ.sub("", guard) for guard in guards]
    try:
        yield
    finally:
        for node, value in values.items():
            node.meta["val"] = value
        program._state_dict, program._guards_code = state, guards


def _traced_inner(value: Any) -> Any:
    """The fake inner tensor of a traced tpu tensor (a graph value), any other value as it is."""
    return value._traced if type(value) is TpuTensor and value._traced is not None else value


def _handle(value: Any, handles: dict[int, Any]) -> Any:
    """The `TpuData` handle of a tpu tensor, a parameter if it is one; one per tensor (in
    `handles`), so that tied weights stay tied."""
    if type(value) is not TpuTensor:
        return value
    if id(value) not in handles:
        handle = value._inner
        handles[id(value)] = torch.nn.Parameter(handle, value.requires_grad) if isinstance(value, torch.nn.Parameter) else handle
    return handles[id(value)]


def _with_tpu_state_of(decomposed: ExportedProgram, program: ExportedProgram) -> ExportedProgram:
    """The decomposed program holding `program`'s tpu tensors where it holds their handles, and
    guarding its inputs' own sizes where it guards their inner tensors' (its graph computes on
    them, so an input of a wrong size is refused in the CPU's words: `x.size()[1] == 3`)."""
    decomposed._state_dict = _tpu_tensors_of(decomposed.state_dict, program.state_dict)
    decomposed._guards_code = [_INNER_READ.sub("", guard) for guard in decomposed._guards_code]
    return decomposed


def _tpu_tensors_of(values: dict[str, Any], originals: dict[str, Any]) -> dict[str, Any]:
    """`values` with each `TpuData` handle replaced by the tpu tensor of that name in `originals`."""
    return {name: originals[name] if type(value) is TpuData else value for name, value in values.items()}


def install() -> None:
    """Wrap `ExportedProgram.run_decompositions` (idempotent)."""
    global _installed
    if _installed:
        return
    ExportedProgram.run_decompositions = _decomposing_tpu_state(ExportedProgram.run_decompositions)
    _installed = True
