"""Lowerings called directly on JAX arrays and compared with torch on the CPU.

Each case runs the registered lowering under `jax.jit` the way the dispatcher does: tensors and
`Scalar` arguments are traced inputs, everything else is a compile-time constant. The result is cast
to torch's dtype (the dispatcher's job) and must match torch's shape exactly and its values within
1e-5 (these cases are small and well conditioned). No device is needed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = jax.numpy

from backend_helpers import assert_matches_cpu  # noqa: E402
from tputrace.backend.ops import activation_route, register_all, registry  # noqa: E402

aten = torch.ops.aten
register_all()

NAN, INF = math.nan, math.inf

# Ops whose Scalars decide the output shape: the dispatcher passes them as constants.
STATIC_SCALAR_OPS = {"aten::arange", "aten::linspace", "aten::logspace", "aten::randint"}


def _is_scalar_argument(argument: torch._C.Argument) -> bool:
    arg_type = argument.type
    if isinstance(arg_type, torch._C.OptionalType):
        arg_type = arg_type.getElementType()
    return isinstance(arg_type, torch._C.NumberType)


def _to_array(value: torch.Tensor) -> jax.Array:
    return jnp.asarray(value.detach().numpy())


def _to_torch(value: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(value))


def run_lowering(op: torch._ops.OpOverload, *args: Any, key: Any = None, **kwargs: Any) -> Any:
    """The lowering's result for torch-style arguments, as torch tensors (lists/tuples kept)."""
    lowering = registry.LOWERINGS[op]
    static = op._schema.name in STATIC_SCALAR_OPS
    scalar_names = set() if static else {a.name for a in op._schema.arguments if _is_scalar_argument(a)}
    positional_names = [a.name for a in op._schema.arguments if not a.kwarg_only]
    dynamic: list[Any] = []

    def template(value: Any, is_scalar: bool) -> Any:
        if isinstance(value, torch.Tensor):
            dynamic.append(_to_array(value))
            return ("slot", len(dynamic) - 1)
        if is_scalar and isinstance(value, (int, float, bool)):
            dynamic.append(value)
            return ("slot", len(dynamic) - 1)
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return [template(v, False) for v in value]
        return ("const", value)

    arg_templates = [template(a, i < len(positional_names) and positional_names[i] in scalar_names) for i, a in enumerate(args)]
    kwarg_templates = {k: template(v, k in scalar_names) for k, v in kwargs.items()}

    def rebuild(t: Any, values: tuple) -> Any:
        if isinstance(t, list):
            return [rebuild(item, values) for item in t]
        kind, payload = t
        return values[payload] if kind == "slot" else payload

    def function(*values: Any) -> Any:
        call_kwargs = {k: rebuild(t, values) for k, t in kwarg_templates.items()}
        if lowering.needs_key:
            call_kwargs["key"] = jax.random.key(0) if key is None else key
        return lowering.fn(*[rebuild(t, values) for t in arg_templates], **call_kwargs)

    result = jax.jit(function)(*dynamic)
    if isinstance(result, (list, tuple)):
        return type(result)(None if r is None else _to_torch(r) for r in result)
    return _to_torch(result)


def check(op: torch._ops.OpOverload, *args: Any, atol: float = 1e-5, outputs: int | None = None, **kwargs: Any) -> None:
    """The lowering agrees with torch's CPU kernel: same shapes, values within atol (NaN equal).

    `outputs` limits the comparison to the first outputs (for ops whose CPU kernel returns empty
    placeholders where the meta kernel, which the dispatcher follows, gives real shapes)."""
    expected = op(*args, **kwargs)
    actual = run_lowering(op, *args, **kwargs)
    expected_list = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    actual_list = list(actual) if isinstance(actual, (list, tuple)) else [actual]
    if outputs is not None:
        expected_list, actual_list = expected_list[:outputs], actual_list[:outputs]
    assert len(actual_list) == len(expected_list), f"{op}: {len(actual_list)} outputs, torch has {len(expected_list)}"
    for got, want in zip(actual_list, expected_list):
        if want is None:
            continue
        assert tuple(got.shape) == tuple(want.shape), f"{op}: shape {tuple(got.shape)} != torch {tuple(want.shape)}"
        assert_matches_cpu(got.to(want.dtype), want, atol=atol, rtol=1e-5, what=f"{op} output")


def t(*values: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


FLOATS = t(-7.5, -3.0, -0.5, -0.0, 0.0, 0.5, 2.0, 3.0, 7.25, NAN, INF, -INF)
INTS = t(-7, -3, -1, 0, 1, 2, 3, 7, dtype=torch.int64)


# --- arithmetic semantics ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_div_rounding_modes(mode: str | None, dtype: torch.dtype) -> None:
    a = t(-7, -6, -1, 0, 1, 5, 7, 9, dtype=dtype)
    b = t(2, -4, 3, -3, -2, 5, -7, 4, dtype=dtype)
    check(aten.div.Tensor_mode, a, b, rounding_mode=mode)
    check(aten.div.Scalar_mode, a, -3, rounding_mode=mode)


def test_float_floor_division_edge_cases() -> None:
    a = t(5.0, -5.0, 0.0, -0.0, 1.0, -1.0, NAN, INF)
    b = t(0.0, 0.0, -3.0, 3.0, INF, INF, 2.0, 2.0)
    check(aten.div.Tensor_mode, a, b, rounding_mode="floor")
    check(aten.floor_divide.default, a, b)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.float32])
def test_remainder_follows_divisor_and_fmod_follows_dividend(dtype: torch.dtype) -> None:
    a = t(-7, -6, -1, 0, 1, 5, 7, 9, dtype=dtype)
    b = t(2, -4, 3, -3, -2, 5, -7, 4, dtype=dtype)
    check(aten.remainder.Tensor, a, b)
    check(aten.fmod.Tensor, a, b)
    check(aten.remainder.Scalar, a, -3)
    check(aten.fmod.Scalar, a, -3)
    check(aten.remainder.Scalar_Tensor, 5, b)


