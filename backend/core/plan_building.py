"""Plan building: the program a new call signature runs, its outputs' specs, and its compile record.

Outputs' specs come from torch's meta kernel (arguments the host refuses raise its error), else from
tracing the lowering; a signature neither can say, or whose lowering cannot trace, runs on the host
(`RUNS_ON_HOST`, kept in the plan cache).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputrace.backend.core import arg_checks, rng
from tputrace.backend.core.compile_history import CompileHistory, SiteCompiles
from tputrace.backend.core.dtypes import to_torch
from tputrace.backend.core.entries import OpEntry
from tputrace.backend.core.executor import Executor
from tputrace.backend.core.length_recompiles import LengthRecompiles
from tputrace.backend.core.memory_formats import corrected_meta
from tputrace.backend.core.plans import STORAGE_ORDER, OutSpec, Plan, array_function, flatten_nested, out_specs_from_meta, rebuild
from tputrace.backend.core.tensor import TpuTensor, geometry_of
from tputrace.backend.indexing import mask_indexing
from tputrace.recording.interface import Recording

RUNS_ON_HOST = object()  # plan-cache marker: this signature runs on the CPU


class PlanBuilding:
    """The Dispatcher's plan building and compile records (a mixin)."""

    executor: Executor
    recorder: Recording | None
    plans: dict[Any, Any]
    plan_lock: threading.RLock
    structures: dict[Any, CompileHistory]
    length_recompiles: LengthRecompiles
    site_compiles: SiteCompiles
    first_chips: dict[tuple[Any, tuple], int]

    def _make_plan(self, entry: OpEntry, key: Any, template_args: tuple, template_kwargs: tuple, dynamic: list, specs: list, originals: list, chip: int, precision: str | None = None) -> Any:
        with self.plan_lock:
            plan = self.plans.get(key)
            if plan is not None:
                return plan
            plan = self._build_plan(entry, key, template_args, template_kwargs, dynamic, specs, originals, chip, precision)
            self.plans[key] = plan
            return plan

    def _build_plan(self, entry: OpEntry, key: Any, template_args: tuple, template_kwargs: tuple, dynamic: list, specs: list, originals: list, chip: int, precision: str | None = None) -> Any:
        kwargs_template = dict(template_kwargs)
        if entry.shapes_from_lowering:
            out_specs, structure = _lowering_outputs(entry, template_args, kwargs_template, dynamic)
        else:
            outputs = self._checked_outputs(entry, template_args, kwargs_template, dynamic, originals)
            if outputs is None:
                return RUNS_ON_HOST
            out_specs, structure = outputs
        n_inputs = len(dynamic) - 2 if entry.lowering.needs_key else len(dynamic)
        extra_kwargs = None
        if entry.lowering.needs_key:
            extra_kwargs = lambda dyn: {"key": rng.key_from(dyn[n_inputs], dyn[n_inputs + 1])}  # noqa: E731
        fn = array_function(entry.lowering.fn, template_args, kwargs_template, out_specs, entry.name, extra_kwargs, precision)
        plan = Plan(entry.name, fn, out_specs, structure, tuple(specs), chip, (entry.op, template_args, template_kwargs), matmul_precision=precision)
        try:
            self.executor.prepare(plan, dynamic)
        except Exception as error:  # noqa: BLE001 - a lowering that cannot trace: run on the host
            if entry.op not in mask_indexing.ROUTES:  # else `fallback` warns if the chip route leaves the call
                self._warn_fallback(entry.name, f"its lowering failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
            return RUNS_ON_HOST
        return plan

    def _checked_outputs(self, entry: OpEntry, template_args: tuple, kwargs_template: dict, dynamic: list, originals: list) -> tuple[tuple, Any] | None:
        """The outputs' specs from torch's meta kernel, else from the lowering; arguments the host
        refuses raise its error; None if neither can say (the signature runs on the host)."""
        call_args, call_kwargs = rebuild(template_args, originals), rebuild(kwargs_template, originals)
        refusal = arg_checks.dtype_refusal(entry.op, call_args, call_kwargs) or arg_checks.kernel_dtype_refusal(entry.op, call_args, call_kwargs)
        if refusal is not None:
            raise refusal from None
        try:
            return self._meta_outputs(entry, template_args, kwargs_template, originals)
        except Exception as meta_error:  # noqa: BLE001 - bad arguments, or no usable meta kernel: ask the host, then the lowering
            if not isinstance(meta_error, NotImplementedError):
                # The host check reads the inputs (a flush in DeferAndFuse): the values this op
                # already collected must come out of that flush.
                dynamic[:] = self.executor.materialize(dynamic, "value_check")
                refusal = arg_checks.host_refusal(self.to_host, entry.op, call_args, call_kwargs)
                if refusal is not None:
                    raise refusal from None
            try:
                return _lowering_outputs(entry, template_args, kwargs_template, dynamic)
            except Exception:  # noqa: BLE001 - neither works
                return None

    def _meta_outputs(self, entry: OpEntry, template_args: tuple, template_kwargs: dict, originals: list) -> tuple[tuple, str]:
        metas = [meta_like(value) for value in originals]
        meta_args = rebuild(template_args, metas)
        meta_kwargs = rebuild(template_kwargs, metas)
        if "device" in meta_kwargs:
            meta_kwargs["device"] = torch.device("meta")
        result = corrected_meta(entry.op, meta_args, entry.op(*meta_args, **meta_kwargs))
        return out_specs_from_meta(result)

    def _storage_plan(self, value: Any, spec: OutSpec, chip: int) -> Plan:
        """The program that transposes a value of this spec into its buffer's storage order."""
        key = ("storage order", spec.shape, spec.dtype, spec.storage_order, chip)
        plan = self.plans.get(key)
        if plan is None:
            with self.plan_lock:
                order = spec.storage_order
                storage_shape = tuple(spec.shape[dim] for dim in order)

                def to_storage_order(logical: Any) -> tuple:
                    return (jnp.transpose(logical, order),)

                out_spec = OutSpec(storage_shape, spec.dtype, spec.jax_dtype, spec.nbytes)
                plan = Plan(STORAGE_ORDER, to_storage_order, (out_spec,), "single", ((spec.shape, spec.dtype),), chip, ("storage order", order))
                self.executor.prepare(plan, [value])
                self.plans[key] = plan
        return plan

    def compile_reason(self, structure_key: Any, in_specs: tuple, names: Sequence[str] | None = None, precision: str | None = None,
                       *, evicted: bool = False) -> tuple[str, str | None]:
        """Why this structure compiles (`CompileHistory.reason`)."""
        history = self.structures.get(structure_key)
        if history is None:
            history = self.structures[structure_key] = CompileHistory()
        return history.reason(in_specs, names, precision, evicted=evicted)

    def record_compile(self, plan: Plan, kind: str, *, evicted: bool = False) -> None:
        """Tell the recorder about a new single-op program: first compile or recompile with its reason
        (a program like an earlier one but for a new data-dependent length says so: `length_recompiles`)."""
        recorder = self.recorder
        line = recorder.frame_id() if recorder is not None and recorder.enabled else None
        history = self.structures.get(plan.structure_key)
        same_signature = history is not None and history.compiled_for(plan.in_specs)
        reason, diff = self.compile_reason(plan.structure_key, plan.in_specs, precision=plan.matmul_precision, evicted=evicted)
        step = recorder.step_index if recorder is not None and line is not None else 0
        module = recorder.module_sid() if recorder is not None and line is not None else None
        site_reason = self.site_compiles.signature_reason(plan.structure_key, line, step, plan.in_specs, plan.matmul_precision,
                                                          module)
        if reason == "recompile" and not evicted and not same_signature:
            reason, diff = site_reason  # new shapes: a recompile only of this structure's program at this line
        first_chip = self.first_chips.setdefault((plan.structure_key, plan.in_specs), plan.chip)
        if reason == "recompile" and same_signature and not evicted and first_chip != plan.chip:
            diff = f"chip: tpu:{first_chip} -> tpu:{plan.chip} (a program is compiled per chip)"
        by_length = self.length_recompiles.reason(plan.structure_key, plan.in_specs, line, step)
        if reason == "first" and by_length is not None:
            reason, diff = by_length
        if reason == "first" and recorder is not None and recorder.enabled and kind == "op" and _is_op_key(plan.structure_key):
            reason, diff = self.site_compiles.reason((plan.structure_key[0], line), recorder.step_index, plan.structure_key)
        if recorder is not None:
            detail = {"matmul_precision": plan.matmul_precision} if plan.matmul_precision else None
            recorder.compiled(plan, kind, reason, diff, detail=detail)


def _lowering_outputs(entry: OpEntry, template_args: tuple, template_kwargs: dict, dynamic: list) -> tuple[tuple, str | tuple[int | None, ...]]:
    """Output specs from tracing the lowering abstractly, for ops whose meta kernel refuses the inputs
    or that have none (`_sample_dirichlet`); a random op's key is derived from its traced seed and
    counter, the last two dynamic values, as in its plan. An output the lowering leaves None (an
    undefined tensor: `_thnn_fused_gru_cell_backward`'s bias gradients without biases) has no spec,
    as when a meta kernel returns None."""
    avals = [jax.ShapeDtypeStruct(value.shape, value.dtype) if hasattr(value, "shape") else value for value in dynamic]
    n_inputs = len(avals) - 2 if entry.lowering.needs_key else len(avals)

    def run(*values: Any) -> Any:
        extra = {"key": rng.key_from(values[n_inputs], values[n_inputs + 1])} if entry.lowering.needs_key else {}
        return entry.lowering.fn(*rebuild(template_args, values), **rebuild(template_kwargs, values), **extra)

    result = jax.eval_shape(run, *avals)
    results = result if isinstance(result, (tuple, list)) else (result,)
    structure: str | tuple[int | None, ...] = "single" if not isinstance(result, (tuple, list)) else "tuple"
    if any(isinstance(out, (tuple, list)) for out in results):
        structure = tuple(len(out) if isinstance(out, (tuple, list)) else None for out in results)
        results = flatten_nested(results)
    specs = tuple(
        None if out is None else OutSpec(tuple(out.shape), to_torch(out.dtype), out.dtype, int(np.prod(out.shape, dtype=np.int64)) * out.dtype.itemsize)
        for out in results
    )
    return specs, structure


def _is_op_key(structure_key: Any) -> bool:
    """Whether a plan's structure key is an ATen op's (op, arguments, keyword arguments), not a view
    chain's or an internal program's."""
    return isinstance(structure_key, tuple) and len(structure_key) == 3 and isinstance(structure_key[0], torch._ops.OpOverload)


def meta_like(value: Any) -> Any:
    """A meta tensor for each tpu tensor in a value (lists and tuples followed), for meta kernels: a
    channels-last tensor's has its strides (the output's strides follow them), any other is contiguous."""
    if isinstance(value, TpuTensor):
        geom = value._geom or geometry_of(value)
        if geom.memory_format is not None:
            return torch.empty_strided(geom.shape, geom.strides, dtype=value.dtype, device="meta")
        return torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(meta_like(item) for item in value)
    return value


def internal_entry(op: Any, fn: Callable) -> OpEntry:
    from tputrace.backend.ops.registry import Lowering

    return OpEntry(op, str(op), "lowered", lowering=Lowering(op, fn))
