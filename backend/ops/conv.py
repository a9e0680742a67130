"""Convolutions (1-3 spatial dims, groups, dilation, transposed) with `lax.conv_general_dilated`, their
backward through `jax.vjp`, and im2col/col2im.

A transposed convolution is the gradient of a convolution with respect to its input: it dilates the
input by the stride, pads by dilation*(kernel-1) - padding (plus output_padding at the end), and
convolves with the kernel flipped and its in/out channel roles swapped within each group.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from tputrace.backend.core import matmul_precision

from ._util import HALF_DTYPES, opmath
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _expand(values: Sequence[int], count: int) -> tuple[int, ...]:
    values = tuple(values)
    return values * count if len(values) == 1 else values


def _dimension_numbers(rank: int) -> lax.ConvDimensionNumbers:
    spec = tuple(range(rank))
    return lax.ConvDimensionNumbers(lhs_spec=spec, rhs_spec=spec, out_spec=spec)


def _transposed_kernel(weight: Array, groups: int) -> Array:
    """(in, out/groups, *k) kernel of a transposed conv as the (out, in/groups, *k) kernel of a conv."""
    in_channels, out_per_group, *kernel = weight.shape
    grouped = weight.reshape(groups, in_channels // groups, out_per_group, *kernel)
    swapped = jnp.swapaxes(grouped, 1, 2).reshape(groups * out_per_group, in_channels // groups, *kernel)
    return jnp.flip(swapped, axis=tuple(range(2, swapped.ndim)))


def conv_forward(input: Array, weight: Array, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int, accumulator: jnp.dtype | None = None) -> Array:  # noqa: A002
    """The convolution without bias; `accumulator` is the dtype it sums in and returns (default: the
    operands')."""
    spatial = weight.ndim - 2
    stride, padding, dilation = _expand(stride, spatial), _expand(padding, spatial), _expand(dilation, spatial)
    numbers = _dimension_numbers(weight.ndim)
    precision = matmul_precision.for_operands(input, weight)
    if not transposed:
        return lax.conv_general_dilated(
            input, weight, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=numbers, feature_group_count=groups, precision=precision,
            preferred_element_type=accumulator,
        )
    output_padding = _expand(output_padding, spatial) if output_padding else (0,) * spatial
    kernel = weight.shape[2:]
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, p, d, op in zip(kernel, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        input, _transposed_kernel(weight, groups), window_strides=(1,) * spatial, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=numbers, feature_group_count=groups, precision=precision,
        preferred_element_type=accumulator,
    )


@lowers(aten.convolution.default, matmul_precision=True)
def convolution(input: Array, weight: Array, bias: Array | None, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> Array:  # noqa: A002
    """Half-precision operands sum in float32 and the bias is added before the one rounding, as
    torch's CPU and CUDA kernels do."""
    accumulator = jnp.float32 if jnp.result_type(input, weight) in HALF_DTYPES else None
    out = conv_forward(input, weight, stride, padding, dilation, transposed, output_padding, groups, accumulator)
    if bias is not None:
        out = out + opmath(bias).reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


@lowers(aten.convolution_backward.default, matmul_precision=True)
def convolution_backward(grad_output: Array, input: Array, weight: Array, bias_sizes: Sequence[int] | None, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int, output_mask: Sequence[bool]) -> tuple[Array | None, Array | None, Array | None]:  # noqa: A002
    def forward(x: Array, w: Array) -> Array:
        return conv_forward(x, w, stride, padding, dilation, transposed, output_padding, groups)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        _, pullback = jax.vjp(forward, input, weight)
        grad_input, grad_weight = pullback(grad_output.astype(jnp.result_type(input, weight)))
        grad_input = grad_input if output_mask[0] else None
        grad_weight = grad_weight if output_mask[1] else None
    if output_mask[2]:
        grad_bias = jnp.sum(opmath(grad_output), axis=(0,) + tuple(range(2, grad_output.ndim)))
    return grad_input, grad_weight, grad_bias


# --- im2col / col2im ---------------------------------------------------------------------------------


def _window_positions(length: int, kernel: int, dilation: int, padding: int, stride: int) -> np.ndarray:
    """Input positions (output, kernel) a sliding window reads; out-of-range ones are padding."""
    count = (length + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    return np.arange(count)[:, None] * stride - padding + np.arange(kernel)[None, :] * dilation


def _im2col(x: Array, kernel_size: Sequence[int], dilation: Sequence[int], padding: Sequence[int], stride: Sequence[int]) -> Array:
    kernel_size, dilation = _expand(kernel_size, 2), _expand(dilation, 2)
    padding, stride = _expand(padding, 2), _expand(stride, 2)
    rows = _window_positions(x.shape[-2], kernel_size[0], dilation[0], padding[0], stride[0])
    cols = _window_positions(x.shape[-1], kernel_size[1], dilation[1], padding[1], stride[1])
    row_index = np.broadcast_to(rows.T[:, None, :, None], (kernel_size[0], kernel_size[1], rows.shape[0], cols.shape[0]))
    col_index = np.broadcast_to(cols.T[None, :, None, :], row_index.shape)
    valid = (row_index >= 0) & (row_index < x.shape[-2]) & (col_index >= 0) & (col_index < x.shape[-1])
    patches = x[..., np.clip(row_index, 0, x.shape[-2] - 1), np.clip(col_index, 0, x.shape[-1] - 1)]
    patches = jnp.where(valid, patches, jnp.zeros_like(patches))
    batch = x.shape[:-3]
    return patches.reshape(batch + (x.shape[-3] * kernel_size[0] * kernel_size[1], rows.shape[0] * cols.shape[0]))


@lowers(aten.im2col.default)
def im2col(self: Array, kernel_size: Sequence[int], dilation: Sequence[int], padding: Sequence[int], stride: Sequence[int]) -> Array:
    return _im2col(self, kernel_size, dilation, padding, stride)


@lowers(aten.col2im.default)
def col2im(self: Array, output_size: Sequence[int], kernel_size: Sequence[int], dilation: Sequence[int], padding: Sequence[int], stride: Sequence[int]) -> Array:
    kernel_size = _expand(kernel_size, 2)
    channels = self.shape[-2] // (kernel_size[0] * kernel_size[1])
    image_shape = self.shape[:-2] + (channels,) + tuple(output_size)
    _, pullback = jax.vjp(lambda image: _im2col(image, kernel_size, dilation, padding, stride), jnp.zeros(image_shape, self.dtype))
    return pullback(self)[0]
