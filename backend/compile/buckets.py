"""Shape bucketing: pad a dynamic dim up to a bucket so that XLA compiles once per bucket.

Padding a dim of size n up to B (zeros at the end) and slicing the outputs back to n gives the same
result only when nothing in the graph mixes positions along that dim: the padded positions must
never reach a real one. `plan` checks that on the graph's symbolic shapes, for each size symbol
that some input dim is exactly (a dim made dynamic by `mark_dynamic` or `dynamic=True`):

- the symbol may appear in a dim only as a factor (`s0`, `4*s0`: a dim of independent rows), never
  as `s0 - 1`, `s0 // 2`, ...;
- no op may lose a dim that carries the symbol (a reduction or a contraction over it);
- ops that mix positions along one dim (softmax, cumsum, sort, cat, gather, ...) must not do so along
  a dim that carries it; normalisations only over dims that do not carry it; convolutions, pooling
  and batch norm with running statistics only with the symbol in the batch dim;
- the size itself must not be used as a value (e.g. dividing by the sequence length);
- every op must be one of those kinds (pointwise, view, reduction, matmul, mixing op with a `dim`,
  layer norm, embedding, factory); any other op refuses bucketing for the graph;
- each output dim carrying the symbol must be exactly it, so the output can be sliced back; sizes
  and strides the graph returns (AOTAutograd's output metadata) are recomputed for the true size.

A graph that fails compiles per concrete shape as usual, and the reason is recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.fx

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload

_VIEWS = {
    "view.default", "_unsafe_view.default", "reshape.default", "permute.default", "transpose.int", "t.default",
    "expand.default", "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "clone.default",
    "alias.default", "_to_copy.default", "slice.Tensor", "select.int", "split_with_sizes.default", "split.Tensor",
    "as_strided.default", "lift_fresh_copy.default", "detach.default", "unbind.int", "stack.default",
}
_REDUCTIONS = {
    "sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax.default", "amin.default", "max.dim",
    "min.dim", "max.default", "min.default", "argmax.default", "argmin.default", "var.correction",
    "var_mean.correction", "std.correction", "prod.dim_int", "prod.default", "any.dim", "any.dims",
    "any.default", "all.dim", "all.dims", "all.default", "logsumexp.default",
}
_MATMULS = {"mm.default", "bmm.default", "addmm.default", "baddbmm.default", "matmul.default", "dot.default", "mv.default", "addmv.default"}
_MIXING = {
    "_softmax.default", "_log_softmax.default", "softmax.int", "log_softmax.int", "cumsum.default",
    "cumprod.default", "logcumsumexp.default", "sort.default", "sort.stable", "argsort.default",
    "argsort.stable", "topk.default", "flip.default", "roll.default", "cat.default", "gather.default",
    "scatter.src", "scatter.value", "scatter_add.default", "scatter_reduce.two", "index_select.default",
    "index_add.default", "cummax.default", "cummin.default", "kthvalue.default", "median.dim", "mode.default",
}
_BATCH_ONLY = {
    "convolution.default", "max_pool2d_with_indices.default", "avg_pool2d.default", "max_pool3d_with_indices.default",
    "avg_pool3d.default", "_native_batch_norm_legit_no_training.default", "_adaptive_avg_pool2d.default",
}
_FACTORIES = {
    "full.default", "zeros.default", "ones.default", "empty.memory_format", "empty_strided.default", "new_zeros.default",
    "new_ones.default", "new_empty.default", "new_full.default", "arange.default", "arange.start", "arange.start_step",
    "scalar_tensor.default", "full_like.default", "zeros_like.default", "ones_like.default", "empty_like.default",
}
_OTHER_SAFE = {"native_layer_norm.default", "embedding.default"}
_BOOKKEEPING = {"sym_size.int", "sym_numel.default", "sym_stride.int", "sym_storage_offset.default", "_assert_scalar.default"}
# Arguments that may hold a size made of the symbol: they shape the output, they are not values.
_SIZE_ARGS = {"size", "shape", "stride", "storage_offset", "start", "end", "step", "split_sizes", "split_size", "sizes", "length"}


@dataclass
class SymbolPadding:
    """Where one size symbol appears: input dims to pad, int inputs to replace, output dims to slice."""

    symbol: str
    tensor_dims: list[tuple[int, int]]  # (array position, dim)
    int_inputs: list[int]  # runtime argument index
    output_dims: list[tuple[int, int]]  # (graph output index, dim)


@dataclass
class BucketCall:
    """One call's bucketing: for each symbol, its true size and the bucket it ran at, and the true
    value of every size symbol of the inputs."""

    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    values: dict[Any, int] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{symbol} {size} -> {bucket}" for symbol, (size, bucket) in self.sizes.items())

    def detail(self) -> dict[str, Any]:
        return {symbol: {"size": size, "bucket": bucket} for symbol, (size, bucket) in self.sizes.items()}


@dataclass
class BucketPlan:
    """How to pad a graph's inputs and slice its outputs for the symbols that are safe to pad."""

    symbols: list[SymbolPadding]
    sources: dict[Any, tuple[str, int, int]]  # size symbol -> ("array", position, dim) or ("static", index, 0)
    value_outputs: list[tuple[int, Any]]  # (graph output index, sympy expression of a returned size)

    def pad(self, arrays: list[Any], statics: dict[int, Any], settings: Any) -> tuple[list[Any], dict[int, Any], BucketCall]:
        call = BucketCall()
        for symbol, (kind, index, dim) in self.sources.items():
            call.values[symbol] = int(arrays[index].shape[dim]) if kind == "array" else int(statics[index])
        arrays = list(arrays)
        statics = dict(statics)
        for padding in self.symbols:
            if padding.tensor_dims:
                position, dim = padding.tensor_dims[0]
                size = int(arrays[position].shape[dim])
            else:
                size = int(statics[padding.int_inputs[0]])
            bucket = settings.bucket(size)
            call.sizes[padding.symbol] = (size, bucket)
            if bucket == size:
                continue
            for position, dim in padding.tensor_dims:
                array = arrays[position]
                widths = [(0, 0)] * array.ndim
                widths[dim] = (0, bucket - array.shape[dim])
                arrays[position] = jnp.pad(array, widths)
            for index in padding.int_inputs:
                statics[index] = bucket
        return arrays, statics, call

    def unpad(self, results: Sequence[Any], layout: Any, call: BucketCall) -> tuple[list[Any], dict[int, int]]:
        """The outputs sliced back to the true sizes, and the true values of the sizes the graph returns."""
        results = list(results)
        values = {output_index: int(expr.subs(call.values)) for output_index, expr in self.value_outputs}
        for padding in self.symbols:
            size, bucket = call.sizes[padding.symbol]
            if size == bucket:
                continue
            for output_index, dim in padding.output_dims:
                slot = layout.outputs[output_index]
                if slot.kind == "array":
                    results[slot.index] = jax.lax.slice_in_dim(results[slot.index], 0, size, axis=dim)
        return results, values


