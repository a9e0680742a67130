"""The dispatcher: every ATen op on a tpu tensor arrives here and runs as an XLA program.

An op is classified once (`entries.classify`); each call then splits its arguments into a constant
template and dynamic inputs, finds or builds the `Plan` for that signature, and hands it to the
executor (strict: run now; DeferAndFuse: add to the pending graph). Views, in-place ops, `out=`
ops, decompositions, transfers and the CPU fallback are handled here too, and each of them is
reported to the recorder when one is active.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputrace.backend import arg_checks, chips, data_dependent, device_module, foreach_lists, generators, index_checks, mask_indexing, matmul_precision, memory, padded_reads, rng, sparse, transfers
from tputrace.sourceloc import first_user_location
from tputrace.backend.deferred import LazyValue
from tputrace.backend.dtypes import cast, short_name, to_jax, to_torch
from tputrace.backend.entries import OpEntry, classify
from tputrace.backend.executor import Executor, StrictExecutor
from tputrace.backend.plans import (
    STORAGE_ORDER,
    VIEW_READ,
    VIEW_WRITE,
    LoweringError,
    OutSpec,
    Plan,
    Slot,
    TensorList,
    array_function,
    compile_program,
    flatten_nested,
    out_specs_from_meta,
    rebuild,
    regroup,
)
from tputrace.backend.compile_history import CompileHistory, SiteCompiles
from tputrace.backend.length_recompiles import LengthRecompiles
from tputrace.backend.memory_formats import corrected_meta, storage_order
from tputrace.backend.tensor import Buffer, CountedBuffer, TpuTensor, channels_last_tensor, geometry_of, new_tensor, sync_hint, view_tensor
from tputrace.backend.views import ViewChain, ViewStep, geometry, storage_as
from tputrace.recording.interface import Recording

aten = torch.ops.aten
_VIEW_DTYPE = aten.view.dtype  # bound once: every view op compares its op with it
_perf_ns = time.perf_counter_ns
_float32_matmul_precision = torch._C._get_float32_matmul_precision

_FALLBACK = object()  # plan-cache marker: this signature runs on the CPU
_UNFLATTENED = object()  # `_run`'s marker: the arguments were not flattened yet
_WRITTEN = object()  # `_functional_result`'s answer when it wrote the result into its target
_NO_CONTEXT = contextlib.nullcontext()
_is_inference = torch._C.TensorBase.is_inference  # without the subclass's Python dispatch: a foreach step asks it of every parameter
# What bumping an inference tensor's version outside inference mode raises (c10's VariableVersion::bump).
_INFERENCE_TENSOR_WRITE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to get a normal tensor "
    "before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for more details."
)
_SLOTS = tuple(Slot(index) for index in range(1024))  # a foreach call over 76 parameters reads ~300 values
_N_SLOTS = len(_SLOTS)
_SLOT_TEMPLATES = tuple(_SLOTS[:count] for count in range(65))  # all-dynamic templates of positional calls
_NUMBER_TYPES = (int, float, bool, complex)
_INTS_ONLY = frozenset({int})
_SCALAR_SPECS = {kind: (kind.__name__,) for kind in _NUMBER_TYPES}
# Ops whose output shape depends on the values: when one runs on the host (a call that `data_dependent`
# or `mask_indexing` leaves to it), reading its inputs is a data-dependent sync.
_DATA_DEPENDENT_OPS = frozenset(
    {"aten::nonzero", "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
     "aten::masked_select", "aten::bincount", "aten::histc", "aten::repeat_interleave", "aten::nonzero_static"}
)


def _inference_as(base: TpuTensor) -> contextlib.AbstractContextManager:
    """The mode to make a view of `base` in: a view is an inference tensor exactly when its base is one.

    A wrapper made under `torch.inference_mode()` is an inference tensor, and torch then refuses to give
    the view of a normal tensor its base's version counter ("Cannot set version_counter for inference
    tensor"), as `mask[:, -1]` in `generate` does."""
    is_inference = base.is_inference()
    if is_inference == torch.is_inference_mode_enabled():
        return _NO_CONTEXT
    return torch.inference_mode(is_inference)


class DeviceMismatchError(RuntimeError):
    """Tensors on different chips (or the host) mixed in one op."""


def _tensor_spec(tensor: torch.Tensor) -> tuple:
    return ("tensor", tuple(tensor.shape), short_name(tensor.dtype))


