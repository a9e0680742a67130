"""Ops routed by hand, where the route derived from the schema would break torch's contract.

- `native_batch_norm` updates the running statistics in training although its schema declares no
  write: it runs as `_native_batch_norm_legit`, whose schema does, so the update reaches the chip on
  every route (decomposition or CPU fallback).
- `batch_norm_gather_stats_with_counts` (SyncBatchNorm's merge of the ranks' statistics) also updates
  the running statistics without declaring the write: it runs as tpu ops that write them.
- In eval mode torch's CPU kernels of `native_batch_norm` and `_native_batch_norm_legit` return empty
  saved statistics (their meta kernels say (C,)); the device returns what the CPU does.
- `_linalg_check_errors` only reads `info` to raise torch's error: the chip checks for a nonzero
  entry and the host sees one bool; `info` is copied out only when there is an error to raise.
- `_linalg_det` and `_linalg_slogdet` of a contiguous real matrix factor its transpose, as torch's
  CPU and CUDA kernels do (det(Aᵀ) = det(A)): their backward reads the LU factors as those of Aᵀ
  whenever A is contiguous, so the factors of A gave a transposed gradient.
- `ctc_loss` with lengths as host tensors (the usual CUDA call: cuDNN wants them there): torch's
  composite for tensor subclasses divides the chip's losses by the host lengths, which mixes devices;
  it runs as the `IntList` overload instead, as torch does for plain tensors.
- `allclose` and `equal` return a Python bool: the chip compares, and the host reads one bool (torch's
  composite would copy both tensors out).
- `_assert_async` (torch's device-side assert, e.g. `one_hot`'s class range): XLA has no asynchronous
  assert, and checking would be a sync per call, so it checks only in DEFER_NEVER_AND_LAUNCH_BLOCKING,
  where every op waits for the chip anyway; elsewhere it is a no-op (no host fallback, no sync).
- `record_stream` (a CUDA caching-allocator hint; DataParallel's scatter calls it) is a no-op: JAX
  frees a chip's buffers once no array holds them, whatever stream used them.
- `one_hot` runs torch's composite as it runs for a plain accelerator tensor, with its class-range
  asserts (`_assert_async`); the path torch takes for a tensor subclass leaves them out. In the
  default modes its class values are checked on the chip as an index op's are (`index_checks`).
- `zeros_like`, `ones_like`, `full_like`, `empty_like` and the `new_*` forms run as the factory of
  their shape and dtype: they read no tensor, so a view's values are not computed for them and a
  pending value does not tie them to its graph (an optimizer's first step then records its state
  apart from the update, `deferred.DeferredExecutor.creating_state`). A channels-last input keeps the
  op, whose output takes its layout, and so does a cut of a data-dependent result, whose route runs
  on its padded buffer.
- `max_pool1d` of a dtype torch's CPU kernel refuses (integers, bool) raises the CPU's error: torch's
  composite sends a non-CPU tensor to `max_pool1d_with_indices`, which the CPU takes for integers (as
  CUDA's kernel does), so only this route sees the dtype that the CPU's own `max_pool1d_impl` refuses.
"""

from __future__ import annotations

from typing import Any

import torch

from tputrace.backend.core import arg_checks, routing
from tputrace.backend.core.entries import bound
from tputrace.backend.core.memory_formats import channels_last_format
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.indexing import index_checks, padded_reads

aten = torch.ops.aten


def _eval_saved_stats(result: tuple, input: TpuTensor, training: bool) -> tuple:  # noqa: A002
    """Empty saved statistics in eval mode, as torch's CPU kernel returns them."""
    if training:
        return tuple(result)
    empty = torch.empty((0,), dtype=result[1].dtype, device=input.device)
    return (result[0], empty, torch.empty((0,), dtype=result[2].dtype, device=input.device))