def test_integer_overflow_wraps() -> None:
    big = t(120, 127, -128, dtype=torch.int8)
    check(aten.add.Tensor, big, t(10, 1, -1, dtype=torch.int8))
    check(aten.mul.Tensor, t(2**30, 3, dtype=torch.int32), t(4, 2**30, dtype=torch.int32))
    check(aten.neg.default, t(-128, 5, dtype=torch.int8))
    check(aten.sum.dim_IntList, t([100, 100], [27, 1], dtype=torch.int8), [0])


def test_alpha_and_scalar_variants() -> None:
    a, b = torch.randn(3, 4), torch.randn(4)
    check(aten.add.Tensor, a, b, alpha=2.5)
    check(aten.sub.Tensor, a, b, alpha=-3)
    check(aten.add.Scalar, a, 3, alpha=2)
    check(aten.rsub.Scalar, a, 2.0)
    check(aten.add.Tensor, INTS, 2.5)
    check(aten.mul.Tensor, INTS, torch.tensor(0.5))


def test_bool_arithmetic_and_logic() -> None:
    p, q = t(True, True, False, False), t(True, False, True, False)
    check(aten.add.Tensor, p, q)
    check(aten.mul.Tensor, p, q)
    for op in (aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default):
        check(op, FLOATS, FLOATS.flip(0))
    check(aten.logical_not.default, FLOATS)
    check(aten.bitwise_and.Tensor, p, q)
    check(aten.bitwise_xor.Scalar, INTS, 5)
    check(aten.bitwise_not.default, p)
    check(aten.bitwise_not.default, INTS)


def test_shifts_out_of_range() -> None:
    a = t(5, -5, 1, -1, dtype=torch.int8)
    check(aten.bitwise_left_shift.Tensor, a, t(1, 2, 9, 7, dtype=torch.int8))
    check(aten.bitwise_right_shift.Tensor, a, t(1, 9, 2, 8, dtype=torch.int8))


def test_integer_and_float_pow() -> None:
    check(aten.pow.Tensor_Tensor, t(2, -1, 1, 0, 3, -2), t(-1, -3, -2, 2, 3, 5))
    check(aten.pow.Tensor_Scalar, t(2, -3, 5, dtype=torch.int32), 3)
    check(aten.pow.Tensor_Scalar, FLOATS, 2)
    check(aten.pow.Tensor_Scalar, FLOATS.abs(), 0.5)
    check(aten.pow.Scalar, 2, t(0.5, -1.0, 3.0))
    check(aten.pow.Tensor_Tensor, FLOATS, t(0.0).expand(12))


def test_clamp_variants() -> None:
    x = FLOATS
    check(aten.clamp.default, x, -1.0, None)
    check(aten.clamp.default, x, None, 2)
    check(aten.clamp.default, x, 3.0, -1.0)
    check(aten.clamp.Tensor, x, t(0.0), None)
    check(aten.clamp_min.default, INTS, 0)
    check(aten.clamp.default, INTS, 0.5, 2.5)


@pytest.mark.parametrize(
    "op",
    [aten.sign.default, aten.abs.default, aten.floor.default, aten.ceil.default, aten.round.default, aten.trunc.default,
     aten.frac.default, aten.exp.default, aten.log1p.default, aten.sigmoid.default, aten.tanh.default, aten.erf.default,
     aten.angle.default, aten.signbit.default, aten.isnan.default, aten.isinf.default, aten.reciprocal.default],
)
def test_unary_edge_values(op: torch._ops.OpOverload) -> None:
    check(op, FLOATS)


def test_unary_on_integers() -> None:
    for op in (aten.sqrt.default, aten.sin.default, aten.floor.default, aten.abs.default, aten.sign.default, aten.round.default):
        check(op, INTS)
    check(aten.round.decimals, t(1.2345, -2.5551, 1234.5), decimals=2)
    check(aten.round.decimals, t(1234.5, -2555.1), decimals=-2)


def test_special_functions() -> None:
    x = t(-8.4784, -2.5, -0.5, 0.0, 0.3, 1.0, 4.5)
    check(aten.digamma.default, x, atol=1e-4)
    check(aten.lgamma.default, x, atol=1e-4)
    for n in (1, 2, 3):
        torch.testing.assert_close(run_lowering(aten.polygamma.default, n, x), torch.polygamma(n, x), rtol=1e-4, atol=1e-3)
    check(aten.xlogy.Tensor, t(0.0, 0.0, 2.0, 1.0), t(0.0, NAN, 3.0, 0.0))
    check(aten.erfinv.default, t(-0.9, 0.0, 0.5, 1.0))


def test_comparisons_with_mixed_types() -> None:
    check(aten.lt.Scalar, INTS, 0.5)
    check(aten.eq.Tensor, FLOATS, FLOATS)
    check(aten.ge.Tensor, INTS, t(0.5))
    check(aten.maximum.default, FLOATS, FLOATS.flip(0))
    check(aten.fmax.default, FLOATS, FLOATS.flip(0))
    check(aten.where.self, FLOATS > 0, FLOATS, t(-1.0))


def test_lerp_addcdiv_masked_fill() -> None:
    a, b, w = torch.randn(5), torch.randn(5), t(0.0, 0.3, 0.5, 0.9, 1.5)
    check(aten.lerp.Tensor, a, b, w)
    check(aten.lerp.Scalar, a, b, 0.75)
    check(aten.addcdiv.default, a, b, w + 1, value=-0.5)
    check(aten.addcmul.default, a, b, w, value=2)
    check(aten.masked_fill.Scalar, INTS, INTS > 0, 2.7)
    check(aten.masked_fill.Tensor, a, a > 0, torch.tensor(NAN))


# --- reductions -------------------------------------------------------------------------------------


X = torch.randn(3, 4, 5)


