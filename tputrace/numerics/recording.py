"""Module hooks that record per-module digests of outputs, input gradients and (when the optimizer steps) parameter
gradients on `tpu`, and replay each module call of the first steps on the CPU from host copies of its inputs and
parameters (torch, inside the run).

A step is a call of a top-level module (one called outside any other module) that starts after a backward, or
that repeats a top-level module of the current step: `model(x)` then `loss_fn(out, y)` then `backward()` is one
step. The CPU replay runs the module's own code on CPU copies of its parameters and of the inputs it was given on
the tpu, so each call is judged on its own: a difference does not travel on to the modules after it.
"""

from __future__ import annotations

import copy
import math
import itertools
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from tputrace import sourceloc
from tputrace.numerics.digests import difference, digest, dtype_name, finite_norm_and_count
from tputrace.numerics.full_precision import FullPrecision
from tputrace.numerics.parameter_grads import ParameterReferences
from tputrace.numerics.random_ops import RandomDraw, RandomLog, RandomReplay
from tputrace.numerics.store import COMPARED, NOT_COMPARED, FullTensor, ModuleCall, NumericsWriter
from tputrace.numerics.tolerance import tolerance_for

# The phase of the rows that compare a module's own parameter gradients, summed over a step's calls.
PARAMETERS = "parameters"
HALF_DTYPES = (torch.bfloat16, torch.float16)
RANDOM_REASON = "its output depends on the random stream (dropout or a random mask in train mode), which differs between the tpu and the CPU"


@dataclass
class _CallState:
    """What a module call's backward needs from its forward."""

    call_id: int
    step: int
    module: str
    module_type: str
    path: str | None
    line: int | None
    host_args: tuple[Any, ...] | None = None
    host_kwargs: dict[str, Any] | None = None
    cpu_module: torch.nn.Module | None = None
    reason: str | None = None
    widened_to: torch.dtype | None = None  # the dtype half-precision inputs are copied in, under autocast
    input_nonfinite: int | None = None
    notes: list[str] = field(default_factory=list)
    random_start: int = 0
    random_draws: list[RandomDraw] = field(default_factory=list)


