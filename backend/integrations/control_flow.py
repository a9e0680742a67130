"""`torch.cond` and `torch.while_loop` on tpu tensors, run as one XLA conditional or loop.

Both are higher-order ops (HOPs). Called eagerly with a tensor predicate, torch compiles a wrapper
around the op with Dynamo (`_hop_compile_and_call`); Dynamo computes the op's result on fake
tensors, then runs it on the real tensors. Below autograd (whose rule, `CondAutogradOp`, traces the
backward as another `cond`) a HOP reaches the Python key, where a mode's rule (fake, proxy,
functionalization) comes first and a tensor subclass needs its own rule (`py_impl(TpuTensor)`).

- While torch.compile or the eager call's Dynamo trace runs, the tpu tensors are traced ones (a
  fake or functional tensor inside): torch's fake-tensor and functionalization rules run on those
  inner tensors, and the HOP node reaching the tpu backend is lowered by `compile/control_flow.py`.
- On real tpu tensors, each branch (or the loop's condition and body) is traced once per input
  signature into an ATen graph on fake tpu tensors (a GraphModule is known by its fingerprint, so
  the new graphs torch builds for every backward reuse the program of an equal one), and the op runs as one program:
  `jax.lax.cond` / `jax.lax.while_loop` of the lowered graphs. The predicate never leaves the
  chip; in DeferAndFuse the program is one node of the pending graph. A predicate on the host (a
  Python bool or a CPU tensor) needs no program: its branch runs op by op.

A Python int carried by `torch.while_loop` counts on the chip as a 0-dim tensor; the host reads its
final value (one data-dependent sync), as torch returns an int. With carried inputs that require
grad, torch runs `while_loop_stack_output` (every iteration's values, stacked) and a backward loop
over them; the stacked values' size is the loop's count, so the count is read on the host (one
data-dependent sync) and the loop runs again as a scan of that many steps. Random ops in an eager
`cond` branch draw as `cond_draws` describes; in an eager loop they draw as its ops would run one by
one (`counted_while_values`), and the host reads the loop's count (one data-dependent sync) to move
the generator past them. They are refused with a one-line error in a loop whose carries require
grad (torch's backward runs the body again, which would need each iteration's counters) and inside
a compiled graph's `cond` or `while_loop`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from tputrace.backend.compat import import_hooks
from tputrace.backend.compile import lowering
from tputrace.backend.compile.control_flow import (
    Subgraph,
    cond_values,
    counted_while_values,
    higher_order_lowerings,
    refuse_draws,
    stacked_body_values,
    subgraph_function,
    while_values,
)
from tputrace.backend.core import matmul_precision, rng, routing
from tputrace.backend.core.dtypes import to_jax
from tputrace.backend.core.plans import OutSpec, Plan
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.core.tensor import TpuData, TpuTensor, _traced_tensor
from tputrace.backend.indexing.mask_counts import SYNC_KIND
from tputrace.backend.integrations import branch_layouts, cond_draws, graph_fingerprints
from tputrace.backend.integrations.export_dims import drop_unused_inner_reads

_perf_ns = time.perf_counter_ns
COND_NAME = "higher_order.cond"
WHILE_LOOP_NAME = "higher_order.while_loop"
_installed = False


# ----------------------------------------------------------------------------- traced tensors
def _holds_traced(values: Any) -> bool:
    return any(type(value) is TpuTensor and value._traced is not None for value in pytree.tree_leaves(values))


def _inner_of(values: Any) -> Any:
    return pytree.tree_map_only(TpuTensor, lambda value: value._inner, values)


def _traced_of(values: Any) -> Any:
    def wrap(value: torch.Tensor) -> torch.Tensor:
        if type(value) is not TpuTensor and value.device.type == "tpu":
            return _traced_tensor(value, value.size(), value.stride())
        return value

    return pytree.tree_map_only(torch.Tensor, wrap, values)


def _on_inner(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A mode's rule of a HOP that, given traced tpu tensors, runs on their inner tensors (with the
    branch graphs' unused inner reads erased first, see `_drop_inner_reads`)."""

    def run(mode: Any, *args: Any, **kwargs: Any) -> Any:
        if not _holds_traced((args, kwargs)):
            return handler(mode, *args, **kwargs)
        _drop_inner_reads(args)
        return _traced_of(handler(mode, *_inner_of(args), **_inner_of(kwargs)))

    run.tpu_inner = True  # type: ignore[attr-defined]
    return run


