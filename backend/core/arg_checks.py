"""Argument checks torch makes and a lowering would skip: bad arguments raise torch's own error.

Five kinds. Only the third and fourth cost anything per call, and only for the ops they list:
- Shapes, dtypes and constant arguments: torch's meta kernel checks them when a signature's plan is
  built (once per signature). A meta kernel that refuses the arguments is asked to confirm on the
  host: the op runs on host copies of its inputs, and the host's error is raised if it refuses them
  too. A meta kernel that merely cannot handle them (a data-dependent output size) is not an error.
- Arguments that must share a dtype (`int32 @ float32`, `index_put_` of float64 values into
  float32), and dtypes a CPU kernel does not take (`softmax` of integers, `abs` of bools, `max` of
  complex numbers), which meta kernels do not check and XLA would compute: confirmed on the host
  with stand-ins that hold no memory (the written tensor excepted), when a signature's plan is built.
  The second is asked only of ops with a bool, integer or complex tensor argument.
- Python-number arguments, which are traced and so not part of a plan's key (`x ** -1` on integers,
  `uniform_(2, 1)`, `fill_(300)` on uint8): checked on every call, only for the ops listed in
  `_VALUE_CHECKS`.
- Values torch's CPU kernels check (an index out of range, a probability outside [0, 1]), which
  CUDA device-asserts and XLA would clamp: checked on host copies in DEFER_NEVER_AND_LAUNCH_BLOCKING,
  the debugging mode (`tputrace run --mode blocking`), as each check is a sync. In the other modes
  indices are checked on the chip and an error raised at the next sync (see `index_checks`).
- Writes into memory that several elements share (`expand(...).add_()`): refused as torch refuses
  them, except by the ops torch allows it (`fill_`, `zero_`, `masked_fill_`, `index_put_`); so are
  writes into memory an input partly shares (`x[1:].copy_(x[:-1])`), checked only when an input
  tensor shares the written tensor's buffer.

Writes through a boolean mask that read one value per set element (`x[mask] = values`,
`masked_scatter_`) check their values against the mask's count in every mode (see `mask_counts`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from tputrace.backend.core.entries import written_arguments
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.indexing import index_checks
from tputrace.backend.indexing.mask_counts import COUNT_CHECKS


aten = torch.ops.aten

Handler = Callable[[Any, Sequence[Any], dict], Any]

# The sync kind a host check is recorded as (tputrace's own cost, not the user's line's).
_CHECK_SYNC_KIND = "value_check"
# torch writes these into tensors whose elements share memory (the last two with a deprecation warning).
_OVERLAP_ALLOWED = frozenset({aten.fill_, aten.zero_, aten.masked_fill_, aten.index_put_, aten._index_put_impl_})
_OVERLAP_MESSAGE = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory location. "
    "Please clone() the tensor before performing the operation."
)


def host_refusal(to_host: Callable[[Any, str], torch.Tensor], op: Any, args: Sequence[Any], kwargs: dict) -> BaseException | None:
    """torch's error for these arguments on the host CPU, or None if the host takes them.

    Runs `op` on host copies of the tpu tensors among the arguments; the copies are dropped, so an
    in-place op changes nothing on the chip."""
    from tputrace.backend.core.tensor import TpuTensor

    host_args, host_kwargs = tree_map_only(TpuTensor, lambda tensor: to_host(tensor, _CHECK_SYNC_KIND).requires_grad_(False), (tuple(args), dict(kwargs)))
    if "device" in host_kwargs:
        host_kwargs["device"] = torch.device("cpu")
    return _host_error(op, host_args, host_kwargs)


def dtype_refusal(op: Any, args: Sequence[Any], kwargs: dict) -> BaseException | None:
    """torch's error for arguments of an op that needs them in one dtype (`int32 @ float32`), which
    its meta kernel does not check and XLA would promote; None if they agree or the host takes them.

    Asked when a signature's plan is built. The host runs the op on stand-ins of the arguments'
    dtypes and shapes that hold no memory (a zero expanded), so the check needs no sync."""
    names = _SAME_DTYPE_ARGUMENTS.get(op.overloadpacket)
    if names is None:
        return None
    dtypes = {value.dtype for name in names if isinstance(value := _reader(op, name)(args, kwargs), torch.Tensor)}
    if len(dtypes) < 2:
        return None
    stand_ins = tree_map_only(torch.Tensor, lambda tensor: torch.zeros((), dtype=tensor.dtype).expand(tensor.shape), (tuple(args), dict(kwargs)))
    return _host_error(op, *stand_ins)


def kernel_dtype_refusal(op: Any, args: Sequence[Any], kwargs: dict) -> BaseException | None:
    """torch's error for a dtype the op's CPU kernel does not take (`"softmax_kernel_impl" not
    implemented for 'Long'`), which its meta kernel accepts; None if the host takes it.

    Asked when a signature's plan is built, only for ops with a bool, integer or complex tensor
    argument (every CPU kernel takes float32 and float64; half types are left unasked, as running
    a large half matmul on the host would cost more than the check is worth), and once per op and
    argument types: what a kernel takes depends on the dtypes, not the shapes. The host runs the op
    on stand-ins (zeros expanded to the arguments' shapes; a written argument gets memory of its
    own), and only an error that names a dtype counts: a stand-in's zero values may be refused for
    reasons of their own."""
    if op.overloadpacket in _KERNEL_DTYPE_EXTENSIONS:
        return None
    leaves = tree_leaves((tuple(args), kwargs))
    if not any(isinstance(leaf, torch.Tensor) and _narrow(leaf.dtype) for leaf in leaves):
        return None
    key = (op, tuple(kwargs), tuple(leaf.dtype if isinstance(leaf, torch.Tensor) else type(leaf) for leaf in leaves))
    if key in _kernel_dtypes_taken:
        return None
    refusal = _host_dtype_error(op, *_stand_ins(op, args, kwargs))
    if refusal is None and all(leaf.numel() for leaf in leaves if isinstance(leaf, torch.Tensor)):  # an empty input may skip the kernel
        _kernel_dtypes_taken.add(key)
    return refusal


def _host_dtype_error(op: Any, host_args: tuple, host_kwargs: dict) -> BaseException | None:
    """The dtype error the host raises for these stand-ins; a random op's draw leaves the CPU's
    generator where it was, so checking a tpu `random_` does not move the script's CPU draws."""
    try:
        with torch.random.fork_rng(devices=()):
            op(*host_args, **host_kwargs)
    except Exception as error:  # noqa: BLE001 - returned for the caller to raise
        return error if _DTYPE_REFUSAL.search(str(error)) else None
    return None


