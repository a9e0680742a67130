"""Softmax, losses, normalisation layers, dropout backward and attention.

Half-precision inputs compute in float32 (the dispatcher casts results back), as torch's CPU kernels
accumulate. Normalisation layers live in `normalization`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import torch

from tputrace.backend.core import matmul_precision

from ._util import UnloweredCase, canon_dim, opmath, to_float
from .ordering import computed_after
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array

# --- softmax ------------------------------------------------------------------------------------


def _along(self: Array, dim: int, fn) -> Array:
    if self.ndim == 0:
        return fn(self.reshape(1), 0).reshape(())
    return fn(self, canon_dim(dim, self.ndim))


def _softmax_along(x: Array, axis: int) -> Array:
    peak = jnp.max(x, axis=axis, keepdims=True)
    exps = jnp.exp(x - peak)
    return exps / jnp.sum(exps, axis=axis, keepdims=True)


def _log_softmax_along(x: Array, axis: int) -> Array:
    shifted = x - jnp.max(x, axis=axis, keepdims=True)
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))


@lowers(aten._softmax.default)
def softmax(self: Array, dim: int, half_to_float: bool) -> Array:
    return _along(to_float(self), dim, _softmax_along)


@lowers(aten._log_softmax.default)
def log_softmax(self: Array, dim: int, half_to_float: bool) -> Array:
    return _along(to_float(self), dim, _log_softmax_along)


@lowers(aten._safe_softmax.default)
def safe_softmax(self: Array, dim: int, dtype: torch.dtype | None = None) -> Array:
    def safe(x: Array, axis: int) -> Array:
        all_masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
        return jnp.where(all_masked, jnp.zeros_like(x), _softmax_along(x, axis))

    return _along(to_float(self), dim, safe)


@lowers(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output: Array, output: Array, dim: int, input_dtype: torch.dtype) -> Array:
    def backward(g: Array, axis: int) -> Array:
        y = opmath(output).reshape(g.shape)
        return y * (g - jnp.sum(g * y, axis=axis, keepdims=True))

    return _along(opmath(grad_output), dim, backward)


@lowers(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output: Array, output: Array, dim: int, input_dtype: torch.dtype) -> Array:
    def backward(g: Array, axis: int) -> Array:
        y = opmath(output).reshape(g.shape)
        return g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)

    return _along(opmath(grad_output), dim, backward)


# --- losses (reduction: 0 none, 1 mean, 2 sum) -------------------------------------------------------


def _reduce(loss: Array, reduction: int) -> Array:
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _reduce_grad(grad: Array, reduction: int, count: int) -> Array:
    return grad / count if reduction == 1 else grad


def _class_last(self: Array, target: Array) -> tuple[Array, Array]:
    """Scores as (samples, classes) and targets as (samples,), for inputs (C), (N, C) or (N, C, d...)."""
    if self.ndim == 1:
        return self.reshape(1, -1), target.reshape(1)
    return jnp.moveaxis(self, 1, -1).reshape(-1, self.shape[1]), target.reshape(-1)


def _nll_terms(self: Array, target: Array, weight: Array | None, ignore_index: int) -> tuple[Array, Array, Array]:
    scores, labels = _class_last(self, target)
    valid = labels != ignore_index
    safe = jnp.where(valid, labels, 0)
    weights = jnp.ones(labels.shape, scores.dtype) if weight is None else weight[safe].astype(scores.dtype)
    weights = jnp.where(valid, weights, jnp.zeros_like(weights))
    return scores, safe, weights


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(self: Array, target: Array, weight: Array | None, reduction: int, ignore_index: int) -> tuple[Array, Array]:
    scores, safe, weights = _nll_terms(self, target, weight, ignore_index)
    losses = -jnp.take_along_axis(scores, safe[:, None], axis=1)[:, 0] * weights
    total_weight = jnp.sum(weights)
    if reduction == 0:
        return losses.reshape(target.shape), jnp.zeros((), scores.dtype)
    total = jnp.sum(losses)
    return (total / total_weight if reduction == 1 else total), total_weight


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output: Array, self: Array, target: Array, weight: Array | None, reduction: int, ignore_index: int, total_weight: Array) -> Array:
    scores, safe, weights = _nll_terms(self, target, weight, ignore_index)
    if reduction == 0:
        grads = grad_output.reshape(-1)
    elif reduction == 1:
        grads = jnp.broadcast_to(grad_output / total_weight, safe.shape)
    else:
        grads = jnp.broadcast_to(grad_output, safe.shape)
    # Each row's target class picked by comparing with an iota, not scattered: XLA fuses the compare
    # into the loop that writes the gradient.
    is_target = jax.lax.broadcasted_iota(safe.dtype, scores.shape, 1) == safe[:, None]
    grad_scores = jnp.where(is_target, (-weights * grads).astype(scores.dtype)[:, None], jnp.zeros((), scores.dtype))
    if self.ndim == 1:
        return grad_scores.reshape(self.shape)
    moved_shape = (self.shape[0],) + self.shape[2:] + (self.shape[1],)
    return jnp.moveaxis(grad_scores.reshape(moved_shape), -1, 1)


@lowers(aten.mse_loss.default)
def mse_loss(self: Array, target: Array, reduction: int = 1) -> Array:
    return _reduce((self - target) ** 2, reduction)


@lowers(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int) -> Array:
    return _reduce_grad(2.0 * (self - target) * grad_output, reduction, self.size)


@lowers(aten.smooth_l1_loss.default)
def smooth_l1_loss(self: Array, target: Array, reduction: int = 1, beta: float = 1.0) -> Array:
    diff = jnp.abs(self - target)
    if beta == 0:
        return _reduce(diff, reduction)
    return _reduce(jnp.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta), reduction)


@lowers(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int, beta: float) -> Array:
    diff = self - target
    slope = jnp.sign(diff) if beta == 0 else jnp.where(jnp.abs(diff) < beta, diff / beta, jnp.sign(diff))
    return _reduce_grad(slope * grad_output, reduction, self.size)


@lowers(aten.huber_loss.default)
def huber_loss(self: Array, target: Array, reduction: int = 1, delta: float = 1.0) -> Array:
    diff = jnp.abs(self - target)
    return _reduce(jnp.where(diff < delta, 0.5 * diff * diff, delta * (diff - 0.5 * delta)), reduction)


@lowers(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int, delta: float) -> Array:
    slope = jnp.clip(self - target, -delta, delta)
    return _reduce_grad(slope * grad_output, reduction, self.size)


@lowers(aten.soft_margin_loss.default)
def soft_margin_loss(self: Array, target: Array, reduction: int = 1) -> Array:
    return _reduce(jnp.log1p(jnp.exp(-target * self)), reduction)


@lowers(aten.soft_margin_loss_backward.default)
def soft_margin_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int) -> Array:
    z = jnp.exp(-target * self)
    return _reduce_grad(-target * z / (1.0 + z) * grad_output, reduction, self.size)


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(self: Array, target: Array, weight: Array | None = None, reduction: int = 1) -> Array:
    log_p = jnp.maximum(jnp.log(self), -100.0)
    log_q = jnp.maximum(jnp.log1p(-self), -100.0)
    loss = -(target * log_p + (1.0 - target) * log_q)
    return _reduce(loss if weight is None else loss * weight, reduction)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output: Array, self: Array, target: Array, weight: Array | None = None, reduction: int = 1) -> Array:
    grad = grad_output * (self - target) / jnp.maximum((1.0 - self) * self, 1e-12)
    return _reduce_grad(grad if weight is None else grad * weight, reduction, self.size)


@lowers(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self: Array, target: Array, weight: Array | None = None, pos_weight: Array | None = None, reduction: int = 1) -> Array:
    log_sigmoid = jnp.minimum(self, 0) - jnp.log1p(jnp.exp(-jnp.abs(self)))
    if pos_weight is None:
        loss = (1.0 - target) * self - log_sigmoid
    else:
        loss = (1.0 - target) * self - ((pos_weight - 1.0) * target + 1.0) * log_sigmoid
    return _reduce(loss if weight is None else loss * weight, reduction)


@lowers(aten.multi_margin_loss.default)
def multi_margin_loss(self: Array, target: Array, p: object = 1, margin: object = 1, weight: Array | None = None, reduction: int = 1) -> Array:
    scores = self.reshape(1, -1) if self.ndim <= 1 else self
    labels = target.reshape(-1)
    picked = jnp.take_along_axis(scores, labels[:, None], axis=1)
    hinge = jnp.maximum(margin - picked + scores, 0.0)
    hinge = jnp.where(p == 2, hinge * hinge, hinge)
    if weight is not None:
        hinge = hinge * weight[labels][:, None]
    hinge = jnp.where(jnp.arange(scores.shape[1])[None, :] == labels[:, None], jnp.zeros_like(hinge), hinge)
    losses = jnp.sum(hinge, axis=1) / scores.shape[1]
    return _reduce(losses if self.ndim == 2 else losses.reshape(()), reduction)


def _check_multilabel_shapes(self: Array, target: Array) -> None:
    """torch's shape checks: the dispatcher takes this op's output shapes from its lowering, not its meta kernel."""
    if self.ndim > 2 or (self.ndim > 0 and self.shape[-1] == 0):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(self.shape)}")
    if target.shape != self.shape:
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {list(self.shape)}")


def _multilabel_rows(self: Array, target: Array) -> tuple[Array, Array]:
    """Scores and targets as (samples, classes), for inputs (), (C) or (N, C)."""
    classes = self.shape[-1] if self.ndim else 1
    return opmath(self).reshape(-1, classes), target.reshape(-1, classes)


def _multilabel_slots(labels: Array) -> Array:
    """Per (sample, slot, class), whether the slot names the class. A row's targets are its entries
    before its first negative one, as in torch's CPU kernel; later entries name nothing."""
    counted = jnp.cumsum(labels < 0, axis=1) == 0
    return (labels[:, :, None] == jnp.arange(labels.shape[1])) & counted[:, :, None]