class NumericsSession:
    """Installs the global module hooks (`install`), records into `writer`, and removes them (`remove`)."""

    def __init__(
        self,
        writer: NumericsWriter,
        replay_steps: int,
        full_modules: frozenset[str],
        budget_bytes: int,
        ops: bool = False,
    ) -> None:
        self._writer = writer
        self._ops_wanted = ops
        self._replay_steps = replay_steps
        self._full_modules = full_modules
        self._budget_bytes = budget_bytes
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._stack: list[_CallState] = []
        self._pending_backward: dict[int, list[_CallState]] = {}
        self._cpu_copies: dict[int, torch.nn.Module] = {}
        self._parameters = ParameterReferences()
        self._random_log: RandomLog | None = None
        self._roots_this_step: set[int] = set()
        self._backward_since_step = False
        self._step = 0
        self._call_ids = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._local = threading.local()
        self._handles: list[Any] = []
        self._warnings: warnings.catch_warnings[None] | None = None  # the filters as they were before `install`

    def install(self) -> None:
        from torch.nn.modules import module as module_hooks
        from torch.optim import optimizer as optimizer_hooks

        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings(
            "ignore", message="Full backward hook is firing when gradients are computed with respect to module outputs"
        )
        self._handles = [
            module_hooks.register_module_forward_pre_hook(self._guarded(self._before_forward)),
            module_hooks.register_module_forward_hook(self._guarded(self._after_forward), with_kwargs=True),
            module_hooks.register_module_full_backward_hook(self._guarded(self._after_backward)),
            optimizer_hooks.register_optimizer_step_pre_hook(self._guarded(self._before_optimizer_step)),
        ]
        if self._replay_steps > 0:
            self._random_log = RandomLog(skip=lambda: getattr(self._local, "replaying", False))
            self._random_log.__enter__()

    def remove(self) -> None:
        self._stop_random_log()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None
        self._pending_backward.clear()
        self._cpu_copies.clear()
        self._parameters.clear()

    def _stop_random_log(self) -> None:
        """Leave the random log's dispatch mode (past the replayed steps it only costs time), if it is the innermost
        mode; a mode the script entered after it keeps it until then."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if self._random_log is not None and _get_current_dispatch_mode() is self._random_log:
            self._random_log.__exit__(None, None, None)
            self._random_log = None

    def _guarded(self, hook: Callable[..., None]) -> Callable[..., None]:
        def run_unless_replaying(*arguments: Any) -> None:
            if getattr(self._local, "replaying", False):
                return
            hook(*arguments)

        return run_unless_replaying

    @contextmanager
    def _replaying(self) -> Iterator[None]:
        self._local.replaying = True
        try:
            yield
        finally:
            self._local.replaying = False

    def _replays(self, step: int) -> bool:
        return step <= self._replay_steps

    def _before_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if not self._stack:
            self._begin_root(module)
        self._name(module)
        location = sourceloc.first_user_location(skip=1)
        state = _CallState(
            call_id=next(self._call_ids),
            step=self._step,
            module=self._names[module],
            module_type=type(module).__name__,
            path=location[0] if location else None,
            line=location[1] if location else None,
        )
        if self._replays(self._step):
            self._keep_inputs(module, args, state)
            if self._random_log is not None:
                state.random_start = len(self._random_log.draws)
        self._stack.append(state)

    def _begin_root(self, module: torch.nn.Module) -> None:
        if self._step == 0 or self._backward_since_step or id(module) in self._roots_this_step:
            self._step += 1
            self._roots_this_step = set()
            self._backward_since_step = False
            self._cpu_copies.clear()
            self._pending_backward.clear()
            self._parameters.clear()
            if not self._replays(self._step):
                self._stop_random_log()
        self._roots_this_step.add(id(module))

    def _name(self, module: torch.nn.Module) -> None:
        if module in self._names:
            return
        root = type(module).__name__
        self._names[module] = root
        for name, child in module.named_modules():
            if name and child not in self._names:
                self._names[child] = f"{root}.{name}"

    def _keep_inputs(self, module: torch.nn.Module, args: tuple[Any, ...], state: _CallState) -> None:
        tensors = [value for value in tree_flatten(args)[0] if isinstance(value, torch.Tensor)]
        state_tensors = list(module.parameters()) + list(module.buffers())
        size = sum(t.numel() * t.element_size() for t in tensors + state_tensors)
        if size > self._budget_bytes:
            state.reason = (
                f"its inputs and parameters ({size} bytes) exceed the host-copy budget ({self._budget_bytes} bytes)"
            )
            return
        state.widened_to = _autocast_widening(module, tensors)
        state.host_args = tree_map(lambda value: _host_copy(value, state.widened_to), args)
        state.input_nonfinite = sum(int((~torch.isfinite(value)).sum()) for value in _floating_tensors(state.host_args))
        state.cpu_module = self._cpu_copy(module)

    def _cpu_copy(self, module: torch.nn.Module) -> torch.nn.Module:
        """A CPU copy of `module` with its parameters and buffers as they are now (one per module per step)."""
        cached = self._cpu_copies.get(id(module))
        if cached is not None:
            return cached
        memo: dict[int, Any] = {}
        for parameter in module.parameters():
            memo[id(parameter)] = torch.nn.Parameter(
                parameter.detach().cpu().clone(), requires_grad=parameter.requires_grad
            )
        for buffer in module.buffers():
            memo[id(buffer)] = buffer.detach().cpu().clone()
        with self._replaying():
            cpu_module = copy.deepcopy(module, memo)
        self._cpu_copies[id(module)] = cpu_module
        return cpu_module

    def _after_forward(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        state = self._stack.pop()
        if self._random_log is not None:
            state.random_draws = self._random_log.draws[state.random_start:]
            if not self._stack:
                self._random_log.draws = []  # every call of this root has its slice
        if state.cpu_module is not None:
            state.host_kwargs = tree_map(lambda value: _host_copy(value, state.widened_to), kwargs)
        outputs = _floating_tensors(output)
        call = self._event(state, "forward")
        call.input_nonfinite = state.input_nonfinite
        replayed = state.cpu_module is not None and not state.reason
        host_outputs = [t.detach().cpu() for t in outputs] if replayed or state.module in self._full_modules else None
        call.tpu = {index: digest(t) for index, t in enumerate(host_outputs if host_outputs is not None else outputs)}
        cpu_outputs: list[torch.Tensor] = []
        if replayed and host_outputs is not None:
            cpu_outputs = self._replay_forward(module, state, call, host_outputs)
        elif state.reason:
            call.outcome, call.reason = NOT_COMPARED, state.reason
        if self._ops_wanted and call.diverged:
            self._ops_wanted = False  # the first divergent call only
            self._record_ops(module, state, call, outputs)
        if state.module in self._full_modules and host_outputs is not None:
            self._keep_full(call.event_id, "tpu", host_outputs)
            self._keep_full(call.event_id, "cpu", cpu_outputs)
        self._writer.add_call(call)
        if any(t.requires_grad for t in outputs):
            self._pending_backward.setdefault(id(module), []).append(state)
            if not replayed:
                self._parameters.leave_out(module, state.module, state.step, state.call_id, state.path, state.line)

    def _event(self, state: _CallState, phase: str) -> ModuleCall:
        return ModuleCall(
            event_id=next(self._event_ids),
            call_id=state.call_id,
            step=state.step,
            phase=phase,
            module=state.module,
            module_type=state.module_type,
            path=state.path,
            line=state.line,
        )

    def _run_cpu(
        self, state: _CallState, seed: int, needs_grad: list[bool] | None = None
    ) -> tuple[Any, list[torch.Tensor]]:
        """Run the CPU copy on fresh copies of the kept inputs; with `needs_grad`, the positional tensor
        inputs it marks require grad. Returns the output and those inputs."""
        assert state.cpu_module is not None and state.host_args is not None
        args = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, state.host_args)
        grad_inputs: list[torch.Tensor] = []
        if needs_grad is not None:
            tensor_positions = [i for i, value in enumerate(args) if isinstance(value, torch.Tensor)]
            args = list(args)
            for position, wants in zip(tensor_positions, needs_grad):
                if wants and args[position].is_floating_point():
                    args[position] = args[position].requires_grad_(True)
                    grad_inputs.append(args[position])
            args = tuple(args)
        with self._replaying(), torch.random.fork_rng(devices=[]), torch.set_grad_enabled(needs_grad is not None), FullPrecision():
            torch.manual_seed(seed)
            if state.random_draws:
                with RandomReplay(state.random_draws):
                    output = state.cpu_module(*args, **(state.host_kwargs or {}))
            else:
                output = state.cpu_module(*args, **(state.host_kwargs or {}))
        return output, grad_inputs

    def _replay_forward(
        self, module: torch.nn.Module, state: _CallState, call: ModuleCall, host_outputs: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        try:
            cpu_outputs = [t.detach() for t in _floating_tensors(self._run_cpu(state, seed=0)[0])]
            if module.training:
                again = [t.detach() for t in _floating_tensors(self._run_cpu(state, seed=1)[0])]
                if any(not _same_values(a, b) for a, b in zip(cpu_outputs, again)):
                    state.reason = RANDOM_REASON
                    call.outcome, call.reason = NOT_COMPARED, RANDOM_REASON
                    return cpu_outputs
        except Exception as failure:  # noqa: BLE001 - a module the CPU cannot run is reported, not fatal
            state.reason = f"the CPU replay failed: {type(failure).__name__}: {failure}"
            call.outcome, call.reason = NOT_COMPARED, state.reason
            return []
        call.cpu = {index: digest(t) for index, t in enumerate(cpu_outputs)}
        _judge(call, host_outputs, cpu_outputs)
        return cpu_outputs

    def _after_backward(
        self, module: torch.nn.Module, grad_input: tuple[Any, ...], grad_output: tuple[Any, ...]
    ) -> None:
        self._backward_since_step = True
        pending = self._pending_backward.get(id(module))
        if not pending:
            return
        state = pending.pop()
        replayed = state.cpu_module is not None and not state.reason
        gradients = [g for g in grad_input if isinstance(g, torch.Tensor) and g.is_floating_point()]
        if not gradients:
            # No input of this call takes a gradient (the first layer): nothing to record for its inputs, but its
            # own parameters still get gradients the CPU can check.
            if replayed:
                self._replay_backward(module, state, None, grad_input, grad_output, [])
            return
        call = self._event(state, "backward")
        host_gradients = [g.detach().cpu() for g in gradients] if replayed else None
        call.tpu = {
            index: digest(g) for index, g in enumerate(host_gradients if host_gradients is not None else gradients)
        }
        if replayed and host_gradients is not None:
            self._replay_backward(module, state, call, grad_input, grad_output, host_gradients)
        elif state.reason:
            call.outcome, call.reason = NOT_COMPARED, state.reason
        self._writer.add_call(call)

    def _replay_backward(
        self,
        module: torch.nn.Module,
        state: _CallState,
        call: ModuleCall | None,
        grad_input: tuple[Any, ...],
        grad_output: tuple[Any, ...],
        host_gradients: list[torch.Tensor],
    ) -> None:
        """The CPU's gradients of the call's inputs (judged into `call`, when given) and of the module's own
        parameters (added to the step's parameter references)."""
        assert state.cpu_module is not None
        needs_grad = [isinstance(g, torch.Tensor) and g.is_floating_point() for g in grad_input]
        own = self._parameters.own_parameters(state.cpu_module)
        try:
            with self._replaying(), torch.enable_grad():
                output, inputs = self._run_cpu(state, seed=0, needs_grad=needs_grad)
                outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
                pairs = [
                    (out, g.detach().cpu().to(out.dtype))
                    for out, g in zip(outputs, grad_output)
                    if isinstance(g, torch.Tensor) and out.requires_grad
                ]
                if not (inputs or own) or not pairs:
                    if call is not None:
                        call.outcome, call.reason = NOT_COMPARED, "no input of the CPU replay gets a gradient"
                    return
                cpu_gradients = torch.autograd.grad(
                    [o for o, _ in pairs], [*inputs, *own], [g for _, g in pairs], allow_unused=True
                )
        except Exception as failure:  # noqa: BLE001 - reported per call
            self._parameters.leave_out(module, state.module, state.step, state.call_id, state.path, state.line)
            if call is not None:
                call.outcome, call.reason = (
                    NOT_COMPARED,
                    f"the CPU replay of the backward failed: {type(failure).__name__}: {failure}",
                )
            return
        self._parameters.add(module, state.module, state.step, state.call_id, state.path, state.line,
                             list(cpu_gradients[len(inputs):]))
        if call is None:
            return
        references = [g if g is not None else torch.zeros_like(i) for g, i in zip(cpu_gradients, inputs)]
        call.cpu = {index: digest(g) for index, g in enumerate(references)}
        _judge(call, host_gradients, references)

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Compare each module's parameter gradients with the CPU's sums over the step's replayed calls, as one
        `parameters` row per module (before the optimizer reads and changes them)."""
        for entry, tpu_gradients, cpu_gradients in self._parameters.take():
            call = ModuleCall(
                event_id=next(self._event_ids), call_id=entry.call_id, step=entry.step, phase=PARAMETERS,
                module=entry.module, module_type=entry.module_type, path=entry.path, line=entry.line,
            )
            call.tpu = {index: digest(g) for index, g in enumerate(tpu_gradients)}
            call.cpu = {index: digest(g) for index, g in enumerate(cpu_gradients)}
            _judge(call, tpu_gradients, cpu_gradients)
            self._writer.add_call(call)

    def _record_ops(
        self, module: torch.nn.Module, state: _CallState, call: ModuleCall, outputs: list[torch.Tensor]
    ) -> None:
        """Run the call again on the tpu and on the CPU copy, op by op, and store how each op's output compares."""
        from tputrace.numerics.ops import compare_ops, op_outputs

        cpu_module = state.cpu_module
        assert state.host_args is not None and cpu_module is not None
        device = outputs[0].device if outputs else torch.device("tpu")
        tpu_args = tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, state.host_args)
        tpu_kwargs = tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, state.host_kwargs or {})
        cpu_args = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, state.host_args)
        try:
            with self._replaying():
                tpu_ops = op_outputs(lambda: module(*tpu_args, **tpu_kwargs))
                cpu_ops = op_outputs(lambda: cpu_module(*cpu_args, **(state.host_kwargs or {})))
        except Exception as failure:  # noqa: BLE001 - the call's own comparison stands without its ops
            warnings.warn(f"tputrace numerics: --ops could not run {state.module} again: {failure}", stacklevel=1)
            return
        self._writer.add_ops(call.event_id, compare_ops(tpu_ops, cpu_ops))

    def _keep_full(self, event_id: int, side: str, tensors: list[torch.Tensor]) -> None:
        for index, tensor in enumerate(tensors):
            data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            self._writer.add_full_tensor(
                FullTensor(event_id, index, side, dtype_name(tensor.dtype), tuple(tensor.shape), data)
            )