# (op, keyword names, argument dtypes and types) the host's kernel took.
_kernel_dtypes_taken: set[tuple] = set()
# Ops whose tpu lowering takes dtypes torch's CPU kernel refuses, as CUDA's kernel does (README).
_KERNEL_DTYPE_EXTENSIONS = frozenset({aten.histc})
# torch's wording when a kernel refuses a dtype: its dispatch macros' `"abs_cpu" not implemented for
# 'Bool'`, and its checks' `Boolean inputs not supported for relu`, `clamp is not supported for complex
# types`, `Integer division with addcdiv is no longer supported`.
_DTYPE_REFUSAL = re.compile(r"not implemented for '|\b(?:[Bb]ool(?:ean)?|[Cc]omplex|[Ii]nteger)\b")


def _narrow(dtype: torch.dtype) -> bool:
    """Whether some CPU kernels refuse this dtype: bool, integers and complex numbers."""
    return not dtype.is_floating_point


def _stand_ins(op: Any, args: Sequence[Any], kwargs: dict) -> tuple[tuple, dict]:
    """Host arguments of the same dtypes and shapes: zeros expanded, holding no memory, except the
    tensors the op writes (in place, `out=`), which get memory of their own (a write into an
    expanded tensor is refused before any dtype is looked at)."""
    written = {argument.name for argument in written_arguments(op)}
    names = [argument.name for argument in op._schema.arguments]

    def stand_in(value: Any, name: str | None) -> Any:
        def make(tensor: torch.Tensor) -> torch.Tensor:
            if name in written:
                return torch.zeros(tensor.shape, dtype=tensor.dtype)
            return torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)

        return tree_map_only(torch.Tensor, make, value)

    host_args = tuple(stand_in(value, names[index] if index < len(names) else None) for index, value in enumerate(args))
    host_kwargs = {name: stand_in(value, name) for name, value in kwargs.items()}
    if "device" in host_kwargs:
        host_kwargs["device"] = torch.device("cpu")
    return host_args, host_kwargs


