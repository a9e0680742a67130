"""DeferAndFuse: ops are recorded into a pending graph per chip and run later as one XLA program.

A flush happens when the host needs a value (item, cpu, numpy, tolist, print, bool, data-dependent
shapes), before a CPU fallback or a collective, at a size cap, and at step boundaries (end of
backward, optimizer.step, tputrace.step). Programs are cached by graph structure plus input
signature, so a steady-state step traces and compiles nothing. A graph that repeats the one flushed at the
same point of the loop before is checked op by op against it and runs its program without its key being
built (`step_replay`).

The pending graph holds the concrete arrays it reads and weak references to the buffers it will
write; a buffer that dies before the flush is not an output, and XLA drops its computation. Arrays
that an in-place update replaced are donated to the program. Where a backward pass starts inside a
graph, the forward values it reads pass through an optimization barrier, so the program keeps what
autograd saved and not the forward's intermediates that XLA would otherwise share with the backward.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import sys
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from tputrace.backend.core import matmul_precision, memory, program_cache
from tputrace.backend.core.plans import VIEW_READ, Plan, compile_program
from tputrace.backend.core.routing import DispatcherApi
from tputrace.backend.eager import graph_changes, hlo_fusions, step_replay
from tputrace.backend.eager.flush_sites import FlushSites, FlushedGraph
from tputrace.backend.eager.program_parts import SCALAR_DTYPES, SCALAR_KINDS, donation, fence, input_specs, saved_values, scalar_identity, unpack
from tputrace.recording.interface import Recording

_perf_ns = time.perf_counter_ns

SIZE_CAP = 10_000
# Python scalars are not program inputs one by one (each would be its own host-to-chip transfer):
# a flush packs them into one array per kind (`program_parts`).
_SCALAR_KINDS = SCALAR_KINDS
_GRAPH_ONLY_REFS = 3
# Ops whose same Python scalars share a slot: a foreach op's per-element scalars are copies of one
# hyperparameter (a bias correction per parameter). Other ops' scalars that happen to be the same (a seed
# and an offset, both 0) keep their own slots, so a program does not change when they stop being the same.
_PER_ELEMENT_SCALAR_OPS = "aten._foreach_"
_UNSHARED: dict = {}
# Ops whose result reads only its inputs' shapes and dtypes (a functional `zero_`/`fill_` overwrites
# its input): an optimizer's first step makes its state with them (see `DeferredExecutor.creating_state`).
NEW_VALUE_OPS = frozenset({
    "aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default", "aten.empty_like.default",
    "aten.new_zeros.default", "aten.new_ones.default", "aten.new_full.default", "aten.new_empty.default",
    "aten.zero.default", "aten.fill.Scalar", "aten.arange.default", "aten.arange.start", "aten.arange.start_step",
    "aten.zeros.default", "aten.ones.default", "aten.full.default",
})
# Copies that make a new value too when they copy only new values (ASGD's `as_tensor(lr).clone()`).
COPY_OPS = frozenset({"aten.clone.default", "aten._to_copy.default"})


class LazyValue:
    """An output of a pending op: its shape and dtype now, its array after the flush."""

    __slots__ = ("graph", "node", "index", "shape", "dtype", "nbytes", "concrete", "__weakref__")

    def __init__(self, graph: "PendingGraph", node: int, index: int, shape: tuple[int, ...], dtype: Any, nbytes: int) -> None:
        self.graph = graph
        self.node = node
        self.index = index
        self.shape = shape
        self.dtype = dtype
        self.nbytes = nbytes
        self.concrete: Any = None

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass
class PendingGraph:
    """The ops recorded on one chip since its last flush."""

    chip: int
    nodes: list[tuple[Plan, tuple]] = field(default_factory=list)
    inputs: list[Any] = field(default_factory=list)
    input_refs: dict[int, tuple[int, int]] = field(default_factory=dict)  # id of an input array -> a node's reference to it
    owners: list[weakref.ref] = field(default_factory=list)
    # Index into `inputs` of an array that an in-place update replaced -> the buffer that held it.
    replaced_inputs: dict[int, weakref.ref] = field(default_factory=dict)
    op_records: list[tuple] = field(default_factory=list)
    record_nodes: list[int] = field(default_factory=list)  # the node of each op record (view reads have no record)
    scalars: tuple[list, ...] = field(default_factory=lambda: ([], [], [], []))
    backward_from: int | None = None  # the first node a backward pass recorded (see `mark_backward`)
    flushed: bool = False
    template: Any = None  # the `step_replay.Template` the graph follows op by op, until an op differs
    replay: str | None = None  # `step_replay`'s HELD, BROKE or NONE; None: not replayed (replay off, optimizer state)
    replay_break: str | None = None  # why the replay broke

    def packed_scalars(self) -> list[np.ndarray]:
        """The Python scalars the graph reads, one array per kind (float, int, bool, complex)."""
        return [np.array(values, dtype=dtype) for values, dtype in zip(self.scalars, SCALAR_DTYPES)]


@dataclass
class FusedProgram:
    """A compiled flush: the program plus the outputs it returns and the inputs it donates."""

    program: Any
    n_ops: int
    donate: tuple[int, ...]
    n_outputs: int
    program_id: int | None = None
    sizes: tuple[int, int] | None = None  # (input bytes, output bytes) of one call, once recorded
    template: Any = None  # its `step_replay.Template`, made at its first flush with replay on
    # The node plans, held so that their ids, which the program's cache key is made of, stay theirs
    # while the program is cached (a freed plan's id could be reused by a new plan).
    plans: tuple = ()


class DeferredExecutor:
    """DEFER_AND_FUSE: records ops into per-chip pending graphs and runs each graph as one program."""

    deferred = True

    def __init__(self, dispatcher: DispatcherApi, size_cap: int = SIZE_CAP) -> None:
        self.dispatcher = dispatcher
        self.size_cap = size_cap
        self.graphs: dict[int, PendingGraph] = {}
        self.programs: dict[Any, FusedProgram] = {}
        # The dispatcher's: once several user threads dispatch, each op holds it from start to end, so
        # a flush (also one outside an op: end of backward, step boundary) never cuts into another op.
        self.lock = dispatcher.thread_lock
        self.last_outputs: list[Any] = []
        self.flush_sites = FlushSites()
        self._timings: queue.SimpleQueue | None = None
        self.held: list[Sequence[Any]] = []  # values ops hold between runs (see `holding`)
        # Per chip, the graph of an optimizer's new state while its first step runs (`creating_state`),
        # and the arrays copied from the host meanwhile, by id (new values too).
        self.state_graphs: dict[int, PendingGraph] | None = None
        self.arrived_for_state: dict[int, Any] = {}
        self.replay_chains = step_replay.Chains() if step_replay.enabled() else None

    # ----------------------------------------------------------------- Executor protocol
    def prepare(self, plan: Plan, dynamic: Sequence[Any]) -> None:
        avals = [jax.ShapeDtypeStruct(value.shape, value.dtype) if hasattr(value, "shape") else value for value in dynamic]
        jax.eval_shape(plan.fn, *avals)

    def run(self, plan: Plan, dynamic: Sequence[Any], record_name: str | None = None, start_ns: int | None = None) -> tuple:
        lock = self.lock
        lock.acquire()  # not `with`: every recorded op pays for the block
        try:
            state_graphs = self.state_graphs
            graph = None if state_graphs is None else self._state_graph(state_graphs, plan, dynamic)
            if graph is None:
                graph = self.graphs.get(plan.chip)
                if graph is None:
                    graph = self.graphs[plan.chip] = self._new_graph(plan.chip)
                elif len(graph.nodes) >= self.size_cap and plan.op_name != VIEW_READ:
                    # Not at a view read: its value goes to an op not recorded yet. This op's pending
                    # inputs become outputs, as a view's value is in no buffer.
                    pending = [value for value in dynamic if type(value) is LazyValue and value.graph is graph]
                    self.flush_graph(graph, "size_cap", extra=pending)
                    graph = self.graphs[plan.chip] = self._new_graph(plan.chip)
            template = graph.template
            if template is not None and step_replay.replay_op(graph, template, plan, dynamic, LazyValue):
                node = len(graph.nodes) - 1
            else:
                if template is not None:
                    graph.template = None
                    graph.replay = step_replay.BROKE
                node = self._record_node(graph, plan, dynamic)
            specs = plan.out_specs
            if len(specs) == 1:
                spec = specs[0]
                outputs = (LazyValue(graph, node, 0, spec.shape, spec.jax_dtype, spec.nbytes),)
            else:
                outputs = tuple([
                    None if spec is None else LazyValue(graph, node, index, spec.shape, spec.jax_dtype, spec.nbytes)
                    for index, spec in enumerate(specs)
                ])
        finally:
            lock.release()
        recorder = self.dispatcher.recorder
        if recorder is not None and record_name is not None and recorder.window_open:
            recorder.op_deferred(graph.op_records, record_name, plan, start_ns if start_ns is not None else _perf_ns())
            graph.record_nodes.append(node)
        return outputs

    def _new_graph(self, chip: int) -> PendingGraph:
        """An empty graph for `chip`, following the template of the graph flushed after its last one there."""
        graph = PendingGraph(chip)
        if self.replay_chains is not None:
            graph.template = self.replay_chains.candidate(chip)
            graph.replay = step_replay.NONE if graph.template is None else step_replay.HELD
        return graph

    def _record_node(self, graph: PendingGraph, plan: Plan, dynamic: Sequence[Any]) -> int:
        """Add an op to the graph (its inputs, scalars and references to earlier ops' outputs); its node."""
        input_refs = graph.input_refs
        refs = []
        op_slots: dict | None = None  # (kind, identity) -> slot, for a foreach op's scalars (`scalar_identity`)
        for value in dynamic:
            if type(value) is LazyValue:
                if value.concrete is None:
                    if value.graph is graph:
                        refs.append((1, value.node, value.index))
                        continue
                    value = self._concrete_value(value, "transfer")
                else:
                    value = value.concrete
            ref = input_refs.get(id(value))  # an array the graph reads already (a scalar is never one)
            if ref is None:
                kind = _SCALAR_KINDS.get(type(value))
                if kind is not None:
                    scalars = graph.scalars[kind]
                    if op_slots is None:
                        op_slots = {} if plan.op_name.startswith(_PER_ELEMENT_SCALAR_OPS) else _UNSHARED
                    slot = op_slots.setdefault((kind, scalar_identity(value)), len(scalars)) if op_slots is not _UNSHARED else len(scalars)
                    if slot == len(scalars):
                        scalars.append(value)
                    refs.append((2, kind, slot))
                    continue
                inputs = graph.inputs
                ref = input_refs[id(value)] = (0, len(inputs))
                inputs.append(value)
            refs.append(ref)
        nodes = graph.nodes
        nodes.append((plan, tuple(refs)))
        return len(nodes) - 1

    @staticmethod
    def own(buffer: Any, _ref: Any = weakref.ref) -> None:
        """A new buffer holds an output `run` just returned: the flush fills it in if it still lives."""
        buffer.array.graph.owners.append(_ref(buffer))

    def track(self, buffer: Any, replaced: Any = None) -> None:
        """A buffer now holds a pending value; `replaced` is the array it held before (donatable)."""
        value = buffer.array
        if type(value) is LazyValue and value.concrete is None:
            value.graph.owners.append(weakref.ref(buffer))
            if replaced is not None and type(replaced) is not LazyValue:
                ref = value.graph.input_refs.get(id(replaced))
                if ref is not None:
                    value.graph.replaced_inputs.setdefault(ref[1], weakref.ref(buffer))

    def write_whole(self, buffers: Sequence[Any], values: Sequence[Any], _ref: Any = weakref.ref) -> None:
        """Write the pending outputs of one `run` into their buffers, each tracked as `track` tracks it
        (a `_foreach_*_` op's list: one graph for all of them, looked up once)."""
        graph = values[0].graph
        owners = graph.owners
        input_refs = graph.input_refs
        replaced_inputs = graph.replaced_inputs
        for buffer, value in zip(buffers, values):
            replaced = buffer.array
            buffer.array = value
            buffer.version += 1
            reference = _ref(buffer)
            owners.append(reference)
            if type(replaced) is not LazyValue:
                ref = input_refs.get(id(replaced))
                if ref is not None:
                    replaced_inputs.setdefault(ref[1], reference)

    @contextlib.contextmanager
    def holding(self, values: Sequence[Any]) -> Iterator[None]:
        """A block in which every flush keeps `values`: an op that records one program and then writes
        its outputs one by one (a `_foreach_*_` into views, or with a cast) may flush at the size cap
        halfway, and the outputs not written yet are in no buffer."""
        with self.lock:
            self.held.append(values)
            try:
                yield
            finally:
                self.held.pop()

    def concrete(self, value: Any, trigger: str) -> tuple[Any, int]:
        """The array behind a value, flushing its graph if needed; also the number of ops flushed."""
        if type(value) is not LazyValue:
            return value, 0
        if value.concrete is not None:
            return value.concrete, 0
        with self.lock:
            graph = value.graph
            pending = len(graph.op_records)
            self.flush_graph(graph, trigger, extra=[value])
            return value.concrete, pending

    def materialize(self, values: list[Any], trigger: str) -> list[Any]:
        """The arrays behind values: each pending graph among them is flushed once, keeping every
        value asked for (flushing for one of them alone would drop the others, e.g. a view's read)."""
        with self.lock:
            pending = [value for value in values if type(value) is LazyValue and value.concrete is None]
            for graph in {id(value.graph): value.graph for value in pending}.values():
                self.flush_graph(graph, trigger, extra=[value for value in pending if value.graph is graph])
            return [value.concrete if type(value) is LazyValue else value for value in values]

    def _concrete_value(self, value: Any, trigger: str) -> Any:
        return self.concrete(value, trigger)[0]

    def flush(self, trigger: str) -> None:
        """Run every chip's pending graph."""
        with self.lock:
            if self.state_graphs:
                self._flush_state_graphs()
            for graph in list(self.graphs.values()):
                if graph.nodes:
                    self.flush_graph(graph, trigger)

    def creating_state(self) -> None:
        """An optimizer takes its first step: the state it makes (zeros, fills) is recorded into a graph
        of its own and run before the update reads it. The update's graph then reads the state as
        inputs, as every later step's does, and the second step compiles nothing new."""
        with self.lock:
            self.state_graphs = {}
            self.arrived_for_state.clear()

    def state_created(self) -> None:
        """The optimizer's first step ended (or another step boundary came): new values go with the rest."""
        with self.lock:
            if self.state_graphs:
                self._flush_state_graphs()
            self.state_graphs = None
            self.arrived_for_state.clear()

    def arrived(self, array: Any) -> None:
        """An array copied from the host: while state is made, a copy of it is a new value too."""
        if self.state_graphs is not None:
            self.arrived_for_state[id(array)] = array

    def _state_graph(self, state_graphs: dict[int, PendingGraph], plan: Plan, dynamic: Sequence[Any]) -> PendingGraph | None:
        """While state is made: the state graph for an op that makes a new value from inputs that it
        can read apart from the pending graph; None for any other op, which first runs the state made."""
        if plan.op_name not in NEW_VALUE_OPS and not (plan.op_name in COPY_OPS and self._copies_new_values(state_graphs, dynamic)):
            if state_graphs:
                self._flush_state_graphs(dynamic)
            return None
        graph = state_graphs.get(plan.chip)
        if graph is None or graph.flushed:
            graph = state_graphs[plan.chip] = PendingGraph(plan.chip)
        pending = self.graphs.get(plan.chip)
        for value in dynamic:
            if type(value) is LazyValue:
                if value.concrete is None:
                    if value.graph is not graph:
                        return None  # made by the pending graph: reading it here would run that graph
                    continue
                value = value.concrete
            if pending is not None and id(value) in pending.input_refs:
                return None  # an input of the pending graph, which the state graph could donate
        return graph

    def _copies_new_values(self, state_graphs: dict[int, PendingGraph], dynamic: Sequence[Any]) -> bool:
        """Whether every array a copy reads is a new value: pending in a state graph, or copied from the host."""
        for value in dynamic:
            if type(value) is LazyValue:
                if value.concrete is None:
                    if state_graphs.get(value.graph.chip) is not value.graph:
                        return False
                    continue
                value = value.concrete
            if _SCALAR_KINDS.get(type(value)) is None and id(value) not in self.arrived_for_state:
                return False
        return True

    def _flush_state_graphs(self, read: Sequence[Any] = ()) -> None:
        """Run the state graphs, keeping the values of theirs in `read`: the op that flushes them reads those, which no
        buffer may hold yet (a channels-last state's value, before the op storing it in its buffer's order)."""
        state_graphs = self.state_graphs
        for graph in list(state_graphs.values()):
            if not graph.flushed and graph.nodes:
                kept = [value for value in read if type(value) is LazyValue and value.graph is graph]
                self.flush_graph(graph, "optimizer_state", extra=kept)
        state_graphs.clear()

    def mark_backward(self) -> None:
        """A backward pass starts: what it reads of the ops recorded before it becomes a fence in the
        program (`program_parts.saved_values`), so XLA keeps what autograd saved and no more."""
        with self.lock:
            if self.state_graphs is not None:
                self.state_created()
            for graph in self.graphs.values():
                if graph.backward_from is None and graph.nodes:
                    graph.backward_from = len(graph.nodes)

    def synchronize(self) -> None:
        self.flush("explicit")
        if self.last_outputs:
            jax.block_until_ready(self.last_outputs)
        jax.effects_barrier()

    # ----------------------------------------------------------------- flushing
    def flush_graph(self, graph: PendingGraph, trigger: str, extra: Sequence[LazyValue] = ()) -> None:
        if self.graphs.get(graph.chip) is graph:
            del self.graphs[graph.chip]
        if graph.flushed:
            raise RuntimeError(f"a value of a DeferAndFuse graph that already ran was needed, but the graph did not keep it ({trigger})")
        graph.flushed = True
        if not graph.nodes:
            return
        start = _perf_ns()
        owners = []
        # `run` makes one LazyValue per (node, index): each output is kept as its one value.
        outputs: dict[tuple[int, int], LazyValue] = {}
        for reference in graph.owners:
            buffer = reference()
            if buffer is None:
                continue
            value = buffer.array
            if type(value) is LazyValue and value.graph is graph and value.concrete is None:
                owners.append(buffer)
                outputs[value.node, value.index] = value
        for value in extra:
            if value.graph is graph:
                outputs[value.node, value.index] = value
        for values in self.held:
            for value in values:
                if type(value) is LazyValue and value.graph is graph and value.concrete is None:
                    outputs[value.node, value.index] = value
        donate, outputs = donation(graph, outputs, LazyValue)
        output_refs = tuple(outputs)
        in_specs = input_specs(graph.inputs)
        template = graph.template
        fused = None if template is None else step_replay.reused_program(graph, template, output_refs, donate, in_specs)
        cache_hit = fused is not None
        if fused is None:
            if template is not None:
                graph.replay = step_replay.BROKE
            fused, cache_hit = self._program(graph, output_refs, donate, in_specs, trigger)
        if graph.replay is not None:
            self._chain(graph, fused)
        launch = _perf_ns()
        # No warning filter here: JAX warns of unusable donated buffers when it lowers, in `compile_program`.
        inputs = self._launch_inputs(graph, fused.donate) if fused.donate else graph.inputs
        scalars = graph.packed_scalars()
        *results, done = fused.program.executable(*inputs, *scalars)
        memory.running(graph.chip, fused.program.temp_bytes + fused.program.output_bytes)
        for value, result in zip(outputs.values(), results):
            value.concrete = result
        for buffer in owners:
            value = buffer.array
            if type(value) is LazyValue:
                buffer.array = value.concrete
                if buffer.nbytes == 0:
                    buffer.count(value.nbytes)
        self.last_outputs = results
        recorder = self.dispatcher.recorder
        if recorder is not None and recorder.enabled:
            self._record_flush(recorder, graph, fused, trigger, cache_hit, start, launch, results, scalars, done)
        # A value still held from this graph (a view's cached read) must not keep its inputs alive: the
        # next flush would see a donated array as shared and copy it.
        graph.inputs = []
        graph.input_refs = {}
        graph.owners = []

    def _program(self, graph: PendingGraph, output_refs: tuple, donate: tuple[int, ...], in_specs: tuple, trigger: str) -> tuple[FusedProgram, bool]:
        """The graph's program, from the cache (keyed by the graph's structure and input specs) or compiled;
        also whether it came from the cache."""
        structure = (tuple([(id(plan), refs) for plan, refs in graph.nodes]), output_refs, donate, graph.backward_from)
        key = (structure, in_specs)
        fused = self.programs.get(key)
        if fused is not None:
            if fused.template is None and self.replay_chains is not None:
                fused.template = step_replay.Template(graph.nodes, key, fused)
            return fused, True
        fused = self._compile(graph, output_refs, donate, in_specs, structure, trigger, program_cache.take_evicted(self, key))
        self.programs[key] = fused
        program_cache.keep_item(self, "programs", key, fused)
        if self.replay_chains is not None:
            fused.template = step_replay.Template(graph.nodes, key, fused)
        return fused, False

    def _chain(self, graph: PendingGraph, fused: FusedProgram) -> None:
        """The graph that follows this one on its chip is checked against the template of its successor last time."""
        graph.template = None
        if self.replay_chains is not None and fused.template is not None:
            self.replay_chains.flushed(graph.chip, fused.template)

    def _launch_inputs(self, graph: PendingGraph, donate: tuple[int, ...]) -> list[Any]:
        """The graph's inputs, with a copy in place of each donated array that something outside the
        graph still holds (`copy_` shares arrays between tensors): donating it would delete live data."""
        inputs = graph.inputs
        last_outputs = {id(value) for value in self.last_outputs}
        # References to a graph-only input: graph.inputs, the loop's `value` and getrefcount's argument.
        shared = [index for index in donate if sys.getrefcount(value := inputs[index]) > _GRAPH_ONLY_REFS + (id(value) in last_outputs)]
        if not shared:
            return inputs
        copies = list(inputs)
        for index in shared:
            copies[index] = jax.device_put(inputs[index], may_alias=False)
        return copies

    def _compile(self, graph: PendingGraph, output_refs: tuple, donate: tuple[int, ...], in_specs: tuple, structure: Any, trigger: str, evicted: bool) -> FusedProgram:
        nodes = list(graph.nodes)

        n_arrays = len(graph.inputs)
        fence_at = graph.backward_from
        saved = saved_values(nodes, fence_at) if fence_at is not None else ()

        def fused(*inputs: Any) -> tuple:
            packed = inputs[n_arrays:]
            values: list[tuple] = []
            for position, (plan, refs) in enumerate(nodes):
                if position == fence_at and saved:
                    fence(values, saved)
                args = [
                    inputs[ref[1]] if ref[0] == 0 else values[ref[1]][ref[2]] if ref[0] == 1 else unpack(packed, ref[1], ref[2])
                    for ref in refs
                ]
                values.append(plan.fn(*args))
            # Last, a byte that no tensor holds: ready when the program has run, whatever becomes of the other
            # outputs (the next program may take them as donated inputs before this one ran).
            return (*[values[node][index] for node, index in output_refs], jax.numpy.zeros((), np.int8))

        n_ops = graph_changes.op_count(nodes)
        name = graph_changes.program_name(nodes)
        recorder = self.dispatcher.recorder
        recording = recorder is not None and recorder.enabled
        program = compile_program(fused, [*graph.inputs, *graph.packed_scalars()], graph.chip, name, keep_hlo=recording, donate=donate)
        fused_program = FusedProgram(program, n_ops, donate, len(output_refs), plans=tuple(node_plan for node_plan, _ in nodes))
        plan = Plan(name, fused, (), "tuple", in_specs, graph.chip, ("fused", structure))
        plan.program = program
        site = (trigger, recorder.frame_id() if recording else None)
        step = recorder.step_index if recording else 0
        input_names = graph_changes.program_input_names(nodes, len(graph.inputs))
        reason, diff = self.dispatcher.compile_reason(plan.structure_key, in_specs, input_names, evicted=evicted)
        by_length = self.dispatcher.length_recompiles.fused_reason(
            nodes, structure[1:], in_specs, lambda index: graph_changes.op_text(nodes, graph, recorder if recording else None, index)
        )
        called_names = graph_changes.called_names_of(nodes, graph)
        if reason == "first":
            reason, diff = self._structure_change(site, step, nodes, called_names, in_specs, graph, recorder if recording else None, by_length)
        locate = functools.partial(graph_changes.op_location, graph, recorder if recording else None)
        self.flush_sites.remember(site, step, FlushedGraph(tuple(nodes), in_specs, called_names, locate))
        if recording:
            precision = matmul_precision.combined([node_plan.matmul_precision for node_plan, _ in nodes])
            detail = {"matmul_precision": precision} if precision else None
            fused_program.program_id = recorder.compiled(plan, "fused", reason, diff, n_ops=n_ops, detail=detail, program_kind="fused")
            self._record_fusions(recorder, fused_program)
        return fused_program

    def _structure_change(self, site: Any, step: int, nodes: list, called_names: tuple[str, ...], in_specs: tuple, graph: PendingGraph, recorder: Recording | None,
                          by_length: tuple[str, str] | None) -> tuple[str, str | None]:
        """A new graph flushed where an earlier step flushed a different one: a recompile, explained by
        `graph_changes.structure_change`. A site's graphs in its first step are first compiles, but for new
        data-dependent lengths and the same ops on inputs of new sizes (a loop that marks no step)."""
        old = self.flush_sites.counterpart(site, step, nodes) or self.flush_sites.same_program(site, step, nodes, in_specs)
        if old is None:
            return by_length or ("first", None)
        return graph_changes.structure_change(old, nodes, called_names, in_specs, graph, recorder, by_length)

    def _record_fusions(self, recorder: Recording, fused: FusedProgram) -> None:
        if fused.program.hlo_text and fused.program_id is not None:
            for fusion in hlo_fusions.parse(fused.program.hlo_text):
                recorder.fusion(fused.program_id, fusion)

    def _record_flush(self, recorder: Recording, graph: PendingGraph, fused: FusedProgram, trigger: str, cache_hit: bool, start: int, launch: int,
                      results: Sequence[Any], scalars: Sequence[np.ndarray], done: Any) -> None:
        flush_id = recorder.next_flush_id()
        sizes = fused.sizes
        if sizes is None:
            # The program's inputs: the arrays it reads and the arrays its Python scalars are packed into. Every
            # call of one program has the same input and output shapes, so they are read on its first call only
            # (a JAX array's `nbytes` is a Python property, and a flush can read hundreds of arrays).
            sizes = fused.sizes = (sum(getattr(value, "nbytes", 0) for value in graph.inputs) + sum(array.nbytes for array in scalars),
                                   sum(getattr(value, "nbytes", 0) for value in results))
        input_bytes, output_bytes = sizes
        recorder.flushed(flush_id, fused.program_id, trigger, len(graph.op_records), cache_hit, graph.chip, start, _perf_ns() - start, input_bytes, output_bytes,
                         graph.replay, graph.replay_break)
        recorder.ops_flushed(graph.op_records, graph.chip, fused.program_id, flush_id)
        recorder.execution_started(fused.program_id, graph.chip, launch, flush_id, results, done=done)