def _drop_inner_reads(args: Sequence[Any]) -> None:
    """Erase the unused reads of traced tpu tensors' inner tensors from the branch graphs among a
    HOP's arguments. Export records one in a branch graph for each read of `_inner`/`_traced` as it
    traces the branch on traced tpu tensors, and removes them only from the top graph; the reads
    fail on any other tensor (the inner ones the mode rules run on, the fake tpu tensors the
    exported program's branches are traced on when it runs). The graphs, which the program keeps,
    are edited in place."""
    for value in args:
        if isinstance(value, torch.fx.GraphModule):
            drop_unused_inner_reads(value)


def _dropping_inner_reads(gen_schema: Callable[..., Any]) -> Callable[..., Any]:
    """A HOP's `gen_schema` (which its autograd rule calls, running the branch graphs on the
    operands before any mode rule) that first erases the branch graphs' unused inner reads."""

    def generate(*args: Any, **kwargs: Any) -> Any:
        if _holds_traced((args, kwargs)):
            _drop_inner_reads(args)
        return gen_schema(*args, **kwargs)

    generate.tpu_inner = True  # type: ignore[attr-defined]
    return generate


def _route_modes_to_inner(hop: Any) -> None:
    """Dynamo's fake run (FakeTensorMode) and AOTAutograd's functionalization (FunctionalTensorMode)
    meet traced tpu tensors: their rules run on the inner tensors, which those traces follow."""
    for mode_type in (FakeTensorMode, FunctionalTensorMode):
        handler = hop.python_key_table[mode_type]
        if not getattr(handler, "tpu_inner", False):
            hop.python_key_table[mode_type] = _on_inner(handler)
    if not getattr(hop.gen_schema, "tpu_inner", False):
        hop.gen_schema = _dropping_inner_reads(hop.gen_schema)


# ----------------------------------------------------------------------------- tracing a branch
class _TracedFunction:
    """One branch (or loop condition or body) traced for one input signature on fake tpu tensors: its
    ATen graph as an array function, and its outputs (fake tensors, and their pytree structure)."""

    def __init__(self, fn: Callable[..., Any], values: Sequence[Any], name: str) -> None:
        from torch._functorch._aot_autograd.functional_utils import from_fun, has_data_mutation, to_fun
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        fake_mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)  # a shape env lets `.item()` trace (torch's while_loop backward selects its step so)
        with fake_mode:
            fakes = [_fake_like(value) if isinstance(value, torch.Tensor) else value for value in values]
        out_structure: list[Any] = []

        def functional(*args: Any) -> Any:
            with FunctionalTensorMode():
                inputs = pytree.tree_map(to_fun, args)
                outputs = fn(*inputs)
                if any(has_data_mutation(value) for value in inputs if isinstance(value, torch.Tensor)):
                    raise RuntimeError(f"{name} writes into its inputs, which torch.cond/while_loop on tpu do not allow; write into a clone and return it")
            flat, spec = pytree.tree_flatten(outputs)
            out_structure.append(spec)
            return [from_fun(value) for value in flat]

        from tputrace.backend.core.arguments import DeviceMismatchError

        try:
            with fake_mode:
                gm = make_fx(functional, decomposition_table=_decompositions())(*fakes)
        except DeviceMismatchError:
            raise RuntimeError(
                f"{name} reads a tpu tensor that is not one of its operands; pass it in the operands "
                "(torch.cond and torch.while_loop do so for the tensors a function closes over)"
            ) from None
        self.out_spec = out_structure[-1]
        self.out_fakes = [node.meta.get("val") for node in gm.graph.find_nodes(op="output")[0].args[0]]
        for position, fake in enumerate(self.out_fakes):
            if not isinstance(fake, torch.Tensor):
                raise RuntimeError(f"{name} returns {type(fake).__name__} as output {position}; torch.cond/while_loop on tpu return tensors only")
        self.function: Subgraph = subgraph_function(gm, name)