def _host_error(op: Any, host_args: tuple, host_kwargs: dict) -> BaseException | None:
    """The error `op` raises on these host arguments, or None. A NotImplementedError (no CPU kernel,
    as for a CUDA-only fused op) is none: the host cannot judge."""
    try:
        op(*host_args, **host_kwargs)
    except NotImplementedError:
        return None
    except Exception as error:  # noqa: BLE001 - returned for the caller to raise
        return error
    return None


def check_strided_within_storage(sizes: Sequence[int], strides: Sequence[int], offset: int, itemsize: int, storage_bytes: int) -> None:
    """torch's refusal of an `as_strided` view that reaches past the end of its storage (meta
    tensors do not check it)."""
    if any(size == 0 for size in sizes):
        return
    needed = (offset + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1) * itemsize
    if needed > storage_bytes:
        raise RuntimeError(
            f"setStorage: sizes {list(sizes)}, strides {list(strides)}, storage offset {offset}, and itemsize {itemsize} "
            f"requiring a storage size of {needed} are out of bounds for storage of size {storage_bytes}"
        )


def check_no_internal_overlap(tensor: Any, op: Any) -> None:
    """torch's refusal to let `op` write a tpu tensor in which a dimension of size > 1 has stride 0
    (only a view can be one: a write into anything else costs one attribute read)."""
    if tensor._view is None or op.overloadpacket in _OVERLAP_ALLOWED:
        return
    for size, stride in zip(tensor.shape, tensor.stride()):
        if stride == 0 and size > 1:
            raise RuntimeError(_OVERLAP_MESSAGE)


# Ops torch lets read memory they partly write: a 0-dim value read as a scalar, and the BLAS ops,
# which copy an overlapping input first.
_PARTIAL_OVERLAP_ALLOWED = frozenset(
    {aten.fill_, aten.masked_fill_, aten.masked_scatter_, aten.mm, aten.addmm, aten.addmm_, aten.bmm, aten.baddbmm, aten.baddbmm_}
    | {aten.addbmm, aten.addbmm_, aten.mv, aten.addmv, aten.addmv_, aten.addr, aten.addr_, aten.dot, aten.vdot, aten._addmm_activation}
)
_PARTIAL_OVERLAP_MESSAGE = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. "
    "Please clone() the tensor before performing the operation."
)


def _dense_byte_span(tensor: Any) -> tuple[int, int] | None:
    """The bytes a non-overlapping and dense tensor covers in its storage, or None if it is not one
    (torch's `get_overlap_status` calls such a pair too hard to tell, and lets it through)."""
    expected = 1
    for stride, size in sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1):
        if stride != expected:
            return None
        expected *= size
    begin = tensor.storage_offset() * tensor.element_size()
    return begin, begin + tensor.numel() * tensor.element_size()


def check_write(target: Any, inputs: Sequence[Any], op: Any) -> None:
    """torch's refusals of `op` writing `target` while reading `inputs`: memory that several of the
    target's elements share, or that an input partly shares."""
    check_no_internal_overlap(target, op)
    check_no_partial_overlap(target, inputs, op)


