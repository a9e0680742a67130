"""Lowerings of `tputrace::rnn_layer` and its backward (`rnn_ops`): one layer and direction of an RNN, LSTM
or GRU over a whole sequence, as a loop XLA compiles once.

The lowering projects every time step's input with one product, then runs the recurrence as a `lax.scan`:
XLA compiles the cell once, where torch's op-by-op path records two products and a cell per time step (and as
many again backward), and XLA compiles each of them. The backward is the scan's own gradient (`jax.vjp`),
recomputing the forward from the layer's inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tputrace.backend.core import matmul_precision

from .registry import lowers
from .rnn_ops import MODE_GRU, MODE_LSTM, MODE_RNN_TANH

Array = jax.Array


def _project(x: Array, weight: Array, bias: Array) -> Array:
    """x @ weight.T + bias at torch's float32 matmul precision."""
    precision = matmul_precision.for_operands(x, weight)
    return jnp.matmul(x, weight.T, precision=precision) + bias


def _step(mode: int, w_hh: Array, b_hh: Array) -> Callable[[tuple[Array, Array], Array], tuple[tuple[Array, Array], Array]]:
    """The recurrence of one time step: (h, c), the step's projected input -> (h', c'), h'."""

    def lstm(carry: tuple[Array, Array], input_gates: Array) -> tuple[tuple[Array, Array], Array]:
        h, c = carry
        gates = input_gates + _project(h, w_hh, b_hh)
        in_gate, forget_gate, cell_gate, out_gate = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(forget_gate) * c + jax.nn.sigmoid(in_gate) * jnp.tanh(cell_gate)
        h = jax.nn.sigmoid(out_gate) * jnp.tanh(c)
        return (h, c), h

    def gru(carry: tuple[Array, Array], input_gates: Array) -> tuple[tuple[Array, Array], Array]:
        h, c = carry
        input_reset, input_update, input_new = jnp.split(input_gates, 3, axis=-1)
        hidden_reset, hidden_update, hidden_new = jnp.split(_project(h, w_hh, b_hh), 3, axis=-1)
        reset = jax.nn.sigmoid(input_reset + hidden_reset)
        update = jax.nn.sigmoid(input_update + hidden_update)
        new = jnp.tanh(input_new + reset * hidden_new)
        h = (1 - update) * new + update * h
        return (h, c), h

    def simple(carry: tuple[Array, Array], input_gates: Array) -> tuple[tuple[Array, Array], Array]:
        h, c = carry
        pre = input_gates + _project(h, w_hh, b_hh)
        h = jnp.tanh(pre) if mode == MODE_RNN_TANH else jax.nn.relu(pre)
        return (h, c), h

    return {MODE_LSTM: lstm, MODE_GRU: gru}.get(mode, simple)


def _layer(mode: int, reverse: bool, x: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array, h0: Array,
           c0: Array) -> tuple[Array, Array, Array]:
    """The layer's outputs (T, B, H), last hidden state and last cell state (c0 unchanged but for an LSTM)."""
    input_gates = _project(x, w_ih, b_ih)
    (h, c), outputs = lax.scan(_step(mode, w_hh, b_hh), (h0, c0), input_gates, reverse=reverse)
    return outputs, h, c


@lowers(torch.ops.tputrace.rnn_layer.default, matmul_precision=True)
def rnn_layer(input: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array, h0: Array, c0: Array, mode: int,
              reverse: bool) -> tuple[Array, Array, Array]:
    """Output, last hidden state and last cell state."""
    return _layer(mode, reverse, input, w_ih, w_hh, b_ih, b_hh, h0, c0)


@lowers(torch.ops.tputrace.rnn_layer_backward.default, matmul_precision=True)
def rnn_layer_backward(input: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array, h0: Array, c0: Array,
                       grad_output: Array, grad_hy: Array, grad_cy: Array, mode: int, reverse: bool) -> tuple[Array, ...]:
    """Gradients of the input, the weights and biases, h0 and c0, from the scan's own gradient."""

    def forward(*arguments: Array) -> tuple[Array, Array, Array]:
        return _layer(mode, reverse, *arguments)

    _, pullback = jax.vjp(forward, input, w_ih, w_hh, b_ih, b_hh, h0, c0)
    return tuple(pullback((grad_output, grad_hy, grad_cy)))