def _fake_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device=tensor.device)


def _decompositions() -> dict:
    """The torch.compile backend's decompositions: the traced graphs hold the ATen ops its graphs hold."""
    from tputrace.backend import compile as compile_backend

    return compile_backend.tpu_backend().decompositions()


# ----------------------------------------------------------------------------- running on the chip
class _ChipCall:
    """A call's tpu tensors read as program inputs, on one chip; its numbers (`statics`, None in a
    tensor's place) are constants of the plan."""

    def __init__(self, dispatcher: DispatcherApi, values: Sequence[Any], op_name: str) -> None:
        self.dynamic: list[Any] = []
        self.specs: list[tuple] = []
        self.statics: list[Any] = []
        self.chip = -1
        for position, value in enumerate(values):
            if isinstance(value, TpuTensor):
                if self.chip not in (-1, value._buf.chip):
                    raise RuntimeError(f"{op_name}: operands on tpu:{self.chip} and tpu:{value._buf.chip}; move them to one chip")
                self.chip = value._buf.chip
                dispatcher._append_tensor(value, self.dynamic, self.specs)
                self.statics.append(None)
            elif isinstance(value, torch.Tensor):
                raise RuntimeError(f"{op_name}: operand {position} is on {value.device}, the others on tpu; move it with .to('tpu')")
            elif isinstance(value, (int, float, bool)):
                self.statics.append(value)
            else:
                raise RuntimeError(f"{op_name}: operand {position} is a {type(value).__name__}; operands are tensors or numbers")


_plans: "weakref.WeakKeyDictionary[Any, dict[Any, tuple]]" = weakref.WeakKeyDictionary()
# By (graphs' fingerprints, call signature), kept for the process as the dispatcher keeps its op
# plans: a fused DeferAndFuse program is keyed by its plans' ids, which a dead plan's successor could
# take. The compiled programs themselves are bounded by `program_cache`.
_plans_by_graphs: dict[Any, tuple] = {}
_graph_numbers: dict[Any, int] = {}


def _cached(functions: Sequence[Callable[..., Any]], key: Any, build: Callable[[Any], tuple]) -> tuple:
    """What `build` returns (a plan, and what rebuilds its results) for these functions and key, built
    once. GraphModules (torch's backward of cond and while_loop makes new ones on every call) are
    known by their fingerprints (`graph_fingerprints`): a new graph that computes what a known one
    does reuses its plan and program. Other functions are known by identity: kept while the first
    lives (the others are held with it, so their ids stay theirs). `build` takes the functions'
    part of the plan's structure key (a string: `length_recompiles` reads tuples in keys)."""
    graphs = graph_fingerprints.fingerprints(functions)
    if graphs is not None:
        entry = _plans_by_graphs.get((graphs, key))
        if entry is None:
            number = _graph_numbers.setdefault(graphs, len(_graph_numbers))
            entry = _plans_by_graphs[(graphs, key)] = build(f"graphs {number}")
        return entry
    ids = tuple(id(fn) for fn in functions)
    try:
        per_function = _plans.setdefault(functions[0], {})
    except TypeError:  # not weak-referenceable: traced on every call
        return build(f"functions {ids}")
    full_key = (ids[1:], key)
    entry = per_function.get(full_key)
    if entry is None:
        entry = per_function[full_key] = (*build(f"functions {ids}"), tuple(functions[1:]))
    return entry[:-1]


