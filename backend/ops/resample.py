"""Resampling: nearest/linear/cubic upsampling and antialiased bilinear/bicubic resizing (and their
backward), reflection and replication padding (and backward), and `grid_sampler_2d`.

Source coordinates are computed in float32 NumPy with torch's formulas (`area_pixel_compute_scale`,
`nearest_neighbor_compute_source_index`), so rounding at window edges matches torch's kernels.
Linear and cubic interpolation are separable: each spatial dim is one (out, in) weight matrix.
Backward ops are the transposes, taken with `jax.vjp`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ._util import HALF_DTYPES, UnloweredCase
from .registry import lowers

aten = torch.ops.aten
Array = jax.Array
f32 = np.float32


def _scale(length: int, out: int, scale: float | None, align_corners: bool = False) -> np.float32:
    """torch's input-per-output step for one dim."""
    if align_corners:
        return f32((length - 1) / (out - 1)) if out > 1 else f32(0)
    if scale is not None and scale > 0:
        return f32(1.0 / scale)
    return f32(length) / f32(out)


def _nearest_source(length: int, out: int, scale: float | None, exact: bool) -> np.ndarray:
    step = _scale(length, out, scale)
    positions = np.arange(out, dtype=f32) + (f32(0.5) if exact else f32(0))
    return np.minimum(np.floor(positions * step).astype(np.int64), length - 1)


def _linear_matrix(length: int, out: int, align_corners: bool, scale: float | None) -> np.ndarray:
    step = _scale(length, out, scale, align_corners)
    positions = np.arange(out, dtype=f32)
    source = step * positions if align_corners else np.maximum(step * (positions + f32(0.5)) - f32(0.5), f32(0))
    low = source.astype(np.int64)
    high = np.minimum(low + 1, length - 1)
    frac = source - low.astype(f32)
    matrix = np.zeros((out, length), f32)
    np.add.at(matrix, (np.arange(out), low), f32(1) - frac)
    np.add.at(matrix, (np.arange(out), high), frac)
    return matrix


def _cubic_matrix(length: int, out: int, align_corners: bool, scale: float | None) -> np.ndarray:
    step = _scale(length, out, scale, align_corners)
    positions = np.arange(out, dtype=f32)
    source = step * positions if align_corners else step * (positions + f32(0.5)) - f32(0.5)
    base = np.floor(source)
    t = source - base
    a = f32(-0.75)

    def near(x: np.ndarray) -> np.ndarray:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    matrix = np.zeros((out, length), f32)
    for offset, weight in zip(range(-1, 3), weights):
        index = np.clip(base.astype(np.int64) + offset, 0, length - 1)
        np.add.at(matrix, (np.arange(out), index), weight)
    return matrix


def _triangle(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0).astype(x.dtype)


def _keys_cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic with a = -0.5 (PIL's antialiasing filter; plain bicubic uses -0.75)."""
    x, a = np.abs(x), x.dtype.type(-0.5)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0)).astype(x.dtype)


def _antialias_matrix(length: int, out: int, align_corners: bool, scale: float | None, dtype: np.dtype, taps: int, kernel: Callable) -> np.ndarray:
    """torch's antialiased weights (`_compute_weights_aa`): when downsampling the filter is stretched
    by the scale, and each output's weights are normalised to sum to one."""
    real = np.dtype(dtype).type
    if align_corners:
        step = real((length - 1) / (out - 1)) if out > 1 else real(0)
    else:
        step = real(1 / scale) if scale is not None and scale > 0 else real(length) / real(out)
    support = real(taps * 0.5 * step) if step >= 1 else real(taps * 0.5)
    inverse = real(1 / step) if step >= 1 else real(1)
    width = int(np.ceil(support)) * 2 + 1
    matrix = np.zeros((out, length), dtype)
    for i in range(out):
        center = real(step * (i + 0.5))
        low = max(int(float(center) - float(support) + 0.5), 0)
        count = min(max(min(int(float(center) + float(support) + 0.5), length) - low, 0), width)
        weights = kernel(((np.arange(low, low + count) - center).astype(dtype) + real(0.5)) * inverse)
        total = weights.sum(dtype=dtype)
        matrix[i, low:low + count] = weights / total if total != 0 else weights
    return matrix


