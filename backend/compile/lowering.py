"""An FX graph of core ATen ops (what AOTAutograd hands a backend) as one JAX function.

Each `call_function` node runs the backend's lowering for its ATen overload (the same registry the
eager dispatcher uses) inside `jax.named_scope(<aten op>)`, so XLA's fusions name the ATen ops they
came from. Results are cast to the dtype of the node's fake value, as the dispatcher casts to the
meta kernel's dtype. Symbolic-shape nodes (`sym_size`, `operator.mul` on sizes, ...) are plain
Python at trace time: XLA compiles one program per concrete shape, so every size is a constant.

A node without a lowering runs on the host: with no tensor inputs it is folded into a constant when
the program is traced; with tensor inputs it becomes a `jax.pure_callback` into torch on the CPU.
A functional collective is an ordered `io_callback` that runs it through its group and waits for it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tputrace import sourceloc
from tputrace.backend.compile import aliases, index_flags, output_layouts
from tputrace.backend.core import arg_checks, matmul_precision, rng, routing
from tputrace.backend.core.dtypes import to_jax, to_torch
from tputrace.backend.core.views import contiguous_strides
from tputrace.backend.ops.registry import LOWERINGS, Lowering
from tputrace.backend.ops.views import strided_positions
from tputrace.recording.interface import active

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload

# Nodes that check or constrain symbolic values: nothing to compute once shapes are concrete.
_CHECKS = {
    name
    for name in (
        "_assert_scalar.default",
        "_assert_async.default",
        "_assert_async.msg",
        "_assert_tensor_metadata.default",
        "sym_constrain_range.default",
        "sym_constrain_range_for_size.default",
        "_functional_sym_constrain_range.default",
        "_functional_sym_constrain_range_for_size.default",
    )
}
_SIZE_QUERIES = {"sym_size.int", "sym_numel.default", "sym_stride.int", "sym_storage_offset.default"}


@dataclass(frozen=True)
class OutputSlot:
    """Where one graph output comes from at run time.

    kind: `array` (result `index` of the XLA program), `input` (the runtime argument at `index`,
    returned as is), or `value` (a Python value known when the program was traced, e.g. a size).
    """

    kind: str
    index: int = -1
    value: Any = None


@dataclass
class TracedLayout:
    """What tracing the graph for one signature found out about its outputs and host ops."""

    outputs: list[OutputSlot] = field(default_factory=list)
    output_dtypes: list[torch.dtype | None] = field(default_factory=list)
    output_on_host: list[bool] = field(default_factory=list)
    output_aliases: dict[int, aliases.OutputAlias] = field(default_factory=dict)
    result_layouts: dict[int, output_layouts.StoredLayout] = field(default_factory=dict)  # by result index
    check_result: int | None = None  # the result that holds the program's index-check flag (`index_flags`)


class GraphLowering:
    """One AOTAutograd graph, ready to become a JAX function for a given set of static inputs."""

    def __init__(self, gm: torch.fx.GraphModule, name: str) -> None:
        self.name = name
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [node for node in self.nodes if node.op == "placeholder"]
        output_node = next(node for node in reversed(self.nodes) if node.op == "output")
        outputs = output_node.args[0]
        self.output_args: list[Any] = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        self.constants = {node: _constant(gm, node.target) for node in self.nodes if node.op == "get_attr"}
        self.random_nodes = [node for node in self.nodes if _lowering(node) is not None and _lowering(node).needs_key]
        self.precision_nodes = frozenset(node for node in self.nodes if _follows_matmul_precision(node))
        self.host_ops = sorted({str(node.target) for node in self.nodes if _is_aten(node) and _lowering(node) is None and not _handled(node)})
        self.op_names = [str(node.target) for node in self.nodes if _is_aten(node) and not _is_bookkeeping(node)]
        self.n_ops = len(self.op_names)
        self.view_chains = aliases.view_chains(self.output_args, output_node.meta.get("desc"))
        self.strided_outputs = output_layouts.strided_outputs(output_node.meta.get("desc"), len(self.output_args))
        self.refusal = _dtype_refusal(self.nodes)
        self.checked_nodes = index_flags.checked_nodes(self.nodes)

    def function(
        self, statics: dict[int, Any], layout: TracedLayout, *, keep_aliases: bool = True, keep_strides: bool = True, precision: str | None = None,
        check_indices: bool = True,
    ) -> Callable[..., tuple]:
        """A function of the tensor inputs (placeholders not in `statics`, in order) followed by one
        (seed, counter) pair per random node; it fills `layout` when traced. With `keep_aliases`, the
        layout says how to rebuild the outputs that are views as views of their bases; with
        `keep_strides`, channels-last outputs come out in storage order (`output_layouts`). The
        float32 products of `precision_nodes` are traced at matmul precision setting `precision`. With
        `check_indices`, the checked nodes' flag is one more result (`layout.check_result`)."""
        placeholders = self.placeholders
        nodes = self.nodes
        output_args = self.output_args
        random_index = {node: position for position, node in enumerate(self.random_nodes)}
        constants = self.constants
        name = self.name
        view_chains = self.view_chains if keep_aliases else []
        strided_outputs = self.strided_outputs if keep_strides else frozenset()
        precision_nodes = self.precision_nodes if precision is not None else frozenset()
        checked_nodes = self.checked_nodes if check_indices else {}

        def run(*arrays: Any) -> tuple:
            env: dict[torch.fx.Node, Any] = {}
            position = 0
            for index, node in enumerate(placeholders):
                if index in statics:
                    env[node] = statics[index]
                else:
                    env[node] = arrays[position]
                    position += 1
            keys = arrays[position:]
            env.update(constants)
            flag = None
            for node in nodes:
                if node.op != "call_function":
                    continue
                args = torch.fx.node.map_arg(node.args, env.__getitem__)
                kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
                extra = {}
                if node in random_index:
                    slot = random_index[node]
                    extra["key"] = rng.key_from(keys[2 * slot], keys[2 * slot + 1])
                if node in precision_nodes:
                    with matmul_precision.scope(precision):
                        env[node] = _evaluate(node, args, kwargs, extra, name)
                else:
                    env[node] = _evaluate(node, args, kwargs, extra, name)
                check = checked_nodes.get(node)
                if check is not None:
                    flag = index_flags.fold(flag, check, node, env)
            results = []
            layout.outputs.clear()
            layout.output_dtypes.clear()
            layout.output_on_host.clear()
            layout.result_layouts.clear()
            for index, output in enumerate(output_args):
                if isinstance(output, torch.fx.Node) and output.op == "placeholder" and placeholders.index(output) not in statics:
                    layout.outputs.append(OutputSlot("input", placeholders.index(output)))
                    layout.output_dtypes.append(None)
                    layout.output_on_host.append(False)
                    continue
                value = env[output] if isinstance(output, torch.fx.Node) else output
                if isinstance(value, (jax.Array, jax.core.Tracer, np.ndarray)):
                    fake = output.meta.get("val") if isinstance(output, torch.fx.Node) else None
                    dtype = fake.dtype if isinstance(fake, torch.Tensor) else to_torch(value.dtype)
                    layout.outputs.append(OutputSlot("array", len(results)))
                    layout.output_dtypes.append(dtype)
                    layout.output_on_host.append(isinstance(fake, torch.Tensor) and fake.device.type == "cpu")
                    stored = output_layouts.stored_layout(fake, tuple(value.shape)) if index in strided_outputs else None
                    results.append(_result(value, stored, len(results), layout))
                else:
                    layout.outputs.append(OutputSlot("value", value=_python_value(value)))
                    layout.output_dtypes.append(None)
                    layout.output_on_host.append(False)
            layout.output_aliases.clear()
            extra_bases: dict[torch.fx.Node, int] = {}
            for chain in view_chains:
                alias = _output_alias(chain, env, layout, results, extra_bases, placeholders, output_args, statics, keep_strides)
                if alias is not None:
                    layout.output_aliases[chain.output] = alias
            layout.check_result = None
            if flag is not None:
                layout.check_result = len(results)
                results.append(flag)
            return tuple(results)

        return run


