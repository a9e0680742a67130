"""The dispatcher: every ATen op on a tpu tensor arrives here and runs as an XLA program.

An op is classified once (`entries.classify`) and routed to its handler; a lowered op's call then
splits its arguments into a constant template and dynamic inputs (`arguments`), finds or builds the
`Plan` for that signature (`plan_building`), and hands it to the executor (strict: run now;
DeferAndFuse: add to the pending graph). Views (`view_ops`), in-place and `out=` writes (`writes`),
transfers (`host_transfers`) and the CPU fallback (`host_fallback`) are the Dispatcher's other jobs,
each a mixin of its own module; each is reported to the recorder when one is active.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tputrace.backend.compat import device_module
from tputrace.backend.core import arg_checks, foreach_lists, generators, matmul_precision, rng, routing
from tputrace.backend.core.arguments import UNFLATTENED, ArgumentFlattening, DeviceMismatchError, positional_originals
from tputrace.backend.core.buffers import TORCH_DEVICES, Buffer, CountedBuffer, torch_device
from tputrace.backend.core.compile_history import CompileHistory, SiteCompiles
from tputrace.backend.core.entries import OpEntry, classify
from tputrace.backend.core.executor import Executor, StrictExecutor
from tputrace.backend.core.host_fallback import CpuFallback
from tputrace.backend.core.host_transfers import HostTransfers
from tputrace.backend.core.length_recompiles import LengthRecompiles
from tputrace.backend.core.plan_building import RUNS_ON_HOST, PlanBuilding, meta_like
from tputrace.backend.core.plans import OutSpec, Plan, regroup
from tputrace.backend.core.tensor import TpuTensor, channels_last_tensor
from tputrace.backend.core.view_ops import ViewOps, storage_elements
from tputrace.backend.core.writes import Writes
from tputrace.backend.indexing import data_dependent, mask_indexing, padded_reads
from tputrace.recording.interface import Recording

__all__ = ["DeviceMismatchError", "Dispatcher", "dispatcher"]

aten = torch.ops.aten
_perf_ns = time.perf_counter_ns
_float32_matmul_precision = torch._C._get_float32_matmul_precision
_make_wrapper = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided


class Dispatcher(ArgumentFlattening, PlanBuilding, ViewOps, Writes, HostTransfers, CpuFallback):
    """Routes ATen ops on tpu tensors to plans, views, writes, decompositions or the CPU fallback."""

    def __init__(self) -> None:
        self.entries: dict[Any, OpEntry] = {}
        self.routes: dict[int, tuple[Callable, Any]] = {}  # by id(op): OpOverload hashes in Python
        self.routed_ops: list[Any] = []  # keeps every routed op alive, so its id stays its own
        self.plans: dict[Any, Any] = {}
        self.structures: dict[Any, CompileHistory] = {}
        self.length_recompiles = LengthRecompiles()  # new data-dependent lengths as recompiles (`record_compile`)
        self.site_compiles = SiteCompiles()  # an op's new non-tensor arguments at a line as recompiles (`record_compile`)
        self.first_chips: dict[tuple[Any, tuple], int] = {}  # by structure and signature: the chip it first compiled for
        self.view_plans: dict[Any, Any] = {}
        self.executor: Executor = StrictExecutor(self)
        self.recorder: Recording | None = None
        self.warned_keys: set[str] = set()  # what `_warn_once` has warned about (op names for fallbacks)
        self.worker_errors: list[BaseException] = []
        self.plan_lock = threading.RLock()
        self.thread_lock = threading.RLock()  # held by every op once several user threads dispatch (tensor.py)
        own_routes: dict[Any, Callable] = {
            aten._to_copy.default: self._to_copy,
            aten.copy_.default: self._copy_,
            aten._local_scalar_dense.default: self._local_scalar_dense,
            aten.detach.default: self._alias,
            aten.alias.default: self._alias,
            aten.lift_fresh.default: self._alias,
            aten.is_same_size.default: lambda args, kwargs: tuple(args[0].shape) == tuple(args[1].shape),
            aten._has_same_storage_numel.default: lambda args, kwargs: storage_elements(args[0]) == storage_elements(args[1]),
            aten.is_pinned.default: lambda args, kwargs: False,
            aten._has_compatible_shallow_copy_type.default: lambda args, kwargs: type(args[0]) is type(args[1]),
        }
        for op, handler in own_routes.items():
            routing.SPECIAL_ROUTES.setdefault(op, handler)
        self.special = routing.SPECIAL_ROUTES  # the table modules register their routes into

    def register_special(self, op: Any, handler: Callable[[tuple, dict], Any]) -> None:
        """Route an op to `handler(args, kwargs)` (`routing.register_special`), replacing any cached route."""
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
        result = func(*meta_like(args), **{name: meta_like(value) for name, value in kwargs.items()})

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

    def _entry(self, op: Any) -> OpEntry:
        entry = self.entries.get(op)
        if entry is None:
            entry = self.entries.setdefault(op, classify(op))
        return entry

    def compute(self, entry: OpEntry, args: Sequence[Any], kwargs: dict, record_as: str | None = None, flat: Any = UNFLATTENED) -> Any:
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
            if plan is None or plan is RUNS_ON_HOST:
                return compute(entry, args, kwargs, None, flat)
            executor = self.executor
            values = executor.run(plan, dynamic, name, start)
            spec = plan.single_output
            if spec is None:
                return self._outputs(plan, values, chip)
            if executor.deferred:
                output = output_tensor(values[0], chip, spec, 0)
                executor.own(output._buf)
                return output
            return output_tensor(values[0], chip, spec, spec.nbytes)

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
            output = output_tensor(value, chip, spec, 0)
            executor.own(output._buf)
            return output
        return output_tensor(value, chip, spec, spec.nbytes)

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

    def _run(self, entry: OpEntry, args: Sequence[Any], kwargs: dict, record_as: str | None, flat: Any = UNFLATTENED) -> tuple[Plan, tuple, int] | None:
        """Run (or record) a lowered op: its plan, output values and chip; None if it runs on the host.
        Its start is read only for the recorder (None: the executor reads no clock). `flat`: what
        `_flatten_positional` gave for these arguments already (a view's read is recorded once)."""
        start = _perf_ns() if self.recorder is not None else None
        generator = None
        if entry.generator_arg is not None:
            args, kwargs, generator = _take_generator(entry.generator_arg, args, kwargs)
        if flat is not UNFLATTENED:
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
                originals = positional_originals(args, entry.scalar_positions)
            precision = matmul_precision.of_call(specs) if entry.lowering.matmul_precision else None
            plan = self._make_plan(entry, key, template_args, template_kwargs, dynamic, list(specs), originals, chip, precision)
            if start is not None:
                start = _perf_ns()
        if plan is RUNS_ON_HOST:
            return None
        return plan, self.executor.run(plan, dynamic, record_as or entry.name, start), chip

    def _decompose(self, entry: OpEntry, args: Sequence[Any], kwargs: dict) -> Any:
        """Run a functional op through its decomposition; if that fails, run the op itself on the host."""
        try:
            return entry.decomposition(*args, **kwargs)
        except (DeviceMismatchError, NotImplementedError, RuntimeError, TypeError, ValueError, IndexError) as error:
            if isinstance(error, DeviceMismatchError) or not _is_functional(entry):
                raise
            self._warn_fallback(entry.name, f"its decomposition failed ({type(error).__name__})")
            return self.fallback(entry, args, kwargs)


def output_tensor(array: Any, chip: int, spec: OutSpec, nbytes: int) -> TpuTensor:
    """A fresh contiguous tpu tensor owning `array`, an op's output of `spec`, as `tensor.new_tensor` makes
    one, with its geometry from the spec (every op's hot path)."""
    geom = spec.geometries.get(chip) or spec.dense_geometry(chip)
    device = TORCH_DEVICES.get(chip) or torch_device(chip)
    tensor = _make_wrapper(TpuTensor, geom.shape, None, None, None, geom.dtype, _STRIDED, device)
    buffer_spec = spec.buffer_spec
    tensor._buf = CountedBuffer(array, chip, nbytes, buffer_spec) if nbytes else Buffer(array, chip, buffer_spec)
    tensor._geom = geom
    return tensor


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


dispatcher = Dispatcher()
routing.install(dispatcher)
