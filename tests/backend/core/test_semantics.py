"""Tensor semantics on `tpu`: dtypes, views, in-place ops, printing, saving, autograd, autocast, fallback."""

from __future__ import annotations

import copy
import io
import threading
import warnings

import pytest
import torch

from backend_helpers import eager, host
from tputrace.backend.compat.device_module import EagerMode

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_round_trip(dtype: torch.dtype) -> None:
    values = torch.arange(6).reshape(2, 3)
    cpu = values % 2 == 0 if dtype == torch.bool else values.to(dtype)
    back = host(cpu.to("tpu"))
    assert back.dtype == dtype and torch.equal(back, cpu)


def test_int64_stays_64_bit() -> None:
    big = torch.tensor([2**40, -(2**41)])
    assert host(big.to("tpu") + 1).tolist() == [2**40 + 1, -(2**41) + 1]
    assert (big.to("tpu") * 2).dtype == torch.int64


def test_python_numbers_of_equal_value_keep_their_own_type_and_sign() -> None:
    """Strict eager passes a Python number to its op's program as an array kept on the chip for the
    next call with that number: 2, 2.0 and True, 0.0 and -0.0, each NaN are told apart as torch does."""
    ints = torch.arange(-3, 3)
    floats = torch.tensor([1.0, -2.0, 0.5])
    for host_tensor in (ints, floats):
        chip_tensor = host_tensor.to("tpu")
        for number in (2, 2.0, True, 2, 0.0, -0.0, float("nan"), 0.0, 2**40, 2.0):
            for operation in (torch.mul, torch.add):
                expected = operation(host_tensor, number)
                result = host(operation(chip_tensor, number))
                assert result.dtype == expected.dtype, (operation, number)
                assert torch.equal(result.isnan(), expected.isnan()), (operation, number)
                finite = ~expected.isnan()
                assert torch.equal(result[finite], expected[finite]), (operation, number)
                assert torch.equal(result[finite].signbit(), expected[finite].signbit()), (operation, number)