def _host_copy(value: Any, widened_to: torch.dtype | None = None) -> Any:
    """A host copy of `value` when it is a tensor; a half-precision one in `widened_to`, when given."""
    if not isinstance(value, torch.Tensor):
        return value
    copied = value.detach().cpu().clone()
    if widened_to is not None and copied.dtype in HALF_DTYPES:
        return copied.to(widened_to)
    return copied


def _autocast_widening(module: torch.nn.Module, inputs: list[torch.Tensor]) -> torch.dtype | None:
    """Under the device's autocast, the dtype the module computes in without it (its floating parameters',
    else float32) when that is wider than half precision: the CPU replay, which has no autocast, gives the
    module's half-precision inputs in it (a float32 `Linear` takes no bfloat16 input outside autocast)."""
    devices = {tensor.device.type for tensor in inputs if tensor.device.type != "cpu"}
    if not any(torch.is_autocast_enabled(device) for device in devices):
        return None
    own = next((parameter.dtype for parameter in module.parameters() if parameter.is_floating_point()), torch.float32)
    return own if own not in HALF_DTYPES else None


def _floating_tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _judge(call: ModuleCall, tpu_values: list[torch.Tensor], cpu_values: list[torch.Tensor]) -> None:
    """Fill in `call`'s outcome: the largest relative difference over its tensors against the tolerance of
    the CPU's dtype (the dtype the module gives without the tpu), and a note when the dtypes differ."""
    if len(tpu_values) != len(cpu_values):
        call.outcome, call.reason = NOT_COMPARED, f"{len(tpu_values)} tensors on the tpu, {len(cpu_values)} on the CPU"
        return
    call.outcome = COMPARED
    if not cpu_values:
        return
    floors = _gradient_floors(cpu_values) if call.phase == PARAMETERS else [0.0] * len(cpu_values)
    results = [difference(a, b, floor) for a, b, floor in zip(tpu_values, cpu_values, floors)]
    worst = max(range(len(results)), key=lambda i: results[i][0] / tolerance_for(dtype_name(cpu_values[i].dtype)))
    call.divergence, call.max_abs_difference = results[worst]
    call.reference_dtype = dtype_name(cpu_values[worst].dtype)
    call.tolerance = tolerance_for(call.reference_dtype)
    changed = sorted(
        {(dtype_name(a.dtype), dtype_name(b.dtype)) for a, b in zip(tpu_values, cpu_values) if a.dtype != b.dtype}
    )
    if changed:
        call.reason = "; ".join(f"{tpu} on the tpu, {cpu} on the CPU" for tpu, cpu in changed)


def _gradient_floors(references: list[torch.Tensor]) -> list[float]:
    """For each of a module's parameter gradients, the norm it would have at the root mean square of all of
    them: the scale its difference is judged against where its own norm is smaller. A gradient that cancels
    to rounding noise (the bias of a layer a normalisation follows, whose mean it removes) is then judged
    against its module's gradients, not against its own noise."""
    norms_and_counts = [finite_norm_and_count(reference) for reference in references]
    count = sum(numel for _, numel in norms_and_counts)
    if not count:
        return [0.0] * len(references)
    mean_square = sum(norm * norm for norm, _ in norms_and_counts) / count
    return [math.sqrt(mean_square * numel) for _, numel in norms_and_counts]


def _same_values(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two replays gave the same tensor, NaN in the same places counting as the same (a module fed NaN
    gives NaN whatever the seed)."""
    return first.shape == second.shape and bool(torch.isclose(first, second, rtol=0.0, atol=0.0, equal_nan=True).all())
