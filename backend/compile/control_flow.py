"""`torch.cond` and `torch.while_loop` as XLA control flow: `jax.lax.cond` and `jax.lax.while_loop`.

The branches (or the loop's condition and body) arrive as FX graphs of ATen ops: the subgraphs of a
`cond`/`while_loop` node of an AOTAutograd graph, or the graphs `backend/control_flow.py` traces
from an eager call. Each becomes a JAX function through the same lowering as a compiled graph, and
the two are put under one XLA conditional or loop, so the predicate stays on the chip (no host sync)
and a DeferAndFuse graph holding the op is not cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import torch

from tputrace.backend.compile.lowering import GraphLowering, TracedLayout
from tputrace.backend.core import matmul_precision

ArrayFunction = Callable[..., tuple]
_ARRAY_TYPES = (jax.Array, jax.core.Tracer)


@dataclass(frozen=True)
class Subgraph:
    """A branch (or loop condition or body) as a function of its inputs' arrays (or Python values)
    returning one array per output. One with `draws` random ops takes a seed and a first counter
    after its inputs: its i-th random op draws with counter `first + i`, the key an eager op with
    that counter gets, so the branch draws what it would draw run op by op."""

    run: ArrayFunction
    draws: int


def subgraph_function(gm: torch.fx.GraphModule, name: str) -> Subgraph:
    """`gm` as a `Subgraph`."""
    lowering = GraphLowering(gm, name)
    draws = len(lowering.random_nodes)
    precision_nodes = bool(lowering.precision_nodes)

    def run(*values: Any) -> tuple:
        keys: list[Any] = []
        if draws:
            values, (seed, first_counter) = values[:-2], values[-2:]
            for index in range(draws):
                keys.extend((seed, first_counter + index))
        layout = TracedLayout()
        precision = matmul_precision.setting() if precision_nodes else None
        results = lowering.function({}, layout, keep_aliases=False, keep_strides=False, precision=precision, check_indices=False)(*values, *keys)
        outputs = []
        for slot in layout.outputs:
            if slot.kind == "array":
                outputs.append(results[slot.index])
            elif slot.kind == "input":
                outputs.append(jnp.asarray(values[slot.index]))
            else:
                raise RuntimeError(f"{name} returns {slot.value!r}; torch.cond/while_loop on tpu return tensors only")
        return tuple(outputs)

    return Subgraph(run, draws)


def refuse_draws(subgraphs: Sequence[Subgraph], names: Sequence[str], where: str) -> None:
    """A one-line error if any of the subgraphs draws random numbers, which `where` cannot."""
    drawing = [name for subgraph, name in zip(subgraphs, names) if subgraph.draws]
    if drawing:
        raise RuntimeError(
            f"{' and '.join(drawing)} draws random numbers, which tpu does not support in {where}; "
            "draw the random tensor before the call and pass it in as an operand"
        )


def _exact(value: Any) -> Any:
    """The value as a strongly typed array: XLA's branches and loop carries must agree in type exactly."""
    array = jnp.asarray(value)
    return jax.lax.convert_element_type(array, array.dtype)


def _scalar_predicate(pred: Any) -> Any:
    array = jnp.reshape(jnp.asarray(pred), ())
    return array if array.dtype == jnp.bool_ else array != 0


def _split_arrays(values: Sequence[Any]) -> tuple[list[int], Callable[[Sequence[Any]], list[Any]]]:
    """Positions of the arrays among `values`, and how to put arrays back among the other values
    (sizes and other Python values are constants of the traced branches)."""
    positions = [index for index, value in enumerate(values) if isinstance(value, _ARRAY_TYPES)]

    def merged(arrays: Sequence[Any]) -> list[Any]:
        full = list(values)
        for index, array in zip(positions, arrays):
            full[index] = array
        return full

    return positions, merged


def cond_values(pred: Any, true_fn: Subgraph, false_fn: Subgraph, operands: Sequence[Any], random_key: Sequence[Any] = ()) -> tuple:
    """`lax.cond` of two branches on `operands` (arrays and Python values). A branch that draws
    random numbers takes `random_key` (a seed and a first counter), which both branches share."""
    positions, merged = _split_arrays(operands)
    n_arrays = len(positions)

    def branch(fn: Subgraph) -> ArrayFunction:
        def run(*arrays: Any) -> tuple:
            key = arrays[n_arrays:] if fn.draws else ()
            return tuple(_exact(value) for value in fn.run(*merged(arrays[:n_arrays]), *key))

        return run

    try:
        return tuple(jax.lax.cond(_scalar_predicate(pred), branch(true_fn), branch(false_fn), *[operands[index] for index in positions], *random_key))
    except TypeError as error:
        first_line = str(error).splitlines()[0]
        raise RuntimeError(f"torch.cond on tpu needs both branches to return tensors of the same shapes and dtypes ({first_line})") from None