def check_no_partial_overlap(target: Any, inputs: Sequence[Any], op: Any) -> None:
    """torch's refusal to let `op` write `target` while reading an input that shares part of its memory
    (`x[1:].copy_(x[:-1])`, `x.add_(x.t())`): XLA would compute it as if the input were cloned first,
    which CUDA and the CPU refuse. The same memory seen the same way (`x.add_(x)`) is allowed. Every
    in-place op pays one pass over its arguments; the spans are compared only for an input that
    shares the target's buffer."""
    buf = target._buf
    shared: list[Any] = []
    for value in inputs:
        if type(value) in (list, tuple):  # a list argument: `torch.cat`'s tensors
            shared.extend(item for item in value if getattr(item, "_buf", None) is buf and item is not target)
        elif getattr(value, "_buf", None) is buf and value is not target:
            shared.append(value)
    if shared and op.overloadpacket not in _PARTIAL_OVERLAP_ALLOWED and target.numel():
        _refuse_partial_overlap(target, shared)


def _refuse_partial_overlap(target: Any, shared: list[Any]) -> None:
    target_span = _dense_byte_span(target)
    for value in shared:
        input_span = _dense_byte_span(value)
        if target_span is None or input_span is None or value.numel() == 0:
            continue
        if target_span == input_span:
            if tuple(target.stride()) != tuple(value.stride()):
                raise RuntimeError(_PARTIAL_OVERLAP_MESSAGE)
        elif target_span[0] < input_span[1] and input_span[0] < target_span[1]:
            raise RuntimeError(_PARTIAL_OVERLAP_MESSAGE)


def with_value_checks(op: Any, handler: Handler, dispatcher: DispatcherApi) -> Handler:
    """`handler`, preceded by `op`'s per-call argument check if it has one; for an op whose inputs
    torch's CPU kernel checks by value (indices, probabilities), preceded in
    DEFER_NEVER_AND_LAUNCH_BLOCKING by that check on host copies (see `host_refusal`) and in the
    other modes, for an index op, followed by its asynchronous index check (see `index_checks`); for
    a write through a mask, preceded by the check of its count (see `mask_counts`)."""
    check = _VALUE_CHECKS.get(op)
    count_check = COUNT_CHECKS.get(op)
    checks_data = op.overloadpacket in _DATA_CHECKED_OPS
    index_check = index_checks.checker(op, dispatcher)
    if check is None and count_check is None and not checks_data:
        return handler

    def checked(entry: Any, args: Sequence[Any], kwargs: dict) -> Any:
        if check is not None:
            check(args, kwargs)
        if count_check is not None:
            count_check(dispatcher.to_host, args, kwargs)
        blocking = checks_data and getattr(dispatcher.executor, "launch_blocking", False)
        if blocking:
            refusal = host_refusal(dispatcher.to_host, op, args, kwargs)
            if refusal is not None:
                if index_check is not None:
                    index_checks.record_host_refusal(dispatcher.recorder, op, refusal)
                raise refusal
        result = handler(entry, args, kwargs)
        if index_check is not None and not blocking:
            index_check(args, kwargs)
        return result

    return checked


def value_check(op: Any) -> Callable[[Sequence[Any], dict], None] | None:
    """`op`'s per-call check of its Python-number arguments, for a kernel that calls no handler."""
    return _VALUE_CHECKS.get(op)


