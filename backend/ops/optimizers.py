"""Fused optimizer steps (`torch.optim.Adam/AdamW(fused=True)`): one lowering updates every parameter
list, computing as torch's fused CPU and CUDA kernels do (in float32 at least, gradients unscaled by
`grad_scale` and written back, the whole step skipped when `found_inf` is set)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


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
    skip = None if found_inf is None else found_inf.reshape(()) != 0
    outputs: tuple[list[Array], ...] = ([], [], [], [], [])
    for index, (param, grad, exp_avg, exp_avg_sq, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
        compute = jnp.promote_types(param.dtype, jnp.float32)
        p, g, m, v = (value.astype(compute) for value in (param, grad, exp_avg, exp_avg_sq))
        if grad_scale is not None:
            g = g / grad_scale.reshape(()).astype(compute)
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
            updated = updated.astype(previous.dtype)
            output.append(updated if skip is None else jnp.where(skip, previous, updated))
    return outputs


@lowers(aten._fused_adam)
def fused_adam(*args: object, **kwargs: object) -> tuple[list[Array], ...]:
    return _fused_adam_step(*args, **kwargs, decoupled_weight_decay=False)  # type: ignore[arg-type]


@lowers(aten._fused_adamw)
def fused_adamw(*args: object, **kwargs: object) -> tuple[list[Array], ...]:
    return _fused_adam_step(*args, **kwargs, decoupled_weight_decay=True)  # type: ignore[arg-type]