def _multilabel_hinges(scores: Array, slots: Array, is_target: Array) -> tuple[Array, Array]:
    """Per (sample, slot, class), whether the hinge 1 - x[target] + x[class] counts (positive, for a
    counted slot, a repeated target once per slot, and a class outside the target set), and its value."""
    picked = jnp.sum(jnp.where(slots, scores[:, None, :], 0), axis=2)
    margins = 1.0 - picked[:, :, None] + scores[:, None, :]
    active = jnp.any(slots, axis=2)[:, :, None] & ~is_target[:, None, :] & (margins > 0)
    return active, jnp.where(active, margins, 0)


@lowers(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self: Array, target: Array, reduction: int) -> tuple[Array, Array]:
    _check_multilabel_shapes(self, target)
    scores, labels = _multilabel_rows(self, target)
    slots = _multilabel_slots(labels)
    is_target = jnp.any(slots, axis=1)
    _, hinges = _multilabel_hinges(scores, slots, is_target)
    losses = jnp.sum(hinges, axis=(1, 2)) / scores.shape[1]
    if reduction == 0:
        output = losses if self.ndim == 2 else losses.reshape(())
    else:
        output = _reduce(losses, reduction)
    return output.astype(self.dtype), is_target.astype(self.dtype).reshape(target.shape)