@pytest.mark.parametrize(("dim", "keepdim"), [(None, False), ([], True), ([0], False), ([-1], True), ([0, 2], True), ([-3, -1], False)])
def test_sum_mean_over_dims(dim: list[int] | None, keepdim: bool) -> None:
    check(aten.sum.dim_IntList, X, dim, keepdim)
    check(aten.mean.dim, X, dim, keepdim)
    check(aten.amax.default, X, dim if dim is not None else [], keepdim)


def test_reductions_over_empty_and_integer_inputs() -> None:
    empty = torch.zeros(0, 3)
    check(aten.sum.dim_IntList, empty, [0])
    check(aten.mean.dim, empty, [0])
    check(aten.prod.dim_int, empty, 0)
    check(aten.sum.default, t(True, True, False))
    check(aten.sum.dim_IntList, INTS.to(torch.int32), [0])
    check(aten.prod.default, INTS[4:])
    check(aten.sum.dim_IntList, X, [1], dtype=torch.float64)
    check(aten.any.dims, X > 1, [0, 2])
    check(aten.all.dim, X > -3, -1, True)
    check(aten.count_nonzero.dim_IntList, (X > 0).float(), [0, 1])


@pytest.mark.parametrize("correction", [None, 0, 2, 100])
def test_var_std_correction(correction: int | None) -> None:
    check(aten.var.correction, X, [1], correction=correction)
    check(aten.std.correction, X, None, correction=correction, keepdim=True)
    check(aten.var_mean.correction, X, [0, 2], correction=correction)


def test_max_min_with_nan_and_argmax_shapes() -> None:
    x = t([1.0, NAN, 3.0, NAN], [2.0, 2.0, -1.0, 0.0])
    check(aten.max.dim, x, 1)
    check(aten.min.dim, x, 0, True)
    check(aten.amax.default, x, [1])
    check(aten.argmax.default, X, None, True)
    check(aten.argmin.default, X, -2)
    check(aten.max.dim, t(5.0), 0)
    check(aten.aminmax.default, X, dim=1)


def test_norms() -> None:
    for order in (2, 1, 0, 3.5, INF, -INF, -1):
        check(aten.linalg_vector_norm.default, X, order, [1, 2], atol=1e-4)
    check(aten.linalg_vector_norm.default, X)
    check(aten.norm.ScalarOpt_dim, X, 2, [0], True)


def test_scans() -> None:
    check(aten.cumsum.default, X, -1)
    check(aten.cumsum.default, t(3.0), 0)
    check(aten.cumsum.default, INTS.to(torch.int8), 0)
    check(aten.cumprod.default, X[:, :2], 1)
    check(aten.logcumsumexp.default, X, 0)
    ties = t(1.0, 3.0, 3.0, NAN, 2.0, NAN, 5.0)
    check(aten.cummax.default, ties, 0)
    check(aten.cummin.default, t(3, 1, 1, 4, 0, 0, dtype=torch.int64), 0)


def test_logsumexp_with_infinities() -> None:
    check(aten.logsumexp.default, t([-INF, -INF], [1.0, INF], [0.0, 1.0]), [1])


# --- sorting ----------------------------------------------------------------------------------------


def test_sort_is_stable_and_orders_nan_last() -> None:
    x = t(3.0, NAN, 1.0, 3.0, -0.0, 0.0, 1.0, NAN, -INF)
    check(aten.sort.stable, x, stable=True)
    check(aten.sort.stable, x, stable=True, descending=True)
    check(aten.sort.default, X, 1, True)


def test_topk_kthvalue_median() -> None:
    check(aten.topk.default, X, 2, 1)
    check(aten.topk.default, X, 3, -1, False)
    check(aten.kthvalue.default, X, 2, 0, True)
    check(aten.median.dim, X, 2)
    check(aten.median.default, t(1.0, NAN, 2.0))
    check(aten.nanmedian.dim, t([1.0, NAN, 2.0, 5.0], [NAN, 3.0, NAN, 4.0]), 1)
    check(aten.searchsorted.Tensor, t(1.0, 2.0, 2.0, 5.0), t(0.0, 2.0, 3.0, 9.0), right=True)


# --- views (dtype-agnostic) and shape ops -----------------------------------------------------------


VIEW_CASES: list[tuple[torch._ops.OpOverload, tuple, dict]] = [
    (aten.view.default, ([4, -1],), {}),
    (aten.transpose.int, (0, -1), {}),
    (aten.permute.default, ([2, 0, 1],), {}),
    (aten.expand.default, ([2, 3, -1, 5],), {}),
    (aten.slice.Tensor, (1, -3, 100, 2), {}),
    (aten.slice.Tensor, (2, None, -10), {}),
    (aten.select.int, (1, -1), {}),
    (aten.squeeze.dims, ([0, 1],), {}),
    (aten.unsqueeze.default, (-1,), {}),
    (aten.as_strided.default, ([2, 2], [1, 3], 2), {}),
    (aten.diagonal.default, (1, 1, 2), {}),
    (aten.diagonal.default, (7, 0, 1), {}),
    (aten.unfold.default, (2, 2, 2), {}),
    (aten.split.Tensor, (2, 1), {}),
    (aten.split_with_sizes.default, ([1, 0, 3], 1), {}),
    (aten.unbind.int, (-1,), {}),
    (aten.t.default, (), {}),
]


@pytest.mark.parametrize("dtype", [torch.int64])
@pytest.mark.parametrize(("op", "args", "kwargs"), VIEW_CASES, ids=[str(c[0]) + str(c[1]) for c in VIEW_CASES])
def test_views_are_dtype_agnostic(op: torch._ops.OpOverload, args: tuple, kwargs: dict, dtype: torch.dtype) -> None:
    base = torch.arange(60).reshape(3, 4, 5).to(dtype)
    if op is aten.t.default:
        base = base[0]
    check(op, base, *args, **kwargs)