def _traced_loop(cond_fn: Callable, body_fn: Callable, inputs: Sequence[Any], refused_in: str | None) -> tuple[_TracedFunction, _TracedFunction]:
    """A while_loop's cond_fn and body_fn traced on its inputs; with `refused_in` (where the loop
    runs), refused if either draws random numbers."""
    cond_traced = _TracedFunction(cond_fn, inputs, "torch.while_loop's cond_fn")
    body_traced = _TracedFunction(body_fn, inputs, "torch.while_loop's body_fn")
    if refused_in is not None:
        refuse_draws((cond_traced.function, body_traced.function), ("torch.while_loop's cond_fn", "torch.while_loop's body_fn"), refused_in)
    return cond_traced, body_traced


_COUNT_SPEC = OutSpec((), torch.int64, to_jax(torch.int64), 8)  # a loop's number of iterations


def _out_specs(fakes: Sequence[torch.Tensor]) -> tuple[OutSpec, ...]:
    return tuple(OutSpec(tuple(fake.shape), fake.dtype, to_jax(fake.dtype), fake.numel() * fake.element_size()) for fake in fakes)


def _run(plan: Plan, call: _ChipCall, start: int) -> list[TpuTensor]:
    dispatcher = routing.active()
    values = dispatcher.executor.run(plan, call.dynamic, plan.op_name, start)
    return [dispatcher._new_output(value, spec, plan.chip) for value, spec in zip(values, plan.out_specs)]


def _cond_on_chip(pred: TpuTensor, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: Sequence[Any]) -> Any:
    dispatcher = routing.active()
    start = _perf_ns()
    operands = _host_scalars_on_chip([pred, *operands])[1:]
    with dispatcher.thread_lock:
        call = _ChipCall(dispatcher, [pred, *operands], COND_NAME)
        template = tuple(call.statics[1:])
        strides = tuple(value.stride() for value in operands if isinstance(value, TpuTensor))  # the outputs' strides may follow them
        key = (tuple(call.specs), strides, template, call.chip, matmul_precision.setting())

        def build(functions_key: Any) -> tuple:
            true_traced = _TracedFunction(true_fn, operands, "torch.cond's true branch")
            false_traced = _TracedFunction(false_fn, operands, "torch.cond's false branch")
            _check_same_outputs(true_traced, false_traced)
            draws = max(true_traced.function.draws, false_traced.function.draws)
            n_arrays = len(call.dynamic) - 1
            layouts = [branch_layouts.layout_of(true_fake, false_fake) for true_fake, false_fake in zip(true_traced.out_fakes, false_traced.out_fakes)]

            def run(pred_value: Any, *arrays: Any) -> tuple:
                operand_values = _with_arrays(template, arrays[:n_arrays])
                values = cond_values(pred_value, true_traced.function, false_traced.function, operand_values, arrays[n_arrays:])
                return branch_layouts.stored_values(values, layouts)

            out_specs = tuple(branch_layouts.out_spec(fake, layout) for fake, layout in zip(true_traced.out_fakes, layouts))
            plan = Plan(COND_NAME, run, out_specs, "tuple", tuple(call.specs), call.chip, (COND_NAME, functions_key))
            return plan, true_traced.out_spec, draws, layouts

        plan, out_structure, draws, layouts = _cached((true_fn, false_fn), key, build)
        if draws:
            call.dynamic.extend(cond_draws.seed_and_counter(pred, operands, call.chip, draws))
        outputs = branch_layouts.outputs(_run(plan, call, start), layouts)
    return pytree.tree_unflatten(outputs, out_structure)


def _with_arrays(template: Sequence[Any], arrays: Sequence[Any]) -> list[Any]:
    """The call's values: each tensor's place in `template` (None) filled with the next array."""
    remaining = iter(arrays)
    return [next(remaining) if value is None else value for value in template]


def _check_same_outputs(true_traced: _TracedFunction, false_traced: _TracedFunction) -> None:
    def text(traced: _TracedFunction) -> str:
        return ", ".join(f"{str(fake.dtype).removeprefix('torch.')}{list(fake.shape)}" for fake in traced.out_fakes)

    same = true_traced.out_spec == false_traced.out_spec and all(
        tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype for a, b in zip(true_traced.out_fakes, false_traced.out_fakes)
    )
    if not same:
        raise RuntimeError(
            f"torch.cond on tpu needs both branches to return tensors of the same shapes and dtypes "
            f"(XLA's conditional has static shapes): the true branch returns ({text(true_traced)}), the false branch ({text(false_traced)})"
        )


