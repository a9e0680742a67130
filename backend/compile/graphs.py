"""A compiled graph at run time: one AOTAutograd graph (forward, backward or inference) of one Dynamo
graph, run as XLA programs compiled once per concrete input signature.

Inputs arrive as `TpuData` handles (what a TpuTensor flattens to), TpuTensors (saved activations the
forward handed to the backward), CPU tensors, or Python values (sizes of dynamic dims, which make
part of the signature: XLA compiles per concrete shape). Outputs are fresh TpuTensors, except that
an output that is one of the inputs is handed back as that very object.

Each XLA compile, execution and fusion is reported to the recorder as the DeferAndFuse executor
reports its flushes; each compile also counts towards the Dynamo frame that produced the graph.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputrace.backend.compile import aliases, buckets, output_layouts
from tputrace.backend.compile.lowering import GraphLowering, TracedLayout
from tputrace.backend.compile.settings import CompileSettings
from tputrace.backend.core import matmul_precision, program_cache, rng, routing, transfers
from tputrace.backend.core.compile_history import CompileHistory
from tputrace.backend.core.dtypes import to_jax, to_torch
from tputrace.backend.core.plans import Plan, Program, compile_program
from tputrace.backend.core.tensor import TpuData, TpuTensor, new_tensor
from tputrace.backend.eager import hlo_fusions
from tputrace.backend.indexing import index_checks
from tputrace.recording.interface import Recording

_perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class GraphInfo:
    """Which graph this is: the Dynamo graph id, its role, and the frame it came from."""

    graph_id: int
    role: str  # forward, backward or inference
    frame_name: str
    compile_id: str | None

    @property
    def name(self) -> str:
        return f"{self.frame_name} graph {self.graph_id} {self.role}"


@dataclass
class GraphProgram:
    """One XLA program of a graph: compiled for one input signature."""

    program: Program
    layout: TracedLayout
    program_id: int | None
    in_specs: tuple


class CompiledGraph:
    """Runs one AOTAutograd graph on the chip (the callable handed back to AOTAutograd)."""

    def __init__(self, gm: torch.fx.GraphModule, info: GraphInfo, settings: CompileSettings, events: Any) -> None:
        # AOTAutograd calls it with one list of arguments; an instance attribute, so that the wrappers
        # AOTAutograd puts around it (functools.wraps copies __dict__) keep it.
        self._boxed_call = True
        self.info = info
        self.lowering = GraphLowering(gm, info.name)
        self.settings = settings
        self.events = events
        self.programs: dict[Any, GraphProgram] = {}
        self.history = CompileHistory()
        self.input_names = [f"input {index} ({node.name})" for index, node in enumerate(self.lowering.placeholders)]
        self.bucketing: buckets.BucketPlan | None = None
        self.bucket_refusal: str | None = None
        if settings.shape_buckets is not None and info.role == "inference":
            self.bucketing, self.bucket_refusal = buckets.plan(gm)

    @property
    def n_ops(self) -> int:
        return self.lowering.n_ops

    # ----------------------------------------------------------------- running
    def __call__(self, *call_args: Any) -> list:
        args = call_args[0] if len(call_args) == 1 and type(call_args[0]) is list else list(call_args)
        if self.lowering.refusal is not None:
            raise self.lowering.refusal from None
        if self.events.pending:
            self.events.drain()
        recorder = self.events.recorder()
        arrays, statics, chip = _read_inputs(args, recorder)
        bucket = None
        if self.bucketing is not None:
            arrays, statics, bucket = self.bucketing.pad(arrays, statics, self.settings)
        for _ in self.lowering.random_nodes:
            seed, counter = rng.next_seed_and_counter(chip)
            arrays.append(np.int64(seed))
            arrays.append(np.int64(counter))
        precision = matmul_precision.setting() if self.lowering.precision_nodes else None
        key = (tuple((array.shape, array.dtype) for array in arrays), tuple(statics.items()), chip, precision)
        entry = self.programs.get(key)
        if entry is None:
            entry = self._compile(key, arrays, statics, chip, bucket, precision)
        launch = _perf_ns()
        results = entry.program.executable(*arrays)
        if entry.layout.check_result is not None:
            _note_index_flag(results[entry.layout.check_result], chip, recorder)
        returned_sizes: dict[int, int] = {}
        if bucket is not None:
            results, returned_sizes = self.bucketing.unpad(results, entry.layout, bucket)
        if recorder is not None:
            recorder.execution_started(entry.program_id, chip, launch, None, results)
            if bucket is not None:
                recorder.bucket_hit(self.info.name, bucket.describe(), launch, _perf_ns() - launch)
        return self._outputs(entry.layout, results, args, chip, returned_sizes, recorder)

    def _outputs(self, layout: TracedLayout, results: Sequence[Any], args: list, chip: int, returned_sizes: dict[int, int], recorder: Recording | None) -> list:
        host_values = self._host_outputs(layout, results, chip, recorder) if any(layout.output_on_host) else {}
        outputs: list[Any] = []
        for index, (slot, dtype, on_host) in enumerate(zip(layout.outputs, layout.output_dtypes, layout.output_on_host)):
            if index in returned_sizes:
                outputs.append(returned_sizes[index])
                continue
            if slot.kind == "array":
                array = results[slot.index]
                if on_host:
                    outputs.append(transfers.array_to_torch(host_values[slot.index], dtype))
                else:
                    outputs.append(_result_tensor(array, chip, dtype, layout.result_layouts.get(slot.index)))
            elif slot.kind == "input":
                outputs.append(args[slot.index])
            else:
                outputs.append(slot.value)
        if layout.output_aliases:
            bases: dict[int, TpuTensor] = {}
            for index, alias in layout.output_aliases.items():
                outputs[index] = aliases.replay(_alias_base(alias, args, outputs, results, layout, bases, chip), alias.steps)
        return outputs

    def _host_outputs(self, layout: TracedLayout, results: Sequence[Any], chip: int, recorder: Recording | None) -> dict[int, Any]:
        """The outputs torch places on the CPU (e.g. updated step counters), copied back in one go: the
        host waits for the program here, a sync."""
        indices = [slot.index for slot, on_host in zip(layout.outputs, layout.output_on_host) if on_host and slot.kind == "array"]
        start = _perf_ns()
        values = jax.device_get([results[index] for index in indices])
        end = _perf_ns()
        if recorder is not None:
            recorder.synced("host_outputs", chip, start, end - start, 0)
            recorder.transferred("d2h", sum(value.nbytes for value in values), chip, -1, start, end - start)
        return dict(zip(indices, values))

    # ----------------------------------------------------------------- compiling
    def precompile(self, example_inputs: Sequence[Any]) -> None:
        """Compile for the example inputs now when their shapes are static (so that XLA's time counts
        towards the Dynamo compile, as Inductor's does); dynamic graphs compile at their first call,
        and graphs whose arguments torch refuses never compile (each call raises its error)."""
        if self.bucketing is not None or self.lowering.refusal is not None:
            return
        arrays: list[Any] = []
        statics: dict[int, Any] = {}
        chip = -1
        for index, value in enumerate(example_inputs):
            if isinstance(value, torch.Tensor):
                shape = []
                for size in value.shape:
                    if not isinstance(size, int):
                        return
                    shape.append(size)
                if value.device.type == "tpu":
                    if chip == -1:
                        chip = value.device.index or 0
                elif value.device.type != "cpu":
                    return
                arrays.append(jax.ShapeDtypeStruct(tuple(shape), to_jax(value.dtype)))
            elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return
            else:
                statics[index] = value
        chip = 0 if chip == -1 else chip
        for _ in self.lowering.random_nodes:
            arrays.append(jax.ShapeDtypeStruct((), np.int64))
            arrays.append(jax.ShapeDtypeStruct((), np.int64))
        precision = matmul_precision.setting() if self.lowering.precision_nodes else None
        key = (tuple((tuple(array.shape), np.dtype(array.dtype)) for array in arrays), tuple(statics.items()), chip, precision)
        if key not in self.programs:
            self._compile(key, arrays, statics, chip, None, precision)

    def _compile(self, key: Any, arrays: list, statics: dict[int, Any], chip: int, bucket: Any, precision: str | None) -> GraphProgram:
        layout = TracedLayout()
        unpadded = bucket is None and self.bucketing is None
        # A padded call's filler would fail the checks (a row of zeros is no distribution): no checks then.
        function = self.lowering.function(
            statics, layout, keep_aliases=unpadded, keep_strides=unpadded, precision=precision, check_indices=unpadded,
        )
        recorder = self.events.recorder()
        program = compile_program(function, arrays, chip, self.info.name, keep_hlo=recorder is not None)
        in_specs = self._in_specs(arrays, statics)
        reason, diff = self.history.reason(in_specs, self.input_names, precision, evicted=program_cache.take_evicted(self, key))
        program_id = None
        if recorder is not None:
            plan = Plan(self.info.name, function, (), "tuple", in_specs, chip, ("compiled", self.info.graph_id, self.info.role))
            plan.program = program
            detail: dict[str, Any] = {"graph_id": self.info.graph_id, "role": self.info.role, "mode": self.settings.mode}
            if self.info.compile_id is not None:
                detail["compile_id"] = self.info.compile_id
            if bucket is not None:
                detail["bucket"] = bucket.detail()
            if self.lowering.host_ops:
                detail["host_ops"] = self.lowering.host_ops
            if precision is not None:
                detail["matmul_precision"] = precision
            program_id = recorder.compiled(plan, "xla", reason, diff, n_ops=self.n_ops, detail=detail, program_kind="compiled")
            if program.hlo_text and program_id is not None:
                for fusion in hlo_fusions.parse(program.hlo_text):
                    recorder.fusion(program_id, fusion)
        self.events.xla_compiled(self.info, program.compile_ns, program_id)
        entry = GraphProgram(program, layout, program_id, in_specs)
        self.programs[key] = entry
        program_cache.keep_item(self, "programs", key, entry)
        return entry

    def _in_specs(self, arrays: Sequence[Any], statics: dict[int, Any]) -> tuple:
        specs = []
        position = 0
        for index in range(len(self.lowering.placeholders)):
            if index in statics:
                specs.append((f"{type(statics[index]).__name__} {statics[index]}",))
            else:
                array = arrays[position]
                specs.append((tuple(array.shape), to_torch(array.dtype)))
                position += 1
        return tuple(specs)


def _note_index_flag(flag: Any, chip: int, recorder: Recording | None) -> None:
    """Hand a program's index-check flag to the chip's (the next sync raises its site's error); with
    launch blocking, raise it at the call, as blocking eager mode raises at the op."""
    dispatcher = routing.active()
    index_checks.note_flag(chip, flag)
    if getattr(dispatcher.executor, "launch_blocking", False):
        index_checks.raise_if_out_of_range(recorder, chip)


def _read_inputs(args: Sequence[Any], recorder: Recording | None) -> tuple[list[Any], dict[int, Any], int]:
    """The arrays of a call's tensor inputs, its other inputs by position, and the chip. CPU tensors
    (e.g. an optimizer's step counters) go in as host arrays: the program's call copies them all."""
    dispatcher = routing.active()
    arrays: list[Any] = []
    statics: dict[int, Any] = {}
    host_bytes = 0
    chip = -1
    for index, value in enumerate(args):
        value_type = type(value)
        if value_type is TpuData or value_type is TpuTensor:
            buf = value._buf
            if chip != buf.chip:
                if chip != -1:
                    raise RuntimeError(f"a compiled graph got tensors on tpu:{chip} and tpu:{buf.chip}; move them to one chip")
                chip = buf.chip
            array = buf.array if value._view is None else dispatcher.read(value)
            if not isinstance(array, jax.Array):
                array = dispatcher.executor.concrete(array, "compiled_graph")[0]
            arrays.append(array)
        elif isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise RuntimeError(f"a compiled tpu graph got a tensor on {value.device}; move it to tpu or cpu")
            host = _host_array(value)
            host_bytes += host.nbytes
            arrays.append(host)
        else:
            statics[index] = value
    if chip == -1:
        from tputrace.backend.compat import device_module

        chip = device_module.current_device()
    if host_bytes and recorder is not None:
        recorder.transferred("h2d", host_bytes, -1, chip, _perf_ns(), 0)
    return arrays, statics, chip


def _alias_base(
    alias: aliases.OutputAlias, args: Sequence[Any], outputs: Sequence[Any], results: Sequence[Any], layout: TracedLayout, bases: dict[int, TpuTensor], chip: int
) -> torch.Tensor:
    """The tensor a view output is a view of: a runtime input, another output, or a program result
    (one tensor per result, kept in `bases`, so that views of one intermediate alias each other)."""
    if alias.kind == "input":
        value = args[alias.index]
        return value.tensor() if type(value) is TpuData else value
    if alias.kind == "output":
        return outputs[alias.index]
    base = bases.get(alias.index)
    if base is None:
        array = results[alias.index]
        base = bases[alias.index] = _result_tensor(array, chip, to_torch(array.dtype), layout.result_layouts.get(alias.index))
    return base


def _result_tensor(array: Any, chip: int, dtype: torch.dtype, stored: output_layouts.StoredLayout | None) -> TpuTensor:
    """A fresh tensor over one program result; a channels-last one (`output_layouts`) if stored so."""
    if stored is None:
        return new_tensor(array, chip, (tuple(array.shape), dtype), array.nbytes)
    return output_layouts.wrap(array, chip, dtype, stored)


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    host = tensor.detach().contiguous()
    if host.dtype == torch.bfloat16:
        return host.view(torch.int16).numpy().view(jnp.bfloat16)
    return host.numpy()



