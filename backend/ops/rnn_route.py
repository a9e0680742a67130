"""`nn.LSTM`, `nn.GRU` and `nn.RNN` on tpu as one op per layer and direction, forward and backward.

Torch's `lstm`, `gru`, `rnn_tanh` and `rnn_relu` decompose on a Python backend into each time step's two
products and fused cell, forward and backward: a 20-step bidirectional layer records about 160 ops, and XLA
compiles each of them. A kernel for the AutogradPrivateUse1 key runs them instead as `tputrace::rnn_layer`
per layer and direction (`rnn_ops`), with its own backward op; `recurrent` lowers both to a `lax.scan`, which
XLA compiles once whatever the sequence's length. Dropout between layers is torch's `dropout`, as in the decomposition.

Other cases keep torch's decomposition: LSTM projections (`proj_size`), inputs that are not 3-D or not
floating point, states or weights whose dtype differs from the input's, packed sequences (the `data` overloads),
and calls under autocast, whose products the decomposition casts as autocast casts each `linear`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch._ops import OpOverload

from tputrace.backend.core import routing

from .rnn_ops import MODE_GRU, MODE_LSTM, MODE_RNN_RELU, MODE_RNN_TANH

aten = torch.ops.aten
_library: torch.library.Library | None = None


def _fits(input: torch.Tensor, states: Sequence[torch.Tensor], params: Sequence[torch.Tensor], has_biases: bool,
          num_layers: int, bidirectional: bool) -> bool:
    """Whether the layer op computes what the decomposition would: plain weights, 3-D floating input and states."""
    per_direction = 4 if has_biases else 2
    return (
        not torch.is_autocast_enabled(input.device.type)
        and input.dim() == 3
        and input.dtype.is_floating_point
        and len(params) == per_direction * num_layers * (2 if bidirectional else 1)
        and all(state.dim() == 3 and state.dtype == input.dtype for state in states)
        and all(param.dtype == input.dtype for param in params)
    )


def _run_layers(mode: int, input: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, params: Sequence[torch.Tensor],
                has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool,
                batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Output, and the last hidden and cell states of every layer and direction (L·D, B, H)."""
    directions = 2 if bidirectional else 1
    per_direction = 4 if has_biases else 2
    layer_input = input.transpose(0, 1) if batch_first else input
    last_hidden: list[torch.Tensor] = []
    last_cell: list[torch.Tensor] = []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = params[index * per_direction:(index + 1) * per_direction]
            if has_biases:
                biases = (weights[2], weights[3])
            else:
                zeros = weights[0].new_zeros(weights[0].shape[0])
                biases = (zeros, zeros)
            output, hidden, cell = torch.ops.tputrace.rnn_layer(
                layer_input, weights[0], weights[1], biases[0], biases[1], h0[index], c0[index], mode, direction == 1)
            outputs.append(output)
            last_hidden.append(hidden)
            last_cell.append(cell)
        layer_input = outputs[0] if directions == 1 else torch.cat(outputs, dim=-1)
        if dropout > 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, True)
    output = layer_input.transpose(0, 1) if batch_first else layer_input
    return output, torch.stack(last_hidden), torch.stack(last_cell)


def lstm(input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor], has_biases: bool,
         num_layers: int, dropout: float, train: bool, bidirectional: bool,
         batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if len(hx) != 2 or hx[0].shape != hx[1].shape or not _fits(input, hx, params, has_biases, num_layers, bidirectional):
        return aten.lstm.input.decompose(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                                         batch_first)
    return _run_layers(MODE_LSTM, input, hx[0], hx[1], params, has_biases, num_layers, dropout, train, bidirectional,
                       batch_first)


def _single_state(mode: int, overload: OpOverload) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The kernel of an op whose state is one hidden tensor (`gru`, `rnn_tanh`, `rnn_relu`)."""

    def kernel(input: torch.Tensor, hx: torch.Tensor, params: Sequence[torch.Tensor], has_biases: bool,
               num_layers: int, dropout: float, train: bool, bidirectional: bool,
               batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if not _fits(input, (hx,), params, has_biases, num_layers, bidirectional):
            return overload.decompose(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                                      batch_first)
        output, hidden, _ = _run_layers(mode, input, hx, hx, params, has_biases, num_layers, dropout, train,
                                        bidirectional, batch_first)
        return output, hidden

    return kernel


def _routed(kernel: Callable[..., tuple[torch.Tensor, ...]]) -> routing.Handler:
    """The kernel as the dispatcher's route, for calls that reach it below autograd (`torch.inference_mode`)."""

    def route(args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
        return kernel(*args, **kwargs)

    return route


def register() -> None:
    """Register the kernels once: for autograd's key, and as routes where autograd is off (inference mode)."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    kernels: dict[OpOverload, Callable[..., tuple[torch.Tensor, ...]]] = {
        aten.lstm.input: lstm,
        aten.gru.input: _single_state(MODE_GRU, aten.gru.input),
        aten.rnn_tanh.input: _single_state(MODE_RNN_TANH, aten.rnn_tanh.input),
        aten.rnn_relu.input: _single_state(MODE_RNN_RELU, aten.rnn_relu.input),
    }
    for overload, kernel in kernels.items():
        _library.impl(overload.name().split("::", 1)[1], kernel, "AutogradPrivateUse1")
        routing.register_special(overload, _routed(kernel))
