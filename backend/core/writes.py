"""Writing ops: in-place ops, `out=` ops and `_foreach_*_` lists, run through their functional forms.

The functional op's result is cast and broadcast into its target as torch's in-place ops do; a result of
the target's dtype and shape is written into it as it is, with no tensor made.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import torch

from tputrace.backend.core import arg_checks, memory
from tputrace.backend.core.arguments import DeviceMismatchError
from tputrace.backend.core.dtypes import cast
from tputrace.backend.core.entries import OpEntry
from tputrace.backend.core.executor import Executor
from tputrace.backend.core.plan_building import internal_entry
from tputrace.backend.core.plans import LoweringError, OutSpec, flatten_nested
from tputrace.backend.core.tensor import TpuTensor
from tputrace.backend.eager.deferred import LazyValue
from tputrace.backend.indexing import padded_reads

aten = torch.ops.aten
_WRITTEN = object()  # `_functional_result`'s answer when it wrote the result into its target

_is_inference = torch._C.TensorBase.is_inference  # without the subclass's Python dispatch: a foreach step asks it of every parameter

# What bumping an inference tensor's version outside inference mode raises (c10's VariableVersion::bump).
_INFERENCE_TENSOR_WRITE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to get a normal tensor "
    "before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for more details."
)


class Writes:
    """The Dispatcher's in-place, `out=` and list writes (a mixin)."""

    executor: Executor

    def _inplace(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        target = args[0]
        if type(target) is not TpuTensor:
            raise DeviceMismatchError(
                f"Expected all tensors to be on the same device, but found {target.device} and tpu: "
                f"{entry.name} writes into a {target.device} tensor; move the tpu tensor with .to('{target.device}') or write into a tpu tensor"
            )
        arg_checks.check_write(target, (*args[1:], *kwargs.values()), entry.op)
        if entry.lowering is not None:
            result = self.compute(entry, args, kwargs)
        elif entry.functional is not None:
            result = self._functional_result(entry, args, kwargs, into=target)
            if result is _WRITTEN:
                return target
        elif entry.decomposition is not None:
            return entry.decomposition(*args, **kwargs)
        else:
            return self.fallback(entry, args, kwargs)
        if isinstance(result, (tuple, list)):
            # The functional op returns one value per written argument (`_amp_update_scale` returns
            # the new scale and growth_tracker_out); the first is `self`'s.
            for position, value in zip(entry.mutated_positions[1:], result[1:]):
                self._assign(args[position], value)
            result = result[0]
        _check_castable(result, target)
        self._assign(target, result)
        return target

    def _functional_entry(self, entry: OpEntry) -> OpEntry:
        """The entry of a writing op's functional form, kept on the writing op's entry (an OpOverload
        hashes in Python: `_entry` of it on every in-place call cost a hash; entries are never replaced)."""
        functional_entry = entry.functional_entry
        if functional_entry is None:
            functional_entry = entry.functional_entry = self._entry(entry.functional)
        return functional_entry

    def _functional_result(self, entry: OpEntry, args: Sequence[Any], kwargs: dict, into: TpuTensor | None = None) -> Any:
        """The result of a writing op's functional form. With `into`, an in-place op's target: a lowered
        result of its dtype and shape is written into it as it is, with no tensor made (`_WRITTEN`)."""
        functional_entry = self._functional_entry(entry)
        if functional_entry.kind != "lowered":
            return self.dispatch(entry.functional, args, kwargs)
        if into is None or padded_reads.cuts_made:
            return self.compute(functional_entry, args, kwargs, record_as=entry.name)
        ran = self._run(functional_entry, args, kwargs, entry.name)
        if ran is None:
            return self.fallback(functional_entry, args, kwargs)
        plan, values, chip = ran
        spec = plan.single_output
        if spec is not None and spec.dtype == into.dtype and spec.shape == into.shape:
            if not self.executor.deferred:  # the result exists beside the target until written, as its tensor did
                memory.running(chip, spec.nbytes)
            self.write(into, values[0])
            return _WRITTEN
        return self._outputs(plan, values, chip)

    def _assign(self, target: TpuTensor, result: Any) -> None:
        """Write a computed tensor into `target`, casting and broadcasting as torch's in-place ops do."""
        if not isinstance(result, TpuTensor):
            raise LoweringError(f"cannot write a {type(result).__name__} into a tpu tensor")
        if result.dtype != target.dtype or result.shape != target.shape:
            result = self._cast_broadcast(result, target)
        self.write(target, self.read(result))

    def _cast_broadcast(self, source: TpuTensor, target: TpuTensor) -> TpuTensor:
        return self.compute(_COPY_ENTRY, (target, source), {}, record_as="aten.copy_.default")

    def _out(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        outs = [kwargs[name] for name in entry.out_names]
        if entry.functional is None or any(not isinstance(out, TpuTensor) for out in outs):
            return self.fallback(entry, args, kwargs)
        inputs = (*args, *(value for name, value in kwargs.items() if name not in entry.out_names))
        for out in outs:
            arg_checks.check_write(out, inputs, entry.op)
        functional_kwargs = {name: value for name, value in kwargs.items() if name not in entry.out_names}
        if entry.factory_out:
            # `torch.eye(n, out=t)` (`nn.init.eye_`), `torch.arange(n, out=t)`: made in the out
            # tensor's dtype on its chip, and resized without a warning, as torch's factories do.
            functional_kwargs.update(dtype=outs[0].dtype, device=outs[0].device)
        result = self._functional_result(entry, args, functional_kwargs)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for out, value in zip(outs, results):
            _check_castable(value, out)
            if tuple(out.shape) != tuple(value.shape):
                if out.numel() != 0 and not entry.factory_out:
                    warnings.warn(
                        f"An output with one or more elements was resized since it had shape {list(out.shape)}, which does not "
                        f"match the required output shape {list(value.shape)} ({entry.name})",
                        UserWarning,
                        stacklevel=2,
                    )
                out.resize_(value.shape)
            self._assign(out, value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _inplace_list(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        """`_foreach_*_`: run the functional op once for the whole list and write each output into its
        target; an output of the target's dtype and shape is written as it is, with no tensor made.

        Each tensor a `_foreach_*_` op writes then has its version counter go up by one, as torch's
        CPU and CUDA kernels bump it (foreach ops have no ADInplaceOrView kernel to do it): an
        optimizer step between a forward and its backward raises autograd's "modified by an inplace
        operation" error."""
        targets = list(args[0])
        # Other written arguments follow the list, as the functional op's outputs do
        # (`_amp_foreach_non_finite_check_and_unscale_` also writes found_inf).
        for position in entry.mutated_positions[1:]:
            written = args[position]
            if isinstance(written, (list, tuple)):
                targets.extend(written)
            else:
                targets.append(written)
        result = self._write_list(entry, targets, args, kwargs)
        if entry.bumps_versions:
            if not torch.is_inference_mode_enabled() and any(map(_is_inference, targets)):
                raise RuntimeError(_INFERENCE_TENSOR_WRITE)  # torch's bump, after the write as there
            torch._C._increment_version(targets)
        return result

    def _write_list(self, entry: OpEntry, targets: list[Any], args: Sequence[Any], kwargs: dict) -> Any:
        """The writes of `_inplace_list`."""
        if entry.functional is None:
            if entry.decomposition is not None:
                return entry.decomposition(*args, **kwargs)
            return self.fallback(entry, args, kwargs)
        for target in targets:
            if type(target) is TpuTensor and target._view is not None:  # only a view can overlap itself
                arg_checks.check_no_internal_overlap(target, entry.op)
        functional_entry = self._functional_entry(entry)
        if functional_entry.kind != "lowered":
            return self._assign_all(targets, self.dispatch(entry.functional, args, kwargs))
        ran = self._run(functional_entry, args, kwargs, entry.name)
        if ran is None:
            return self._assign_all(targets, self.fallback(functional_entry, args, kwargs))
        plan, values, chip = ran
        if _whole_writes(targets, plan.out_specs):
            # No write runs an op, so none can flush: each array goes into its buffer as `write` puts it.
            self.executor.write_whole([target._buf for target in targets], values)
            return None
        with self.executor.holding(values):
            for target, value, spec in zip(targets, values, plan.out_specs):
                if type(value) is LazyValue and value.concrete is not None:
                    value = value.concrete  # an earlier write flushed at the size cap: the array, not a stale pending value
                if spec.dtype == target.dtype and spec.shape == target.shape:
                    self.write(target, value)
                else:
                    # As torch's per-tensor CPU path: the targets before one that refuses the result are written.
                    _check_castable_dtype(spec.dtype, target)
                    self._assign(target, self._new_output(value, spec, chip))
        return None

    def _assign_all(self, targets: Sequence[TpuTensor], results: Sequence[Any]) -> None:
        if isinstance(results, tuple) and any(isinstance(result, (tuple, list)) for result in results):
            results = flatten_nested(results)
        for target, result in zip(targets, results):
            self._assign(target, result)


def _whole_writes(targets: Sequence[Any], specs: Sequence[OutSpec]) -> bool:
    """Whether each output of a `_foreach_*_` replaces its target's whole buffer as it is: every target
    a tpu tensor that is no view, of its output's dtype and shape (read from its geometry where it has
    one: a parameter's or an optimizer state's, kept from its first read; a tensor's `shape` is ~0.5 µs)."""
    for target, spec in zip(targets, specs):
        if type(target) is not TpuTensor or target._view is not None:
            return False
        geom = target._geom
        if geom is None:
            if spec.dtype != target.dtype or spec.shape != target.shape:
                return False
        elif spec.dtype != geom.dtype or spec.shape != geom.shape:
            return False
    return True


def _check_castable(result: Any, target: torch.Tensor) -> None:
    """torch's rule for in-place and `out=` results: an int tensor takes no float result, a bool no int."""
    if isinstance(result, torch.Tensor):
        _check_castable_dtype(result.dtype, target)


def _check_castable_dtype(dtype: torch.dtype, target: torch.Tensor) -> None:
    if dtype != target.dtype and not torch.can_cast(dtype, target.dtype):
        raise RuntimeError(f"result type {_TYPE_NAMES.get(dtype, dtype)} can't be cast to the desired output type {_TYPE_NAMES.get(target.dtype, target.dtype)}")


_TYPE_NAMES = {dtype: name for name, dtype in (("Float", torch.float32), ("Double", torch.float64), ("Half", torch.float16), ("BFloat16", torch.bfloat16), ("Long", torch.int64), ("Int", torch.int32), ("Short", torch.int16), ("Char", torch.int8), ("Byte", torch.uint8), ("Bool", torch.bool), ("ComplexFloat", torch.complex64), ("ComplexDouble", torch.complex128))}


def _copy_lowering(target: Any, source: Any) -> Any:
    return jnp.broadcast_to(cast(source, target.dtype), target.shape)


_COPY_ENTRY = internal_entry(aten.copy.default, _copy_lowering)