def _antialias_lowering(taps: int, kernel: Callable) -> Callable:
    def lowering(self: Array, output_size: Sequence[int], align_corners: bool, *scales: float | None) -> Array:
        if self.dtype not in (jnp.float32, jnp.float64):
            raise UnloweredCase("antialiased resize of integer (torch uses fixed-point weights) or half-precision images")
        scales = list(scales) + [None] * (2 - len(scales))
        x = self
        for axis, (length, out, scale) in reversed(list(enumerate(zip(self.shape[-2:], output_size, scales)))):
            if length == out:  # torch skips a dim whose size does not change
                continue
            matrix = jnp.asarray(_antialias_matrix(length, out, align_corners, scale, np.dtype(self.dtype), taps, kernel))
            axis += x.ndim - 2
            x = jnp.moveaxis(jnp.tensordot(x, matrix, axes=([axis], [1]), precision=jax.lax.Precision.HIGHEST), -1, axis)
        return x

    return lowering


def _separable(x: Array, matrices: Sequence[np.ndarray]) -> Array:
    """Interpolate along the last axes, one matrix each. Integer images (uint8) are interpolated in
    float32 and rounded back, saturating, after each axis, the last (width) first, as torch's CPU
    kernel does; half-precision images are interpolated in float32 over every axis and rounded once."""
    rank = len(matrices)
    source_dtype = x.dtype
    integral = not jnp.issubdtype(source_dtype, jnp.inexact)
    compute = jnp.float32 if integral or source_dtype in HALF_DTYPES else source_dtype
    for i, matrix in reversed(list(enumerate(matrices))):
        axis = x.ndim - rank + i
        weights = jnp.asarray(matrix, compute)
        x = jnp.moveaxis(jnp.tensordot(x.astype(compute), weights, axes=([axis], [1]), precision=jax.lax.Precision.HIGHEST), -1, axis)
        if integral:
            limits = jnp.iinfo(source_dtype)
            x = jnp.clip(jnp.floor(x + 0.5), limits.min, limits.max).astype(source_dtype)
    return x.astype(source_dtype)