class Dispatcher:
    """Routes ATen ops on tpu tensors to plans, views, writes, decompositions or the CPU fallback."""

    def __init__(self) -> None:
        self.entries: dict[Any, OpEntry] = {}
        self.routes: dict[int, tuple[Callable, Any]] = {}  # by id(op): OpOverload hashes in Python
        self.routed_ops: list[Any] = []  # keeps every routed op alive, so its id stays its own
        self.plans: dict[Any, Any] = {}
        self.structures: dict[Any, CompileHistory] = {}
        self.length_recompiles = LengthRecompiles()  # new data-dependent lengths as recompiles (`record_compile`)
        self.site_compiles = SiteCompiles()  # an op's new non-tensor arguments at a line as recompiles (`record_compile`)
        self.view_plans: dict[Any, Any] = {}
        self.executor: Executor = StrictExecutor(self)
        self.recorder: Recording | None = None
        self.warned_keys: set[str] = set()  # what `_warn_once` has warned about (op names for fallbacks)
        self.worker_errors: list[BaseException] = []
        self.plan_lock = threading.RLock()
        self.thread_lock = threading.RLock()  # held by every op once several user threads dispatch (tensor.py)
        self.special: dict[Any, Callable] = {
            aten._to_copy.default: self._to_copy,
            aten.copy_.default: self._copy_,
            aten._local_scalar_dense.default: self._local_scalar_dense,
            aten.detach.default: self._alias,
            aten.alias.default: self._alias,
            aten.lift_fresh.default: self._alias,
            aten.is_same_size.default: lambda args, kwargs: tuple(args[0].shape) == tuple(args[1].shape),
            aten._has_same_storage_numel.default: lambda args, kwargs: _storage_numel(args[0]) == _storage_numel(args[1]),
            aten.is_pinned.default: lambda args, kwargs: False,
            aten._has_compatible_shallow_copy_type.default: lambda args, kwargs: type(args[0]) is type(args[1]),
        }

    # ----------------------------------------------------------------- entry point
    def register_special(self, op: Any, handler: Callable[[tuple, dict], Any]) -> None:
        """Route an op to `handler(args, kwargs)` (e.g. collectives), replacing any cached route."""
        self.special[op] = handler
        self.routes.pop(id(op), None)

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        route = self.routes.get(id(func))
        if route is None:
            route = self._route(func)
        handler, entry = route
        return handler(entry, args, kwargs)

    def dispatch_on_worker(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Dispatch on autograd's C++ worker thread, where a Python exception would abort the process:
        an error is kept, placeholder outputs of the right shape are returned, and the error is
        raised on the user's thread when backward() returns."""
        try:
            route = self.routes.get(id(func)) or self._route(func)
            return route[0](route[1], args, kwargs)
        except BaseException as error:  # noqa: BLE001 - re-raised by raise_worker_errors
            self.worker_errors.append(error)
            try:
                return self._placeholder_outputs(func, args, kwargs)
            except Exception:  # noqa: BLE001 - no meta kernel (or no chip) to make them: the kept error is the one to raise
                return _undefined_outputs(func)

    def raise_worker_errors(self) -> None:
        if self.worker_errors:
            error = self.worker_errors[0]
            self.worker_errors.clear()
            raise error

    def _placeholder_outputs(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Stand-ins for a failed op's outputs: NaN (integers: zero) tensors of the shapes its meta kernel gives."""
        chip = next((value._buf.chip for value in args if isinstance(value, TpuTensor)), 0)
        result = func(*_meta_like(args), **{name: _meta_like(value) for name, value in kwargs.items()})

        def placeholder(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                host = torch.full(tuple(value.shape), float("nan") if value.dtype.is_floating_point else 0, dtype=value.dtype)
                return self.from_host(host, chip)
            if isinstance(value, (list, tuple)):
                return type(value)(placeholder(item) for item in value)
            return value

        return placeholder(result)

    def _route(self, func: Any) -> tuple[Callable, Any]:
        special = self.special.get(func)
        if special is not None:
            route = (lambda _entry, args, kwargs: special(args, kwargs), None)
        else:
            entry = self._entry(func)
            handlers = {
                "lowered": self.compute,
                "view": self._view,
                "inplace": self._inplace,
                "out": self._out,
                "inplace_list": self._inplace_list,
                "decompose": self._decompose,
                "fallback": self.fallback,
            }
            handler = self._plain_compute(entry) if _is_plain(entry) else handlers[entry.kind]
            sized = data_dependent.ROUTES.get(func)
            if sized is not None:
                handler = self._sized_first(sized, handler)
            handler = mask_indexing.host_mask_route(foreach_lists.route(handler, func), func, self.from_host)
            route = (arg_checks.with_value_checks(func, handler, self), entry)
        self.routes[id(func)] = route
        self.routed_ops.append(func)
        return route

    def _sized_first(self, sized: data_dependent.Route, handler: Callable) -> Callable:
        """An op whose output's length depends on its values (`data_dependent`): the chip computes it
        after the host reads that length; calls the route leaves (None) go to the op's own handler."""

        def run(entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
            result = sized(self, args, kwargs)
            return handler(entry, args, kwargs) if result is None else result

        return run

    # ----------------------------------------------------------------- values
    def read(self, tensor: TpuTensor) -> Any:
        """The tensor's current array (a view is recomputed when its buffer has been written).

        A view's value is kept until its buffer changes; in DeferAndFuse a pending value is reused
        while its graph is pending or once the flush kept it, so a view read N times is one op."""
        view = tensor._view
        buf = tensor._buf
        if view is None:
            return buf.array
        if tensor._cached_version == buf.version:
            cached = tensor._cached
            if type(cached) is not LazyValue:
                return cached
            if cached.concrete is not None:
                return cached.concrete
            if not cached.graph.flushed:
                return cached
        value = self.executor.run(self._chain_plan(view, buf), (buf.array,))[0]
        tensor._cached = value
        tensor._cached_version = buf.version
        return value

    def write(self, tensor: TpuTensor, value: Any) -> None:
        """Replace the tensor's data; a write to a view is scattered into its buffer."""
        buf = tensor._buf
        view = tensor._view
        replaced = buf.array
        if view is None:
            buf.write(value)
        else:
            buf.write(self.executor.run(self._scatter_plan(view, buf), (buf.array, value))[0])
            tensor._cached = value
            tensor._cached_version = buf.version
        if self.executor.deferred:
            self.executor.track(buf, replaced)

    # ----------------------------------------------------------------- argument templates
    def _flatten_general(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> tuple[tuple, tuple, list, list, list, int]:
        """Split any call (keyword arguments, lists, host scalars; mixed chips are an error) into
        (template args, template kwargs, dynamic values, input specs, originals, chip)."""
        dynamic: list[Any] = []
        specs: list[tuple] = []
        originals: list[Any] = []
        chip_box = [-1]
        template_args = tuple(
            self._flatten_value(value, position in entry.scalar_positions, position in entry.scalar_list_positions, dynamic, specs, originals, chip_box)
            for position, value in enumerate(args)
        )
        template_kwargs = tuple(
            (name, self._flatten_value(value, name in entry.scalar_names, name in entry.scalar_list_names, dynamic, specs, originals, chip_box))
            for name, value in kwargs.items()
        )
        return template_args, template_kwargs, dynamic, specs, originals, chip_box[0]

    def _flatten_positional(self, args: Sequence[Any], scalar_positions: frozenset[int]) -> tuple[tuple, list, tuple, int] | None:
        """The common case: positional tpu tensors, Python scalars, constants and lists of constants
        (None if anything else). Returns (template args, dynamic values, input specs, chip). A call
        whose arguments are all dynamic shares one template; others build theirs from the first constant.
        Every op's hot path: a tensor is added as `_append_tensor` adds it, inline (no call per argument),
        and an argument's position is counted from what is built (no `enumerate` tuple per argument)."""
        dynamic: list[Any] = []
        specs: list[tuple] = []
        template: list[Any] | None = None
        chip = -1
        for value in args:
            value_type = type(value)
            if value_type is TpuTensor:
                buf = value._buf
                if chip != buf.chip:
                    if chip != -1:
                        return None
                    chip = buf.chip
                if value._view is None:
                    dynamic.append(buf.array)
                    spec = buf.spec
                    if spec is None:
                        spec = buf.spec = (value.shape, value.dtype)
                    specs.append(spec)
                else:
                    dynamic.append(self.read(value))
                    specs.append((value._geom or geometry_of(value)).spec)
            elif value_type in _NUMBER_TYPES and (len(dynamic) if template is None else len(template)) in scalar_positions:
                dynamic.append(value)  # the position: every argument so far is dynamic, or has its template entry
                specs.append(_SCALAR_SPECS[value_type])
            elif isinstance(value, torch.Tensor):
                return None
            else:
                if value_type is list:
                    if any(isinstance(item, torch.Tensor) for item in value):
                        return None
                    value = tuple(value)
                if template is None:
                    template = list(_SLOTS[: len(dynamic)])  # every earlier argument was dynamic
                template.append(value)
                continue
            if template is not None:
                template.append(_SLOTS[len(dynamic) - 1])
        return _SLOT_TEMPLATES[len(dynamic)] if template is None else tuple(template), dynamic, tuple(specs), chip

    def _flatten_value(self, value: Any, is_scalar: bool, is_scalar_list: bool, dynamic: list, specs: list, originals: list, chip_box: list) -> Any:
        if isinstance(value, TpuTensor):
            chip = value._buf.chip
            if chip_box[0] == -1:
                chip_box[0] = chip
            elif chip != chip_box[0]:
                raise DeviceMismatchError(
                    f"Expected all tensors to be on the same device, but found tpu:{chip_box[0]} and tpu:{chip}; "
                    f"move one with .to('tpu:{chip_box[0]}')"
                )
            slot = _SLOTS[len(dynamic)] if len(dynamic) < _N_SLOTS else Slot(len(dynamic))
            self._append_tensor(value, dynamic, specs)
            originals.append(value)
            return slot
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 and value.device.type == "cpu":
                slot = Slot(len(dynamic))
                scalar = value.item()
                dynamic.append(scalar)
                specs.append((f"{type(scalar).__name__}:{short_name(value.dtype)}",))
                originals.append(value)
                return slot
            raise DeviceMismatchError(
                f"Expected all tensors to be on the same device, but found tpu and {value.device}; "
                f"move the {value.device} tensor with .to('tpu')"
            )
        if is_scalar and isinstance(value, (int, float, bool, complex)):
            slot = Slot(len(dynamic))
            dynamic.append(value)
            specs.append((type(value).__name__,))
            originals.append(value)
            return slot
        if isinstance(value, (list, tuple)):
            if is_scalar_list:
                return self._flatten_scalar_list(value, dynamic, specs, originals, chip_box)
            if (value and type(value[0]) is TpuTensor) or any(isinstance(item, torch.Tensor) for item in value):
                return self._flatten_tensor_list(value, dynamic, specs, originals, chip_box)
            return tuple(value)
        return value

    def _append_tensor(self, tensor: TpuTensor, dynamic: list, specs: list) -> None:
        """Add a tpu tensor's current value and its (shape, dtype) spec to a call's dynamic inputs."""
        if tensor._view is None:
            buf = tensor._buf
            dynamic.append(buf.array)
            spec = buf.spec
            if spec is None:
                spec = buf.spec = (tensor.shape, tensor.dtype)
            specs.append(spec)
        else:
            dynamic.append(self.read(tensor))
            specs.append((tensor._geom or geometry_of(tensor)).spec)

    def _flatten_tensor_list(self, items: Sequence[Any], dynamic: list, specs: list, originals: list, chip_box: list) -> TensorList:
        """A list of tensors (a `_foreach_*` list, `cat`'s inputs, indices): tpu tensors on the call's
        chip are taken directly; anything else (host tensors, copied to the chip; None; another
        chip's tensor, an error) goes through `_flatten_value`."""
        host_chip = max(chip_box[0], 0)
        slots = []
        for item in items:
            if type(item) is TpuTensor and (chip_box[0] == item._buf.chip or chip_box[0] == -1):
                buf = item._buf
                chip_box[0] = buf.chip
                index = len(dynamic)
                slots.append(_SLOTS[index] if index < _N_SLOTS else Slot(index))
                originals.append(item)
                if item._view is None:  # `_append_tensor`'s first case, inline: every element of a `_foreach_*` list
                    dynamic.append(buf.array)
                    spec = buf.spec
                    if spec is None:
                        spec = buf.spec = (item.shape, item.dtype)
                    specs.append(spec)
                else:
                    self._append_tensor(item, dynamic, specs)
            else:
                slots.append(self._flatten_value(self._index_on_chip(item, host_chip), False, False, dynamic, specs, originals, chip_box))
        return TensorList(slots)

    def _flatten_scalar_list(self, items: Sequence[Any], dynamic: list, specs: list, originals: list, chip_box: list) -> tuple:
        """A list of Scalars (e.g. a `_foreach_*` ScalarList): Python numbers become dynamic inputs."""
        slots = []
        for item in items:
            spec = _SCALAR_SPECS.get(type(item))
            if spec is None:
                slots.append(self._flatten_value(item, True, False, dynamic, specs, originals, chip_box))
                continue
            index = len(dynamic)
            slots.append(_SLOTS[index] if index < _N_SLOTS else Slot(index))
            dynamic.append(item)
            specs.append(spec)
            originals.append(item)
        return tuple(slots)

    def _index_on_chip(self, value: Any, chip: int) -> Any:
        """Tensors in a list argument (e.g. the indices of `x[idx]`) may live on the host, as torch
        allows for accelerators: they are copied to the chip."""
        if isinstance(value, torch.Tensor) and not isinstance(value, TpuTensor) and value.dim() > 0 and value.device.type == "cpu":
            return self.from_host(value, chip)
        return value

    # ----------------------------------------------------------------- functional ops
    def compute(self, entry: OpEntry, args: Sequence[Any], kwargs: dict, record_as: str | None = None, flat: Any = _UNFLATTENED) -> Any:
        """Run a lowered functional op and wrap its outputs as tpu tensors (`flat`: what
        `_flatten_positional` gave for these arguments already)."""
        if padded_reads.cuts_made and any(map(padded_reads.is_cut, args)):
            padded = padded_reads.on_padded(self, entry, args, kwargs, record_as)  # `x[mask] * 2`, `x[mask].sum()`
            if padded is not None:
                return padded
        ran = self._run(entry, args, kwargs, record_as, flat)
        if ran is None:
            return self.fallback(entry, args, kwargs)
        return self._outputs(*ran)

    def _plain_compute(self, entry: OpEntry) -> Callable[[OpEntry, Sequence[Any], dict], Any]:
        """`compute` for a plain op (`_is_plain`), the route of most ops: a positional call whose plan
        is cached runs with one call to flatten its arguments and one to the executor, and a single
        output is wrapped inline. Any other call (keywords, a data-dependent cut, a new signature, a
        host fallback) goes on to `compute` with what was flattened."""
        flatten = self._flatten_positional
        scalar_positions = entry.scalar_positions
        plans = self.plans
        by_precision = entry.lowering.matmul_precision
        compute = self.compute
        name = entry.name

        def compute_plain(entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
            if kwargs or (padded_reads.cuts_made and any(map(padded_reads.is_cut, args))):
                return compute(entry, args, kwargs)
            start = _perf_ns() if self.recorder is not None else None
            flat = flatten(args, scalar_positions)
            if flat is None:
                return compute(entry, args, kwargs, None, flat)
            template_args, dynamic, specs, chip = flat
            if chip == -1:
                return compute(entry, args, kwargs, None, flat)
            if by_precision:
                plan = plans.get((entry, template_args, (), specs, chip, _matmul_precision_setting()))
            else:
                plan = plans.get((entry, template_args, (), specs, chip))
            if plan is None or plan is _FALLBACK:
                return compute(entry, args, kwargs, None, flat)
            executor = self.executor
            values = executor.run(plan, dynamic, name, start)
            spec = plan.single_output
            if spec is None:
                return self._outputs(plan, values, chip)
            if executor.deferred:
                output = new_tensor(values[0], chip, spec.buffer_spec, 0)
                executor.own(output._buf)
                return output
            return new_tensor(values[0], chip, spec.buffer_spec, spec.nbytes)

        return compute_plain

    def _outputs(self, plan: Plan, values: Sequence[Any], chip: int) -> Any:
        """A plan's output values as tpu tensors, in the structure the op returns."""
        spec = plan.single_output
        if spec is not None:
            return self._new_output(values[0], spec, chip)
        structure = plan.out_structure
        if structure == "single":
            return self._channels_last_output(values[0], plan.out_specs[0], chip)
        outputs = [None if spec is None else self._new_output(value, spec, chip) for value, spec in zip(values, plan.out_specs)]
        if structure == "tuple":
            return tuple(outputs)
        return outputs if structure == "list" else regroup(outputs, structure)

    def _new_output(self, value: Any, spec: OutSpec, chip: int) -> TpuTensor:
        """A new tpu tensor for one output value of a plan (in DeferAndFuse, one the flush fills in).
        `_plain_compute`'s route does the same inline for a single output (every op's hot path)."""
        if spec.storage_order is not None:
            return self._channels_last_output(value, spec, chip)
        executor = self.executor
        if executor.deferred:
            output = new_tensor(value, chip, spec.buffer_spec, 0)
            executor.own(output._buf)
            return output
        return new_tensor(value, chip, spec.buffer_spec, spec.nbytes)

    def _channels_last_output(self, value: Any, spec: OutSpec, chip: int) -> TpuTensor:
        """A channels-last output: its buffer holds the value's dims in storage order (one transpose,
        fused in DeferAndFuse); the tensor keeps the value itself for its next read."""
        executor = self.executor
        stored = executor.run(self._storage_plan(value, spec, chip), (value,))[0]
        storage_shape = tuple(spec.shape[dim] for dim in spec.storage_order)
        buf = Buffer(stored, chip, (storage_shape, spec.dtype)) if executor.deferred else CountedBuffer(stored, chip, spec.nbytes, (storage_shape, spec.dtype))
        if executor.deferred:
            executor.own(buf)
        output = channels_last_tensor(buf, spec.shape, spec.strides, spec.dtype, spec.storage_order)
        output._cached = value
        output._cached_version = buf.version
        return output

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

    def _run(self, entry: OpEntry, args: Sequence[Any], kwargs: dict, record_as: str | None, flat: Any = _UNFLATTENED) -> tuple[Plan, tuple, int] | None:
        """Run (or record) a lowered op: its plan, output values and chip; None if it runs on the host.
        Its start is read only for the recorder (None: the executor reads no clock). `flat`: what
        `_flatten_positional` gave for these arguments already (a view's read is recorded once)."""
        start = _perf_ns() if self.recorder is not None else None
        generator = None
        if entry.generator_arg is not None:
            args, kwargs, generator = _take_generator(entry.generator_arg, args, kwargs)
        if flat is not _UNFLATTENED:
            fast = flat
        else:
            fast = self._flatten_positional(args, entry.scalar_positions) if not kwargs and entry.simple_args else None
        if fast is None:
            template_args, template_kwargs, dynamic, specs, originals, chip = self._flatten_general(entry, args, kwargs)
            specs = tuple(specs)
        else:
            template_args, dynamic, specs, chip = fast
            template_kwargs = ()
            originals = None
        if chip == -1:
            chip = device_module.chip_index(kwargs.get("device"))
        key = (entry, template_args, template_kwargs, specs, chip)
        if entry.typed_constants:
            key += (tuple(type(value) for value in template_args),)
        if entry.lowering.matmul_precision:  # the setting keys every dtype's plan: one C call, no dtype test
            key += (_matmul_precision_setting(),)
        plan = self.plans.get(key)
        if entry.lowering.needs_key:
            dynamic.extend(rng.next_seed_and_counter(chip) if generator is None else generators.next_seed_and_counter(generator))
        if plan is None:
            if originals is None:
                originals = _positional_originals(args, entry.scalar_positions)
            precision = matmul_precision.of_call(specs) if entry.lowering.matmul_precision else None
            plan = self._make_plan(entry, key, template_args, template_kwargs, dynamic, list(specs), originals, chip, precision)
            if start is not None:
                start = _perf_ns()
        if plan is _FALLBACK:
            return None
        return plan, self.executor.run(plan, dynamic, record_as or entry.name, start), chip

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
                return _FALLBACK
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
            return _FALLBACK
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
        metas = [_meta_like(value) for value in originals]
        meta_args = rebuild(template_args, metas)
        meta_kwargs = rebuild(template_kwargs, metas)
        if "device" in meta_kwargs:
            meta_kwargs["device"] = torch.device("meta")
        result = corrected_meta(entry.op, meta_args, entry.op(*meta_args, **meta_kwargs))
        return out_specs_from_meta(result)

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
        reason, diff = self.compile_reason(plan.structure_key, plan.in_specs, precision=plan.matmul_precision, evicted=evicted)
        by_length = self.length_recompiles.reason(plan.structure_key, plan.in_specs)
        if reason == "first" and by_length is not None:
            reason, diff = by_length
        recorder = self.recorder
        if reason == "first" and recorder is not None and recorder.enabled and kind == "op" and _is_op_key(plan.structure_key):
            reason, diff = self.site_compiles.reason((plan.structure_key[0], recorder.frame_id()), recorder.step_index, plan.structure_key)
        if recorder is not None:
            detail = {"matmul_precision": plan.matmul_precision} if plan.matmul_precision else None
            recorder.compiled(plan, kind, reason, diff, detail=detail)

    # ----------------------------------------------------------------- views
    def _view(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        base = args[0]
        if entry.op is _VIEW_DTYPE and (args[1] if len(args) > 1 else kwargs["dtype"]) == base.dtype:
            entry, args, kwargs = self._entry(aten.alias.default), (base,), {}  # a view as its own dtype is an alias
        geom = base._geom or geometry_of(base)
        key = (entry, _static_args(args), tuple((name, _static(value)) for name, value in kwargs.items()) if kwargs else (), geom)
        cached = self.view_plans.get(key)
        if cached is None:
            cached = self.view_plans[key] = self._build_view(entry, args, kwargs, base)
        if cached is _FALLBACK:
            return self.fallback(entry, args, kwargs)
        buf = base._buf
        parent = base._view
        if parent is not None and cached and cached[0][0].absolute:
            # `as_strided` of a cut's own strides addresses its value, not its buffer; of a dtype view, the
            # storage read as its dtype
            source = padded_reads.own_strides_cut(base) if padded_reads.cuts_made else None
            if source is None and to_torch(buf.array.dtype) != base.dtype:
                source = storage_as(base.dtype)
            if source is not None:
                parent, cached = source, tuple((_relative(step), root, out_geom) for step, root, out_geom in cached)
        with _inference_as(base):
            results = [
                view_tensor(buf, out_geom, None if out_geom.dense and _is_whole_array(out_geom, buf.array, step, parent) else root if parent is None else parent.then(step))
                for step, root, out_geom in cached
            ]
        if self.recorder is not None:
            self.recorder.view_op(entry.name, base, results)
        if len(results) == 1 and not isinstance(cached, list):
            return results[0]
        return results

    def _build_view(self, entry: OpEntry, args: Sequence[Any], kwargs: dict, base: TpuTensor) -> Any:
        """The outputs of a view op on a base of this geometry: (step, its chain from the buffer, geometry) each."""
        storage_numel = max(_storage_numel(base), base.storage_offset() + 1)
        meta_base = torch.empty(storage_numel, dtype=base.dtype, device="meta").as_strided(base.shape, base.stride(), base.storage_offset())
        if entry.op is aten.as_strided.default:
            offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
            if offset is None:  # torch's default is the base's own offset; the lowering's is 0
                offset = base.storage_offset()
                args, kwargs = (*args[:3], offset), {}
            arg_checks.check_strided_within_storage(args[1], args[2], offset, base.element_size(), base.untyped_storage().nbytes())
        try:
            result = entry.op(meta_base, *args[1:], **kwargs)
        except RuntimeError:
            raise  # torch's own refusal (e.g. a view the strides do not allow)
        except Exception:  # noqa: BLE001 - no meta kernel: the op runs on the host
            return _FALLBACK
        outputs = result if isinstance(result, (list, tuple)) else [result]
        lowering = entry.lowering.fn
        static_args = tuple(args[1:])
        static_kwargs = dict(kwargs)
        absolute = entry.op is aten.as_strided.default
        chip = base._buf.chip
        layout = []
        for index, meta in enumerate(outputs):
            step = ViewStep(
                lowering,
                static_args,
                static_kwargs,
                index if isinstance(result, (list, tuple)) else None,
                (entry.op, tuple(_static(a) for a in static_args), tuple((k, _static(v)) for k, v in static_kwargs.items()), index),
                absolute,
            )
            out_geom = geometry(tuple(meta.shape), tuple(meta.stride()), meta.storage_offset(), meta.dtype, chip)
            layout.append((step, ViewChain.root(step), out_geom))
        return layout if isinstance(result, (list, tuple)) else tuple(layout)

    def _chain_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        return self._chain_memo(chain, buf, "chain", self._shared_chain_plan)

    def _scatter_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        return self._chain_memo(chain, buf, "scatter", self._shared_scatter_plan)

    @staticmethod
    def _chain_memo(chain: ViewChain, buf: Buffer, kind: str, build: Callable[[ViewChain, Buffer], Plan]) -> Plan:
        """A chain's read or write plan for a buffer of this signature, kept on the chain."""
        array = buf.array
        memo_key = (kind, array.shape, array.dtype, buf.chip)
        plan = chain.plans.get(memo_key)
        if plan is None:
            plan = chain.plans[memo_key] = build(chain, buf)
        return plan

    def _shared_chain_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        """The read plan of every chain with this chain's steps, on a buffer of this signature."""
        key = ("chain", chain.key, buf.array.shape, buf.array.dtype, buf.chip)
        plan = self.plans.get(key)
        if plan is None:
            with self.plan_lock:
                fn = chain.function()
                out = jax.eval_shape(fn, jax.ShapeDtypeStruct(buf.array.shape, buf.array.dtype))[0]
                spec = OutSpec(tuple(out.shape), torch.float32, out.dtype, 0)
                plan = Plan(VIEW_READ, fn, (spec,), "single", ((tuple(buf.array.shape), to_torch(buf.array.dtype)),), buf.chip, ("chain", chain.key))
                self.executor.prepare(plan, [buf.array])
                self.plans[key] = plan
        return plan

    def _shared_scatter_plan(self, chain: ViewChain, buf: Buffer) -> Plan:
        """The write plan of every chain with this chain's steps, into a buffer of this signature."""
        key = ("scatter", chain.key, buf.array.shape, buf.array.dtype, buf.chip)
        plan = self.plans.get(key)
        if plan is None:
            with self.plan_lock:
                fn = chain.scatter_function(tuple(buf.array.shape), buf.array.dtype)
                nbytes = int(np.prod(buf.array.shape, dtype=np.int64)) * np.dtype(buf.array.dtype).itemsize
                spec = OutSpec(tuple(buf.array.shape), to_torch(buf.array.dtype), buf.array.dtype, nbytes)
                view = jax.eval_shape(chain.function(), jax.ShapeDtypeStruct(buf.array.shape, buf.array.dtype))[0]
                plan = Plan(VIEW_WRITE, fn, (spec,), "single", ((tuple(buf.array.shape), to_torch(buf.array.dtype)),), buf.chip, ("scatter", chain.key))
                self.executor.prepare(plan, [buf.array, view])  # the value as a shape: no program compiles to make it
                self.plans[key] = plan
        return plan

    def _alias(self, args: Sequence[Any], kwargs: dict) -> TpuTensor:
        tensor = args[0]
        with _inference_as(tensor):
            alias = view_tensor(tensor._buf, tensor._geom or geometry_of(tensor), tensor._view)
        cached = tensor._cached
        if cached is not None:
            alias._cached = cached
            alias._cached_version = tensor._cached_version
        return alias

    def _decompose(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        """Run a functional op through its decomposition; if that fails, run the op itself on the host."""
        try:
            return entry.decomposition(*args, **kwargs)
        except (DeviceMismatchError, NotImplementedError, RuntimeError, TypeError, ValueError, IndexError) as error:
            if isinstance(error, DeviceMismatchError) or not _is_functional(entry):
                raise
            self._warn_fallback(entry.name, f"its decomposition failed ({type(error).__name__})")
            return self.fallback(entry, args, kwargs)

    # ----------------------------------------------------------------- writes
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

    def _entry(self, op: Any) -> OpEntry:
        entry = self.entries.get(op)
        if entry is None:
            entry = self.entries.setdefault(op, classify(op))
        return entry

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
            executor = self.executor
            deferred = executor.deferred
            for target, value in zip(targets, values):
                buf = target._buf
                replaced = buf.array
                buf.write(value)
                if deferred:
                    executor.track(buf, replaced)
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

    # ----------------------------------------------------------------- transfers and syncs
    def _to_copy(self, args: Sequence[Any], kwargs: dict) -> torch.Tensor:
        source = args[0]
        device = kwargs.get("device")
        dtype = kwargs.get("dtype") or source.dtype
        if device is not None and torch.device(device).type == "meta":
            return _meta_copy(source, kwargs)
        memory_format = kwargs.get("memory_format")
        if device is not None and torch.device(device).type == "cpu":
            host = self.to_host(source, sync_hint() or "cpu")
            host = host if host.dtype == dtype else host.to(dtype)
            if memory_format is not None or (source._geom or geometry_of(source)).memory_format is not None:
                host = _with_host_layout(host, source, kwargs)
            return host
        target_chip = source._buf.chip if device is None or torch.device(device).index is None else torch.device(device).index
        if target_chip != source._buf.chip:
            source = self.copy_to_chip(source, target_chip)
            if dtype == source.dtype and memory_format in (None, torch.preserve_format, torch.contiguous_format):
                return source
        convert_kwargs = {"dtype": dtype} if memory_format is None else {"dtype": dtype, "memory_format": memory_format}
        return self.compute(_CONVERT_ENTRY, (source,), convert_kwargs, record_as="aten._to_copy.default")

    def _copy_(self, args: Sequence[Any], kwargs: dict) -> torch.Tensor:
        target, source = args[0], args[1]
        if not isinstance(target, TpuTensor):
            host = self.to_host(source, sync_hint() or "cpu")
            with torch._C._DisableTorchDispatch():
                target.copy_(host)
            return target
        if not isinstance(source, TpuTensor):
            host = source.detach().to(target.dtype).expand(target.shape).contiguous()
            self.write(target, self.to_chip(host, target._buf.chip))
            return target
        arg_checks.check_write(target, (source,), aten.copy_.default)
        if source._buf.chip != target._buf.chip:
            source = self.copy_to_chip(source, target._buf.chip)
        if source.dtype == target.dtype and tuple(source.shape) == tuple(target.shape):
            self.write(target, self.read(source))
        else:
            self.write(target, self.read(self._cast_broadcast(source, target)))
        return target

    def _local_scalar_dense(self, args: Sequence[Any], kwargs: dict) -> Any:
        tensor = args[0]
        host = self.to_host(tensor, sync_hint() or "item")
        return host.item()

    def to_host(self, tensor: TpuTensor, sync_kind: str) -> torch.Tensor:
        """A CPU copy of a tpu tensor: the host waits for the chip (a sync) and copies (a transfer);
        an index out of range on the chip since the last sync raises here (see `index_checks`)."""
        self.raise_worker_errors()
        start = _perf_ns()
        cut = padded_reads.host_cut(tensor)  # a data-dependent output: its padded buffer, cut here
        value, pending = self.executor.concrete(self.read(tensor) if cut is None else tensor._buf.array, sync_kind)
        jax.block_until_ready(value)
        index_checks.raise_if_out_of_range(self.recorder, tensor._buf.chip)
        stall_end = _perf_ns()
        host = transfers.array_to_torch(value, tensor.dtype, cut)
        end = _perf_ns()
        if self.recorder is not None:
            nbytes = host.numel() * host.element_size() if cut is None else value.nbytes
            self.recorder.synced(sync_kind, tensor._buf.chip, start, stall_end - start, pending)
            self.recorder.transferred("d2h", nbytes, tensor._buf.chip, -1, stall_end, end - stall_end)
        return host

    def to_chip(self, host: torch.Tensor, chip: int) -> Any:
        start = _perf_ns()
        array = transfers.torch_to_array(host, chips.device(chip))
        if self.recorder is not None:
            self.recorder.transferred("h2d", host.numel() * host.element_size(), -1, chip, start, _perf_ns() - start)
        if self.executor.deferred:
            self.executor.arrived(array)
        return array

    def copy_to_chip(self, tensor: TpuTensor, chip: int) -> TpuTensor:
        """A copy on another chip; the transfer's time starts after the pending work that makes the
        value has run (its flush and compile are recorded as such, not as transfer time)."""
        value = self.executor.concrete(self.read(tensor), "transfer")[0]
        start = _perf_ns()
        array = jax.device_put(value, chips.device(chip))
        nbytes = tensor.numel() * tensor.element_size()
        if self.recorder is not None:
            self.recorder.transferred("d2d", nbytes, tensor._buf.chip, chip, start, _perf_ns() - start)
        return TpuTensor(CountedBuffer(array, chip, nbytes), tuple(tensor.shape), tensor.dtype)

    def from_host(self, host: torch.Tensor, chip: int) -> TpuTensor:
        """A new tpu tensor holding a copy of a CPU tensor (a sparse one densified: see `sparse`); a
        channels-last one stays channels-last."""
        if host.layout != torch.strided:
            sparse.warn_dense(host.layout)
            host = host.to_dense()
        order = storage_order(tuple(host.shape), tuple(host.stride())) if host.dim() in (4, 5) else None
        if order is not None:
            stored = host.detach().permute(order)  # contiguous: the host tensor's own storage order
            buf = CountedBuffer(self.to_chip(stored, chip), chip, host.numel() * host.element_size())
            return channels_last_tensor(buf, tuple(host.shape), tuple(host.stride()), host.dtype, order)
        host = host.detach().contiguous()
        array = self.to_chip(host, chip)
        return TpuTensor(CountedBuffer(array, chip, host.numel() * host.element_size()), tuple(host.shape), host.dtype)

    # ----------------------------------------------------------------- CPU fallback
    def fallback(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        """Run the op on the host CPU: inputs copied out, outputs (and mutated inputs) copied back."""
        if entry.op.namespace == "c10d":
            raise RuntimeError(
                f"{entry.name} on tpu tensors in a process group without the 'tpu' backend (made before "
                "`import tputrace.backend`?): import tputrace.backend before init_process_group/new_group, or pass backend='tpu'"
            )
        on_chip = mask_indexing.ROUTES.get(entry.op)
        if on_chip is not None and (selected := on_chip(self, args, kwargs)) is not None:
            return selected  # `x[mask]`: indexed on the chip by the mask's set positions
        self._warn_fallback(entry.name, "it has no lowering" if entry.lowering is None else "its lowering cannot take these inputs (e.g. a data-dependent shape)")
        sync_kind = "data_dependent" if entry.op._schema.name in _DATA_DEPENDENT_OPS else "fallback"
        start = _perf_ns()
        chip_box = [0]
        to_cpu = {}

        def host_of(value: Any) -> Any:
            if isinstance(value, TpuTensor):
                chip_box[0] = value._buf.chip
                host = self.to_host(value, sync_kind)
                memory_format = (value._geom or geometry_of(value)).memory_format
                if memory_format is not None:  # the CPU kernel's outputs follow its inputs' format
                    host = host.contiguous(memory_format=memory_format)
                to_cpu[id(host)] = value
                return host.requires_grad_(False)
            if isinstance(value, torch.Generator):
                return generators.host_generator(value)
            if isinstance(value, (list, tuple)):
                return type(value)(host_of(item) for item in value)
            return value

        host_args = host_of(args)
        host_kwargs = {name: host_of(value) for name, value in kwargs.items()}
        if "device" in host_kwargs:
            host_kwargs["device"] = torch.device("cpu")
        transferred = [host_kwargs[name] for name in entry.out_names if isinstance(host_kwargs.get(name), torch.Tensor)]
        for host in transferred:  # out= tensors the kernel may resize need storage torch owns
            if id(host) in to_cpu:
                resizable = host.clone()
                to_cpu[id(resizable)] = to_cpu[id(host)]
                host_kwargs[next(name for name in entry.out_names if host_kwargs.get(name) is host)] = resizable
        result = entry.op(*host_args, **host_kwargs)
        chip = chip_box[0]
        for host in _written_hosts(entry, host_args, host_kwargs):
            target = to_cpu.get(id(host))
            if target is not None:
                if tuple(host.shape) != tuple(target.shape):
                    target.resize_(host.shape)
                self.write(target, self.to_chip(host.to(target.dtype).contiguous(), target._buf.chip))

        def back(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                target = to_cpu.get(id(value))
                return target if target is not None else self.from_host(value, chip)
            if isinstance(value, (list, tuple)):
                return type(value)(back(item) for item in value)
            return value

        output = back(result)
        if self.recorder is not None:
            inputs = ", ".join(
                f"{short_name(value.dtype)}[{','.join(map(str, value.shape))}]" for value in args if isinstance(value, torch.Tensor)
            )
            self.recorder.fell_back(entry.name, inputs, chip, start, _perf_ns() - start)
        return output

    def _warn_fallback(self, op_name: str, why: str) -> None:
        self._warn_once(op_name, f"tputrace: {op_name} runs on the host CPU because {why}; it is counted as a CPU fallback")

    def _warn_once(self, key: str, message: str) -> None:
        """Warn once per key, at the user's line that led here."""
        if key in self.warned_keys:
            return
        self.warned_keys.add(key)
        location = first_user_location(2)
        if location is None:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        else:
            warnings.warn_explicit(message, RuntimeWarning, location[0], location[1])


# Views that only reorder or relabel dims: a dense chain of them of the buffer's shape is the array itself. (Not the
# value-changing views, `_conj` and `_neg_view`, nor `narrow` or `slice`, which mark a data-dependent cut's chain.)
_LAYOUT_VIEWS = frozenset({aten.t.default, aten.transpose.int, aten.permute.default, aten.detach.default, aten.alias.default, aten.view.default, aten._unsafe_view.default})


_RELATIVE_STEPS: dict[int, ViewStep] = {}  # id(step) -> its relative step (steps live as long as the view plans)


def _relative(step: ViewStep) -> ViewStep:
    """`step` (an `as_strided`) applied to the value of the chain before it instead of the buffer; one
    shared step per step, so that the chains it ends are shared too."""
    relative = _RELATIVE_STEPS.get(id(step))
    if relative is None:
        relative = _RELATIVE_STEPS[id(step)] = dataclasses.replace(step, absolute=False)
    return relative


def _is_whole_array(geom: Any, array: Any, step: ViewStep, parent: ViewChain | None) -> bool:
    """Whether a dense view of this geometry, made by `step` after `parent`, is its buffer's array
    as it is (same shape and dtype, layout views only; e.g. `w.t().t()`, a weight's gradient): such
    a view reads and writes the array with no program."""
    if geom.shape != tuple(array.shape) or to_jax(geom.dtype) != array.dtype:
        return False
    steps = (step,) if parent is None else (*parent.steps, step)
    return all(chain_step.key[0] in _LAYOUT_VIEWS for chain_step in steps)


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


def _storage_numel(tensor: torch.Tensor) -> int:
    """Elements the tensor's storage holds (forward-mode AD compares a tangent's with its primal's)."""
    return tensor.untyped_storage().nbytes() // tensor.element_size()


def _positional_originals(args: Sequence[Any], scalar_positions: frozenset[int]) -> list[Any]:
    """The arguments behind `_flatten_positional`'s dynamic values, in order (for meta kernels)."""
    return [
        value for position, value in enumerate(args)
        if type(value) is TpuTensor or (type(value) in _NUMBER_TYPES and position in scalar_positions)
    ]


def _written_hosts(entry: OpEntry, host_args: Sequence[Any], host_kwargs: dict) -> list[torch.Tensor]:
    written = []
    for position in entry.mutated_positions:
        if position < len(host_args):
            value = host_args[position]
            written.extend(value if isinstance(value, (list, tuple)) else [value])
    for name in entry.out_names:
        value = host_kwargs.get(name)
        if value is not None:
            written.extend(value if isinstance(value, (list, tuple)) else [value])
    return [value for value in written if isinstance(value, torch.Tensor)]


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


def _is_functional(entry: OpEntry) -> bool:
    return not entry.op._schema.is_mutable


_UNDEFINED_RETURNS: dict[str, Callable[[], Any]] = {"ListType": list, "IntType": int, "SymIntType": int, "FloatType": float, "NumberType": float, "BoolType": bool}


def _undefined_outputs(op: Any) -> Any:
    """An op's outputs as nothing, by its schema: undefined tensors (None, which autograd takes as no
    gradient), empty lists, zeros. For an op that failed on the autograd worker with no meta kernel."""
    outputs = tuple(_UNDEFINED_RETURNS.get(returned.type.kind(), lambda: None)() for returned in op._schema.returns)
    if len(outputs) == 1:
        return outputs[0]
    return outputs or None


def _meta_like(value: Any) -> Any:
    """A meta tensor for each tpu tensor in a value (lists and tuples followed), for meta kernels: a
    channels-last tensor's has its strides (the output's strides follow them), any other is contiguous."""
    if isinstance(value, TpuTensor):
        geom = value._geom or geometry_of(value)
        if geom.memory_format is not None:
            return torch.empty_strided(geom.shape, geom.strides, dtype=value.dtype, device="meta")
        return torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta_like(item) for item in value)
    return value


def _with_host_layout(host: torch.Tensor, source: TpuTensor, kwargs: dict) -> torch.Tensor:
    """A contiguous host copy of `source` laid out as torch's `_to_copy` lays it out (a channels-last
    tensor stays channels-last on the CPU, as a CUDA one does)."""
    meta_kwargs = {name: value for name, value in kwargs.items() if name not in ("pin_memory", "non_blocking")}
    strides = _meta_copy(source, {**meta_kwargs, "device": torch.device("meta")}).stride()
    if tuple(strides) == tuple(host.stride()):
        return host
    return torch.empty_strided(tuple(host.shape), strides, dtype=host.dtype).copy_(host)


def _meta_copy(source: TpuTensor, kwargs: dict) -> torch.Tensor:
    """`.to("meta")`: a meta tensor with the source's sizes and strides, converted as torch converts
    (ZeroTensor's kernels and meta-device model code move tensors to meta to compute only shapes)."""
    meta_source = torch.empty_strided(tuple(source.shape), source.stride(), dtype=source.dtype, device="meta")
    return aten._to_copy.default(meta_source, **kwargs)


def _storage_numel(tensor: TpuTensor) -> int:
    """The number of the tensor's own elements its buffer's storage holds (a dtype view of another
    width holds more or fewer than the buffer's array)."""
    array = tensor._buf.array
    numel = int(np.prod(_root_shape(tensor)))
    dtype = getattr(array, "dtype", None)
    if dtype is None or to_torch(dtype) == tensor.dtype:
        return numel
    return numel * np.dtype(dtype).itemsize // tensor.element_size()


def _root_shape(tensor: TpuTensor) -> tuple[int, ...]:
    return tuple(tensor._buf.array.shape) if hasattr(tensor._buf.array, "shape") else tuple(tensor.shape)


def _is_plain(entry: OpEntry) -> bool:
    """A lowered op whose positional calls key their plan by their flattened arguments alone (no
    generator, typed constants or random key): `Dispatcher._plain_compute` routes it."""
    return entry.kind == "lowered" and entry.simple_args and entry.generator_arg is None and not entry.typed_constants and not entry.lowering.needs_key


def _matmul_precision_setting() -> str:
    """The float32 matmul precision setting, which keys every matmul plan: one C call."""
    try:
        return _float32_matmul_precision()
    except RuntimeError:  # torch's per-backend API mixed with the legacy one
        return matmul_precision.setting()


def _take_generator(generator_arg: tuple[int, str], args: Sequence[Any], kwargs: dict) -> tuple[Sequence[Any], dict, Any]:
    """Take a random op's `generator` out of its arguments: the generator's seed and counter become
    program inputs, so no plan key holds a generator object (a new one per call would compile anew)."""
    position, name = generator_arg
    generator = kwargs.get(name)
    if generator is not None:
        return args, {**kwargs, name: None}, generator
    if 0 <= position < len(args) and args[position] is not None:
        return (*args[:position], None, *args[position + 1 :]), kwargs, args[position]
    return args, kwargs, None


def _static(value: Any) -> Any:
    if type(value) is int:
        return value
    if isinstance(value, list):
        items = tuple(value)
        if _INTS_ONLY.issuperset(map(type, items)):  # sizes or dims (`view(B, T, nh, hs)`): one pass in C
            return items
        return tuple(_static(item) for item in items)
    if isinstance(value, torch.Tensor):
        raise TypeError("tensor argument in a view op")
    return value


def _static_args(args: Sequence[Any]) -> tuple:
    """A view op's arguments after its base, hashable (lists as tuples); as they are when all ints."""
    values = tuple(args[1:])
    for value in values:
        if type(value) is not int:
            return tuple([_static(item) for item in values])
    return values


def _copy_lowering(target: Any, source: Any) -> Any:
    return jnp.broadcast_to(cast(source, target.dtype), target.shape)


def _convert_lowering(source: Any, *, dtype: torch.dtype, memory_format: Any = None) -> Any:
    return cast(source, to_jax(dtype))


def _internal_entry(op: Any, fn: Callable) -> OpEntry:
    from tputrace.backend.ops.registry import Lowering

    return OpEntry(op, str(op), "lowered", lowering=Lowering(op, fn))


_COPY_ENTRY = _internal_entry(aten.copy.default, _copy_lowering)
_CONVERT_ENTRY = _internal_entry(aten._to_copy.default, _convert_lowering)

dispatcher = Dispatcher()