@lowers(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output: Array, self: Array, target: Array, reduction: int, is_target: Array) -> Array:
    scores, labels = _multilabel_rows(self, target)
    slots = _multilabel_slots(labels)
    active, _ = _multilabel_hinges(scores, slots, is_target.reshape(scores.shape) != 0)
    active = active.astype(scores.dtype)
    target_counts = jnp.sum(jnp.sum(active, axis=2)[:, :, None] * slots, axis=1)
    grad = (jnp.sum(active, axis=1) - target_counts) / scores.shape[1]
    if reduction == 0 and grad_output.ndim > 0:
        grad = grad * opmath(grad_output).reshape(-1, 1)
    else:
        grad = _reduce_grad(grad, reduction, scores.shape[0]) * opmath(grad_output)
    return grad.reshape(self.shape)


@lowers(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output: Array, mask: Array, scale: float) -> Array:
    return grad_output * mask.astype(grad_output.dtype) * scale


# --- attention ----------------------------------------------------------------------------------


def _grouped_heads(q: Array, k: Array) -> bool:
    return k.ndim == q.ndim and q.ndim >= 3 and k.shape[-3] != q.shape[-3] and q.shape[-3] % k.shape[-3] == 0


def _scores(q: Array, k: Array, is_causal: bool, attn_mask: Array | None, scale: float) -> Array:
    """Scaled q·k scores with masked positions at -inf (or the float mask added)."""
    scores = jnp.einsum("...qd,...kd->...qk", q, k, precision=matmul_precision.for_operands(q, k)) * scale
    if is_causal:
        allowed = jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), jnp.bool_))
        scores = jnp.where(allowed, scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ else scores + attn_mask
    return scores


def _softmax(q: Array, k: Array, is_causal: bool, attn_mask: Array | None, scale: float) -> tuple[Array, Array, Array]:
    """The attention probabilities, with each row's finite peak and the sum of exps under it."""
    scores = _scores(q, k, is_causal, attn_mask, scale)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, jnp.zeros_like(peak))
    exps = jnp.exp(scores - peak)
    total = jnp.sum(exps, axis=-1, keepdims=True)
    return exps / total, peak, total