ZERO_DIM_OPERANDS = {
    "uint8 > int64 -1": lambda d: torch.tensor([1, 2], dtype=torch.uint8, device=d) > torch.tensor(-1, device=d),
    "uint8 == int64 -1": lambda d: torch.tensor([255, 0], dtype=torch.uint8, device=d) == torch.tensor(-1, device=d),
    "int8 == int64 128": lambda d: torch.tensor([-128], dtype=torch.int8, device=d) == torch.tensor(128, device=d),
    "float32 == float64 0.1": lambda d: torch.tensor([0.1, 0.2], device=d) == torch.tensor(0.1, dtype=torch.float64, device=d),
    "float16 < float64 0.1": lambda d: torch.tensor([0.1], dtype=torch.float16, device=d) < torch.tensor(0.1, dtype=torch.float64, device=d),
    "maximum uint8 int64": lambda d: torch.maximum(torch.tensor([1, 2], dtype=torch.uint8, device=d), torch.tensor(-1, device=d)),
    "clamp uint8 by int64": lambda d: torch.tensor([1, 200], dtype=torch.uint8, device=d).clamp(torch.tensor(-1, device=d), torch.tensor(100, device=d)),
    "uint8 // int64 -1": lambda d: torch.tensor([4], dtype=torch.uint8, device=d) // torch.tensor(-1, device=d),
    "int == float64": lambda d: torch.tensor([1, 2], device=d) == torch.tensor(1.0, dtype=torch.float64, device=d),
    "float16 == complex scalar": lambda d: torch.tensor([1.0], dtype=torch.float16, device=d) == 1j,
}


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=lambda mode: mode.name)
@pytest.mark.parametrize("case", sorted(ZERO_DIM_OPERANDS))
def test_zero_dim_operands_promote_as_on_the_cpu(case: str, mode: EagerMode) -> None:
    """A 0-dim tensor of a wider dtype than the other operand's, in the same category, is cast to
    that operand's dtype before the op computes (torch's promotion), not the other way round."""
    call = ZERO_DIM_OPERANDS[case]
    expected = call("cpu")
    with eager(mode):
        result = host(call("tpu"))
    assert result.dtype == expected.dtype and torch.equal(result, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_floats_become_uint8_through_int64_as_on_the_cpu(dtype: torch.dtype) -> None:
    """torch casts a float to uint8 through int64 on every device, so negatives and values past 255 wrap."""
    values = torch.tensor([-1.0, -0.5, 2.7, 255.0, 256.0, 300.0, -200.0], dtype=dtype)
    expected = values.to(torch.uint8)
    assert torch.equal(host(values.to("tpu").to(torch.uint8)), expected)
    assert torch.equal(host(torch.zeros(7, dtype=torch.uint8, device="tpu").copy_(values.to("tpu"))), expected)


def test_writes_through_views_reach_the_base_and_back() -> None:
    base = torch.zeros(3, 4, device="tpu")
    row = base[1]
    row.fill_(5)
    assert host(base)[1].tolist() == [5.0] * 4
    base.add_(1)
    assert host(row).tolist() == [6.0] * 4
    base.t()[0, 2] = 9
    assert base[2, 0].item() == 9
    base.view(-1)[0] = -1
    assert base[0, 0].item() == -1
    alias = base.detach()
    alias.zero_()
    assert base.abs().sum().item() == 0
    chunk = base[:, 1:3]
    chunk.copy_(torch.ones(3, 2))
    assert host(base).sum().item() == 6


def test_in_place_and_out_variants() -> None:
    x = torch.arange(4.0, device="tpu")
    x.mul_(2).add_(1)
    assert host(x).tolist() == [1.0, 3.0, 5.0, 7.0]
    out = torch.empty(4, device="tpu")
    torch.add(x, 1, out=out)
    assert host(out).tolist() == [2.0, 4.0, 6.0, 8.0]
    integers = torch.arange(4, device="tpu")
    integers += 1
    assert integers.dtype == torch.int64 and host(integers).tolist() == [1, 2, 3, 4]


def test_print_repr_tolist_numpy_item() -> None:
    x = torch.tensor([[1.5, 2.0]], device="tpu")
    assert repr(x) == "tensor([[1.5000, 2.0000]], device='tpu:0')"
    assert repr(torch.tensor([1, 2], device="tpu", dtype=torch.int32)) == "tensor([1, 2], device='tpu:0', dtype=torch.int32)"
    assert "grad_fn=<MulBackward0>" in repr(torch.ones(1, device="tpu", requires_grad=True) * 2)
    assert x.tolist() == [[1.5, 2.0]] and x.numpy().shape == (1, 2)
    assert x.sum().item() == 3.5 and f"{x.sum():.1f}" == "3.5"
    assert bool(x.sum() > 3)


def test_factories() -> None:
    assert host(torch.zeros(2, 2, device="tpu")).sum().item() == 0
    assert host(torch.ones(3, device="tpu", dtype=torch.int32)).tolist() == [1, 1, 1]
    assert host(torch.full((2,), 7.0, device="tpu")).tolist() == [7.0, 7.0]
    assert host(torch.arange(1, 7, 2, device="tpu")).tolist() == [1, 3, 5]
    assert host(torch.linspace(0, 1, 3, device="tpu")).tolist() == [0.0, 0.5, 1.0]
    uniform = host(torch.rand(1000, device="tpu"))
    assert 0 <= uniform.min() and uniform.max() < 1 and abs(uniform.mean().item() - 0.5) < 0.05
    normal = host(torch.randn(2000, device="tpu"))
    assert abs(normal.mean().item()) < 0.1 and abs(normal.std().item() - 1) < 0.1
    integers = host(torch.randint(0, 5, (100,), device="tpu"))
    assert integers.min() >= 0 and integers.max() < 5
    filled = torch.empty(1000, device="tpu").normal_(3.0, 0.5)
    assert abs(host(filled).mean().item() - 3.0) < 0.1
    kept = host(torch.nn.functional.dropout(torch.ones(1000, device="tpu"), 0.5))
    assert set(kept.unique().tolist()) <= {0.0, 2.0} and 300 < (kept == 0).sum() < 700


@pytest.mark.parametrize("shape", [(3, 3), (4, 2, 1), (2, 5, -1), (0, 3), (5, 5, -10)], ids=str)
def test_triangle_indices_on_the_chip(shape: tuple[int, ...]) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*CPU fallback", category=RuntimeWarning)
        for factory in (torch.tril_indices, torch.triu_indices):
            on_chip = factory(*shape, device="tpu")
            assert on_chip.dtype == torch.int64 and torch.equal(host(on_chip), factory(*shape))


@pytest.mark.parametrize("length", [0, 1, 2, 7, 8])
def test_kaiser_window_matches_cpu(length: int) -> None:
    for options in ({}, {"periodic": False}, {"periodic": True, "beta": 5.0}):
        on_chip = host(torch.kaiser_window(length, device="tpu", **options))
        expected = torch.kaiser_window(length, **options)
        assert on_chip.shape == expected.shape and torch.allclose(on_chip, expected, atol=1e-6), options


def test_randperm_draws_from_the_chip_seed() -> None:
    torch.tpu.manual_seed(7)
    first = host(torch.randperm(50, device="tpu"))
    torch.tpu.manual_seed(7)
    assert torch.equal(host(torch.randperm(50, device="tpu")), first)
    assert sorted(first.tolist()) == list(range(50)) and first.dtype == torch.int64
    assert not torch.equal(host(torch.randperm(50, device="tpu")), first)


def _randperm_outcome(device: str, n: int, dtype: torch.dtype | None, out: bool) -> str:
    """The shape and dtype `randperm` gives, or the type and text of torch's error."""
    try:
        if out:
            result = torch.randperm(n, out=torch.empty(0, dtype=dtype, device=device))
        else:
            result = torch.randperm(n, dtype=dtype, device=device)
    except (RuntimeError, NotImplementedError) as error:
        return f"{type(error).__name__}: {error}"
    return f"{tuple(result.shape)} {result.dtype}"


@pytest.mark.parametrize("mode", [EagerMode.DEFER_NEVER, EagerMode.DEFER_AND_FUSE], ids=["strict", "fuse"])
@pytest.mark.parametrize("out", [False, True], ids=["dtype", "out"])
def test_randperm_refuses_what_the_cpu_refuses(mode: EagerMode, out: bool) -> None:
    """A dtype the kernel has no form for, an `n - 1` the integer dtype cannot hold and an `n` past what
    a floating dtype counts exactly raise torch's errors, where the chip computed a permutation."""
    cases = [(3, torch.complex64), (3, torch.bool), (129, torch.int8), (128, torch.int8), (257, torch.uint8),
             (2050, torch.float16), (2049, torch.float16), (300, torch.bfloat16), (2**24 + 2, torch.float32), (-1, torch.int64),
             (5, torch.int32)]
    with eager(mode):
        on_chip = [_randperm_outcome("tpu", n, dtype, out) for n, dtype in cases]
    assert on_chip == [_randperm_outcome("cpu", n, dtype, out) for n, dtype in cases]
    assert sum("Error" in outcome for outcome in on_chip) == 7


def test_save_load_deepcopy_state_dict() -> None:
    model = torch.nn.Linear(3, 2).to("tpu")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["weight"].device.type == "tpu" and torch.equal(host(loaded["weight"]), host(model.weight))
    clone = copy.deepcopy(model)
    assert clone.weight.device.type == "tpu" and torch.equal(host(clone.weight), host(model.weight))
    other = torch.nn.Linear(3, 2).to("tpu")
    other.load_state_dict(model.state_dict())
    assert torch.equal(host(other.bias), host(model.bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64], ids=str)
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_determinant_gradients_match_cpu(dtype: torch.dtype, transposed: bool) -> None:
    """torch's backward of det/slogdet reads the LU factors of Aᵀ when A is contiguous and real."""
    torch.manual_seed(0)
    base = torch.randn(2, 4, 4, dtype=dtype)
    results = []
    for device in ("cpu", "tpu"):
        matrix = base.to(device).requires_grad_()
        view = matrix.mT if transposed else matrix
        total = torch.linalg.det(view).abs().sum() + torch.linalg.slogdet(view).logabsdet.sum()
        if not dtype.is_complex:
            total = total + torch.logdet(view @ view.mT + torch.eye(4, dtype=dtype, device=device)).sum()
        (gradient,) = torch.autograd.grad(total, matrix)
        results.append(gradient.to("cpu"))
    assert torch.allclose(results[1], results[0], rtol=1e-4, atol=1e-4), (results[1] - results[0]).abs().max()


def _forward_mode(device: str) -> list[torch.Tensor]:
    import torch.autograd.forward_ad as forward_ad
    from torch.func import functional_call, hessian, jacfwd, jvp

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).to(device)
    inputs = torch.randn(5, 3).to(device)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(inputs, torch.ones_like(inputs))
        tangent = forward_ad.unpack_dual(net(dual) * 2).tangent  # an operand without tangent: a zero tangent
    _, jvp_out = jvp(net, (inputs,), (torch.ones_like(inputs),))
    jacobian = jacfwd(net)(inputs[0])
    params = dict(net.named_parameters())
    second = hessian(lambda point: functional_call(net, params, (point,)).sum())(inputs[0])
    return [value.detach().to("cpu") for value in (tangent, jvp_out, jacobian, second)]