def _output_alias(
    chain: aliases.ViewChain,
    env: dict[torch.fx.Node, Any],
    layout: TracedLayout,
    results: list[Any],
    extra_bases: dict[torch.fx.Node, int],
    placeholders: list[torch.fx.Node],
    output_args: list[Any],
    statics: dict[int, Any],
    keep_strides: bool,
) -> aliases.OutputAlias | None:
    """How to rebuild a view output from its base (None: leave it a fresh tensor). A base that is
    neither an input nor an output is appended to `results` once (`extra_bases` says where), in
    storage order when it is channels-last, so that views of it get torch's strides."""
    if layout.outputs[chain.output].kind != "array" or layout.output_on_host[chain.output]:
        return None
    steps = aliases.concrete_steps(chain, env)
    if steps is None:
        return None
    root = chain.root
    if root.op == "placeholder":
        index = placeholders.index(root)
        return None if index in statics else aliases.OutputAlias("input", index, steps)
    fake = root.meta.get("val")
    if not isinstance(fake, torch.Tensor) or fake.device.type == "cpu" or not isinstance(env.get(root), (jax.Array, jax.core.Tracer)):
        return None
    for index, output in enumerate(output_args):
        if output is root and layout.outputs[index].kind == "array":
            return aliases.OutputAlias("output", index, steps)
    if root not in extra_bases:
        extra_bases[root] = len(results)
        stored = output_layouts.stored_layout(fake, tuple(env[root].shape)) if keep_strides else None
        results.append(_result(env[root], stored, len(results), layout))
    return aliases.OutputAlias("result", extra_bases[root], steps)