def _legit_default(args: tuple, kwargs: dict) -> tuple:
    input, weight, bias, running_mean, running_var, training, momentum, eps = bound(aten._native_batch_norm_legit.default, args, kwargs)  # noqa: A001
    decomposition = torch._decomp.decomposition_table[aten._native_batch_norm_legit.default]
    result = decomposition(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _eval_saved_stats(result, input, training)


def _native_batch_norm(args: tuple, kwargs: dict) -> tuple:
    input, weight, bias, running_mean, running_var, training, momentum, eps = bound(aten.native_batch_norm.default, args, kwargs)  # noqa: A001
    if running_mean is None or running_var is None:
        result = torch.ops.aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    else:
        result = torch.ops.aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _eval_saved_stats(result, input, training)


def _batch_norm_gather_stats_with_counts(args: tuple, kwargs: dict) -> tuple:
    """SyncBatchNorm's merge of every rank's (mean, invstd, count) into the global mean and invstd, as
    CUDA's kernel merges them; like `native_batch_norm` it also updates the running statistics (with
    the unbiased variance) although its schema declares no write."""
    _, mean, invstd, running_mean, running_var, momentum, eps, counts = bound(aten.batch_norm_gather_stats_with_counts.default, args, kwargs)
    weights = counts.to(mean.dtype).unsqueeze(-1)
    total = weights.sum(0)
    global_mean = (mean * weights).sum(0) / total
    variance = ((invstd.reciprocal().square() - eps + (mean - global_mean).square()) * weights).sum(0) / total
    if running_mean is not None:
        running_mean.copy_(running_mean * (1 - momentum) + global_mean * momentum)
    if running_var is not None:
        running_var.copy_(running_var * (1 - momentum) + variance * (total / (total - 1)) * momentum)
    return global_mean, (variance + eps).rsqrt()


def _linalg_check_errors(args: tuple, kwargs: dict) -> None:
    info, api_name = args[0], args[1]
    is_matrix = kwargs.get("is_matrix", args[2] if len(args) > 2 else True)
    if info.numel() == 0 or not bool(torch.ops.aten.any.default(torch.ops.aten.ne.Scalar(info, 0))):
        return None
    host_info = routing.active().to_host(info, "item")
    torch.ops.aten._linalg_check_errors.default(host_info, api_name, is_matrix=is_matrix)
    return None


def _factor_transpose_when_contiguous(op: Any) -> Any:
    def handler(args: tuple, kwargs: dict) -> Any:
        dispatcher = routing.active()
        (matrix,) = bound(op, args, kwargs)
        if matrix.is_contiguous() and not matrix.is_complex():
            matrix = matrix.mT
        return dispatcher.compute(dispatcher._entry(op), (matrix,), {})

    return handler


def _ctc_loss_tensor(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0, reduction: int = 1, zero_infinity: bool = False) -> Any:
    if input_lengths.device.type == "cpu" and target_lengths.device.type == "cpu":
        return aten.ctc_loss.IntList(log_probs, targets, input_lengths.tolist(), target_lengths.tolist(), blank, reduction, zero_infinity)
    return aten.ctc_loss.Tensor.decompose(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)


def _allclose(args: tuple, kwargs: dict) -> bool:
    self, other, rtol, atol, equal_nan = bound(aten.allclose.default, args, kwargs)
    return bool(aten.all.default(aten.isclose.default(self, other, rtol, atol, equal_nan)))


def _equal(args: tuple, kwargs: dict) -> bool:
    self, other = bound(aten.equal.default, args, kwargs)
    return tuple(self.shape) == tuple(other.shape) and bool(aten.all.default(aten.eq.Tensor(self, other)))


def _assert_async(args: tuple, kwargs: dict) -> None:
    if getattr(routing.active().executor, "launch_blocking", False) and not bool(aten.is_nonzero.default(args[0])):
        raise RuntimeError(args[1] if len(args) > 1 else kwargs.get("assert_msg", "Expected Tensor with single nonzero value, but got zero"))
    return None


def _one_hot(tensor: Any, num_classes: int = -1) -> Any:
    if tensor.dtype != torch.int64:  # torch's kernel checks it; its decomposition does not
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    high = num_classes if num_classes >= 0 else index_checks.UNBOUNDED
    index_checks.check("aten.one_hot", [(tensor, index_checks.IndexRange(0, high))])
    try:
        return aten.one_hot.default.decompose(tensor, num_classes)
    except RuntimeError as refusal:  # DEFER_NEVER_AND_LAUNCH_BLOCKING: its asserts checked the classes at the op
        index_checks.record_host_refusal(routing.active().recorder, aten.one_hot.default, refusal)
        raise


def _max_pool1d(*args: Any, **kwargs: Any) -> Any:
    refusal = arg_checks.kernel_dtype_refusal(aten.max_pool1d.default, args, kwargs)
    if refusal is not None:
        raise refusal
    return aten.max_pool1d.default.decompose(*args, **kwargs)


_FACTORY_OF = {
    aten.zeros_like.default: aten.zeros.default,
    aten.empty_like.default: aten.zeros.default,
    aten.ones_like.default: aten.ones.default,
    aten.full_like.default: aten.full.default,
    aten.new_zeros.default: aten.zeros.default,
    aten.new_empty.default: aten.zeros.default,
    aten.new_ones.default: aten.ones.default,
    aten.new_full.default: aten.full.default,
}
_LIKE_OPS = frozenset({aten.zeros_like.default, aten.empty_like.default, aten.ones_like.default, aten.full_like.default})
_PLAIN_KEYWORDS = frozenset({"dtype", "layout", "device", "pin_memory", "memory_format"})


def _factory_without_reading(dispatcher: DispatcherApi, op: Any) -> Any:
    """`op` (a `*_like` or `new_*`) as its factory, which reads no tensor; other calls take the op's
    own route. Both entries are looked up once, here (an OpOverload hashes in Python)."""
    route = dispatcher._route(op)
    factory = _FACTORY_OF[op]
    factory_entry = dispatcher._entry(factory)
    like = op in _LIKE_OPS
    name = str(op)
    check = arg_checks.value_check(factory)  # `full`'s: the number must fit an integer dtype

    def handler(args: tuple, kwargs: dict) -> Any:
        tensor = args[0] if args else None
        if type(tensor) is TpuTensor and (like or len(args) > 1) and _plain_call(tensor, kwargs, like):
            size, rest = (tuple(tensor.shape), args[1:]) if like else (tuple(args[1]), args[2:])
            factory_args, factory_kwargs = (size, *rest), {"dtype": kwargs.get("dtype") or tensor.dtype, "device": tensor.device}
            if check is not None:
                check(factory_args, factory_kwargs)
            return dispatcher.compute(factory_entry, factory_args, factory_kwargs, record_as=name)
        return route[0](route[1], args, kwargs)

    return handler


def _plain_call(tensor: TpuTensor, kwargs: dict, like: bool) -> bool:
    """A call whose output is a contiguous strided tensor on the tensor's chip, and, for a like op,
    not of a cut (whose route runs on its padded buffer, compiling no program per count)."""
    if not _PLAIN_KEYWORDS.issuperset(kwargs) or kwargs.get("pin_memory") or kwargs.get("layout") not in (None, torch.strided):
        return False
    device = kwargs.get("device")
    if device is not None and torch.device(device) != tensor.device:
        return False
    if not like:
        return True
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return False
    if padded_reads.cuts_made and padded_reads.is_cut(tensor):
        return False
    return kwargs.get("memory_format") is torch.contiguous_format or channels_last_format(tuple(tensor.shape), tuple(tensor.stride())) is None


_library: torch.library.Library | None = None


def register() -> None:
    """Route these ops to their handlers."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("ctc_loss.Tensor", _ctc_loss_tensor, "AutogradPrivateUse1")
        _library.impl("one_hot", _one_hot, "AutogradPrivateUse1")
        _library.impl("max_pool1d", _max_pool1d, "AutogradPrivateUse1")
    dispatcher = routing.active()
    routing.register_special(aten.native_batch_norm.default, _native_batch_norm)
    routing.register_special(aten._native_batch_norm_legit.default, _legit_default)
    routing.register_special(aten.batch_norm_gather_stats_with_counts.default, _batch_norm_gather_stats_with_counts)
    routing.register_special(aten._linalg_check_errors.default, _linalg_check_errors)
    routing.register_special(aten._assert_async.default, _assert_async)
    routing.register_special(aten._assert_async.msg, _assert_async)
    routing.register_special(aten.allclose.default, _allclose)
    routing.register_special(aten.equal.default, _equal)
    routing.register_special(aten.record_stream.default, lambda args, kwargs: None)
    for op in (aten._linalg_det.default, aten._linalg_slogdet.default):
        routing.register_special(op, _factor_transpose_when_contiguous(op))
    for op in _FACTORY_OF:
        if op not in dispatcher.special:
            routing.register_special(op, _factory_without_reading(dispatcher, op))