def test_dtype_reinterpreting_views() -> None:
    x = torch.randn(3, 4)
    check(aten.view.dtype, x, torch.int32)
    check(aten.view.dtype, x, torch.uint8)
    check(aten.view.dtype, torch.arange(8, dtype=torch.int16).reshape(2, 4), torch.float32)
    check(aten.view_as_real.default, torch.randn(3, dtype=torch.complex64))
    check(aten.view_as_complex.default, torch.randn(3, 2))


def test_cat_skips_1d_empty_tensors_and_promotes() -> None:
    check(aten.cat.default, [torch.randn(2, 3), torch.zeros(0), torch.arange(3).reshape(1, 3)], 0)
    check(aten.cat.default, [torch.randn(2, 3), torch.randn(2, 1)], -1)
    check(aten.stack.default, [torch.randn(2), torch.randn(2)], -1)


def test_pad_flip_roll_repeat_triangles() -> None:
    x = torch.randn(2, 3, 4)
    check(aten.constant_pad_nd.default, x, [1, 2, -1, 1], 3.5)
    check(aten.flip.default, x, [0, -1])
    check(aten.roll.default, x, [1, -2], [0, 2])
    check(aten.roll.default, x, [5])
    check(aten.repeat.default, x, [2, 1, 1, 2])
    check(aten.triu.default, x, -1)
    check(aten.tril.default, x, 2)
    check(aten.rot90.default, x, 3, [1, 2])
    check(aten.diag_embed.default, torch.randn(2, 3), 1, 0, 2)


def test_scatters_through_views() -> None:
    x = torch.randn(4, 5)
    check(aten.slice_scatter.default, x, torch.randn(4, 2), 1, 1, 5, 2)
    check(aten.select_scatter.default, x, torch.randn(5), 0, -1)
    check(aten.diagonal_scatter.default, x, torch.randn(4), 1)
    check(aten.as_strided_scatter.default, x, torch.randn(2, 2), [2, 2], [5, 1], 1)
    check(aten.unfold_backward.default, torch.randn(4, 3, 3), [4, 7], 1, 3, 2)


# --- indexing ---------------------------------------------------------------------------------------


def test_advanced_indexing() -> None:
    x = torch.randn(4, 5, 6)
    i, j = t(0, -1, 2), t([1], [3], [-4])
    check(aten.index.Tensor, x, [i])
    check(aten.index.Tensor, x, [None, i])
    check(aten.index.Tensor, x, [i, None, t(0, 1, 2)])
    check(aten.index.Tensor, x, [j, i])
    check(aten.index_put.default, x, [i, None, t(1, 1, 1)], torch.randn(3, 5))
    check(aten.index_put.default, torch.zeros(5), [t(0, 0, 3)], t(1.0, 2.0, 3.0), True)
    check(aten.index_put.default, x, [x[:, :, 0] > 0], t(7.0))
    check(aten.index_put.default, torch.zeros(3, 2), [t(True, False, True)], torch.randn(2, 2), True)
    check(aten.index_select.default, x, -1, t(5, 0, 0))


def test_gather_and_scatters() -> None:
    x = torch.randn(4, 5)
    index = torch.tensor([[0, 1, 3], [3, 2, 0]])
    check(aten.gather.default, x, 1, index)
    check(aten.gather.default, x, 0, index)
    src = torch.randn(2, 4)
    check(aten.scatter.src, x, 1, index, src)
    check(aten.scatter.value, x, 0, index, 2.5)
    check(aten.scatter_add.default, x, 1, torch.tensor([[0, 0, 4], [1, 1, 1]]), src)
    for reduce, include_self in (("sum", False), ("prod", True), ("mean", False), ("mean", True), ("amax", False), ("amin", True)):
        check(aten.scatter_reduce.two, x, 1, torch.tensor([[0, 0, 4], [1, 1, 1]]), src, reduce, include_self=include_self)
    check(aten.scatter_reduce.two, INTS.reshape(2, 4), 1, torch.tensor([[0, 0], [1, 1]]), t([3, 4], [5, 7]), "mean", include_self=True)
    check(aten.index_add.default, x, 0, t(0, 0, 2), torch.randn(3, 5), alpha=2)
    check(aten.index_copy.default, x, 1, t(4, 0), torch.randn(4, 2))
    check(aten.index_fill.int_Scalar, x, 1, t(4, 0), -1.5)
    check(aten.index_reduce.default, x, 0, t(0, 0, 2), torch.randn(3, 5), "amax", include_self=False)
    check(aten.masked_scatter.default, x, x > 0, torch.arange(20.0))
    check(aten.take.default, x, t([0, -1], [7, 19]))
    check(aten.put.default, x, t(0, 0, 19), t(1.0, 2.0, 3.0), True)


def test_embedding_forward_and_backward() -> None:
    weight, indices = torch.randn(6, 3), t([0, 2, 2], [5, 1, 2])
    check(aten.embedding.default, weight, indices)
    grad = torch.randn(2, 3, 3)
    check(aten.embedding_dense_backward.default, grad, indices, 6, 2, False)
    check(aten.embedding_dense_backward.default, grad, indices, 6, -1, True)


# --- factories and random ---------------------------------------------------------------------------


def test_factories() -> None:
    check(aten.full.default, [2, 3], 1.5)
    check(aten.full.default, [2], 7, dtype=torch.int32)
    check(aten.arange.start_step, 1, 2.5, 0.3)
    check(aten.arange.start_step, 10, -3, -4)
    check(aten.linspace.default, -1, 1, 7)
    check(aten.linspace.default, 0, 10, 4, dtype=torch.int64)
    check(aten.logspace.default, 0, 3, 4, 2.0)
    check(aten.eye.m, 3, 5)
    check(aten.tril_indices.default, 4, 3, 1)
    check(aten.triu_indices.default, 3, 5, -1)
    check(aten.scalar_tensor.default, 2.5)
    check(aten.zeros_like.default, INTS)
    check(aten.new_full.default, INTS, [2, 2], 3)