def _result(value: Any, stored: output_layouts.StoredLayout | None, index: int, layout: TracedLayout) -> Any:
    """A program result: the value, or, for a channels-last one, the value in storage order."""
    value = jnp.asarray(value)
    if stored is None:
        return value
    layout.result_layouts[index] = stored
    return output_layouts.to_storage_order(value, stored)


def _dtype_refusal(nodes: Sequence[torch.fx.Node]) -> BaseException | None:
    """torch's error for the first op whose arguments must share a dtype and do not (`mm` of float32
    and float64), which meta kernels, and so Dynamo's and AOTAutograd's tracing, let through; the
    host judges stand-ins of the traced values, as the eager dispatcher does."""
    for node in nodes:
        if not _is_aten(node):
            continue
        with unset_fake_temporarily():
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), _stand_in)
            refusal = arg_checks.dtype_refusal(node.target, args, kwargs)
        if refusal is not None:
            return refusal
    return None


def _stand_in(node: torch.fx.Node) -> Any:
    """A host tensor of a node's traced dtype and shape that holds no memory (a zero expanded)."""
    fake = node.meta.get("val")
    if not isinstance(fake, torch.Tensor):
        return fake
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    return torch.zeros((), dtype=fake.dtype).expand([optimization_hint(size, fallback=1) for size in fake.shape])


def _constant(gm: torch.fx.GraphModule, target: str) -> Any:
    """A `get_attr` node's value (a tensor constant) as an array baked into the program."""
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor):
        return value
    # AOTAutograd calls the compiler with its fake mode still on, which refuses a real host constant
    # (`torch.tensor(data)` in the compiled code): read it with the mode off.
    with unset_fake_temporarily():
        return _constant_array(value)


def _constant_array(value: torch.Tensor) -> Any:
    if value.device.type == "tpu":
        dispatcher = routing.active()
        array = dispatcher.read(value)
        return array if isinstance(array, jax.Array) else dispatcher.executor.concrete(array, "compiled_graph")[0]
    host = value.detach().contiguous()
    if host.dtype == torch.bfloat16:
        return jnp.asarray(host.view(torch.int16).numpy().view(jnp.bfloat16))
    return np.asarray(host.numpy())


def _is_aten(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, OpOverload)


def _overload_name(node: torch.fx.Node) -> str:
    return str(node.target).removeprefix("aten.")


def _is_bookkeeping(node: torch.fx.Node) -> bool:
    name = _overload_name(node)
    return name in _CHECKS or name in _SIZE_QUERIES


def _lowering(node: torch.fx.Node) -> Lowering | None:
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return None
    return LOWERINGS.get(node.target)


