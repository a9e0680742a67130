"""Fused optimizer steps (`torch.optim.Adam/AdamW/SGD/Adagrad(fused=True)`): one lowering updates every
parameter list, computing as torch's fused CPU and CUDA kernels do (in float32 at least, gradients
unscaled by `grad_scale` and written back, the whole step skipped when `found_inf` is set)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _compute_type(value: Array) -> jnp.dtype:
    return jnp.promote_types(value.dtype, jnp.float32)


def _scalar(value: Array | float) -> Array | float:
    """A hyperparameter given as a float, or as a one-element tensor (the `tensor_lr` overloads)."""
    return value.reshape(()) if hasattr(value, "reshape") else value


def _unscaled(grad: Array, grad_scale: Array | None, compute: jnp.dtype) -> Array:
    grad = grad.astype(compute)
    return grad if grad_scale is None else grad / grad_scale.reshape(()).astype(compute)


def _skipping(found_inf: Array | None, updated: Array, previous: Array) -> Array:
    """The update in the previous value's dtype, or the previous value when the step is skipped (inf found)."""
    updated = updated.astype(previous.dtype)
    return updated if found_inf is None else jnp.where(found_inf.reshape(()) != 0, previous, updated)


def _fused_adam_step(
    params: list[Array],
    grads: list[Array],
    exp_avgs: list[Array],
    exp_avg_sqs: list[Array],
    max_exp_avg_sqs: list[Array],
    state_steps: list[Array],
    *,
    lr: Array,
    beta1: Array,
    beta2: Array,
    weight_decay: Array,
    eps: Array,
    amsgrad: bool,
    maximize: bool,
    decoupled_weight_decay: bool,
    grad_scale: Array | None = None,
    found_inf: Array | None = None,
) -> tuple[list[Array], ...]:
    outputs: tuple[list[Array], ...] = ([], [], [], [], [])
    for index, (param, grad, exp_avg, exp_avg_sq, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
        compute = _compute_type(param)
        p, m, v = (value.astype(compute) for value in (param, exp_avg, exp_avg_sq))
        g = _unscaled(grad, grad_scale, compute)
        grad_out = g
        if maximize:
            g = -g
        if decoupled_weight_decay:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = m + (g - m) * (1 - beta1)
        v = beta2 * v + (1 - beta2) * g * g
        count = step.reshape(()).astype(compute)
        bias_correction1 = 1 - beta1**count
        bias_correction2_sqrt = jnp.sqrt(1 - beta2**count)
        if amsgrad:
            v_max = jnp.maximum(max_exp_avg_sqs[index].astype(compute), v)
            denominator = jnp.sqrt(v_max) / bias_correction2_sqrt + eps
        else:
            denominator = jnp.sqrt(v) / bias_correction2_sqrt + eps
        p = p - (lr / bias_correction1) * m / denominator
        new = [p, grad_out, m, v] + ([v_max] if amsgrad else [])
        old = [param, grad, exp_avg, exp_avg_sq] + ([max_exp_avg_sqs[index]] if amsgrad else [])
        for output, updated, previous in zip(outputs, new, old):
            output.append(_skipping(found_inf, updated, previous))
    return outputs


@lowers(aten._fused_adam)
def fused_adam(*args: object, **kwargs: object) -> tuple[list[Array], ...]:
    return _fused_adam_step(*args, **kwargs, decoupled_weight_decay=False)  # type: ignore[arg-type]


@lowers(aten._fused_adamw)
def fused_adamw(*args: object, **kwargs: object) -> tuple[list[Array], ...]:
    return _fused_adam_step(*args, **kwargs, decoupled_weight_decay=True)  # type: ignore[arg-type]


@lowers(aten._fused_sgd)
def fused_sgd(
    params: list[Array],
    grads: list[Array],
    momentum_buffers: list[Array],
    *,
    weight_decay: Array,
    momentum: Array,
    lr: Array,
    dampening: Array,
    nesterov: bool,
    maximize: bool,
    is_first_step: bool,
    grad_scale: Array | None = None,
    found_inf: Array | None = None,
) -> tuple[list[Array], list[Array], list[Array]]:
    """torch's fused SGD: momentum buffers exist (and are updated) only when `momentum_buffer_list` is given."""
    lr = _scalar(lr)
    outputs: tuple[list[Array], list[Array], list[Array]] = ([], [], [])
    for index, (param, grad) in enumerate(zip(params, grads)):
        compute = _compute_type(param)
        p, g = param.astype(compute), _unscaled(grad, grad_scale, compute)
        outputs[1].append(_skipping(found_inf, g, grad))
        if maximize:
            g = -g
        g = g + weight_decay * p
        if momentum_buffers:
            buffer = g if is_first_step else momentum * momentum_buffers[index].astype(compute) + (1 - dampening) * g
            outputs[2].append(_skipping(found_inf, buffer, momentum_buffers[index]))
            g = g + momentum * buffer if nesterov else buffer
        outputs[0].append(_skipping(found_inf, p - lr * g, param))
    return outputs


@lowers(aten._fused_adagrad)
def fused_adagrad(
    params: list[Array],
    grads: list[Array],
    state_sums: list[Array],
    state_steps: list[Array],
    *,
    lr: Array,
    lr_decay: Array,
    weight_decay: Array,
    eps: Array,
    maximize: bool,
    grad_scale: Array | None = None,
    found_inf: Array | None = None,
) -> tuple[list[Array], list[Array], list[Array], list[Array]]:
    """torch's fused Adagrad: the optimizer counts the steps before the call; the kernel reads them."""
    lr = _scalar(lr)
    outputs: tuple[list[Array], ...] = ([], [], [], [])
    for param, grad, state_sum, step in zip(params, grads, state_sums, state_steps):
        compute = _compute_type(param)
        p, g, total = param.astype(compute), _unscaled(grad, grad_scale, compute), state_sum.astype(compute)
        outputs[1].append(_skipping(found_inf, g, grad))
        if maximize:
            g = -g
        g = g + weight_decay * p
        step_lr = lr / (1 + (step.reshape(()).astype(compute) - 1) * lr_decay)
        total = total + g * g
        outputs[0].append(_skipping(found_inf, p - step_lr * g / (jnp.sqrt(total) + eps), param))
        outputs[2].append(_skipping(found_inf, total, state_sum))
        outputs[3].append(step)
    return outputs
