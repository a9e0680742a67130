"""Executors: how plans run. Strict eager runs each op's program at once (DEFER_NEVER, optionally
blocking until the chip finishes: DEFER_NEVER_AND_LAUNCH_BLOCKING)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, Protocol

import jax

from tputrace.backend.core import chips, memory, program_cache, routing
from tputrace.backend.core.plans import Plan, compile_program
from tputrace.backend.core.routing import DispatcherApi

_perf_ns = time.perf_counter_ns
_NOTHING_HELD = contextlib.nullcontext()
# Python numbers already on a chip, as the weakly typed scalars jax.jit makes of them (bool strongly
# typed): a program called with a Python number copies it to the chip on every call (~2-3 µs); the
# same number (a scale, an eps, a step size) is usually passed again. Keyed by (type, value, chip).
_DEVICE_SCALARS: dict[tuple[type, Any, int], jax.Array] = {}
_MAX_DEVICE_SCALARS = 1024
_INT64_RANGE = range(-(2**63), 2**63)


class Executor(Protocol):
    """What the dispatcher needs from an execution strategy."""

    def prepare(self, plan: Plan, dynamic: Sequence[Any]) -> None:
        """Make the plan runnable (compile, or check that it traces); raise if its lowering fails."""

    def run(self, plan: Plan, dynamic: Sequence[Any], record_name: str | None = None, start_ns: int | None = None) -> tuple:
        """Run the plan on these inputs; returns its output values."""

    deferred: bool

    def concrete(self, value: Any, trigger: str) -> tuple[Any, int]:
        """The array behind a value (running pending work if needed) and the number of ops that ran."""

    def materialize(self, values: list[Any], trigger: str) -> list[Any]:
        """The arrays behind values, running pending work once for all of them (a host check in
        the middle of an op needs values the op already collected)."""

    def track(self, buffer: Any, replaced: Any = None) -> None:
        """A buffer now holds a value this executor produced."""

    def write_whole(self, buffers: Sequence[Any], values: Sequence[Any]) -> None:
        """Write each value (the outputs of one `run`) into its buffer as `Buffer.write` does, as a
        `_foreach_*_` op writes its list; each buffer is then tracked (`track`)."""

    def holding(self, values: Sequence[Any]) -> contextlib.AbstractContextManager:
        """A block in which any run of pending work keeps `values` (an op's outputs it has not yet
        written into their tensors: a flush in between must not drop them)."""

    def synchronize(self) -> None:
        """Wait for every launched program."""


class StrictExecutor:
    """DEFER_NEVER: every op is its own cached XLA program, launched as soon as it is dispatched."""

    deferred = False

    def __init__(self, dispatcher: DispatcherApi, launch_blocking: bool = False) -> None:
        self.dispatcher = dispatcher
        self.launch_blocking = launch_blocking
        self.last_values: Any = None

    def prepare(self, plan: Plan, dynamic: Sequence[Any]) -> None:
        evicted = program_cache.take_evicted(plan)
        recorder = self.dispatcher.recorder
        plan.program = compile_program(plan.fn, dynamic, plan.chip, plan.op_name, count_hlo=recorder is not None and recorder.enabled)
        program_cache.keep_attribute(plan, "program", plan.program)
        self.dispatcher.record_compile(plan, "op", evicted=evicted)

    def run(self, plan: Plan, dynamic: Sequence[Any], record_name: str | None = None, start_ns: int | None = None) -> tuple:
        program = plan.program
        if program is None:
            self.prepare(plan, dynamic)
            program = plan.program
        if plan.scalar_inputs:
            dynamic = _with_device_scalars(dynamic, plan.scalar_inputs, plan.chip)
        values = program.executable(*dynamic)
        if program.temp_bytes:  # its outputs are counted as its tensors are made
            memory.running(plan.chip, program.temp_bytes)
        self.last_values = values
        if self.launch_blocking:
            jax.block_until_ready(values)
        recorder = self.dispatcher.recorder
        if recorder is not None and record_name is not None and recorder.window_open:
            begin = start_ns if start_ns is not None else _perf_ns()
            recorder.op_ran(plan, record_name, begin, _perf_ns() - begin, None)
        return values

    def concrete(self, value: Any, trigger: str) -> tuple[Any, int]:
        return value, 0

    def materialize(self, values: list[Any], trigger: str) -> list[Any]:
        return list(values)

    def track(self, buffer: Any, replaced: Any = None) -> None:
        """Strict values are concrete already."""

    def write_whole(self, buffers: Sequence[Any], values: Sequence[Any]) -> None:
        for buffer, value in zip(buffers, values):
            buffer.write(value)

    def holding(self, values: Sequence[Any]) -> contextlib.AbstractContextManager:
        return _NOTHING_HELD

    def synchronize(self) -> None:
        if self.last_values is not None:
            jax.block_until_ready(self.last_values)
        jax.effects_barrier()


def _with_device_scalars(dynamic: Sequence[Any], positions: tuple[int, ...], chip: int) -> list[Any]:
    """The inputs with each Python int, float or bool at `positions` replaced by its array on the
    chip (`_DEVICE_SCALARS`). A float zero (0.0 and -0.0 compare equal), a NaN and an int outside
    int64 stay Python numbers, as does anything else (the program converts them as before)."""
    inputs = list(dynamic)
    for position in positions:
        value = inputs[position]
        kind = type(value)
        if kind is float:
            if value != value or value == 0.0:
                continue
        elif kind is int:
            if value not in _INT64_RANGE:
                continue
        elif kind is not bool:
            continue
        key = (kind, value, chip)
        array = _DEVICE_SCALARS.get(key)
        if array is None:
            if len(_DEVICE_SCALARS) >= _MAX_DEVICE_SCALARS:
                _DEVICE_SCALARS.clear()  # values that never repeat (a decaying step size) start it over
            array = _DEVICE_SCALARS[key] = jax.device_put(value, chips.device(chip))
        inputs[position] = array
    return inputs


def switch(mode: str) -> None:
    """Install the executor for an eager mode name (see `torch.tpu.EagerMode`)."""
    dispatcher = routing.active()
    dispatcher.executor.synchronize()
    executor = _executors.get(mode)
    if executor is None:
        if mode == "DEFER_AND_FUSE":
            from tputrace.backend.eager.deferred import DeferredExecutor

            executor = DeferredExecutor(dispatcher)
        else:
            executor = StrictExecutor(dispatcher, launch_blocking=mode == "DEFER_NEVER_AND_LAUNCH_BLOCKING")
        _executors[mode] = executor
    dispatcher.executor = executor


_executors: dict[str, Executor] = {}  # one per mode, so compiled-program caches survive mode switches


def forget_compiled_programs() -> None:
    """Drop every cached compiled program, ours and JAX's, after running what is pending: each op
    and fused graph compiles again when next run. For a long-lived process that has compiled many
    distinct programs (a test session): XLA:CPU maps about four memory regions per program it keeps, and
    Linux caps a process at `vm.max_map_count` (65,530 by default) regions, past which XLA's next
    compile crashes. The plan and program caches go together: a fused program is keyed by the ids of
    its ops' plans, which a new plan may reuse."""
    from tputrace.backend.indexing import index_checks
    dispatcher = routing.active()
    with dispatcher.thread_lock:
        for executor in (dispatcher.executor, *_executors.values()):
            executor.synchronize()
            if executor.deferred:
                executor.flush_sites.clear()
        program_cache.drop_all()  # fused and torch.compile graph programs too
        dispatcher.plans.clear()
        index_checks.forget_plans()
        jax.clear_caches()