def test_random_ops_shapes_and_statistics() -> None:
    key = jax.random.key(7)
    uniform = run_lowering(aten.rand.default, [20000], key=key)
    assert uniform.shape == (20000,) and 0.0 <= float(uniform.min()) and float(uniform.max()) < 1.0
    assert abs(float(uniform.mean()) - 0.5) < 0.02
    normal = run_lowering(aten.normal.Tensor_Tensor, torch.full((20000,), 3.0), torch.full((20000,), 2.0), key=key)
    assert abs(float(normal.mean()) - 3.0) < 0.1 and abs(float(normal.std()) - 2.0) < 0.1
    ints = run_lowering(aten.randint.low, -3, 4, [1000], key=key)
    assert int(ints.min()) == -3 and int(ints.max()) == 3
    perm = run_lowering(aten.randperm.default, 50, key=key)
    assert sorted(perm.tolist()) == list(range(50))
    out, mask = run_lowering(aten.native_dropout.default, torch.ones(10000), 0.25, True, key=key)
    assert abs(float(mask.float().mean()) - 0.75) < 0.03
    torch.testing.assert_close(out[mask.bool()], torch.full((int(mask.sum()),), 1 / 0.75))
    draws = run_lowering(aten.multinomial.default, t([0.0, 1.0, 0.0], [0.5, 0.0, 0.5]), 2, False, key=key)
    assert draws[0, 0] == 1 and set(draws[1].tolist()) == {0, 2}
    first = run_lowering(aten.rand.default, [4], key=jax.random.key(1))
    second = run_lowering(aten.rand.default, [4], key=jax.random.key(2))
    assert not torch.equal(first, second)


# --- nn -----------------------------------------------------------------------------------------


def test_softmax_family() -> None:
    x = torch.randn(3, 5)
    x[0] = -INF
    check(aten._softmax.default, x, 1, False)
    check(aten._log_softmax.default, X, 0, False)
    check(aten._safe_softmax.default, x, 1)
    y, g = torch.softmax(X, -1), torch.randn(3, 4, 5)
    check(aten._softmax_backward_data.default, g, y, -1, torch.float32)
    check(aten._log_softmax_backward_data.default, g, y.log(), -1, torch.float32)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_forward_backward(reduction: int) -> None:
    scores = torch.randn(6, 4).log_softmax(1)
    target = t(0, 3, -100, 2, 2, 1)
    weight = t(1.0, 0.5, 2.0, 0.0)
    out, total = aten.nll_loss_forward.default(scores, target, weight, reduction, -100)
    check(aten.nll_loss_forward.default, scores, target, weight, reduction, -100)
    check(aten.nll_loss_backward.default, torch.ones_like(out), scores, target, weight, reduction, -100, total)
    images, labels = torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
    check(aten.nll_loss2d_forward.default, images, labels, None, reduction, 1)


def test_layer_group_batch_norm_backward_match_autograd() -> None:
    x = torch.randn(4, 6, 5, requires_grad=True)
    w, b = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    out, mean, rstd = aten.native_layer_norm.default(x, [5], w, b, 1e-5)
    check(aten.native_layer_norm.default, x.detach(), [5], w.detach(), b.detach(), 1e-5)
    grad = torch.randn_like(out)
    check(aten.native_layer_norm_backward.default, grad, x.detach(), [5], mean, rstd, w.detach(), b.detach(), [True, True, True], atol=1e-4)
    images = torch.randn(2, 6, 3, 3)
    gw, gb = torch.randn(6), torch.randn(6)
    out, mean, rstd = aten.native_group_norm.default(images, gw, gb, 2, 6, 9, 3, 1e-5)
    check(aten.native_group_norm.default, images, gw, gb, 2, 6, 9, 3, 1e-5)
    check(aten.native_group_norm_backward.default, torch.randn_like(out), images, mean, rstd, gw, 2, 6, 9, 3, [True, True, True], atol=1e-4)
    rm, rv = torch.randn(6), torch.rand(6) + 0.5
    check(aten._native_batch_norm_legit_functional.default, images, gw, gb, rm, rv, True, 0.1, 1e-5)
    check(aten._native_batch_norm_legit_no_training.default, images, gw, gb, rm, rv, 0.1, 1e-5, outputs=1)
    out, mean, invstd = aten._native_batch_norm_legit.no_stats(images, gw, gb, True, 0.1, 1e-5)
    check(aten.native_batch_norm_backward.default, torch.randn_like(out), images, gw, rm, rv, mean, invstd, True, 1e-5, [True, True, True], atol=1e-4)