def _while_on_chip(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried: Sequence[Any], additional: Sequence[Any]) -> tuple:
    dispatcher = routing.active()
    start = _perf_ns()
    int_positions = [position for position, value in enumerate(carried) if type(value) is int]
    carried = _ints_on_chip(carried, int_positions, WHILE_LOOP_NAME)
    inputs = _host_scalars_on_chip([*carried, *additional])
    carried = inputs[: len(carried)]
    with dispatcher.thread_lock:
        call = _ChipCall(dispatcher, inputs, WHILE_LOOP_NAME)
        if not all(isinstance(value, TpuTensor) for value in carried):
            kinds = ", ".join(type(value).__name__ for value in carried)
            raise RuntimeError(f"torch.while_loop on tpu carries tensors and ints, got ({kinds})")
        template = tuple(call.statics)
        key = (tuple(call.specs), template, call.chip, matmul_precision.setting())

        def build(functions_key: Any) -> tuple:
            cond_traced, body_traced = _traced_loop(cond_fn, body_fn, inputs, None)
            draws = (cond_traced.function.draws, body_traced.function.draws)
            n_carried, n_arrays = len(carried), len(call.dynamic)

            def run(*arrays: Any) -> tuple:
                values = _with_arrays(template, arrays[:n_arrays])
                if any(draws):
                    return counted_while_values(cond_traced.function, body_traced.function, values[:n_carried], values[n_carried:], arrays[n_arrays:])
                return while_values(cond_traced.function, body_traced.function, values[:n_carried], values[n_carried:])

            out_specs = (*_out_specs(carried), _COUNT_SPEC) if any(draws) else _out_specs(carried)
            plan = Plan(WHILE_LOOP_NAME, run, out_specs, "tuple", tuple(call.specs), call.chip, (WHILE_LOOP_NAME, functions_key))
            return plan, draws

        plan, (cond_draws_per_check, body_draws_per_step) = _cached((cond_fn, body_fn), key, build)
        if cond_draws_per_check or body_draws_per_step:
            call.dynamic.extend(rng.next_seed_and_counter(call.chip, 0))
        outputs: list[Any] = _run(plan, call, start)
        if cond_draws_per_check or body_draws_per_step:
            steps = int(dispatcher.to_host(outputs.pop(), SYNC_KIND).item())
            rng.next_seed_and_counter(call.chip, steps * (cond_draws_per_check + body_draws_per_step) + cond_draws_per_check)
        for position in int_positions:
            outputs[position] = int(dispatcher.to_host(outputs[position], SYNC_KIND).item())
        return tuple(outputs)


def _ints_on_chip(carried: Sequence[Any], int_positions: Sequence[int], op_name: str) -> list[Any]:
    """The carried values with each Python int as a 0-dim int64 tensor on the chip of the carried
    tensors: the loop counts on the chip, and the host reads the final count (one data-dependent
    sync), as torch returns an int for an int carry."""
    if not int_positions:
        return list(carried)
    device = next((value.device for value in carried if isinstance(value, TpuTensor)), None)
    if device is None:
        raise RuntimeError(f"{op_name} on tpu needs a tpu tensor among the carried inputs, got only ints")
    return [torch.tensor(value, dtype=torch.int64, device=device) if position in int_positions else value for position, value in enumerate(carried)]


def _host_scalars_on_chip(values: Sequence[Any]) -> list[Any]:
    """The values with each 0-dim CPU tensor moved to the chip of the tpu ones, as an op takes a CPU
    scalar beside tpu tensors: Dynamo passes a float a branch reads as one once it changes between
    calls, and torch's backward of while_loop counts its steps in one."""
    device = next((value.device for value in values if isinstance(value, TpuTensor)), None)
    if device is None:
        return list(values)
    return [value.to(device) if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0 else value for value in values]


