"""Max, average and adaptive pooling (1-3 spatial dims) and their backward ops.

Max pooling gathers its windows with static index arrays built in NumPy: each output position reads
kernel positions `o*stride - padding + k*dilation`; positions outside the input are masked (−inf).
Indices returned by max pooling are flat positions within each input plane, as torch's. Average
pooling never gathers windows (a 2560-wide pool would copy 6.5M elements per output): it sums
windows one spatial axis at a time. Average-pool divisors follow torch: windows clipped at
`length + padding` when padding counts, at the input when it does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ._util import HALF_DTYPES, is_float
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array


def _expand(values: Sequence[int] | int | None, count: int, default: Sequence[int] | None = None) -> tuple[int, ...]:
    if values is None or (not isinstance(values, int) and len(values) == 0):
        return tuple(default)
    if isinstance(values, int):
        return (values,) * count
    values = tuple(values)
    return values * count if len(values) == 1 else values


def _output_length(length: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    span = length + 2 * padding - dilation * (kernel - 1) - 1
    count = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (count - 1) * stride >= length + padding:
        count -= 1
    return count


class Windows:
    """Static gather indices for pooling windows over the trailing `len(positions)` dims."""

    def __init__(self, lengths: Sequence[int], positions: Sequence[np.ndarray], valid: Sequence[np.ndarray]) -> None:
        rank = len(positions)
        self.out_shape = tuple(p.shape[0] for p in positions)
        index, mask, flat = [], np.ones((1,) * 2 * rank, bool), np.zeros((1,) * 2 * rank, np.int64)
        plane_strides = [math.prod(lengths[i + 1:]) for i in range(rank)]
        for axis, (length, pos, ok) in enumerate(zip(lengths, positions, valid)):
            shape = [1] * (2 * rank)
            shape[axis], shape[rank + axis] = pos.shape
            clipped = np.clip(pos, 0, max(length - 1, 0)).reshape(shape)
            index.append(clipped)
            mask = mask & ok.reshape(shape)
            flat = flat + clipped * plane_strides[axis]
        full = self.out_shape + tuple(p.shape[1] for p in positions)
        self.window = math.prod(p.shape[1] for p in positions)
        self.index = tuple(index)
        self.mask = np.broadcast_to(mask, full).reshape(self.out_shape + (self.window,))
        self.flat = np.broadcast_to(flat, full).reshape(self.out_shape + (self.window,))

    def gather(self, x: Array) -> Array:
        """x's windows as (..., *out_shape, window_size)."""
        patches = x[(Ellipsis,) + self.index]
        return patches.reshape(patches.shape[: x.ndim - len(self.index)] + self.out_shape + (self.window,))


def _sliding(lengths: Sequence[int], kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool) -> Windows:
    positions, valid = [], []
    for length, k, s, p, d in zip(lengths, kernel, stride, padding, dilation):
        count = _output_length(length, k, s, p, d, ceil_mode)
        pos = np.arange(count)[:, None] * s - p + np.arange(k)[None, :] * d
        positions.append(pos)
        valid.append((pos >= 0) & (pos < length))
    return Windows(lengths, positions, valid)


def _lowest(dtype: jnp.dtype) -> Array:
    return jnp.asarray(-jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min, dtype)


def _max_over_windows(self: Array, windows: Windows) -> tuple[Array, Array]:
    patches = jnp.where(windows.mask, windows.gather(self), _lowest(self.dtype))
    choice = jnp.argmax(patches, axis=-1)
    values = jnp.take_along_axis(patches, choice[..., None], axis=-1)[..., 0]
    flat = jnp.broadcast_to(jnp.asarray(windows.flat), patches.shape)
    indices = jnp.take_along_axis(flat, choice[..., None], axis=-1)[..., 0]
    return values, indices