@pytest.mark.parametrize(
    ("transposed", "stride", "padding", "dilation", "groups", "output_padding"),
    [(False, [1, 1], [0, 0], [1, 1], 1, [0, 0]), (False, [2, 1], [1, 2], [1, 2], 2, [0, 0]),
     (True, [2, 2], [1, 0], [1, 1], 2, [1, 0]), (True, [1, 2], [0, 1], [2, 1], 1, [0, 1])],
)
def test_convolution_and_backward(transposed: bool, stride: list, padding: list, dilation: list, groups: int, output_padding: list) -> None:
    x = torch.randn(2, 4, 7, 6)
    weight = torch.randn(4, 6 // groups, 3, 2) if transposed else torch.randn(6, 4 // groups, 3, 2)
    bias = torch.randn(6)
    args = (stride, padding, dilation, transposed, output_padding, groups)
    check(aten.convolution.default, x, weight, bias, *args, atol=1e-4)
    out = aten.convolution.default(x, weight, bias, *args)
    check(aten.convolution_backward.default, torch.randn_like(out), x, weight, [6], *args, [True, True, True], atol=1e-4)


def test_conv1d_and_conv3d() -> None:
    check(aten.convolution.default, torch.randn(2, 3, 9), torch.randn(4, 3, 3), None, [2], [1], [1], False, [0], 1, atol=1e-4)
    check(aten.convolution.default, torch.randn(1, 2, 4, 5, 3), torch.randn(3, 2, 2, 2, 2), None, [1, 1, 1], [0, 1, 0], [1, 1, 1], False, [0, 0, 0], 1, atol=1e-4)


def test_pooling() -> None:
    x = torch.randn(2, 3, 7, 6)
    check(aten.max_pool2d_with_indices.default, x, [3, 2], [2, 2], [1, 1], [1, 2], True)
    out, indices = aten.max_pool2d_with_indices.default(x, [2, 2])
    check(aten.max_pool2d_with_indices_backward.default, torch.randn_like(out), x, [2, 2], [2, 2], [0, 0], [1, 1], False, indices)
    check(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1], True, False)
    check(aten.avg_pool2d.default, x, [3, 2], [2, 1], [1, 0], True, True)
    check(aten.avg_pool2d.default, x, [2, 2], [], [0, 0], False, True, 3)
    out = aten.avg_pool2d.default(x, [3, 3], [2, 2], [1, 1], True, False)
    check(aten.avg_pool2d_backward.default, torch.randn_like(out), x, [3, 3], [2, 2], [1, 1], True, False, None)
    check(aten._adaptive_avg_pool2d.default, x, [3, 4])
    check(aten.adaptive_max_pool2d.default, x, [4, 5])
    check(aten.max_pool3d_with_indices.default, torch.randn(1, 2, 5, 4, 4), [2, 2, 2], [2, 1, 2])


# (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override). The wide
# cases have padded axes of length 1 in arrays big enough for XLA:CPU to hand a padded reduce-window
# to YNNPACK, which broadcasts such an axis into its padding (sums came back k*k times too large).
AVG_POOL_CASES = [
    ((2, 3, 7, 6), [3, 2], [2, 3], [1, 1], False, True, None),
    ((2, 3, 5, 1), [4, 1], [2, 3], [2, 0], True, False, None),
    ((2, 3, 1, 5), [2, 4], [3, 2], [1, 1], False, False, 3),
    ((2, 3, 2, 3), [3, 3], [1, 3], [1, 1], True, True, None),
    ((2, 4096, 1, 5), [1, 1], [3, 2], [0, 0], True, True, None),
    ((2, 4096, 1, 1), [4, 4], [4, 4], [0, 0], True, True, None),
    ((2, 2560, 1, 1), [2560, 2560], [2560, 2560], [0, 0], True, True, None),
    ((2, 4096, 7, 7), [7, 7], [7, 7], [0, 0], False, True, None),
    ((1, 2, 5, 3, 4), [3, 2, 2], [2, 1, 3], [1, 1, 0], True, False, None),
    ((2, 1024, 1, 2, 1), [1, 2, 1], [2, 2, 2], [0, 1, 0], True, True, None),
]


@pytest.mark.parametrize("case", AVG_POOL_CASES, ids=lambda case: "x".join(map(str, case[0])) + f"-k{case[1][0]}")
def test_avg_pool_matches_torch(case: tuple) -> None:
    shape, *args = case
    rank = len(shape) - 2
    forward = aten.avg_pool2d.default if rank == 2 else aten.avg_pool3d.default
    backward = aten.avg_pool2d_backward.default if rank == 2 else aten.avg_pool3d_backward.default
    x = torch.randn(*shape)
    check(forward, x, *args, atol=1e-4)
    check(backward, torch.randn_like(forward(x, *args)), x, *args, atol=1e-4)
    if rank == 2:
        check(forward, x.half(), *args, atol=1e-2)


def test_wide_avg_pool_needs_no_window_copies() -> None:
    """EfficientNet's head pool (kernel 2560, ceil_mode, on 1x1): gathering its windows made a
    125 GiB temporary in XLA's memory analysis; window sums need none."""
    x = jax.ShapeDtypeStruct((2, 2560, 1, 1), jnp.float32)
    args = ([2560, 2560], [2560, 2560], [0, 0], True, True, None)
    forward = registry.LOWERINGS[aten.avg_pool2d.default].fn
    backward = registry.LOWERINGS[aten.avg_pool2d_backward.default].fn
    programs = [jax.jit(lambda x: forward(x, *args)).lower(x), jax.jit(lambda g, x: backward(g, x, *args)).lower(x, x)]
    for program in programs:
        assert program.compile().memory_analysis().temp_size_in_bytes < 2**20


# Final pools over a whole feature map: (input shape, output shape, forward op, its backward, forward's
# arguments after the input). The backward takes (grad_output, input, *arguments) for avg_pool2d and
# (grad_output, input) for the adaptive pool.
FINAL_POOLS = [
    ((8, 1280, 7, 7), (8, 1280, 1, 1), aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default, ([1, 1],), ()),
    ((8, 32, 112, 112), (8, 32, 1, 1), aten.avg_pool2d.default, aten.avg_pool2d_backward.default, ([112, 112], [112, 112], [0, 0], False, True, None), ([112, 112], [112, 112], [0, 0], False, True, None)),
    ((8, 1280, 7, 7), (8, 1280, 1, 1), aten.avg_pool2d.default, aten.avg_pool2d_backward.default, ([7, 7], [], [0, 0], True, False, None), ([7, 7], [7, 7], [0, 0], True, False, None)),
]