def _nearest(x: Array, output_size: Sequence[int], scales: Sequence[float | None], exact: bool) -> Array:
    rank = len(output_size)
    for i, (out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - rank + i
        x = jnp.take(x, _nearest_source(x.shape[axis], out, scale, exact), axis=axis)
    return x


def _nearest_lowering(rank: int, exact: bool) -> Callable:
    def lowering(self: Array, output_size: Sequence[int], *scales: float | None) -> Array:
        return _nearest(self, output_size, list(scales) + [None] * (rank - len(scales)), exact)

    return lowering


def _interpolating_lowering(rank: int, matrix_fn: Callable) -> Callable:
    def lowering(self: Array, output_size: Sequence[int], align_corners: bool, *scales: float | None) -> Array:
        scales = list(scales) + [None] * (rank - len(scales))
        lengths = self.shape[-rank:]
        return _separable(self, [matrix_fn(n, o, align_corners, s) for n, o, s in zip(lengths, output_size, scales)])

    return lowering


def _backward_of(forward: Callable) -> Callable:
    def lowering(grad_output: Array, output_size: Sequence[int], input_size: Sequence[int], *rest: object) -> Array:
        _, pullback = jax.vjp(lambda x: forward(x, output_size, *rest), jnp.zeros(tuple(input_size), grad_output.dtype))
        return pullback(grad_output)[0]

    return lowering


for _rank, _suffix in ((1, "1d"), (2, "2d"), (3, "3d")):
    for _exact, _prefix in ((False, "upsample_nearest"), (True, "_upsample_nearest_exact")):
        _forward = _nearest_lowering(_rank, _exact)
        lowers(getattr(aten, f"{_prefix}{_suffix}").default)(_forward)
        lowers(getattr(aten, f"{_prefix}{_suffix}_backward").default)(_backward_of(_forward))

for _name, _rank, _matrix in (("upsample_linear1d", 1, _linear_matrix), ("upsample_bilinear2d", 2, _linear_matrix),
                              ("upsample_trilinear3d", 3, _linear_matrix), ("upsample_bicubic2d", 2, _cubic_matrix)):
    _forward = _interpolating_lowering(_rank, _matrix)
    lowers(getattr(aten, _name).default)(_forward)
    lowers(getattr(aten, f"{_name}_backward").default)(_backward_of(_forward))

for _name, _taps, _kernel in (("_upsample_bilinear2d_aa", 2, _triangle), ("_upsample_bicubic2d_aa", 4, _keys_cubic)):
    _forward = _antialias_lowering(_taps, _kernel)
    lowers(getattr(aten, _name).default)(_forward)
    lowers(getattr(aten, f"{_name}_backward").default)(_backward_of(_forward))


# --- padding ------------------------------------------------------------------------------------


def _pad(self: Array, padding: Sequence[int], mode: str) -> Array:
    """Pad with jnp.pad, then crop where a pad width is negative (torch allows that)."""
    rank = len(padding) // 2
    widths = [(0, 0)] * (self.ndim - rank) + [(padding[2 * i], padding[2 * i + 1]) for i in reversed(range(rank))]
    padded = jnp.pad(self, [(max(low, 0), max(high, 0)) for low, high in widths], mode=mode)
    crop = tuple(slice(max(-low, 0), padded.shape[axis] - max(-high, 0)) for axis, (low, high) in enumerate(widths))
    return padded[crop]


def _pad_lowering(mode: str) -> Callable:
    def lowering(self: Array, padding: Sequence[int]) -> Array:
        return _pad(self, padding, mode)

    return lowering


def _pad_backward_lowering(mode: str) -> Callable:
    def lowering(grad_output: Array, self: Array, padding: Sequence[int]) -> Array:
        _, pullback = jax.vjp(lambda x: _pad(x, padding, mode), jnp.zeros(self.shape, grad_output.dtype))
        return pullback(grad_output)[0]

    return lowering


for _kind, _mode in (("reflection", "reflect"), ("replication", "edge")):
    for _suffix in ("1d", "2d", "3d"):
        lowers(getattr(aten, f"{_kind}_pad{_suffix}").default)(_pad_lowering(_mode))
        lowers(getattr(aten, f"{_kind}_pad{_suffix}_backward").default)(_pad_backward_lowering(_mode))


# --- grid sampling ------------------------------------------------------------------------------


def _reflect(coord: Array, twice_low: int, twice_high: int) -> Array:
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    distance = jnp.abs(coord - low)
    extra = jnp.fmod(distance, span)
    flips = jnp.floor(distance / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _clip_coordinate(coord: Array, size: int) -> Array:
    """Clipped into [0, size - 1], with torch's gradient: 1 strictly inside, 0 on or past a border
    (`jnp.clip` would split the gradient at a border)."""
    inside = (coord > 0) & (coord < size - 1)
    return jnp.where(inside, coord, lax.stop_gradient(jnp.clip(coord, 0, size - 1)))


def _unnormalize(coord: Array, size: int, align_corners: bool) -> Array:
    """A grid coordinate in [-1, 1] as a pixel coordinate."""
    return ((coord + 1) / 2) * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2


def _apply_padding(coord: Array, size: int, padding_mode: int, align_corners: bool) -> Array:
    """Border (1) clips into the image, reflection (2) folds back into it; zeros (0) leaves it."""
    if padding_mode == 1:
        coord = _clip_coordinate(coord, size)
    elif padding_mode == 2:
        coord = _reflect(coord, 0, 2 * (size - 1)) if align_corners else _reflect(coord, -1, 2 * size - 1)
        coord = _clip_coordinate(coord, size)
    return coord


def _cubic_weights(t: Array, a: float) -> list[Array]:
    """The four cubic-convolution weights of taps at offsets -1, 0, 1, 2 from floor(x), t = x - floor(x)."""

    def near(x: Array) -> Array:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: Array) -> Array:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@lowers(aten.grid_sampler_2d.default)
def grid_sampler_2d(input: Array, grid: Array, interpolation_mode: int, padding_mode: int, align_corners: bool) -> Array:  # noqa: A002
    """Bilinear (0), nearest (1) or bicubic (2) sampling. Bicubic pads each of its 16 taps (at integer
    positions) rather than the sampling point, as torch does; the taps' indices carry no gradient."""
    height, width = input.shape[-2:]
    x = _unnormalize(grid[..., 0], width, align_corners)
    y = _unnormalize(grid[..., 1], height, align_corners)
    if interpolation_mode != 2:
        x = _apply_padding(x, width, padding_mode, align_corners)
        y = _apply_padding(y, height, padding_mode, align_corners)

    def sample(image: Array, ys: Array, xs: Array) -> Array:
        inside = (ys >= 0) & (ys <= height - 1) & (xs >= 0) & (xs <= width - 1)
        values = image[:, jnp.clip(ys, 0, height - 1), jnp.clip(xs, 0, width - 1)]
        return jnp.where(inside, values, jnp.zeros_like(values))

    def tap(coord: Array, size: int) -> Array:
        return lax.stop_gradient(_apply_padding(coord, size, padding_mode, align_corners)).astype(jnp.int64)

    def per_image(image: Array, ys: Array, xs: Array) -> Array:
        if interpolation_mode == 1:
            return sample(image, jnp.round(ys).astype(jnp.int64), jnp.round(xs).astype(jnp.int64))
        x0, y0 = jnp.floor(xs), jnp.floor(ys)
        dx, dy = xs - x0, ys - y0
        if interpolation_mode == 2:
            x_weights, y_weights = _cubic_weights(dx, -0.75), _cubic_weights(dy, -0.75)
            x_taps = [tap(x0 + offset, width) for offset in range(-1, 3)]
            y_taps = [tap(y0 + offset, height) for offset in range(-1, 3)]
            rows = [sum(sample(image, y_tap, x_tap) * x_weight for x_tap, x_weight in zip(x_taps, x_weights)) for y_tap in y_taps]
            return sum(row * y_weight for row, y_weight in zip(rows, y_weights))
        x0, y0 = x0.astype(jnp.int64), y0.astype(jnp.int64)
        return (
            sample(image, y0, x0) * ((1 - dx) * (1 - dy))
            + sample(image, y0, x0 + 1) * (dx * (1 - dy))
            + sample(image, y0 + 1, x0) * ((1 - dx) * dy)
            + sample(image, y0 + 1, x0 + 1) * (dx * dy)
        )

    return jax.vmap(per_image)(input, y, x)


@lowers(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(
    grad_output: Array, input: Array, grid: Array, interpolation_mode: int, padding_mode: int, align_corners: bool, output_mask: Sequence[bool]  # noqa: A002
) -> tuple[Array | None, Array | None]:
    """The gradients of `grid_sampler_2d` (a spatial transformer's backward), by differentiating its lowering."""
    _, pullback = jax.vjp(lambda image, where: grid_sampler_2d(image, where, interpolation_mode, padding_mode, align_corners), input, grid)
    grad_input, grad_grid = pullback(grad_output)
    return (grad_input if output_mask[0] else None), (grad_grid if output_mask[1] else None)
