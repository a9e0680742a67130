"""Why a flushed DeferAndFuse graph compiled anew: the first difference from the earlier graph at its
flush site (an input's shape or dtype, an op's arguments, ops added or left out), with the ops named as
the user called them and located at the user's lines."""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Callable, Sequence
from typing import Any

from tputrace.backend.core.plans import INTERNAL_PLANS, VIEW_READ, Plan
from tputrace.backend.core.signatures import key_change, signature_diff
from tputrace.backend.eager.flush_sites import FlushedGraph
from tputrace.recording.interface import Recording

_NAMED = {VIEW_READ: "view_read"}  # how a fused program's name counts a dispatcher program, where not by its own name
_MAX_ALIGNED_NODES = 8000  # two graphs' nodes together, beyond which a recompile's diff aligns only their common ends


def structure_change(old: FlushedGraph, nodes: list, called_names: tuple[str, ...], in_specs: tuple, graph: Any, recorder: Recording | None,
                     by_length: tuple[str, str] | None) -> tuple[str, str | None]:
    """Why a graph recompiles where `old` (the earlier graph most like it, `FlushSites.counterpart`)
    flushed: the first op that reads a program input whose shape or dtype changed (when both graphs run
    the same ops: where ops were added or left out, the inputs shift), else the data-dependent lengths
    that changed (`by_length`), else the first op where the graphs differ, naming ops as the user called
    them (`called_names`, per node)."""
    old_nodes = old.nodes
    same_ops = len(nodes) == len(old_nodes) and all(plan.op_name == old_plan.op_name for (plan, _), (old_plan, _) in zip(nodes, old_nodes))
    by_input = _changed_input_reader(nodes, old.in_specs, in_specs) if same_ops else None
    if by_input is not None:
        index, position, changed = by_input
        change = signature_diff(old.in_specs[changed:changed + 1], in_specs[changed:changed + 1], [f"arg {position}"])
        return "recompile", f"{op_text(nodes, graph, recorder, index)}: {change}"
    if by_length is not None:
        return by_length
    for index, ((plan, refs), (old_plan, old_refs)) in enumerate(zip(nodes, old_nodes)):
        if plan is not old_plan or refs != old_refs:
            op = op_text(nodes, graph, recorder, index)
            if plan.op_name == old_plan.op_name and plan.chip != old_plan.chip:
                return "recompile", f"{op}: chip: tpu:{old_plan.chip} -> tpu:{plan.chip} (a program is compiled per chip)"
            if plan.op_name == old_plan.op_name and old_plan.matmul_precision and plan.matmul_precision and old_plan.matmul_precision != plan.matmul_precision:
                return "recompile", f"{op}: float32 matmul precision: {old_plan.matmul_precision} -> {plan.matmul_precision}"
            if plan.op_name == old_plan.op_name and len(plan.in_specs) == len(old_plan.in_specs):
                names = [f"arg {position}" for position in range(len(plan.in_specs))]
                change = signature_diff(old_plan.in_specs, plan.in_specs, names)
                if change != "same signature":
                    return "recompile", f"{op}: {change}"
            if plan.op_name == old_plan.op_name and refs == old_refs:
                return "recompile", f"{op}: non-tensor arguments {key_change(old_plan.structure_key, plan.structure_key)}"
            if plan.op_name == old_plan.op_name and _scalar_slots_differ(refs, old_refs):
                return "recompile", f"{op}: Python scalar arguments that were the same value now differ, or the reverse (the same ones share one program input)"
            if plan.op_name == old_plan.op_name:
                return "recompile", f"{op}: reads other values (inputs wired differently)"
            return "recompile", _ops_change(nodes, called_names, old, index, graph, recorder)
    if len(nodes) != len(old_nodes):
        return "recompile", _ops_change(nodes, called_names, old, min(len(nodes), len(old_nodes)), graph, recorder)
    return "recompile", f"same {op_count(nodes)} ops; the values kept after the flush, the donated inputs or the op where backward began changed"


