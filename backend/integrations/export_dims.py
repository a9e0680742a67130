"""Named `Dim`s of `torch.export.export` on tpu tensors stay dynamic (strict and non-strict).

Export traces a tpu tensor through its one inner tensor (`TpuTensor._inner`), and the graph
computes on that inner tensor. A named `Dim("n")` reaches export as a constraint on the outer
tensor only, so the inner tensor got the example's static sizes and the program was specialised to
them (`Guard failed: x.size()[0] == 4` on another size); torch's own wrapper subclasses
(`TwoTensor`) do the same. `Dim.AUTO` and `Dim.DYNAMIC` were fine: they call `mark_dynamic`, which
torch mirrors onto inner tensors.

`install` wraps two steps of export:
- while a module is exported, every dim of a tpu input's inner tensor is dynamic
  (`maybe_mark_dynamic`'s mark); the traced tensor ties each to its outer dim
  (`tensor._traced_tensor`): a static outer dim makes the inner one static again, a dynamic one
  makes the two one symbol. The exported graph then loses any read of the inner tensor left unused
  (one can outlive export's own clean-up and fails on a real input, whose `_traced` is None);
- export accepts a symbol shared by two input sources only where the user declared them equal, so
  the inner dim of a named `Dim`'s tensor is declared free of the constraint (a "relaxed" source,
  as `Dim.DYNAMIC`'s are): the outer dim, which the user's inputs have, still carries it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_leaves

from tputrace.backend.compat import import_hooks
from tputrace.backend.core.tensor import TpuTensor

if TYPE_CHECKING:
    from torch._dynamo.source import TensorPropertySource

_MARK = "_dynamo_weak_dynamic_indices"
_installed = False


def _with_dynamic_inner_dims(export: Any) -> Any:
    @functools.wraps(export)
    def export_with_dynamic_inner_dims(*args: Any, **kwargs: Any) -> Any:
        inner_tensors = [value._inner for value in tree_leaves((args, kwargs)) if type(value) is TpuTensor]
        marked = [inner for inner in inner_tensors if not hasattr(inner, _MARK)]
        for inner in marked:
            setattr(inner, _MARK, set(range(inner.dim())))
        try:
            program = export(*args, **kwargs)
        finally:
            for inner in marked:
                delattr(inner, _MARK)
        if inner_tensors:
            drop_unused_inner_reads(program.graph_module)
        return program

    return export_with_dynamic_inner_dims


def drop_unused_inner_reads(graph_module: torch.fx.GraphModule) -> None:
    """Erase reads of a tpu input's inner tensor that nothing uses. Export records one for each
    read of a tensor attribute of a subclass input while it traces (the inner tensor's reads of
    `_inner`/`_traced`) and removes the unused ones, but one can outlive that when a dynamic dim is
    bound after it: the program then failed on a real input, whose `_traced` is None. Export never
    removes those of a `torch.cond` branch's graph (see `control_flow`)."""
    graph = graph_module.graph
    read_inner = torch.ops.export.access_subclass_inner_tensor.default
    unused = [node for node in graph.nodes if node.target is read_inner and not node.users]
    for node in unused:
        graph.erase_node(node)
    if unused:
        graph_module.recompile()


def _with_relaxed_inner_dims(process_equalities: Any) -> Any:
    @functools.wraps(process_equalities)
    def process(constraint: Any, get_sources: Any, shape_env: Any, names: Any, source_pairs: Any, derived: Any, phantoms: Any, relaxed_sources: set) -> None:
        process_equalities(constraint, get_sources, shape_env, names, source_pairs, derived, phantoms, relaxed_sources)
        relaxed_sources.update(_inner_dims(get_sources(constraint.t_id, constraint.dim)))

    return process


def _inner_dims(outer_dims: list[TensorPropertySource]) -> Iterator[TensorPropertySource]:
    """The same dims of the inputs' `_inner` tensors (sources nothing tracks for a non-tpu input)."""
    from torch._dynamo.source import AttrSource, TensorProperty, TensorPropertySource

    for outer_dim in outer_dims:
        yield TensorPropertySource(AttrSource(outer_dim.base, "_inner"), TensorProperty.SIZE, outer_dim.idx)


def install() -> None:
    """Wrap export's processing of `Dim` equalities, and its entry once `torch.export._trace` is
    imported (by the first export; idempotent)."""
    global _installed
    if _installed:
        return
    from torch.export import dynamic_shapes

    dynamic_shapes._process_equalities = _with_relaxed_inner_dims(dynamic_shapes._process_equalities)
    import_hooks.when_imported("torch.export._trace", _wrap_export_entry)
    _installed = True


def _wrap_export_entry(trace_module: Any) -> None:
    """Export's entry (`_trace._export`) with the inputs' inner dims dynamic."""
    trace_module._export = _with_dynamic_inner_dims(trace_module._export)