@pytest.mark.parametrize("case", FINAL_POOLS, ids=lambda case: f"{case[2].__name__}-" + "x".join(map(str, case[0])))
def test_final_pool_temporaries_stay_below_a_quarter_of_the_input(case: tuple) -> None:
    """A pool over the whole map compiles to programs whose temporaries (XLA's memory analysis) stay
    under a quarter of the input's bytes in both directions: no copy of the windows, nor of the input."""
    in_shape, out_shape, forward_op, backward_op, forward_args, backward_args = case
    x, grad = jax.ShapeDtypeStruct(in_shape, jnp.float32), jax.ShapeDtypeStruct(out_shape, jnp.float32)
    forward, backward = registry.LOWERINGS[forward_op].fn, registry.LOWERINGS[backward_op].fn
    programs = [jax.jit(lambda x: forward(x, *forward_args)).lower(x), jax.jit(lambda g, x: backward(g, x, *backward_args)).lower(grad, x)]
    input_bytes = math.prod(in_shape) * 4
    for program in programs:
        assert program.compile().memory_analysis().temp_size_in_bytes < input_bytes // 4
    sample = torch.randn(in_shape[0], 2, *in_shape[2:])
    check(forward_op, sample, *forward_args, atol=1e-4)
    check(backward_op, torch.randn(in_shape[0], 2, *out_shape[2:]), sample, *backward_args, atol=1e-4)


def test_integer_avg_pool_divides_truncating() -> None:
    x = torch.randint(-50, 50, (2, 3, 5, 4))
    check(aten.avg_pool2d.default, x, [3, 2], [2, 2], [1, 1], True, False)
    check(aten.avg_pool2d.default, x, [2, 2], [1, 2], [0, 1], False, True, 3)


@pytest.mark.parametrize("shape, output_size", [((2, 3, 8, 6), [4, 3]), ((2, 3, 7, 6), [3, 4]), ((2, 3, 5, 5), [7, 7]), ((2, 3, 4, 6, 8), [2, 3, 4]), ((2, 3, 5, 6, 7), [2, 3, 3])])
def test_adaptive_avg_pool_uniform_and_uneven_windows(shape: tuple, output_size: list) -> None:
    forward = aten._adaptive_avg_pool2d.default if len(output_size) == 2 else aten._adaptive_avg_pool3d.default
    backward = aten._adaptive_avg_pool2d_backward.default if len(output_size) == 2 else aten._adaptive_avg_pool3d_backward.default
    x = torch.randn(*shape)
    check(forward, x, output_size)
    check(forward, x.half(), output_size, atol=1e-2)
    check(backward, torch.randn_like(forward(x, output_size)), x)


def test_upsampling_and_padding() -> None:
    x = torch.randn(1, 2, 5, 4)
    check(aten.upsample_nearest2d.default, x, [7, 9])
    check(aten.upsample_nearest2d.default, x, [15, 6], 3.0, 1.5)
    check(aten._upsample_nearest_exact2d.default, x, [7, 3])
    for align in (False, True):
        check(aten.upsample_bilinear2d.default, x, [8, 7], align)
        check(aten.upsample_bicubic2d.default, x, [9, 6], align, atol=1e-4)
    check(aten.upsample_bilinear2d_backward.default, torch.randn(1, 2, 8, 7), [8, 7], [1, 2, 5, 4], False)
    check(aten.reflection_pad2d.default, x, [2, 1, 3, 0])
    check(aten.replication_pad2d.default, x, [2, -1, 3, 0])
    check(aten.reflection_pad1d_backward.default, torch.randn(1, 2, 7), torch.randn(1, 2, 4), [2, 1])


def test_activation_backwards() -> None:
    x, g = torch.randn(20) * 4, torch.randn(20)
    check(aten.gelu.default, x, approximate="tanh")
    check(aten.gelu_backward.default, g, x)
    check(aten.gelu_backward.default, g, x, approximate="tanh")
    check(aten.threshold_backward.default, g, x, 0.5)
    check(aten.hardtanh_backward.default, g, x, -1.0, 2.0)
    check(aten.leaky_relu_backward.default, g, x, 0.2, False)
    check(aten.elu_backward.default, g, 1.5, 1.0, 1.0, False, x)
    check(aten.softplus_backward.default, g, x, 2.0, 5.0)
    check(aten.hardswish_backward.default, g, x)


def test_attention_matches_math() -> None:
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    mask = torch.randn(5, 7) > 0
    mask[:, 0] = True
    check(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, 0.0, True, atol=1e-5)
    additive = torch.zeros(5, 7).masked_fill(~mask, -INF)
    check(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, attn_mask=additive, scale=0.3, atol=1e-5)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    actual = run_lowering(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, attn_mask=mask, scale=0.3)[0]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_attention_backward_rebuilds_the_probabilities_in_one_program() -> None:
    """Forward and backward in one program (as DeferAndFuse compiles them): the backward rebuilds the
    probabilities from the logsumexp after the gradient exists (its own exp and scores matmul, 2 + 5
    matmuls), so XLA keeps no softmax from the forward to the backward, and gives torch's gradients."""
    q, k, v = (torch.randn(2, 3, 6, 8, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(2, 3, 6, 8)
    forward = registry.lowering_for(aten._scaled_dot_product_flash_attention_for_cpu.default).fn
    backward = registry.lowering_for(aten._scaled_dot_product_flash_attention_for_cpu_backward.default).fn

    def step(q: jax.Array, k: jax.Array, v: jax.Array, grad: jax.Array) -> tuple[jax.Array, ...]:
        out, logsumexp = forward(q, k, v, 0.0, True)
        return backward(grad, q, k, v, out, logsumexp, 0.0, True)

    arrays = [_to_array(value) for value in (q, k, v, grad_out)]
    compiled = jax.jit(step).lower(*arrays).compile()
    hlo_text = compiled.as_text()
    assert (hlo_text.count(" exponential("), hlo_text.count(" dot(")) == (2, 7)
    expected = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad_out)
    for actual, wanted in zip(compiled(*arrays), expected, strict=True):
        torch.testing.assert_close(torch.from_numpy(np.array(actual)), wanted, atol=1e-5, rtol=1e-5)


# --- linalg and foreach -------------------------------------------------------------------------


def test_matrix_products() -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    nan_self = torch.full((3, 5), NAN)
    check(aten.addmm.default, nan_self, a, b, beta=0, alpha=2)
    check(aten.addmm.default, torch.randn(5), a, b, beta=0.5, alpha=-1, atol=1e-4)
    check(aten.baddbmm.default, torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5), beta=2, atol=1e-4)
    check(aten.mm.default, INTS.reshape(2, 4), INTS.reshape(4, 2))
    check(aten.addr.default, t(True, False), t(True, False), t(False, True))