def test_forward_mode_ad_matches_cpu() -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*CPU fallback", category=RuntimeWarning)
        result = _forward_mode("tpu")
    for got, want in zip(result, _forward_mode("cpu")):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "eq", "lt", "neg", "abs", "exp", "tanh", "floor"])
def test_elementwise_prims_match_cpu(name: str) -> None:
    """`torch.ops.prims` ops, which torch's reference implementations call, run on the chip."""
    prim = getattr(torch.ops.prims, name)
    cases = [(torch.tensor([1.5, -2.0, 0.25]), torch.tensor([0.5, 4.0, -1.0])),
             (torch.tensor([7, -7, 3], dtype=torch.int32), torch.tensor([2, 2, -2], dtype=torch.int32))]
    unary = len(prim.default._schema.arguments) == 1
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*CPU fallback", category=RuntimeWarning)
        for first, second in cases:
            if unary and first.dtype == torch.int32 and name in ("exp", "tanh", "floor"):
                continue
            operands = (first,) if unary else (first, second)
            expected = prim(*operands)
            got = host(prim(*(operand.to("tpu") for operand in operands)))
            assert got.dtype == expected.dtype and torch.allclose(got, expected), (got, expected)


def _writes_through_dtype_views(device: str) -> list[torch.Tensor]:
    results = []
    values = torch.tensor([1 + 2j, -1 + 0.5j, 3 - 1j], device=device)
    torch.view_as_real(values).mul_(2)
    results.append(values.clone())
    values.real.mul_(10)
    values.imag.zero_()
    results.append(values.clone())
    matrix = torch.tensor([[1 + 2j, 3 + 4j], [5 + 6j, 7 + 8j]], device=device)
    matrix.t().real.add_(100)
    torch.view_as_real(matrix)[0, 1].fill_(-1)
    results.append(matrix.clone())
    pairs = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    torch.view_as_complex(pairs).mul_(1j)
    results.append(pairs.clone())
    floats = torch.tensor([-1.5, 2.0, -3.0, 4.0], device=device)
    floats.view(torch.int32).bitwise_and_(0x7FFFFFFF)  # clears the sign bits
    results.append(floats.clone())
    shorts = torch.arange(4, dtype=torch.int16, device=device)
    shorts.view(torch.int8)[1::2].fill_(1)
    bytes_ = torch.arange(8, dtype=torch.int8, device=device)
    bytes_.view(torch.int32).add_(1)
    results += [shorts.clone(), bytes_.clone()]
    parameter = torch.nn.Parameter(torch.tensor([1 + 2j, -0.5 + 1j], device=device))
    optimizer = torch.optim.Adam([parameter], lr=0.1)  # updates complex parameters through view_as_real
    (parameter.abs() ** 2).sum().backward()
    optimizer.step()
    results.append(parameter.detach().clone())
    return [result.to("cpu") for result in results]


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_writes_through_dtype_reinterpreting_views(mode: str) -> None:
    """In-place writes through `view_as_real`, `.real`/`.imag`, `view_as_complex` and `view(dtype)`
    reach the buffer as on the CPU (they raised in strict mode and lost values in DeferAndFuse)."""
    from backend_helpers import eager
    from tputrace.backend.compat.device_module import EagerMode

    expected = _writes_through_dtype_views("cpu")
    with eager(EagerMode[mode]):
        result = _writes_through_dtype_views("tpu")
    for got, want in zip(result, expected):
        assert got.dtype == want.dtype and torch.allclose(got, want), (got, want)