def _max_pool(self: Array, rank: int, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool) -> tuple[Array, Array]:
    kernel = _expand(kernel_size, rank)
    windows = _sliding(self.shape[-rank:], kernel, _expand(stride, rank, kernel), _expand(padding, rank), _expand(dilation, rank), ceil_mode)
    return _max_over_windows(self, windows)


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self: Array, kernel_size: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> tuple[Array, Array]:
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self: Array, kernel_size: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> tuple[Array, Array]:
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _scatter_to_planes(grad_output: Array, self: Array, indices: Array, rank: int) -> Array:
    """Add each output gradient into the flat plane position its index names."""
    batch = self.shape[:-rank]
    plane = math.prod(self.shape[-rank:])
    rows = math.prod(batch)
    outputs = math.prod(grad_output.shape[-rank:])
    grads = grad_output.reshape(rows, outputs)
    where = indices.reshape(rows, outputs)
    result = jnp.zeros((rows, plane), grad_output.dtype).at[jnp.arange(rows)[:, None], where].add(grads)
    return result.reshape(self.shape)


@lowers(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output: Array, self: Array, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool, indices: Array) -> Array:
    return _scatter_to_planes(grad_output, self, indices, 2)


@lowers(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output: Array, self: Array, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool, indices: Array) -> Array:
    return _scatter_to_planes(grad_output, self, indices, 3)


def _avg_divisors(lengths: Sequence[int], kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool) -> np.ndarray:
    per_dim = []
    for length, k, s, p in zip(lengths, kernel, stride, padding):
        count = _output_length(length, k, s, p, 1, ceil_mode)
        start = np.arange(count) * s - p
        end = np.minimum(start + k, length + p)
        if count_include_pad:
            per_dim.append(end - start)
        else:
            per_dim.append(np.minimum(end, length) - np.maximum(start, 0))
    divisor = np.ones((), np.int64)
    for sizes in per_dim:
        divisor = np.multiply.outer(divisor, sizes)
    return divisor


def _axis_window_sums(x: Array, axis: int, length: int, kernel: int, stride: int, padding: int, count: int) -> Array:
    """Zero-padded window sums along one axis, without materialising any window.

    A window reads positions `[o*stride - padding, o*stride - padding + kernel)` of the axis. A single
    window, or an axis of length 1, is a masked sum or a masked broadcast. Otherwise the sums come
    from `reduce_window` on that axis alone: XLA:CPU's YNNPACK fusion of a padded reduce-window
    broadcasts an axis of length 1 into its padding (the sum of a 1x1 plane under a kxk window came
    back k*k times too large once the array was big enough to be given to YNNPACK), so padded axes
    of length 1 never reach it.
    """
    starts = np.arange(count) * stride - padding
    positions = np.arange(length)
    inside = (positions[None, :] >= starts[:, None]) & (positions[None, :] < starts[:, None] + kernel)
    shape = [1] * x.ndim
    if count == 1:
        shape[axis] = length
        return jnp.sum(jnp.where(inside[0].reshape(shape), x, jnp.zeros((), x.dtype)), axis=axis, keepdims=True)
    if length == 1:
        shape[axis] = count
        return jnp.where(inside[:, 0].reshape(shape), x, jnp.zeros((), x.dtype))
    high = max((count - 1) * stride + kernel - length - padding, 0)
    window, strides = [1] * x.ndim, [1] * x.ndim
    window[axis], strides[axis] = kernel, stride
    pads = [(0, 0)] * x.ndim
    pads[axis] = (padding, high)
    return jax.lax.reduce_window(x, np.zeros((), x.dtype), jax.lax.add, tuple(window), tuple(strides), pads)


def _accumulation_dtype(x: Array) -> jnp.dtype:
    """float32 for half floats (torch accumulates them in float32), the input's dtype otherwise."""
    return jnp.dtype(jnp.float32) if x.dtype in HALF_DTYPES else x.dtype