def test_solvers() -> None:
    a = torch.randn(2, 3, 3) + 3 * torch.eye(3)
    check(aten._linalg_solve_ex.default, a, torch.randn(2, 3), atol=1e-4)
    check(aten._linalg_solve_ex.default, a, torch.randn(2, 4, 3), left=False, atol=1e-4)
    check(aten.linalg_inv_ex.default, a, atol=1e-4)
    spd = a @ a.mT
    check(aten.linalg_cholesky_ex.default, spd, upper=True, atol=1e-4)
    det, lu, pivots = run_lowering(aten._linalg_det.default, a)
    torch.testing.assert_close(det, torch.linalg.det(a), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pivots, torch.linalg.lu_factor(a).pivots)


def test_foreach_ops() -> None:
    xs, ys = [torch.randn(3), torch.randn(2, 2)], [torch.randn(3), torch.randn(2, 2)]
    check(aten._foreach_add.List, xs, ys, alpha=-2)
    check(aten._foreach_mul.Scalar, xs, 0.5)
    check(aten._foreach_div.ScalarList, xs, [2.0, -4.0])
    check(aten._foreach_addcdiv.ScalarList, xs, ys, [y.abs() + 1 for y in ys], [0.1, 0.2])
    check(aten._foreach_addcmul.Tensor, xs, ys, ys, t(0.5, 2.0))
    check(aten._foreach_lerp.Scalar, xs, ys, 0.3)
    check(aten._foreach_sqrt.default, [x.abs() for x in xs])
    check(aten._foreach_norm.Scalar, xs, 2)
    check(aten._foreach_pow.ScalarAndTensor, 2.0, xs)


# --- the registry itself --------------------------------------------------------------------------


INPLACE_RANDOM = {aten.normal_.default, aten.bernoulli_.float}


def test_registry_has_no_composite_or_mutating_lowerings() -> None:
    """A CompositeImplicit op never reaches the dispatcher, so its lowering would be dead code, unless
    a route sends it below autograd."""
    composite = [
        str(op)
        for op in registry.LOWERINGS
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd") and op not in activation_route.ROUTED_OPS
    ]
    assert composite == []
    mutating = [str(op) for op in registry.LOWERINGS if op._schema.is_mutable and op not in INPLACE_RANDOM]
    assert mutating == []


def test_registering_an_overload_twice_is_an_error() -> None:
    with pytest.raises(registry.DuplicateLoweringError):
        registry.lowers(aten.add.Tensor)(lambda self, other, alpha=1: self)


def test_core_coverage_is_reported() -> None:
    core = [op for op in _all_overloads() if torch.Tag.core in op.tags]
    lowered = [op for op in core if op in registry.LOWERINGS]
    assert len(lowered) >= 150, f"only {len(lowered)} of {len(core)} core overloads lowered"


def _all_overloads() -> list[torch._ops.OpOverload]:
    overloads = []
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload_name in packet.overloads():
            overloads.append(getattr(packet, overload_name))
    return overloads


def test_fused_rnn_cells_match_autograd() -> None:
    """The fused LSTM/GRU cells (torch uses them off the CPU) against the cells written in torch ops."""
    batch, hidden = 3, 4
    input_gates, hidden_gates = torch.randn(batch, 4 * hidden), torch.randn(batch, 4 * hidden)
    cx, bias_i, bias_h = torch.randn(batch, hidden), torch.randn(4 * hidden), torch.randn(4 * hidden)
    gates = (input_gates + bias_i + hidden_gates + bias_h).requires_grad_()
    i, f, g, o = gates.chunk(4, 1)
    cy = f.sigmoid() * cx + i.sigmoid() * g.tanh()
    hy = o.sigmoid() * cy.tanh()
    hy_l, cy_l, workspace = run_lowering(aten._thnn_fused_lstm_cell.default, input_gates, hidden_gates, cx, bias_i, bias_h)
    torch.testing.assert_close((hy_l, cy_l), (hy, cy))
    grad_hy, grad_cy = torch.randn_like(hy), torch.randn_like(cy)
    expected = torch.autograd.grad((hy, cy), gates, (grad_hy, grad_cy))[0]
    grad_gates, _, grad_bias = run_lowering(aten._thnn_fused_lstm_cell_backward_impl.default, grad_hy, grad_cy, cx, cy_l, workspace, True)
    torch.testing.assert_close(grad_gates, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_bias, expected.sum(0), atol=1e-5, rtol=1e-5)

    input_gates, hidden_gates, hx = torch.randn(batch, 3 * hidden), torch.randn(batch, 3 * hidden), torch.randn(batch, hidden)
    ig, hg = input_gates.clone().requires_grad_(), hidden_gates.clone().requires_grad_()
    (ir, iz, i_n), (hr, hz, h_n) = ig.chunk(3, 1), hg.chunk(3, 1)
    reset, update = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    new = (i_n + reset * h_n).tanh()
    hy = new + update * (hx - new)
    hy_l, workspace = run_lowering(aten._thnn_fused_gru_cell.default, input_gates, hidden_gates, hx)
    torch.testing.assert_close(hy_l, hy)
    grad_hy = torch.randn_like(hy)
    expected_i, expected_h = torch.autograd.grad(hy, (ig, hg), grad_hy)
    grads = run_lowering(aten._thnn_fused_gru_cell_backward.default, grad_hy, workspace, False)
    torch.testing.assert_close(grads[0], expected_i, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], expected_h, atol=1e-5, rtol=1e-5)