def _attention(query: Array, key: Array, value: Array, is_causal: bool, attn_mask: Array | None, scale: float | None) -> tuple[Array, Array]:
    q, k, v = to_float(query), to_float(key), to_float(value)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if _grouped_heads(q, k):
        repeats = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, repeats, axis=-3), jnp.repeat(v, repeats, axis=-3)
    probabilities, peak, total = _softmax(q, k, is_causal, attn_mask, scale)
    out = jnp.einsum("...qk,...kd->...qd", probabilities, v, precision=matmul_precision.for_operands(probabilities, v))
    logsumexp = (jnp.log(total) + peak)[..., 0]
    return out, logsumexp


@lowers(aten._scaled_dot_product_flash_attention_for_cpu.default, matmul_precision=True)
def sdpa_flash_for_cpu(query: Array, key: Array, value: Array, dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask: Array | None = None, scale: float | None = None) -> tuple[Array, Array]:
    if dropout_p > 0.0:
        raise UnloweredCase("attention dropout needs a random key")
    return _attention(query, key, value, is_causal, attn_mask, scale)


@lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, matmul_precision=True)
def sdpa_flash_for_cpu_backward(grad_out: Array, query: Array, key: Array, value: Array, out: Array, logsumexp: Array, dropout_p: float, is_causal: bool, *, attn_mask: Array | None = None, scale: float | None = None) -> tuple[Array, Array, Array]:
    if dropout_p > 0.0:
        raise UnloweredCase("attention dropout needs a random key")

    q, k, v = to_float(query), to_float(key), to_float(value)
    # torch's decomposition of the forward op (torch.compile) returns the attention weights in place
    # of the logsumexp: only the op's own (B, H, L) logsumexp is used.
    if _grouped_heads(q, k) or tuple(logsumexp.shape) != tuple(q.shape[:-1]):
        def forward(q: Array, k: Array, v: Array) -> Array:
            return _attention(q, k, v, is_causal, attn_mask, scale)[0]

        _, pullback = jax.vjp(forward, q, k, v)
        return pullback(to_float(grad_out))
    # The probabilities are recomputed from the saved logsumexp after the gradient exists, as
    # FlashAttention's backward does: in one fused program (DeferAndFuse) XLA would otherwise merge the
    # scores and softmax with the forward's and keep them from the forward to the backward
    # (ordering.py). The saved output gives each row's sum(grad * probabilities · v) as sum(grad * out).
    grad = to_float(grad_out)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = _scores(computed_after(q, grad), k, is_causal, attn_mask, scale)
    probabilities = jnp.exp(scores - to_float(logsumexp)[..., None])
    grad_value = jnp.einsum("...qk,...qd->...kd", probabilities, grad, precision=matmul_precision.for_operands(probabilities, grad))
    grad_probabilities = jnp.einsum("...qd,...kd->...qk", grad, v, precision=matmul_precision.for_operands(grad, v))
    row = jnp.sum(grad * to_float(out), axis=-1, keepdims=True)
    grad_scores = probabilities * (grad_probabilities - row) * scale
    grad_query = jnp.einsum("...qk,...kd->...qd", grad_scores, k, precision=matmul_precision.for_operands(grad_scores, k))
    grad_key = jnp.einsum("...qk,...qd->...kd", grad_scores, q, precision=matmul_precision.for_operands(grad_scores, q))
    return grad_query, grad_key, grad_value


@lowers(aten._trilinear.default)
def trilinear(i1: Array, i2: Array, i3: Array, expand1: Sequence[int], expand2: Sequence[int], expand3: Sequence[int], sumdim: Sequence[int], unroll_dim: int = 1) -> Array:
    """i1, i2, i3 each unsqueezed at their `expand` dims, multiplied, and summed over `sumdim` (in float32
    for half-precision inputs, rounded once)."""
    i1, i2, i3 = opmath(i1), opmath(i2), opmath(i3)
    product = jnp.expand_dims(i1, tuple(expand1)) * jnp.expand_dims(i2, tuple(expand2)) * jnp.expand_dims(i3, tuple(expand3))
    return jnp.sum(product, axis=tuple(sumdim)) if sumdim else product