# ----------------------------------------------------------------------------- the tpu rules
def _cond_rule(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: Sequence[Any]) -> Any:
    if not isinstance(pred, TpuTensor):
        return true_fn(*operands) if bool(pred) else false_fn(*operands)
    if pred.numel() != 1:
        raise RuntimeError(f"torch.cond's predicate must have one element, got shape {tuple(pred.shape)}")
    return _cond_on_chip(pred, true_fn, false_fn, operands)


def _while_loop_rule(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried: Sequence[Any], additional: Sequence[Any], **kwargs: Any) -> Any:
    if kwargs.get("mutated_arg_indices"):
        raise RuntimeError("torch.while_loop on tpu does not let cond_fn or body_fn write into their inputs; write into a clone and carry it")
    return _while_on_chip(cond_fn, body_fn, carried, additional)


def _stacked_while_loop_rule(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried: Sequence[Any], additional: Sequence[Any]) -> tuple:
    """torch's `while_loop_stack_output` (the forward of `while_loop` when a carried input requires
    grad): the carried values after every iteration, stacked. XLA needs the number of iterations as
    a size, so the loop runs twice: once counting its iterations (read on the host, one
    data-dependent sync), then as a scan of that many bodies that stacks their outputs."""
    dispatcher = routing.active()
    n_carried = len(carried)
    inputs = _host_scalars_on_chip([*carried, *additional])
    carried = inputs[:n_carried]
    if not all(isinstance(value, TpuTensor) for value in carried):
        kinds = ", ".join(type(value).__name__ for value in carried)
        raise RuntimeError(f"torch.while_loop's backward needs tensor carries, as on the CPU, got ({kinds}); carry a Python int as a 0-dim tensor")
    start = _perf_ns()
    with dispatcher.thread_lock:
        call = _ChipCall(dispatcher, inputs, WHILE_LOOP_NAME)
        template = tuple(call.statics)
        key = (tuple(call.specs), template, call.chip, matmul_precision.setting())

        def build_traces(functions_key: Any) -> tuple:
            cond_traced, body_traced = _traced_loop(cond_fn, body_fn, inputs, "a torch.while_loop whose carried inputs require grad")

            def count(*arrays: Any) -> tuple:
                values = _with_arrays(template, arrays)
                return counted_while_values(cond_traced.function, body_traced.function, values[:n_carried], values[n_carried:])

            count_specs = (*_out_specs(carried), _COUNT_SPEC)
            plan = Plan(WHILE_LOOP_NAME, count, count_specs, "tuple", tuple(call.specs), call.chip, (WHILE_LOOP_NAME, "count", functions_key))
            return plan, body_traced, {}, functions_key

        count_plan, body_traced, stack_plans, functions_key = _cached((cond_fn, body_fn), ("stacked", key), build_traces)
        *_, count_tensor = _run(count_plan, call, start)
        iterations = int(dispatcher.to_host(count_tensor, SYNC_KIND).item())
    if iterations == 0:
        return tuple(value.unsqueeze(0).clone() for value in carried)
    with dispatcher.thread_lock:
        call = _ChipCall(dispatcher, inputs, WHILE_LOOP_NAME)
        plan = stack_plans.get(iterations)
        if plan is None:

            def stack(*arrays: Any) -> tuple:
                values = _with_arrays(template, arrays)
                return stacked_body_values(body_traced.function, values[:n_carried], values[n_carried:], iterations)

            stacked_fakes = [torch.empty((iterations, *value.shape), dtype=value.dtype, device="meta") for value in carried]
            plan = stack_plans[iterations] = Plan(
                WHILE_LOOP_NAME, stack, _out_specs(stacked_fakes), "tuple", tuple(call.specs), call.chip, (WHILE_LOOP_NAME, "stack", iterations, functions_key)
            )
        return tuple(_run(plan, call, _perf_ns()))