def test_channels_last_permute_then_view_is_a_view() -> None:
    """A channels_last tensor's permute-then-view works on CUDA and the CPU: on tpu it is a view too
    (no copy, no host fallback), and a write through it reaches the tensor."""
    values = torch.arange(96.0).reshape(2, 3, 4, 4)
    on_chip = values.to("tpu").contiguous(memory_format=torch.channels_last)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flat = on_chip.permute(0, 2, 3, 1).view(2, -1)
    assert not [str(warning.message) for warning in caught]
    assert torch.equal(host(flat), values.permute(0, 2, 3, 1).reshape(2, -1))
    flat[1, 0] = -5
    assert on_chip[1, 0, 0, 0].item() == -5


@pytest.mark.parametrize(
    "operation",
    [
        lambda device: torch.tensor([3], device=device).div_(2),
        lambda device: torch.tensor([1, 2], device=device).add_(1.5),
        lambda device: torch.tensor([0, 3], device=device).clamp_(0.5, 2.5),
        lambda device: torch.tensor([True], device=device).add_(torch.tensor([2], device=device)),
        lambda device: torch.add(torch.tensor([1, 2], device=device), 1.5, out=torch.empty(2, dtype=torch.long, device=device)),
    ],
    ids=["div_", "add_float", "clamp_", "bool_add_", "out"],
)
def test_in_place_result_that_cannot_be_cast_raises(operation: object) -> None:
    """As on the CPU: an int tensor takes no float result in place (it was truncated silently)."""
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            operation(device)  # type: ignore[operator]


