"""`tputrace::rnn_layer`: one layer and direction of an RNN, LSTM or GRU over a whole sequence, as one op.

`rnn_route` runs `nn.LSTM`, `nn.GRU` and `nn.RNN` on tpu through this op, and `recurrent` lowers it and its
backward (`tputrace::rnn_layer_backward`) to a `lax.scan`. Layouts: `input` is time-major (T, B, I), `h0`/`c0`
are (B, H) (`c0` is carried unchanged but for an LSTM), weights are torch's (`w_ih` (G·H, I), `w_hh` (G·H, H),
biases (G·H,), zeros where the module has none), gates in torch's order (LSTM: input, forget, cell, output;
GRU: reset, update, new). The CPU kernels compute the same step by step with torch's ops; the backend falls
back to them where the lowering cannot run.
"""

from __future__ import annotations

from typing import Any

import torch

MODE_RNN_TANH = 0
MODE_RNN_RELU = 1
MODE_LSTM = 2
MODE_GRU = 3
MODES = (MODE_RNN_TANH, MODE_RNN_RELU, MODE_LSTM, MODE_GRU)


def _cell(mode: int, input_gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_hh: torch.Tensor,
          b_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One time step on the host: (h', c') from the step's projected input."""
    hidden_gates = torch.nn.functional.linear(h, w_hh, b_hh)
    if mode == MODE_LSTM:
        in_gate, forget_gate, cell_gate, out_gate = (input_gates + hidden_gates).chunk(4, dim=-1)
        c = torch.sigmoid(forget_gate) * c + torch.sigmoid(in_gate) * torch.tanh(cell_gate)
        return torch.sigmoid(out_gate) * torch.tanh(c), c
    if mode == MODE_GRU:
        input_reset, input_update, input_new = input_gates.chunk(3, dim=-1)
        hidden_reset, hidden_update, hidden_new = hidden_gates.chunk(3, dim=-1)
        reset = torch.sigmoid(input_reset + hidden_reset)
        update = torch.sigmoid(input_update + hidden_update)
        new = torch.tanh(input_new + reset * hidden_new)
        return (1 - update) * new + update * h, c
    pre = input_gates + hidden_gates
    return (torch.tanh(pre) if mode == MODE_RNN_TANH else torch.relu(pre)), c


def _host_layer(input: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor,
                h0: torch.Tensor, c0: torch.Tensor, mode: int, reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    input_gates = torch.nn.functional.linear(input, w_ih, b_ih)
    h, c = h0, c0
    outputs: list[torch.Tensor] = []
    steps = range(input.shape[0] - 1, -1, -1) if reverse else range(input.shape[0])
    for step in steps:
        h, c = _cell(mode, input_gates[step], h, c, w_hh, b_hh)
        outputs.append(h)
    if reverse:
        outputs.reverse()
    output = torch.stack(outputs) if outputs else input.new_empty((0, *h0.shape))
    return output, h.clone(), c.clone()


@torch.library.custom_op("tputrace::rnn_layer", mutates_args=(), device_types="cpu")
def rnn_layer(input: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor,
              h0: torch.Tensor, c0: torch.Tensor, mode: int, reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's outputs (T, B, H), last hidden state and last cell state."""
    with torch.no_grad():
        return _host_layer(input, w_ih, w_hh, b_ih, b_hh, h0, c0, mode, reverse)


@rnn_layer.register_fake
def _rnn_layer_fake(input: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                    b_hh: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, mode: int,
                    reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return input.new_empty((input.shape[0], *h0.shape)), torch.empty_like(h0), torch.empty_like(c0)


@torch.library.custom_op("tputrace::rnn_layer_backward", mutates_args=(), device_types="cpu")
def rnn_layer_backward(input: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                       b_hh: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, grad_output: torch.Tensor,
                       grad_hy: torch.Tensor, grad_cy: torch.Tensor, mode: int,
                       reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                               torch.Tensor, torch.Tensor]:
    """Gradients of the input, the weights and biases, h0 and c0."""
    inputs = tuple(tensor.detach().requires_grad_() for tensor in (input, w_ih, w_hh, b_ih, b_hh, h0, c0))
    with torch.enable_grad():
        outputs = _host_layer(*inputs, mode, reverse)
    grads = torch.autograd.grad(outputs, inputs, (grad_output, grad_hy, grad_cy), allow_unused=True)
    filled = [torch.zeros_like(tensor) if grad is None else grad for grad, tensor in zip(grads, inputs)]
    return filled[0], filled[1], filled[2], filled[3], filled[4], filled[5], filled[6]


@rnn_layer_backward.register_fake
def _rnn_layer_backward_fake(input: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                             b_hh: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, *rest: Any) -> tuple[torch.Tensor, ...]:
    return tuple(torch.empty_like(tensor) for tensor in (input, w_ih, w_hh, b_ih, b_hh, h0, c0))


def _save(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs[:7])
    ctx.mode, ctx.reverse = inputs[7], inputs[8]


def _backward(ctx: Any, grad_output: torch.Tensor | None, grad_hy: torch.Tensor | None,
              grad_cy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    inputs = ctx.saved_tensors
    input, h0, c0 = inputs[0], inputs[5], inputs[6]
    cotangents = (input.new_zeros((input.shape[0], *h0.shape)) if grad_output is None else grad_output,
                  torch.zeros_like(h0) if grad_hy is None else grad_hy,
                  torch.zeros_like(c0) if grad_cy is None else grad_cy)
    if torch.is_grad_enabled():
        # backward(create_graph=True): recompute step by step with torch's ops, whose gradients torch can take again.
        outputs = _host_layer(*inputs, ctx.mode, ctx.reverse)
        differentiable = [index for index, tensor in enumerate(inputs) if tensor.requires_grad]
        found = torch.autograd.grad(outputs, [inputs[index] for index in differentiable], cotangents,
                                    create_graph=True, allow_unused=True)
        grads: list[torch.Tensor | None] = [None] * len(inputs)
        for index, grad in zip(differentiable, found):
            grads[index] = grad
        return (*grads, None, None)
    return (*torch.ops.tputrace.rnn_layer_backward(*inputs, *cotangents, ctx.mode, ctx.reverse), None, None)


rnn_layer.register_autograd(_backward, setup_context=_save)