def _follows_matmul_precision(node: torch.fx.Node) -> bool:
    """A matrix product whose first tensor input is float32 or complex64 (its products take one dtype)."""
    lowering = _lowering(node)
    if lowering is None or not lowering.matmul_precision:
        return False
    for arg in node.args:
        value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(value, torch.Tensor):
            return matmul_precision.reducible(value.dtype)
    return False


def _handled(node: torch.fx.Node) -> bool:
    """Ops this module runs itself (no registry lowering needed)."""
    return _is_bookkeeping(node) or str(node.target) in _SPECIAL


def _evaluate(node: torch.fx.Node, args: tuple, kwargs: dict, extra: dict, graph_name: str) -> Any:
    target = node.target
    control_flow = _control_flow_lowering(target)
    if control_flow is not None:
        name = f"higher_order.{target.name()}"
        with jax.named_scope(name):
            return _conform(control_flow(node, *args, **kwargs), node.meta.get("val"), name)
    if not isinstance(target, OpOverload):
        return target(*args, **kwargs)
    args, kwargs = _wrap_numbers(target, args, kwargs)
    name = _overload_name(node)
    if name in _CHECKS:
        return None
    if name in _SIZE_QUERIES:
        return _size_query(name, args)
    special = _SPECIAL.get(str(target))
    with jax.named_scope(str(target)):
        if special is not None:
            result = special(node, *args, **kwargs)
        else:
            lowering = LOWERINGS.get(target)
            if lowering is None:
                if target.namespace == "_c10d_functional":
                    return _collective(node, args, kwargs)
                return _on_host(node, args, kwargs, graph_name)
            result = lowering.fn(*args, **kwargs, **extra)
    return _conform(result, node.meta.get("val"), str(target))


_CONTROL_FLOW: dict[Any, Callable[..., Any]] = {}
# What gives the lowerings of control-flow higher-order ops, by op (`compile.control_flow`, added by
# `integrations.control_flow.install`): asked on the first such node, as they import torch's HOP modules.
CONTROL_FLOW_SOURCES: list[Callable[[], dict[Any, Callable[..., Any]]]] = []


def _control_flow_lowering(target: Any) -> Callable[..., Any] | None:
    """The lowering of a `cond` or `while_loop` node (XLA control flow over its subgraphs); None
    for any other target."""
    if not isinstance(target, torch._ops.HigherOrderOperator):
        return None
    if not _CONTROL_FLOW:
        for lowerings in CONTROL_FLOW_SOURCES:
            _CONTROL_FLOW.update(lowerings())
    return _CONTROL_FLOW.get(target)


_TENSOR_ARGUMENTS: dict[Any, tuple[frozenset[int], frozenset[str]]] = {}


def _tensor_arguments(op: OpOverload) -> tuple[frozenset[int], frozenset[str]]:
    """Positions and keyword names of an overload's `Tensor` arguments."""
    known = _TENSOR_ARGUMENTS.get(op)
    if known is None:
        positions, names = set(), set()
        for position, argument in enumerate(op._schema.arguments):
            argument_type = argument.type
            if isinstance(argument_type, torch._C.OptionalType):
                argument_type = argument_type.getElementType()
            if isinstance(argument_type, torch._C.TensorType):
                (names.add(argument.name) if argument.kwarg_only else positions.add(position))
        known = _TENSOR_ARGUMENTS[op] = (frozenset(positions), frozenset(names))
    return known