def test_in_place_results_that_can_be_cast_still_write() -> None:
    assert host(torch.tensor([1, 2], device="tpu").mul_(2)).tolist() == [2, 4]
    assert host(torch.ones(2, dtype=torch.float16, device="tpu").add_(torch.ones(2, device="tpu"))).tolist() == [2.0, 2.0]
    assert host(torch.tensor([1.0, 2.0], device="tpu").eq_(torch.tensor([1.0, 0.0], device="tpu"))).tolist() == [1.0, 0.0]


def test_autograd_matches_cpu() -> None:
    torch.manual_seed(0)
    weights = torch.randn(5, 3, requires_grad=True)
    inputs = torch.randn(4, 5)
    (torch.tanh(inputs @ weights).pow(2).mean()).backward()
    expected = weights.grad.clone()
    tpu_weights = weights.detach().to("tpu").requires_grad_()
    (torch.tanh(inputs.to("tpu") @ tpu_weights).pow(2).mean()).backward()
    assert torch.allclose(host(tpu_weights.grad), expected, atol=1e-6)


def test_autocast_to_bfloat16() -> None:
    a, b = torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        product = a @ b
        probabilities = torch.softmax(product, dim=-1)
    assert product.dtype == torch.bfloat16 and probabilities.dtype == torch.float32


def test_autocast_without_a_dtype_gives_bfloat16_on_every_thread() -> None:
    weights = torch.randn(4, 4, device="tpu")
    dtypes: dict[str, torch.dtype] = {}

    def product_dtype(name: str, dtype: torch.dtype | None = None) -> None:
        with torch.autocast("tpu", dtype=dtype):
            dtypes[name] = (weights @ weights).dtype

    product_dtype("main")
    product_dtype("main, float16 named", torch.float16)
    thread = threading.Thread(target=product_dtype, args=("new thread",))
    thread.start()
    thread.join()
    assert dtypes == {"main": torch.bfloat16, "main, float16 named": torch.float16, "new thread": torch.bfloat16}
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16


