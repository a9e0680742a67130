"""`torch.cond` and `torch.while_loop` as XLA control flow: `jax.lax.cond` and `jax.lax.while_loop`.

The branches (or the loop's condition and body) arrive as FX graphs of ATen ops: the subgraphs of a
`cond`/`while_loop` node of an AOTAutograd graph, or the graphs `backend/control_flow.py` traces
from an eager call. Each becomes a JAX function through the same lowering as a compiled graph, and
the two are put under one XLA conditional or loop, so the predicate stays on the chip (no host sync)
and a DeferAndFuse graph holding the op is not cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch

from tputrace.backend import matmul_precision
from tputrace.backend.compile.lowering import GraphLowering, TracedLayout

ArrayFunction = Callable[..., tuple]
_ARRAY_TYPES = (jax.Array, jax.core.Tracer)


def subgraph_function(gm: torch.fx.GraphModule, name: str) -> ArrayFunction:
    """`gm` as a function of its inputs' arrays (or Python values) returning one array per output."""
    lowering = GraphLowering(gm, name)
    if lowering.random_nodes:
        ops = ", ".join(sorted({str(node.target) for node in lowering.random_nodes}))
        raise RuntimeError(
            f"{name} draws random numbers ({ops}), which tpu does not support inside torch.cond/while_loop; "
            "draw the random tensor before the call and pass it in as an operand"
        )
    precision_nodes = bool(lowering.precision_nodes)

    def run(*values: Any) -> tuple:
        layout = TracedLayout()
        precision = matmul_precision.setting() if precision_nodes else None
        results = lowering.function({}, layout, keep_aliases=False, keep_strides=False, precision=precision)(*values)
        outputs = []
        for slot in layout.outputs:
            if slot.kind == "array":
                outputs.append(results[slot.index])
            elif slot.kind == "input":
                outputs.append(jnp.asarray(values[slot.index]))
            else:
                raise RuntimeError(f"{name} returns {slot.value!r}; torch.cond/while_loop on tpu return tensors only")
        return tuple(outputs)

    return run


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


def cond_values(pred: Any, true_fn: ArrayFunction, false_fn: ArrayFunction, operands: Sequence[Any]) -> tuple:
    """`lax.cond` of two branch functions on `operands` (arrays and Python values)."""
    positions, merged = _split_arrays(operands)

    def branch(fn: ArrayFunction) -> ArrayFunction:
        return lambda *arrays: tuple(_exact(value) for value in fn(*merged(arrays)))

    try:
        return tuple(jax.lax.cond(_scalar_predicate(pred), branch(true_fn), branch(false_fn), *[operands[index] for index in positions]))
    except TypeError as error:
        first_line = str(error).splitlines()[0]
        raise RuntimeError(f"torch.cond on tpu needs both branches to return tensors of the same shapes and dtypes ({first_line})") from None


def while_values(cond_fn: ArrayFunction, body_fn: ArrayFunction, carried: Sequence[Any], additional: Sequence[Any]) -> tuple:
    """`lax.while_loop` of a condition and a body over the `carried` arrays (`additional` fixed)."""
    if not all(isinstance(value, _ARRAY_TYPES) for value in carried):
        kinds = ", ".join(type(value).__name__ for value in carried)
        raise RuntimeError(f"torch.while_loop on tpu carries tensors only, got ({kinds}); carry a Python int as a 0-dim tensor")
    initial = tuple(_exact(value) for value in carried)

    def keep_going(carry: tuple) -> Any:
        (pred,) = cond_fn(*carry, *additional)
        return _scalar_predicate(pred)

    def body(carry: tuple) -> tuple:
        outputs = body_fn(*carry, *additional)
        if len(outputs) != len(carry):
            raise RuntimeError(f"torch.while_loop's body returns {len(outputs)} values for {len(carry)} carried inputs")
        for index, (output, start) in enumerate(zip(outputs, carry)):
            if tuple(jnp.shape(output)) != tuple(start.shape):
                raise RuntimeError(
                    f"torch.while_loop's body returns shape {tuple(jnp.shape(output))} for carried input {index} of shape {tuple(start.shape)}"
                )
        return tuple(jax.lax.convert_element_type(output, start.dtype) for output, start in zip(outputs, carry))

    return tuple(jax.lax.while_loop(keep_going, body, initial))


def lower_cond(node: torch.fx.Node, pred: Any, true_gm: torch.fx.GraphModule, false_gm: torch.fx.GraphModule, operands: Sequence[Any]) -> tuple:
    """A `cond` node of a compiled graph."""
    return cond_values(pred, subgraph_function(true_gm, f"{node.name} true branch"), subgraph_function(false_gm, f"{node.name} false branch"), operands)


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