def _on_handles(rule: Callable[..., Any]) -> Callable[..., Any]:
    """A tpu rule for the handles a compiled graph run eagerly (`backend="aot_eager"`) holds instead
    of tpu tensors (`TpuData`): the rule runs on TpuTensors over the same buffers, and its tpu results
    come back as handles, as `TpuData.__torch_dispatch__` does for ATen ops."""

    def run(*args: Any, **kwargs: Any) -> Any:
        tensors = pytree.tree_map_only(TpuData, lambda handle: handle.tensor(), (args, kwargs))
        return pytree.tree_map_only(TpuTensor, lambda tensor: tensor._inner, rule(*tensors[0], **tensors[1]))

    return run


def _past_analysis_mode(hop: Any, rule: Callable[..., Any]) -> Callable[..., Any]:
    """The rule of AOTAutograd's first-run check of custom ops' aliasing (a dispatch mode) for a
    HOP. Given handles it declines (NotImplemented, so that the handles' own dispatch runs), and
    for a HOP torch returns that NotImplemented as the op's result; with handles this runs the tpu
    rule instead (the check concerns custom ops, not HOPs), else the mode as torch would."""

    def run(mode: Any, *args: Any, **kwargs: Any) -> Any:
        if any(type(value) is TpuData for value in pytree.tree_leaves((args, kwargs))):
            return rule(*args, **kwargs)
        return mode.__torch_dispatch__(hop, [], args, kwargs)

    return run


def _storages_through_traced(original: Callable[[torch.Tensor], set]) -> Callable[[torch.Tensor], set]:
    """Dynamo's `get_tensor_storages` (which refuses every traceable wrapper subclass, so Dynamo
    cannot trace `while_loop` on one), answering for a traced tpu tensor with its inner tensor's
    storages: the traced tensor has no storage of its own."""

    def get_tensor_storages(tensor: torch.Tensor) -> set:
        if type(tensor) is TpuTensor and tensor._traced is not None:
            return original(tensor._traced)
        return original(tensor)

    get_tensor_storages.tpu_inner = True  # type: ignore[attr-defined]
    return get_tensor_storages


def install() -> None:
    """Register the tpu rules of `cond` and `while_loop`, and let their mode rules see through traced
    tpu tensors (once). The rules of AOTAutograd's analysis mode and Dynamo's patch wait until those
    modules are imported (`import_hooks`), by torch.compile, torch.export or a HOP's eager trace."""
    global _installed
    if _installed:
        return
    if higher_order_lowerings not in lowering.CONTROL_FLOW_SOURCES:
        lowering.CONTROL_FLOW_SOURCES.append(higher_order_lowerings)
    for hop, rule in _hop_rules():
        hop.py_impl(TpuTensor)(rule)
        hop.py_impl(TpuData)(_on_handles(rule))
        _route_modes_to_inner(hop)
    import_hooks.when_imported("torch._functorch._aot_autograd.runtime_wrappers", _install_analysis_mode_rules)
    import_hooks.when_imported("torch._dynamo.variables.higher_order_ops", _install_dynamo_storages)
    _installed = True


def _hop_rules() -> tuple[tuple[Any, Callable[..., Any]], ...]:
    """Each HOP with its tpu rule."""
    from torch._higher_order_ops.cond import cond_op
    from torch._higher_order_ops.while_loop import while_loop_op, while_loop_stack_output_op

    return ((cond_op, _cond_rule), (while_loop_op, _while_loop_rule), (while_loop_stack_output_op, _stacked_while_loop_rule))


def _install_analysis_mode_rules(runtime_wrappers: Any) -> None:
    """The HOPs' rules of AOTAutograd's custom-op analysis mode (see `_past_analysis_mode`)."""
    for hop, rule in _hop_rules():
        hop.py_impl(runtime_wrappers._AnalyzeCustomOpInputOutputMode)(_past_analysis_mode(hop, _on_handles(rule)))


def _install_dynamo_storages(dynamo_hops: Any) -> None:
    """Let Dynamo trace HOPs on traced tpu tensors (see `_storages_through_traced`)."""
    if not getattr(dynamo_hops.get_tensor_storages, "tpu_inner", False):
        dynamo_hops.get_tensor_storages = _storages_through_traced(dynamo_hops.get_tensor_storages)