def _scalar_slots_differ(refs: tuple, old_refs: tuple) -> bool:
    """Whether two ops' arguments differ only in which packed scalar slots they read (`program_parts.scalar_identity`)."""
    return len(refs) == len(old_refs) and all(ref == old or (ref[0] == old[0] == 2 and ref[1] == old[1]) for ref, old in zip(refs, old_refs))


def op_count(nodes: Sequence[tuple[Plan, tuple]]) -> int:
    """The graph's ops: its nodes but view reads and writes and the dispatcher's other own programs."""
    return sum(1 for plan, _ in nodes if plan.op_name not in INTERNAL_PLANS)


def program_name(nodes: Sequence[tuple[Plan, tuple]]) -> str:
    """The fused program's name: `fused_26_ops` by its ops, or, for a graph of the dispatcher's own programs only (a
    DDP bucket's view reads and writes), by what it runs: `fused_2_view_reads_1_view_write`, not `fused_0_ops`."""
    n_ops = op_count(nodes)
    if n_ops or not nodes:
        return f"fused_{n_ops}_ops"
    counts: dict[str, int] = {}
    for plan, _ in nodes:
        counts[plan.op_name] = counts.get(plan.op_name, 0) + 1
    return "fused_" + "_".join(f"{count}_{_NAMED.get(name, name)}{'s' if count != 1 else ''}" for name, count in counts.items())


def op_text(nodes: Sequence[tuple[Plan, tuple]], graph: Any, recorder: Recording | None, index: int) -> str:
    """'op 3 aten.add.Tensor (train.py:9)': the node at `index`, numbered among the graph's ops (view
    reads, which a trace has no op of, not counted: a view read gets the number of the op reading it)."""
    return f"op {op_count(nodes[:index])} {_called_name_in(graph, nodes, index)}{op_location(graph, recorder, index)}"


def _called_name_in(graph: Any, nodes: Sequence[tuple[Plan, tuple]], index: int) -> str:
    """The op the user called that node `index` of `graph` runs (`aten._foreach_mul_.Scalar`, whose node
    runs `aten._foreach_mul.Scalar`); the node's plan name where it has no op record (a view read)."""
    position = bisect.bisect_left(graph.record_nodes, index)
    if position < len(graph.record_nodes) and graph.record_nodes[position] == index:
        return graph.op_records[position][1]
    return nodes[index][0].op_name


def called_names_of(nodes: Sequence[tuple[Plan, tuple]], graph: Any) -> tuple[str, ...]:
    """`_called_name_in` of every node, kept with a flushed graph for a later graph's diff."""
    return tuple(_called_name_in(graph, nodes, index) for index in range(len(nodes)))


def op_location(graph: Any, recorder: Recording | None, index: int) -> str:
    """' (file:line)' of the op at node `index` ('' unknown). A view read has no op record of its own: it
    is attributed to the op that reads it."""
    position = bisect.bisect_left(graph.record_nodes, index)
    if recorder is None or position >= len(graph.op_records):
        return ""
    location = recorder.frame_text(graph.op_records[position][5])
    return f" ({location})" if location else ""