def while_values(cond_fn: Subgraph, body_fn: Subgraph, carried: Sequence[Any], additional: Sequence[Any]) -> tuple:
    """`lax.while_loop` of a condition and a body over the `carried` arrays (`additional` fixed)."""
    refuse_draws((cond_fn, body_fn), ("torch.while_loop's cond_fn", "torch.while_loop's body_fn"), "torch.while_loop")
    if not all(isinstance(value, _ARRAY_TYPES) for value in carried):
        kinds = ", ".join(type(value).__name__ for value in carried)
        raise RuntimeError(f"torch.while_loop on tpu carries tensors only, got ({kinds}); carry a Python int as a 0-dim tensor")
    initial = tuple(_exact(value) for value in carried)

    def keep_going(carry: tuple) -> Any:
        (pred,) = cond_fn.run(*carry, *additional)
        return _scalar_predicate(pred)

    def body(carry: tuple) -> tuple:
        outputs = body_fn.run(*carry, *additional)
        if len(outputs) != len(carry):
            raise RuntimeError(f"torch.while_loop's body returns {len(outputs)} values for {len(carry)} carried inputs")
        for index, (output, start) in enumerate(zip(outputs, carry)):
            if tuple(jnp.shape(output)) != tuple(start.shape):
                raise RuntimeError(
                    f"torch.while_loop's body returns shape {tuple(jnp.shape(output))} for carried input {index} of shape {tuple(start.shape)}"
                )
        return tuple(jax.lax.convert_element_type(output, start.dtype) for output, start in zip(outputs, carry))

    return tuple(jax.lax.while_loop(keep_going, body, initial))


def counted_while_values(cond_fn: Subgraph, body_fn: Subgraph, carried: Sequence[Any], additional: Sequence[Any], random_key: Sequence[Any] = ()) -> tuple:
    """`while_values`, followed by the number of iterations the loop ran (an int64 array). A
    condition or body that draws random numbers takes `random_key` (a seed and a first counter):
    the loop draws as its ops would run one by one, condition then body, each iteration's
    counters following the last's (so `steps * (cond draws + body draws) + cond draws` in all)."""
    per_step = cond_fn.draws + body_fn.draws

    def key(fn: Subgraph, count: Any, offset: int) -> tuple:
        if not fn.draws:
            return ()
        seed, first_counter = random_key
        return seed, first_counter + count * per_step + offset

    def keep_going(count: Any, *values: Any) -> tuple:
        return cond_fn.run(*values, *key(cond_fn, count, 0))

    def body(count: Any, *values: Any) -> tuple:
        return (count + 1, *body_fn.run(*values, *key(body_fn, count, cond_fn.draws)))

    count, *outputs = while_values(Subgraph(keep_going, 0), Subgraph(body, 0), (jnp.zeros((), jnp.int64), *carried), additional)
    return (*outputs, count)


def stacked_body_values(body_fn: Subgraph, carried: Sequence[Any], additional: Sequence[Any], count: int) -> tuple:
    """The carried values after each of `count` runs of the body, stacked along a new first dim
    (what torch's `while_loop_stack_output` returns, once the loop's count is known)."""
    initial = tuple(_exact(value) for value in carried)

    def step(carry: tuple, _: Any) -> tuple:
        outputs = tuple(jax.lax.convert_element_type(output, start.dtype) for output, start in zip(body_fn.run(*carry, *additional), carry))
        return outputs, outputs

    _, stacked = jax.lax.scan(step, initial, None, length=count)
    return tuple(stacked)


def lower_cond(node: torch.fx.Node, pred: Any, true_gm: torch.fx.GraphModule, false_gm: torch.fx.GraphModule, operands: Sequence[Any]) -> tuple:
    """A `cond` node of a compiled graph."""
    names = (f"{node.name} true branch", f"{node.name} false branch")
    branches = (subgraph_function(true_gm, names[0]), subgraph_function(false_gm, names[1]))
    refuse_draws(branches, names, 'torch.cond under torch.compile(backend="tpu")')
    return cond_values(pred, *branches, operands)


def lower_while_loop(
    node: torch.fx.Node, cond_gm: torch.fx.GraphModule, body_gm: torch.fx.GraphModule, carried: Sequence[Any], additional: Sequence[Any], **kwargs: Any
) -> tuple:
    """A `while_loop` node of a compiled graph."""
    return while_values(subgraph_function(cond_gm, f"{node.name} condition"), subgraph_function(body_gm, f"{node.name} body"), carried, additional)


def higher_order_lowerings() -> dict[Any, Callable[..., tuple]]:
    """The lowering of each control-flow higher-order op, by op."""
    from torch._higher_order_ops.cond import cond_op
    from torch._higher_order_ops.while_loop import while_loop_op

    return {cond_op: lower_cond, while_loop_op: lower_while_loop}