def _wrap_numbers(op: OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A Python number in a `Tensor` argument (a wrapped scalar, e.g. the 1 of `1 - x`) as a 0-d
    array, as the eager dispatcher passes it."""
    positions, names = _tensor_arguments(op)
    if any(position < len(args) and type(args[position]) in (int, float, bool) for position in positions):
        args = tuple(jnp.asarray(value) if position in positions and type(value) in (int, float, bool) else value for position, value in enumerate(args))
    if names and any(type(kwargs.get(name)) in (int, float, bool) for name in names):
        kwargs = {name: jnp.asarray(value) if name in names and type(value) in (int, float, bool) else value for name, value in kwargs.items()}
    return args, kwargs


def _size_query(name: str, args: tuple) -> int:
    array = args[0]
    if name == "sym_size.int":
        return int(array.shape[args[1]])
    if name == "sym_numel.default":
        return int(np.prod(array.shape, dtype=np.int64))
    if name == "sym_storage_offset.default":
        return 0
    strides = contiguous_strides(tuple(array.shape))
    return strides[args[1]]


def _conform(result: Any, fake: Any, op_name: str) -> Any:
    """Cast a lowering's result to the dtype (and static shape) of the node's fake value."""
    if isinstance(result, (tuple, list)):
        fakes = fake if isinstance(fake, (tuple, list)) else [None] * len(result)
        return type(result)(_conform(item, item_fake, op_name) for item, item_fake in zip(result, fakes))
    if result is None or not isinstance(fake, torch.Tensor):
        return result
    value = jnp.asarray(result)
    wanted = to_jax(fake.dtype)
    if value.dtype != wanted:
        value = value.astype(wanted)
    shape = _static_shape(fake)
    if shape is not None and value.shape != shape:
        if value.size != int(np.prod(shape, dtype=np.int64)):
            raise RuntimeError(f"{op_name}: lowering returned shape {value.shape}, torch says {shape}")
        value = value.reshape(shape)
    return value


def _static_shape(fake: torch.Tensor) -> tuple[int, ...] | None:
    shape = []
    for size in fake.shape:
        if not isinstance(size, int):
            return None
        shape.append(size)
    return tuple(shape)


def _python_value(value: Any) -> Any:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise RuntimeError(f"symbolic value {value} reached a compiled graph's output")
    return value


# ----------------------------------------------------------------------------- ops run here


def _to_copy(node: torch.fx.Node, value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return value if dtype is None else value.astype(to_jax(dtype))


def _copy(node: torch.fx.Node, target: Any, source: Any, non_blocking: bool = False) -> Any:
    return jnp.broadcast_to(jnp.asarray(source).astype(target.dtype), target.shape)


def _as_strided(node: torch.fx.Node, value: Any, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Any:
    """`as_strided` addresses the input's storage: rebuild that storage from the input's own layout
    (its fake value's strides and offset), then read the requested positions from it."""
    fake = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if storage_offset is None:  # torch's default: the input's own offset
        storage_offset = int(fake.storage_offset()) if fake is not None else 0
    if fake is None or (fake.is_contiguous() and fake.storage_offset() == 0):
        storage = value.reshape(-1)
    else:
        own = strided_positions(tuple(value.shape), tuple(int(s) for s in fake.stride()), int(fake.storage_offset()))
        length = int(own.max()) + 1 if own.size else 1
        storage = jnp.zeros((length,), value.dtype).at[own.reshape(-1)].set(value.reshape(-1))
    positions = strided_positions(size, stride, storage_offset)
    if not positions.size:
        return jnp.zeros(tuple(size), value.dtype)
    return jnp.take(storage, positions, mode="clip")


def _scalar_of(node: torch.fx.Node, value: Any) -> Any:
    """`Tensor.item()` traced into a program (torch's while_loop backward picks its step with one):
    the one element as a 0-dim array, which indexing ops take as a traced index."""
    return jnp.reshape(value, ())


def _select(node: torch.fx.Node, value: Any, dim: int, index: Any) -> Any:
    """`select` at an index the program computes (a traced `.item()`), as a dynamic slice; at a
    Python index, the registered lowering."""
    if not isinstance(index, (jax.Array, jax.core.Tracer)):
        return LOWERINGS[aten.select.int].fn(value, dim, index)
    axis = dim % value.ndim
    return jax.lax.dynamic_index_in_dim(value, index % value.shape[axis], axis=axis, keepdims=False)


def _waited(node: torch.fx.Node, value: Any) -> Any:
    """`wait_tensor`: the collective that made `value` completed inside its own callback."""
    return value


_SPECIAL: dict[str, Callable[..., Any]] = {
    "aten._local_scalar_dense.default": _scalar_of,
    "aten.select.int": _select,
    "aten._to_copy.default": _to_copy,
    "aten.copy.default": _copy,
    "aten.as_strided.default": _as_strided,
    "_c10d_functional.wait_tensor.default": _waited,
}

_warned_host_ops: set[tuple[str, str]] = set()


def _on_host(node: torch.fx.Node, args: tuple, kwargs: dict, graph_name: str) -> Any:
    """Run an op without a lowering on the CPU with torch: folded to a constant when it reads no
    arrays, else a host callback inside the program."""
    op_name = str(node.target)
    if (graph_name, op_name) not in _warned_host_ops:
        _warned_host_ops.add((graph_name, op_name))
        warnings.warn(f"tputrace: {op_name} has no lowering; it runs on the host CPU inside compiled graph {graph_name}", RuntimeWarning, stacklevel=2)
    call = _HostCall(node, args, kwargs)
    if not call.array_positions:
        result = call()
        return _conform(result if not isinstance(result, tuple) else tuple(result), node.meta.get("val"), op_name)
    result = jax.pure_callback(call, call.result_shapes(), *call.arrays())
    return _conform(result, node.meta.get("val"), op_name)


def _collective(node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
    """A functional collective (what Dynamo makes of `dist.all_reduce`, funcol, DTensor): the host runs
    it through its group on CPU copies and waits for it, in an ordered callback, so that every rank
    issues a program's collectives in the graph's order and none is dropped or folded at trace time."""
    call = _HostCall(node, args, kwargs, wait=True, location=sourceloc.last_user_location(node.stack_trace))
    result = jax.experimental.io_callback(call, call.result_shapes(), *call.arrays(), ordered=True)
    return _conform(result, node.meta.get("val"), str(node.target))


def _recording_at(location: tuple[str, int, str] | None) -> contextlib.AbstractContextManager[None]:
    """What a host callback records (a collective), at the line its node was traced from."""
    recorder = active()
    if recorder is None or not recorder.enabled:
        return contextlib.nullcontext()
    return recorder.recording_at(location)


class _HostCall:
    """One node run by torch on the host, its array arguments passed in as NumPy arrays."""

    def __init__(self, node: torch.fx.Node, args: tuple, kwargs: dict, wait: bool = False,
                 location: tuple[str, int, str] | None = None) -> None:
        self.node = node
        self.wait = wait
        self.location = location  # the user's line the node was traced from, for a collective's record
        self.leaves, self.spec = jax.tree_util.tree_flatten((args, kwargs), is_leaf=lambda value: isinstance(value, torch.device))
        self.array_positions = [index for index, leaf in enumerate(self.leaves) if isinstance(leaf, (jax.Array, jax.core.Tracer))]

    def arrays(self) -> list[Any]:
        return [self.leaves[index] for index in self.array_positions]

    def __call__(self, *arrays: Any) -> Any:
        values = list(self.leaves)
        for index, array in zip(self.array_positions, arrays):
            values[index] = torch.from_numpy(np.array(array))
        host_args, host_kwargs = jax.tree_util.tree_unflatten(self.spec, values)
        host_kwargs = {key: (torch.device("cpu") if key == "device" else value) for key, value in host_kwargs.items()}
        with _recording_at(self.location):
            result = self.node.target(*host_args, **host_kwargs)
            items = list(result) if isinstance(result, (tuple, list)) else [result]
            if self.wait:
                items = [torch.ops._c10d_functional.wait_tensor(item) for item in items]
        if isinstance(result, (tuple, list)):
            return tuple(item.numpy() for item in items)
        return items[0].numpy()

    def result_shapes(self) -> Any:
        """The outputs' shapes and dtypes, from the op's meta kernel."""
        metas = []
        for index, leaf in enumerate(self.leaves):
            metas.append(torch.empty(tuple(leaf.shape), dtype=to_torch(leaf.dtype), device="meta") if index in self.array_positions else leaf)
        meta_args, meta_kwargs = jax.tree_util.tree_unflatten(self.spec, metas)
        meta_kwargs = {key: (torch.device("meta") if key == "device" else value) for key, value in meta_kwargs.items()}
        meta_result = self.node.target(*meta_args, **meta_kwargs)
        multiple = isinstance(meta_result, (tuple, list))
        shapes = [jax.ShapeDtypeStruct(tuple(item.shape), to_jax(item.dtype)) for item in (meta_result if multiple else [meta_result])]
        return tuple(shapes) if multiple else shapes[0]