def _ops_change(nodes: Sequence[tuple[Plan, tuple]], called_names: tuple[str, ...], old: FlushedGraph, index: int, graph: Any, recorder: Recording | None) -> str:
    """A structure change whose nodes first differ at `index`: the first run of ops the new graph left
    out, added or put in place of others, its common ops with the old graph aligned (set-up work that
    only the first step's graph ran is a run left out at op 0), and how many such runs follow."""
    names = [plan.op_name for plan, _ in nodes]
    old_names = [plan.op_name for plan, _ in old.nodes]
    runs = []
    for _, old_start, old_end, start, end in _differing_runs(old_names, names, index):
        left_out = [at for at in range(old_start, old_end) if old_names[at] not in INTERNAL_PLANS]
        added = [at for at in range(start, end) if names[at] not in INTERNAL_PLANS]
        if left_out or added:
            runs.append((start, left_out, added))
    if not runs:
        where = op_location(graph, recorder, index) if index < len(nodes) else ""
        return f"structure change at op {op_count(nodes[:index])}{where}: {op_count(old.nodes)} ops -> {op_count(nodes)} ops"
    start, left_out, added = runs[0]
    where = op_location(graph, recorder, start) if start < len(nodes) else ""

    def new_location(at: int) -> str:  # the first op of the run is the one at `where`
        return "" if at == start else op_location(graph, recorder, at)

    counts = f" ({op_count(old.nodes)} ops -> {op_count(nodes)} ops)"
    if left_out and added:
        if len(left_out) == 1 and len(added) == 1:
            change, counts = f"{old.op_names[left_out[0]]} -> {called_names[added[0]]}", ""
        else:
            change = f"{_op_run(left_out, old.op_names, old.locate)} -> {_op_run(added, called_names, new_location)}"
    elif left_out:
        change = f"{_op_run(left_out, old.op_names, old.locate)} left out"
    else:
        change = f"{_op_run(added, called_names, new_location)} added"
    more = f"; {len(runs) - 1} more {'change' if len(runs) == 2 else 'changes'} after it" if len(runs) > 1 else ""
    return f"structure change at op {op_count(nodes[:start])}{where}: {change}{more}{counts}"


def _differing_runs(old_names: list[str], names: list[str], index: int) -> list[tuple[str, int, int, int, int]]:
    """difflib's opcodes for the two graphs' op names, but the equal ones, past their common first
    `index` nodes. Graphs beyond `_MAX_ALIGNED_NODES` nodes are aligned at their common ends only."""
    if len(old_names) + len(names) > _MAX_ALIGNED_NODES:
        common_end = 0
        most = min(len(names), len(old_names)) - index
        while common_end < most and names[-1 - common_end] == old_names[-1 - common_end]:
            common_end += 1
        return [("replace", index, len(old_names) - common_end, index, len(names) - common_end)]
    matcher = difflib.SequenceMatcher(None, old_names[index:], names[index:], autojunk=False)
    return [(tag, index + old_start, index + old_end, index + start, index + end)
            for tag, old_start, old_end, start, end in matcher.get_opcodes() if tag != "equal"]


def _op_run(positions: Sequence[int], names: Sequence[str], location: Callable[[int], str]) -> str:
    """The ops at `positions` of a graph, with `location(position)`: 'aten.zero_.default (train.py:26)',
    '4x aten.uniform_.default (train.py:3)' (one op and line), or '3 ops, aten.zero_.default
    (train.py:26) to aten.fill_.Scalar (train.py:28)'."""
    first, last = positions[0], positions[-1]
    if len(positions) == 1:
        return f"{names[first]}{location(first)}"
    lines = {location(at) for at in positions} - {""}
    if len({names[at] for at in positions}) == 1 and len(lines) <= 1:
        return f"{len(positions)}x {names[first]}{''.join(lines)}"
    return f"{len(positions)} ops, {names[first]}{location(first)} to {names[last]}{location(last)}"


def _changed_input_reader(nodes: Sequence[tuple[Plan, tuple]], old_specs: tuple, in_specs: tuple) -> tuple[int, int, int] | None:
    """For the first program input whose shape or dtype differs from the earlier graph's (same number of
    inputs): the first node that reads it, the argument it reads it as, and the input's index."""
    if len(old_specs) != len(in_specs):
        return None
    changed = next((index for index, (old, new) in enumerate(zip(old_specs, in_specs)) if old != new), None)
    if changed is None:
        return None
    for index, (_, refs) in enumerate(nodes):
        for position, ref in enumerate(refs):
            if ref[0] == 0 and ref[1] == changed:
                return index, position, changed
    return None


def program_input_names(nodes: Sequence[tuple[Plan, tuple]], n_inputs: int) -> list[str]:
    """Each program input named by the first op that reads it, e.g. 'aten.embedding.default arg 1'."""
    names: list[str | None] = [None] * n_inputs
    for plan, refs in nodes:
        for position, ref in enumerate(refs):
            if ref[0] == 0 and names[ref[1]] is None:
                names[ref[1]] = f"input {ref[1]} ({plan.op_name} arg {position})"
    return [name or f"input {index}" for index, name in enumerate(names)]