# --- fused recurrent cells (torch routes LSTM/GRU cells on non-CPU devices to these) ---------------


def _with_biases(gates: Array, bias: Array | None) -> Array:
    return gates if bias is None else gates + bias


@lowers(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates: Array, hidden_gates: Array, cx: Array, input_bias: Array | None = None, hidden_bias: Array | None = None) -> tuple[Array, Array, Array]:
    """Gates in order input, forget, cell, output; the workspace keeps the activated gates."""
    gates = _with_biases(input_gates, input_bias) + _with_biases(hidden_gates, hidden_bias)
    in_gate, forget_gate, cell_gate, out_gate = jnp.split(gates, 4, axis=-1)
    in_gate, forget_gate, out_gate = jax.nn.sigmoid(in_gate), jax.nn.sigmoid(forget_gate), jax.nn.sigmoid(out_gate)
    cell_gate = jnp.tanh(cell_gate)
    cy = forget_gate * cx + in_gate * cell_gate
    hy = out_gate * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([in_gate, forget_gate, cell_gate, out_gate], axis=-1)


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(grad_hy: Array | None, grad_cy: Array | None, cx: Array, cy: Array, workspace: Array, has_bias: bool) -> tuple[Array, Array, Array | None]:
    in_gate, forget_gate, cell_gate, out_gate = jnp.split(workspace, 4, axis=-1)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else grad_hy
    grad_cy = jnp.zeros_like(cy) if grad_cy is None else grad_cy
    tanh_cy = jnp.tanh(cy)
    grad_out = grad_hy * tanh_cy * out_gate * (1 - out_gate)
    grad_cell_state = grad_hy * out_gate * (1 - tanh_cy * tanh_cy) + grad_cy
    grad_in = grad_cell_state * cell_gate * in_gate * (1 - in_gate)
    grad_forget = grad_cell_state * cx * forget_gate * (1 - forget_gate)
    grad_cell = grad_cell_state * in_gate * (1 - cell_gate * cell_gate)
    grad_gates = jnp.concatenate([grad_in, grad_forget, grad_cell, grad_out], axis=-1)
    grad_bias = jnp.sum(grad_gates, axis=0) if has_bias else None
    return grad_gates, grad_cell_state * forget_gate, grad_bias


@lowers(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates: Array, hidden_gates: Array, hx: Array, input_bias: Array | None = None, hidden_bias: Array | None = None) -> tuple[Array, Array]:
    """Gates in order reset, update, new; the workspace keeps (reset, update, new, hidden new part, hx)."""
    input_reset, input_update, input_new = jnp.split(_with_biases(input_gates, input_bias), 3, axis=-1)
    hidden_reset, hidden_update, hidden_new = jnp.split(_with_biases(hidden_gates, hidden_bias), 3, axis=-1)
    reset = jax.nn.sigmoid(input_reset + hidden_reset)
    update = jax.nn.sigmoid(input_update + hidden_update)
    new = jnp.tanh(input_new + reset * hidden_new)
    hy = new + update * (hx - new)
    return hy, jnp.concatenate([reset, update, new, hidden_new, hx], axis=-1)


@lowers(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy: Array, workspace: Array, has_bias: bool) -> tuple[Array | None, ...]:
    """Gradients of the input gates, hidden gates, hx and the two biases; without biases those two are
    undefined tensors (None), as torch's CUDA kernel leaves them and its autograd formula expects."""
    reset, update, new, hidden_new, hx = jnp.split(workspace, 5, axis=-1)
    grad_update = grad_hy * (hx - new) * update * (1 - update)
    grad_hx = grad_hy * update
    grad_new = grad_hy * (1 - update) * (1 - new * new)
    grad_hidden_new = grad_new * reset
    grad_reset = grad_new * hidden_new * reset * (1 - reset)
    grad_input_gates = jnp.concatenate([grad_reset, grad_update, grad_new], axis=-1)
    grad_hidden_gates = jnp.concatenate([grad_reset, grad_update, grad_hidden_new], axis=-1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return grad_input_gates, grad_hidden_gates, grad_hx, jnp.sum(grad_input_gates, axis=0), jnp.sum(grad_hidden_gates, axis=0)