def _avg_pool(self: Array, rank: int, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Array:
    """torch's average pooling: separable window sums over each spatial axis, then torch's divisor.

    Integer inputs sum exactly and divide truncating toward zero, as torch's integer kernels do.
    """
    kernel = _expand(kernel_size, rank)
    stride, padding = _expand(stride, rank, kernel), _expand(padding, rank)
    lengths = self.shape[-rank:]
    total = self.astype(_accumulation_dtype(self))
    for i, (length, k, s, p) in enumerate(zip(lengths, kernel, stride, padding)):
        count = _output_length(length, k, s, p, 1, ceil_mode)
        total = _axis_window_sums(total, self.ndim - rank + i, length, k, s, p, count)
    if divisor_override:
        divisor = np.asarray(divisor_override, np.int64)
    else:
        divisor = np.maximum(_avg_divisors(lengths, kernel, stride, padding, ceil_mode, count_include_pad), 1)
    if is_float(total):
        return (total / jnp.asarray(divisor, total.dtype)).astype(self.dtype)
    return jax.lax.div(total, jnp.broadcast_to(jnp.asarray(divisor, total.dtype), total.shape))


@lowers(aten.avg_pool2d.default)
def avg_pool2d(self: Array, kernel_size: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Array:
    return _avg_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers(aten.avg_pool3d.default)
def avg_pool3d(self: Array, kernel_size: Sequence[int], stride: Sequence[int] = (), padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Array:
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _pullback(forward, self: Array, grad_output: Array) -> Array:
    _, pull = jax.vjp(forward, jnp.zeros(self.shape, grad_output.dtype))
    return pull(grad_output)[0]


@lowers(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output: Array, self: Array, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Array:
    return _pullback(lambda x: _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override), self, grad_output)


@lowers(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output: Array, self: Array, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Array:
    return _pullback(lambda x: _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override), self, grad_output)


# --- adaptive pooling ----------------------------------------------------------------------------


def _adaptive_bounds(length: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    o = np.arange(out)
    return (o * length) // out, -((-(o + 1) * length) // out)


def _adaptive_matrix(length: int, out: int, dtype: jnp.dtype) -> Array:
    start, end = _adaptive_bounds(length, out)
    positions = np.arange(length)[None, :]
    inside = (positions >= start[:, None]) & (positions < end[:, None])
    return jnp.asarray(inside / np.maximum(end - start, 1)[:, None], dtype)


def _adaptive_avg(self: Array, output_size: Sequence[int]) -> Array:
    """Adaptive average pooling, one spatial axis at a time: an axis whose windows are uniform (its
    length a multiple of the output size) is a reshape and a mean; any other axis a product with
    its (output x length) averaging matrix."""
    rank = len(output_size)
    x = self.astype(_accumulation_dtype(self)) if is_float(self) else self.astype(jnp.float32)
    for i, out in enumerate(output_size):
        axis = x.ndim - rank + i
        length = x.shape[axis]
        if out and length % out == 0:
            x = jnp.mean(x.reshape(x.shape[:axis] + (out, length // out) + x.shape[axis + 1:]), axis=axis + 1)
            continue
        matrix = _adaptive_matrix(length, out, x.dtype)
        x = jnp.moveaxis(jnp.tensordot(x, matrix, axes=([axis], [1]), precision=jax.lax.Precision.HIGHEST), -1, axis)
    return x.astype(self.dtype) if is_float(self) else x


@lowers(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(self: Array, output_size: Sequence[int]) -> Array:
    return _adaptive_avg(self, output_size)


@lowers(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output: Array, self: Array) -> Array:
    return _pullback(lambda x: _adaptive_avg(x, grad_output.shape[-2:]), self, grad_output)


@lowers(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output: Array, self: Array) -> Array:
    return _pullback(lambda x: _adaptive_avg(x, grad_output.shape[-3:]), self, grad_output)


def _adaptive_max(self: Array, output_size: Sequence[int]) -> tuple[Array, Array]:
    rank = len(output_size)
    lengths = self.shape[-rank:]
    positions, valid = [], []
    for length, out in zip(lengths, output_size):
        start, end = _adaptive_bounds(length, out)
        width = int(np.max(end - start)) if out else 1
        pos = start[:, None] + np.arange(width)[None, :]
        positions.append(pos)
        valid.append(pos < end[:, None])
    return _max_over_windows(self, Windows(lengths, positions, valid))


@lowers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(self: Array, output_size: Sequence[int]) -> tuple[Array, Array]:
    return _adaptive_max(self, output_size)


@lowers(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output: Array, self: Array, indices: Array) -> Array:
    return _scatter_to_planes(grad_output, self, indices, 2)


@lowers(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output: Array, self: Array, indices: Array) -> Array:
    return _scatter_to_planes(grad_output, self, indices, 3)
