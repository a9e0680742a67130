"""The Dynamo backend `"tpu"`: each FX graph Dynamo captures goes through AOTAutograd with core ATen
decompositions, and each graph AOTAutograd produces (forward, backward, or inference) becomes one
`CompiledGraph`: one XLA program per concrete input signature."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from tputrace.backend.compile import hop_decompositions
from tputrace.backend.compile.eager_graphs import EagerGraph, data_dependent_cause
from tputrace.backend.compile.events import DynamoEvents
from tputrace.backend.compile.graphs import CompiledGraph, GraphInfo
from tputrace.backend.compile.int_uses import int_uses
from tputrace.backend.compile.settings import CompileSettings
from tputrace.backend.core.dtypes import short_name

# Dynamo's source of a frame local or global (`L['pos']`, `G['step']`): the Python name in it.
_LOCAL = re.compile(r"[LG]\['([^']+)'\]")

_perf_ns = time.perf_counter_ns


class TpuBackend:
    """What `torch.compile(model, backend="tpu", mode=..., options=...)` calls for each graph."""

    def __init__(self, events: DynamoEvents) -> None:
        self.events = events
        self._graph_ids = itertools.count()
        self._lock = threading.Lock()
        self._decompositions: dict | None = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None, options: dict | None = None) -> Any:
        from torch._dynamo.backends.common import aot_autograd

        settings = CompileSettings.from_torch(mode, options)
        self.events.install()
        start = _perf_ns()
        with self._lock:
            graph_id = next(self._graph_ids)
        compile_id = _current_compile_id()
        location = _user_location(gm)
        self.events.graph_captured(compile_id, graph_id, location, _user_inputs_text(gm), settings.mode)
        frame_name = location[0] if location is not None else "graph"
        int_sources = _int_input_sources(gm)

        def compiler(role: str) -> Any:
            def compile_graph(aot_gm: torch.fx.GraphModule, aot_inputs: Sequence[Any]) -> CompiledGraph | EagerGraph:
                begin = _perf_ns()
                info = GraphInfo(graph_id, role, frame_name, compile_id)
                aot_gm = hop_decompositions.decompose(aot_gm, aot_inputs, self.decompositions())
                eager_cause = data_dependent_cause(aot_gm)
                graph: CompiledGraph | EagerGraph
                if eager_cause is not None:
                    graph = EagerGraph(aot_gm, info.name, eager_cause, self.events)
                else:
                    graph = CompiledGraph(aot_gm, info, settings, self.events)
                    graph.precompile(aot_inputs)
                recorder = self.events.recorder()
                if recorder is not None:
                    detail: dict[str, Any] = {"graph_id": graph_id, "role": role, "n_ops": graph.n_ops}
                    if eager_cause is not None:
                        detail["runs_eagerly"] = eager_cause
                    if compile_id is not None:
                        detail["compile_id"] = compile_id
                    int_names = _int_input_names(int_sources, aot_inputs) if role != "backward" else {}
                    if int_names:
                        detail["int_inputs"] = int_names
                        uses = int_uses(aot_gm)
                        detail["int_uses"] = {index: uses[int(index)] for index in int_names if int(index) in uses}
                    if graph.bucketing is not None:
                        detail["buckets"] = [padding.symbol for padding in graph.bucketing.symbols]
                    if graph.bucket_refusal is not None:
                        detail["bucket_refusal"] = graph.bucket_refusal
                    recorder.graph_lowered(info.name, _inputs_text(aot_inputs), _chip_of(aot_inputs), begin, _perf_ns() - begin, detail)
                return graph

            return compile_graph

        compiled = aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=self.decompositions(),
        )(gm, example_inputs)
        self.events.backend_finished(compile_id, _perf_ns() - start)
        return compiled

    def decompositions(self) -> dict:
        if self._decompositions is None:
            import torch._decomp

            from tputrace.backend.compile import foreach_scalars

            self._decompositions = {**torch._decomp.core_aten_decompositions(), **foreach_scalars.decompositions()}
        return self._decompositions


def _current_compile_id() -> str | None:
    compile_id = torch._guards.CompileContext.current_compile_id()
    return None if compile_id is None else str(compile_id)


def _user_location(gm: torch.fx.GraphModule) -> tuple[str, str, int] | None:
    """(qualified name, file, first line) of the user code Dynamo compiled: the frame itself when it
    is the user's, else (`torch.compile(module)` compiles a wrapper frame inside torch) the forward
    of the root module the graph came from, e.g. ('GPT.forward', '.../gpt_train.py', 86)."""
    import inspect

    from tputrace import sourceloc

    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = getattr(InstructionTranslator.current_tx(), "f_code", None)
    except Exception:  # noqa: BLE001 - only names for the trace
        code = None
    roots = sourceloc.library_roots()
    if code is not None and sourceloc.is_user_file(code.co_filename, roots):
        return getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            continue
        _, module_type = next(iter(stack.values()))
        forward = getattr(module_type, "forward", None) if isinstance(module_type, type) else None
        forward_code = getattr(forward, "__code__", None)
        if forward_code is None:
            break
        file = inspect.getsourcefile(forward) or forward_code.co_filename
        return f"{module_type.__qualname__}.forward", file, forward_code.co_firstlineno
    if code is not None:
        return getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno
    return None


def _placeholder_source(node: torch.fx.Node) -> str:
    """The Python source Dynamo names for a graph input (`L['pos']`, `L['self']._parameters['weight']`); "" for none."""
    grapharg = node.meta.get("grapharg")
    source = grapharg.source.name if grapharg is not None and getattr(grapharg, "source", None) is not None else ""
    return str(source() if callable(source) else source)


def _user_inputs_text(gm: torch.fx.GraphModule) -> str:
    """Shapes of the graph's inputs that are not module parameters or buffers."""
    texts = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = _placeholder_source(node)
        if "_parameters" in source or "_buffers" in source:
            continue
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            texts.append(f"{short_name(value.dtype)}[{','.join(str(size) for size in value.shape)}]")
    return ", ".join(texts)


def _int_input_sources(gm: torch.fx.GraphModule) -> list[str | None]:
    """Per input of Dynamo's graph, the Python name of an int it takes as an input (`pos` for `L['pos']`,
    `self.calls` for `L['self'].calls`); None for the others (tensors, or an int without a source)."""
    names: list[str | None] = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = _placeholder_source(node)
        is_int = isinstance(node.meta.get("example_value"), (int, torch.SymInt))
        names.append(_LOCAL.sub(r"\1", source) if is_int and source else None)
    return names


def _int_input_names(sources: list[str | None], aot_inputs: Sequence[Any]) -> dict[str, str]:
    """The Python names of the ints an AOT forward or inference graph takes, by input index, where its inputs are
    Dynamo's graph's, in order (the tpu backend compiles such an int's value into the program)."""
    if len(sources) != len(aot_inputs):
        return {}
    return {str(index): name for index, (name, value) in enumerate(zip(sources, aot_inputs))
            if name is not None and isinstance(value, (int, torch.SymInt))}


def _inputs_text(inputs: Sequence[Any]) -> str:
    texts = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            texts.append(f"{short_name(value.dtype)}[{','.join(str(size) for size in value.shape)}]")
        else:
            texts.append(type(value).__name__)
    return ", ".join(texts)


def _chip_of(inputs: Sequence[Any]) -> int:
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            return value.device.index or 0
    return 0