def test_op_without_lowering_falls_back_correctly_and_warns_once() -> None:
    values = torch.tensor([3.0, 1.0, 3.0, 0.0, 1.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = torch.histogram(values.to("tpu"), bins=3).hist
        torch.histogram(values.to("tpu"), bins=3)
    assert host(counts).tolist() == [1.0, 2.0, 2.0]
    fallback_warnings = [warning for warning in caught if "runs on the host CPU" in str(warning.message)]
    assert len(fallback_warnings) <= 1


def test_in_place_view_ops_change_the_tensor_shape_and_stay_views() -> None:
    for device in ("cpu", "tpu"):
        base = torch.arange(6.0, device=device).reshape(1, 2, 3)
        x = base.view(1, 2, 3)
        x.squeeze_(0)
        assert tuple(x.shape) == (2, 3) and x.stride() == (3, 1)
        x.t_()
        assert tuple(x.shape) == (3, 2) and x.stride() == (1, 3)
        x.unsqueeze_(0)
        x.transpose_(0, 2)
        x.swapdims_(1, 2)
        assert tuple(x.shape) == (2, 1, 3) and x.stride() == (3, 3, 1)
        x.add_(10)
        assert host(base).tolist() == [[[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]]]
        y = torch.arange(6.0, device=device)
        y.as_strided_((2, 2), (1, 2), 1)
        assert tuple(y.shape) == (2, 2) and y.storage_offset() == 1 and host(y).tolist() == [[1.0, 3.0], [2.0, 4.0]]


def test_lstm_and_gru_with_batch_first_match_cpu() -> None:
    for layer_type in (torch.nn.LSTM, torch.nn.GRU):
        torch.manual_seed(0)
        layer = layer_type(4, 5, num_layers=2, batch_first=True)
        inputs = torch.randn(2, 3, 4)
        expected = layer(inputs)[0]
        got = copy.deepcopy(layer).to("tpu")(inputs.to("tpu"))[0]
        assert tuple(got.shape) == (2, 3, 5)
        torch.testing.assert_close(host(got), expected, atol=1e-5, rtol=1e-5)


def test_resize_and_out_into_empty_or_wrong_size_tensors() -> None:
    grown = torch.arange(6.0, device="tpu")
    grown.resize_(2, 4)
    assert tuple(grown.shape) == (2, 4) and grown.stride() == (4, 1)
    assert host(grown).flatten()[:6].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    shrunk = torch.arange(8.0, device="tpu")[2:]
    shrunk.resize_(2, 2)
    assert shrunk.storage_offset() == 2 and host(shrunk).tolist() == [[2.0, 3.0], [4.0, 5.0]]
    empty = torch.empty(0, device="tpu")
    torch.mm(torch.ones(3, 4, device="tpu"), torch.ones(4, 2, device="tpu"), out=empty)
    assert host(empty).tolist() == [[4.0, 4.0]] * 3
    wrong = torch.zeros(2, device="tpu")
    with pytest.warns(UserWarning, match="was resized"):
        torch.add(torch.arange(3.0, device="tpu"), 1, out=wrong)
    assert host(wrong).tolist() == [1.0, 2.0, 3.0]
    fallback_out = torch.empty(0, device="tpu")
    torch.eye(2, out=fallback_out)
    assert host(fallback_out).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    torch.testing.assert_close(host(torch.linalg.matrix_power(torch.ones(2, 2, device="tpu"), 0)), torch.eye(2))
    target = torch.zeros(2, 3, device="tpu")
    target.set_(torch.arange(4.0, device="tpu"))
    assert tuple(target.shape) == (4,) and host(target).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_set_to_nothing_and_is_set_to_as_on_the_cpu() -> None:
    """`set_()` empties a tensor (it raised); `is_set_to` is True for tensors over the same storage with
    the same geometry (it was False even for a tensor and itself)."""
    for device in ("cpu", "tpu"):
        source = torch.arange(4.0, device=device)
        target = torch.zeros(3, device=device)
        target.set_(source)
        target.add_(1)
        assert target.is_set_to(source) and source.is_set_to(source) and source.view(4).is_set_to(source)
        assert not source[1:].is_set_to(source) and not torch.arange(4.0, device=device).is_set_to(source)
        assert host(source).tolist() == [1.0, 2.0, 3.0, 4.0]
        target.set_()
        assert tuple(target.shape) == (0,) and host(source).tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_statistics_match_cpu(training: bool) -> None:
    torch.manual_seed(0)
    inputs, weight, bias = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    running = {device: (torch.zeros(3, device=device), torch.ones(3, device=device)) for device in ("cpu", "tpu")}
    results = {
        device: torch.ops.aten.native_batch_norm(inputs.to(device), weight.to(device), bias.to(device), *running[device], training, 0.1, 1e-5)
        for device in ("cpu", "tpu")
    }
    for got, expected in zip(results["tpu"], results["cpu"]):
        assert tuple(got.shape) == tuple(expected.shape)
        torch.testing.assert_close(host(got), expected, atol=1e-5, rtol=1e-5)
    for got, expected in zip(running["tpu"], running["cpu"]):
        torch.testing.assert_close(host(got), expected, atol=1e-6, rtol=1e-6)
    assert training == (running["cpu"][0].abs().sum().item() > 0)


def test_linalg_errors_raise_as_on_cpu() -> None:
    not_positive_definite = torch.tensor([[4.0, 2.0, 1.0], [2.0, 1.0, 3.0], [1.0, 3.0, 5.0]])
    with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 2"):
        torch.linalg.cholesky(not_positive_definite.to("tpu"))
    with pytest.raises(torch.linalg.LinAlgError, match="diagonal element 2 is zero"):
        torch.linalg.inv(torch.tensor([[1.0, 2.0], [2.0, 4.0]], device="tpu"))
    batch = torch.stack([torch.eye(3), torch.diag(torch.tensor([1.0, -1.0, -1.0]))])
    assert host(torch.linalg.cholesky_ex(batch.to("tpu")).info).tolist() == [0, 2]
    torch.testing.assert_close(host(torch.linalg.inv(torch.tensor([[2.0, 1.0], [1.0, 3.0]], device="tpu"))), torch.tensor([[0.6, -0.2], [-0.2, 0.4]]))