def plan(gm: torch.fx.GraphModule) -> tuple[BucketPlan | None, str | None]:
    """The padding plan for the graph's dynamic size symbols, and why any symbol was refused."""
    global _symbols
    _symbols = _Symbols(gm)
    try:
        return _plan(gm)
    finally:
        _symbols = None


def _plan(gm: torch.fx.GraphModule) -> tuple[BucketPlan | None, str | None]:
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    tensor_dims: dict[Any, list[tuple[int, int]]] = {}
    int_inputs: dict[Any, list[int]] = {}
    sources: dict[Any, tuple[str, int, int]] = {}
    array_position = 0
    for index, node in enumerate(placeholders):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                expr = _expr(size)
                if expr is not None and expr.is_Symbol:
                    tensor_dims.setdefault(expr, []).append((array_position, dim))
                    sources.setdefault(expr, ("array", array_position, dim))
            array_position += 1
        elif isinstance(value, torch.SymInt) and _expr(value) is not None and _expr(value).is_Symbol:
            int_inputs.setdefault(_expr(value), []).append(index)
            sources.setdefault(_expr(value), ("static", index, 0))
    if not tensor_dims:
        return None, "no dynamic dims to pad (use torch._dynamo.mark_dynamic or dynamic=True)"
    paddings: list[SymbolPadding] = []
    refusals: list[str] = []
    value_outputs: dict[int, Any] = {}
    for symbol, dims in tensor_dims.items():
        refusal = _refusal(gm, symbol)
        if refusal is None:
            refusal, output_dims, returned_sizes = _output_dims(gm, symbol, set(sources))
        if refusal is not None:
            refusals.append(f"{symbol}: {refusal}")
            continue
        paddings.append(SymbolPadding(str(symbol), dims, int_inputs.get(symbol, []), output_dims))
        value_outputs.update(returned_sizes)
    plan_ = BucketPlan(paddings, sources, sorted(value_outputs.items())) if paddings else None
    return plan_, ("; ".join(refusals) or None)