def _integral(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex


def _check_integer_power(args: Sequence[Any], kwargs: dict) -> None:
    base = args[0] if args else kwargs["self"]
    exponent = args[1] if len(args) > 1 else kwargs["exponent"]
    if _integral(base.dtype) and type(exponent) in (int, bool) and exponent < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")


def _check_uniform_range(args: Sequence[Any], kwargs: dict) -> None:
    tensor = args[0] if args else kwargs["self"]
    if not (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        torch.empty(0, dtype=tensor.dtype).uniform_()  # raises torch's "not implemented for 'Long'"
    low = args[1] if len(args) > 1 else kwargs.get("from", 0.0)
    high = args[2] if len(args) > 2 else kwargs.get("to", 1.0)
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}")


def _random_range_check(low_at: int | None, high_at: int) -> Callable[[Sequence[Any], dict], None]:
    """The check of `randint`/`random_` whose bounds are positional arguments `low_at` (None: 0) and `high_at`."""
    names = {low_at: "from", high_at: "to"}

    def check(args: Sequence[Any], kwargs: dict) -> None:
        low, high = (args[at] if at is not None and at < len(args) else kwargs.get(names[at], 0 if at is None else None) for at in (low_at, high_at))
        if high is not None and low >= high:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
        tensor = args[0] if args else kwargs.get("self")
        if isinstance(tensor, torch.Tensor) and high is not None:
            # torch's bound check for the tensor's dtype ("to - 1 is out of bounds for bool"), on an empty stand-in
            torch.empty(0, dtype=tensor.dtype).random_(low, high)

    return check


def _floating_variance_check(name: str) -> Callable[[Sequence[Any], dict], None]:
    """`std`/`var`/`std_mean`/`var_mean` of an integer tensor: torch's error, which names `name`."""

    def check(args: Sequence[Any], kwargs: dict) -> None:
        source = args[0] if args else kwargs["self"]
        if _integral(source.dtype):
            raise RuntimeError(f"{name} only support floating point and complex dtypes")

    return check


def _check_round_decimals(args: Sequence[Any], kwargs: dict) -> None:
    """`round(decimals=...)` of an integer tensor: torch's kernel has no integer form (plain `round` has)."""
    tensor = args[0] if args else kwargs["self"]
    if _integral(tensor.dtype):
        torch.zeros(1, dtype=tensor.dtype).round(decimals=kwargs.get("decimals", 0))  # raises torch's "not implemented for 'Long'"


def _check_median_dim(args: Sequence[Any], kwargs: dict) -> None:
    """`median(dim)`/`nanmedian(dim)` over a dimension of size 0."""
    source = args[0] if args else kwargs["self"]
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    if source.dim() > 0 and source.shape[dim] == 0:
        raise RuntimeError(f"median(): Expected reduction dim {dim % source.dim()} to have non-zero size.")


def _check_histc_arguments(args: Sequence[Any], kwargs: dict) -> None:
    """`histc`'s checks that need no values (its dtype, bins, a given range that is not finite or
    reversed): the host runs it on an empty stand-in, which raises the same error (no sync). Integer
    dtypes are CUDA's (torch's CPU kernel has none): their stand-in is float32, for the other checks."""
    source = args[0] if args else kwargs["self"]
    options = {name: value for name, value in kwargs.items() if name != "self"}
    stand_in_dtype = torch.float32 if not source.dtype.is_floating_point and not source.dtype.is_complex and source.dtype != torch.bool else source.dtype
    torch.histc(torch.empty(0, dtype=stand_in_dtype), *args[1:], **options)


# The largest `n` whose permutation each floating dtype holds exactly, and torch's wording of the limit.
_RANDPERM_PRECISION: dict[torch.dtype, tuple[int, str]] = {
    torch.float16: (2**11 + 1, "2049 for Half"), torch.float32: (2**24 + 1, "2^24+1 for Float"),
    torch.float64: (2**53 + 1, "2^53+1 for Double"),
}


def _check_dropout_dtype(args: Sequence[Any], kwargs: dict) -> None:
    """`F.dropout` of a complex tensor in training: the CPU's dropout draws its mask with `bernoulli_`,
    which has no complex form (nor has CUDA's fused kernel), so it raises; torch sends a device's
    dropout to `native_dropout`, whose lowering would compute it."""
    tensor = args[0] if args else kwargs["input"]
    train = args[2] if len(args) > 2 else kwargs.get("train")
    if tensor.dtype.is_complex and train is not False and tensor.numel() > 0:
        torch.empty(1, dtype=tensor.dtype).bernoulli_(0.5)  # raises the CPU's "bernoulli_scalar_cpu_" not implemented for 'ComplexFloat'


def _check_randperm(args: Sequence[Any], kwargs: dict) -> None:
    """torch's refusals of `randperm(n, dtype=...)`, which its meta kernel does not make: a dtype its
    kernel has no form for (bool, complex), an `n - 1` the integer dtype cannot hold, and an `n` past
    what a floating dtype counts exactly. They come before any allocation, so none costs a host draw."""
    n = args[0] if args else kwargs["n"]
    out = kwargs.get("out")
    dtype = out.dtype if isinstance(out, torch.Tensor) else kwargs.get("dtype") or torch.int64
    if n < 0 and isinstance(out, torch.Tensor):
        raise RuntimeError(f"n must be non-negative, got{n}")
    if n < 0:
        return  # torch's negative-size error comes first, from the lowering's shape
    if dtype == torch.bool or dtype.is_complex:
        torch.randperm(0, dtype=dtype)  # raises torch's "randperm" not implemented for 'Bool'
    torch.scalar_tensor(n - 1 if n > 0 else n, dtype=dtype)  # raises torch's overflow error for integer dtypes
    limit = _RANDPERM_PRECISION.get(dtype)
    if limit is not None and n > limit[0]:
        raise RuntimeError(f"n cannot be greater than {limit[1]} type.")


# Arguments torch's CPU and CUDA kernels require in one dtype (index arguments excluded).
_SAME_DTYPE_ARGUMENTS: dict[Any, tuple[str, ...]] = {
    aten.mm: ("self", "mat2"), aten.bmm: ("self", "mat2"), aten.addmm: ("self", "mat1", "mat2"),
    aten.addbmm: ("self", "batch1", "batch2"), aten.baddbmm: ("self", "batch1", "batch2"), aten.mv: ("self", "vec"),
    aten.addmv: ("self", "mat", "vec"), aten.dot: ("self", "tensor"), aten.vdot: ("self", "other"),
    aten.linalg_cross: ("self", "other"), aten.cross: ("self", "other"), aten.index_put: ("self", "values"),
    aten._index_put_impl: ("self", "values"), aten.index_copy: ("self", "source"), aten.index_add: ("self", "source"),
}

_INTEGER_TYPE_NAMES = {
    torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t", torch.uint16: "uint16_t",
    torch.int32: "int", torch.uint32: "uint32_t", torch.int64: "int64_t",
}


def _reader(op: Any, name: str) -> Callable[[Sequence[Any], dict], Any]:
    """Reads argument `name` of a call of `op`, positional or keyword (the schema is read once,
    here: reading it costs ~2 µs)."""
    position = next(index for index, argument in enumerate(op._schema.arguments) if argument.name == name)
    return lambda args, kwargs: args[position] if position < len(args) else kwargs.get(name)


def _scalar_fits_check(op: Any, values: tuple[str, ...], target: str) -> Callable[[Sequence[Any], dict], None]:
    """torch's refusal of a Python number that the integer dtype of argument `target` (a tensor, or
    a dtype for a factory) cannot hold: XLA would wrap it (`fill_(300)` on uint8 gives 44). An
    unsigned type takes negatives down to -max, as torch's check does."""

    read_target = _reader(op, target)
    read_values = [_reader(op, name) for name in values]

    def check(args: Sequence[Any], kwargs: dict) -> None:
        held = read_target(args, kwargs)
        dtype = held if isinstance(held, torch.dtype) else getattr(held, "dtype", None)
        type_name = _INTEGER_TYPE_NAMES.get(dtype)
        if type_name is None:
            return
        limits = torch.iinfo(dtype)
        lowest = -limits.max if not dtype.is_signed else limits.min
        for read in read_values:
            value = read(args, kwargs)
            if type(value) in (int, float) and not lowest <= value <= limits.max:
                raise RuntimeError(f"value cannot be converted to type {type_name} without overflow")

    return check


def _fits_checks() -> dict[Any, Callable[[Sequence[Any], dict], None]]:
    """The ops whose Scalar torch converts to the tensor's dtype with an overflow check."""
    checked = [
        (aten.clamp.default, ("min", "max"), "self"), (aten.clamp_.default, ("min", "max"), "self"),
        (aten.fill.Scalar, ("value",), "self"), (aten.fill_.Scalar, ("value",), "self"),
        (aten.scalar_tensor.default, ("s",), "dtype"),
        (aten.masked_fill.Scalar, ("value",), "self"), (aten.masked_fill_.Scalar, ("value",), "self"),
        (aten.index_fill.int_Scalar, ("value",), "self"), (aten.index_fill_.int_Scalar, ("value",), "self"),
        (aten.scatter.value, ("value",), "self"), (aten.scatter_.value, ("value",), "self"),
        (aten.where.ScalarOther, ("other",), "self"), (aten.where.ScalarSelf, ("self",), "other"),
        (aten.full.default, ("fill_value",), "dtype"),
    ]
    return {op: _scalar_fits_check(op, values, target) for op, values, target in checked}


def _overloads(packet: Any) -> list[Any]:
    return [getattr(packet, name) for name in packet.overloads()]


# Ops whose CPU kernels check their inputs' values, where CUDA device-asserts and XLA clamps or
# returns NaN: an index out of range, a class past num_classes, a probability outside [0, 1].
# (`one_hot` is composite: its class range is checked by its `_assert_async`, see `op_routes`.)
_DATA_CHECKED_OPS = frozenset({
    aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_, aten.index_select, aten.index_add, aten.index_add_,
    aten.index_copy, aten.index_copy_, aten.index_fill, aten.index_fill_, aten.gather, aten.scatter, aten.scatter_,
    aten.scatter_add, aten.scatter_add_, aten.scatter_reduce, aten.scatter_reduce_, aten.take, aten.put, aten.put_,
    aten.embedding, aten._embedding_bag, aten.embedding_bag, aten.nll_loss_forward, aten.nll_loss2d_forward,
    aten.multinomial, aten.bernoulli, aten.bernoulli_, aten.binary_cross_entropy, aten.histc,
})


_VALUE_CHECKS: dict[Any, Callable[[Sequence[Any], dict], None]] = {
    aten.pow.Tensor_Scalar: _check_integer_power,
    aten.pow_.Scalar: _check_integer_power,
    aten.pow.Tensor_Scalar_out: _check_integer_power,
    aten.uniform_.default: _check_uniform_range,
    aten.uniform.default: _check_uniform_range,
    aten.median.dim: _check_median_dim,
    aten.round.decimals: _check_round_decimals,
    aten.round_.decimals: _check_round_decimals,
    aten.round.decimals_out: _check_round_decimals,
    aten.histc.default: _check_histc_arguments,
    aten.nanmedian.dim: _check_median_dim,
    **_fits_checks(),
    aten.native_dropout.default: _check_dropout_dtype,
    aten.randperm.default: _check_randperm,
    aten.randperm.generator: _check_randperm,
    aten.randperm.out: _check_randperm,
    aten.randperm.generator_out: _check_randperm,
    aten.randint.default: _random_range_check(None, 0),
    aten.randint.low: _random_range_check(0, 1),
    getattr(aten.random_, "from"): _random_range_check(1, 2),
    aten.random_.to: _random_range_check(None, 1),
    **{
        op: _floating_variance_check(name)
        for packet, name in ((aten.std, "std and var"), (aten.var, "std and var"), (aten.std_mean, "std_mean"), (aten.var_mean, "var_mean"))
        for op in _overloads(packet)
    },
}