class _Symbols:
    """Size expressions with the symbols of one size unified: Dynamo gives a TpuTensor's dim and the
    same dim of its inner tensor (`x.size()[1]`, `x._inner.size()[1]`) two symbols, always equal."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.aliases: dict[Any, Any] = {}
        shape_env = None
        for node in gm.graph.nodes:
            value = node.meta.get("val") if node.op == "placeholder" else None
            sizes = list(value.shape) if isinstance(value, torch.Tensor) else [value]
            shape_env = next((size.node.shape_env for size in sizes if isinstance(size, torch.SymInt)), None)
            if shape_env is not None:
                break
        if shape_env is None:
            return
        representatives: dict[str, Any] = {}
        for symbol, sources in sorted(shape_env.var_to_sources.items(), key=lambda item: str(item[0])):
            if not sources:
                continue
            key = sources[0].name.replace("._inner", "")
            representative = representatives.setdefault(key, symbol)
            if representative != symbol:
                self.aliases[symbol] = representative

    def expr(self, size: Any) -> Any:
        if not isinstance(size, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        expr = size.node.expr
        return expr.xreplace(self.aliases) if self.aliases else expr


_symbols: _Symbols | None = None


def _expr(size: Any) -> Any:
    if _symbols is not None:
        return _symbols.expr(size)
    return size.node.expr if isinstance(size, torch.SymInt) else None


def _factor_kind(size: Any, symbol: Any) -> int:
    """0: the dim does not involve the symbol; 1: the symbol is a factor of it; -1: any other use."""
    expr = _expr(size)
    if expr is None or symbol not in expr.free_symbols:
        return 0
    if expr == symbol:
        return 1
    if expr.is_Mul and sum(1 for arg in expr.args if arg == symbol) == 1 and all(symbol not in arg.free_symbols for arg in expr.args if arg != symbol):
        return 1
    return -1


def _count(tensor: torch.Tensor, symbol: Any) -> int:
    return sum(1 for size in tensor.shape if _factor_kind(size, symbol) == 1)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def _involves(value: Any, symbol: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return symbol in _expr(value).free_symbols
    if isinstance(value, (list, tuple)):
        return any(_involves(item, symbol) for item in value)
    return False


def _refusal(gm: torch.fx.GraphModule, symbol: Any) -> str | None:
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        inputs = [tensor for arg in node.all_input_nodes for tensor in _tensors(arg.meta.get("val"))]
        outputs = _tensors(node.meta.get("val"))
        for tensor in inputs + outputs:
            for size in tensor.shape:
                if _factor_kind(size, symbol) == -1:
                    return f"{node.target} has a dim of size {size}: padding {symbol} would shift it"
        if not isinstance(node.target, OpOverload):
            continue
        name = str(node.target).removeprefix("aten.")
        if name in _BOOKKEEPING:
            continue
        value_use = _value_use(node, symbol)
        if value_use is not None:
            return f"{node.target} uses the size {symbol} as a value ({value_use})"
        most_in = max((_count(tensor, symbol) for tensor in inputs), default=0)
        if most_in == 0 and all(_count(tensor, symbol) == 0 for tensor in outputs):
            continue
        rule = _op_rule(node, name, symbol, inputs)
        if rule is not None:
            return rule
        fewest_out = min((_count(tensor, symbol) for tensor in outputs), default=0)
        if fewest_out < most_in:
            return f"{node.target} reduces or contracts over a dim of size {symbol}"
    return None


def _op_rule(node: torch.fx.Node, name: str, symbol: Any, inputs: list[torch.Tensor]) -> str | None:
    if torch.Tag.pointwise in node.target.tags or name in _VIEWS or name in _REDUCTIONS or name in _MATMULS or name in _FACTORIES:
        return None
    if name == "embedding.default":
        return None
    first = inputs[0] if inputs else None
    if name in _MIXING:
        dims = _argument(node, "dim")
        if dims is None:
            dims = _argument(node, "dims")
        if dims is None:
            dims = 0
        for dim in dims if isinstance(dims, (list, tuple)) else [dims]:
            if first is not None and first.dim() and _factor_kind(first.shape[dim % first.dim()], symbol) == 1:
                return f"{node.target} mixes positions along a dim of size {symbol}"
        return None
    if name == "native_layer_norm.default":
        normalized = _argument(node, "normalized_shape") or ()
        for size in first.shape[first.dim() - len(normalized):]:
            if _factor_kind(size, symbol) == 1:
                return f"{node.target} normalises over a dim of size {symbol}"
        return None
    if name in _BATCH_ONLY:
        for dim, size in enumerate(first.shape):
            if dim != 0 and _factor_kind(size, symbol) == 1:
                return f"{node.target} mixes positions along dim {dim} of size {symbol}"
        return None
    return f"no padding rule for {node.target}"


def _argument(node: torch.fx.Node, wanted: str) -> Any:
    for position, argument in enumerate(node.target._schema.arguments):
        if argument.name == wanted:
            if argument.kwarg_only or position >= len(node.args):
                return node.kwargs.get(wanted, argument.default_value)
            return node.args[position]
    return None


def _value_use(node: torch.fx.Node, symbol: Any) -> str | None:
    """The argument that carries the symbol as a value (not a size), if any."""
    for position, argument in enumerate(node.target._schema.arguments):
        if argument.kwarg_only or position >= len(node.args):
            value = node.kwargs.get(argument.name)
        else:
            value = node.args[position]
        if isinstance(value, torch.fx.Node):
            value = value.meta.get("val")
            if isinstance(value, torch.Tensor):
                continue
        if argument.name not in _SIZE_ARGS and _involves(value, symbol):
            return argument.name
    return None


def _output_dims(gm: torch.fx.GraphModule, symbol: Any, known: set) -> tuple[str | None, list[tuple[int, int]], dict[int, Any]]:
    """The output dims to slice back, and the returned sizes (as expressions) to recompute."""
    output_node = next(node for node in reversed(gm.graph.nodes) if node.op == "output")
    outputs = output_node.args[0]
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    dims: list[tuple[int, int]] = []
    sizes: dict[int, Any] = {}
    for index, output in enumerate(outputs):
        value = output.meta.get("val") if isinstance(output, torch.fx.Node) else output
        if isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                expr = _expr(size)
                if expr is None or symbol not in expr.free_symbols:
                    continue
                if expr != symbol:
                    return f"output {index} dim {dim} has size {size}: it cannot be sliced back", [], {}
                dims.append((index, dim))
        elif isinstance(value, torch.SymInt) and _involves(value, symbol):
            if not _expr(value).free_symbols <= known:
                return f"output {index} is the size {value}, which the inputs do not determine", [], {}
            sizes[index] = _expr(value)
        elif _involves(value, symbol):
            return f"output {index} is {value}", [], {}
    return None, dims, sizes
