"""Step-level replay for DeferAndFuse: a graph that repeats the one recorded at the same point of the
previous step is recorded against that graph's template and runs its program without building its key.

Each flushed graph leaves a `Template`: its ops (plan and argument references), the program it ran and
what keyed that program (outputs kept, inputs donated, where the backward began, input specs). Templates
form a chain per chip (`Chains`), each leading to the template of the graph flushed after it last time, so a loop's
graphs find their counterparts without knowing where its steps begin. While a graph follows its
candidate, each op is checked against the template's op at its position (`replay_op`): the same plan
object (so the same op, constants and input specs, as plans are keyed by them) reading the same kinds of
values (an earlier op's output, an array the graph reads already, a new array, a Python scalar of the
same kind). The template's node is then reused as is. At the flush, the outputs kept and inputs donated
(which depend on which tensors are still alive), the backward's start and the input specs are compared
with the template's; when all match, the cached program runs without its cache key being built and
hashed. Any difference ends the replay for the rest of the graph, which is recorded and keyed as
without replay: results never depend on it. Why a replay ended is kept (`PendingGraph.replay_break`) for the trace.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from tputrace import settings
from tputrace.backend.core.plans import Plan
from tputrace.backend.core.signatures import signature_diff
from tputrace.backend.eager.program_parts import SCALAR_KINDS as _SCALAR_KINDS, scalar_identity

# `deferred`'s PendingGraph and FusedProgram, which import this module.
PendingGraph = Any
FusedProgram = Any

HELD = "held"
BROKE = "broke"
NONE = "none"  # no template to follow: the first graph at its point of the loop

_SCALAR_NAMES = ("a float", "an int", "a bool", "a complex")


def enabled() -> bool:
    """Whether DeferAndFuse replays repeated graphs (`TPUTRACE_STEP_REPLAY`: 1, the default, or 0)."""
    return settings.step_replay_enabled()


class Template:
    """A flushed graph as the next occurrence of it is checked against, and the program it ran."""

    __slots__ = ("nodes", "n_nodes", "program", "output_refs", "donate", "backward_from", "in_specs", "__weakref__")

    def __init__(self, nodes: Sequence[tuple[Plan, tuple]], key: Any, program: FusedProgram) -> None:
        structure, in_specs = key
        self.nodes = tuple(nodes)
        self.n_nodes = len(self.nodes)
        self.program = weakref.ref(program)  # dropped with the program when the program cache evicts it
        self.output_refs: tuple = structure[1]
        self.donate: tuple[int, ...] = structure[2]
        self.backward_from: int | None = structure[3]
        self.in_specs: tuple = in_specs


class Chains:
    """Per chip, the template of the graph flushed last, and for each template the one flushed after it last
    time: the next graph on a chip follows that one. Templates live as long as their programs (weak keys)."""

    def __init__(self) -> None:
        self.last: dict[int, Template] = {}
        self.following: weakref.WeakKeyDictionary[Template, Template] = weakref.WeakKeyDictionary()

    def candidate(self, chip: int) -> Template | None:
        last = self.last.get(chip)
        return None if last is None else self.following.get(last)

    def flushed(self, chip: int, template: Template) -> None:
        last = self.last.get(chip)
        if last is not None:
            self.following[last] = template
        self.last[chip] = template


def replay_op(graph: PendingGraph, template: Template, plan: Plan, dynamic: Sequence[Any], lazy_type: type) -> bool:
    """Record one op as the template's op at the graph's next position, if the op matches it: True when
    recorded, False (the graph as it was, `graph.replay_break` set) when the op differs. Every op's hot
    path while a replay holds: the new arrays and scalars are added as they are checked, and taken out
    again if a later argument differs."""
    nodes = graph.nodes
    node = len(nodes)
    if node >= template.n_nodes:
        graph.replay_break = f"op {node} ({plan.op_name}): more ops than the previous occurrence's {template.n_nodes}"
        return False
    expected = template.nodes[node]
    if expected[0] is not plan:
        graph.replay_break = _plan_difference(node, expected[0], plan)
        return False
    inputs = graph.inputs
    input_refs = graph.input_refs
    n_inputs = first_new = len(inputs)
    added_scalars: list[list] | None = None
    refs = expected[1]
    if len(refs) != len(dynamic):
        graph.replay_break = f"op {node} ({plan.op_name}): {len(dynamic)} arguments, previously {len(refs)}"
        return False
    position = -1
    for argument in dynamic:  # no `zip`: making one costs more than most ops' checks
        position += 1
        ref = refs[position]
        if type(argument) is lazy_type:
            if argument.concrete is None:
                if ref[0] == 1 and argument.graph is graph and argument.node == ref[1] and argument.index == ref[2]:
                    continue
                break
            value = argument.concrete
        else:
            value = argument
        kind = ref[0]
        if kind == 0:
            index = ref[1]
            if index < n_inputs:
                if inputs[index] is value:
                    continue
            elif index == n_inputs and id(value) not in input_refs and _SCALAR_KINDS.get(type(value)) is None:
                input_refs[id(value)] = ref
                inputs.append(value)
                n_inputs += 1
                continue
        elif kind == 2 and _SCALAR_KINDS.get(type(value)) == ref[1]:
            bucket = graph.scalars[ref[1]]
            slot = ref[2]
            if slot == len(bucket):
                bucket.append(value)
                if added_scalars is None:
                    added_scalars = [bucket]
                else:
                    added_scalars.append(bucket)
                continue
            # A slot this op shares among its same scalars: the value must be that slot's still.
            if slot < len(bucket) and scalar_identity(bucket[slot]) == scalar_identity(value):
                continue
        break
    else:
        nodes.append(expected)
        return True
    for value in inputs[first_new:]:
        del input_refs[id(value)]
    del inputs[first_new:]
    for bucket in added_scalars or ():
        bucket.pop()
    graph.replay_break = _argument_difference(node, plan, position, ref, argument, graph, lazy_type)
    return False


def reused_program(graph: PendingGraph, template: Template, output_refs: tuple, donate: tuple[int, ...], in_specs: tuple) -> FusedProgram | None:
    """The template's program for a graph that replayed every op of it, if what keys the program matches
    too; else None, with `graph.replay_break` set."""
    n_nodes = len(graph.nodes)
    if n_nodes != template.n_nodes:
        graph.replay_break = f"flushed after {n_nodes} ops, where the previous occurrence had {template.n_nodes}"
    elif graph.backward_from != template.backward_from:
        graph.replay_break = f"the backward began at op {graph.backward_from}, previously at op {template.backward_from}"
    elif output_refs != template.output_refs:
        graph.replay_break = _outputs_difference(graph, template.output_refs, output_refs)
    elif donate != template.donate:
        graph.replay_break = f"donates {len(donate)} inputs, previously {len(template.donate)} (other buffers were written in place or are shared)"
    elif in_specs != template.in_specs:
        graph.replay_break = "an input's shape or dtype differs: " + _first_spec_difference(template.in_specs, in_specs)
    else:
        program = template.program()
        if program is not None:
            return program
        graph.replay_break = "its program was dropped from the program cache"
    return None


def _plan_difference(node: int, expected: Plan, plan: Plan) -> str:
    if expected.op_name != plan.op_name:
        return f"op {node}: {plan.op_name} where the previous occurrence had {expected.op_name}"
    if expected.in_specs != plan.in_specs:
        try:
            change = signature_diff(expected.in_specs, plan.in_specs)
        except Exception:  # noqa: BLE001 - specs this text cannot show: say that they differ
            change = "their shapes or dtypes differ"
        return f"op {node} ({plan.op_name}): other inputs, {change}"
    return f"op {node} ({plan.op_name}): other constant arguments (a baked value or option changed)"


def _argument_difference(node: int, plan: Plan, position: int, ref: tuple, value: Any, graph: PendingGraph, lazy_type: type) -> str:
    return f"op {node} ({plan.op_name}) argument {position}: {_value_text(value, graph, lazy_type)} where the previous occurrence read {_ref_text(ref)}"


def _ref_text(ref: tuple) -> str:
    if ref[0] == 1:
        return f"op {ref[1]}'s output {ref[2]}"
    if ref[0] == 2:
        return f"{_SCALAR_NAMES[ref[1]]} scalar"
    return f"input array {ref[1]}"


def _value_text(value: Any, graph: PendingGraph, lazy_type: type) -> str:
    if type(value) is lazy_type and value.concrete is None:
        if value.graph is graph:
            return f"op {value.node}'s output {value.index}"
        return "a pending value of another graph"
    kind = _SCALAR_KINDS.get(type(value))
    if kind is not None:
        return f"{_SCALAR_NAMES[kind]} scalar"
    ref = graph.input_refs.get(id(value))
    return f"input array {ref[1]}" if ref is not None else "a new input array"


def _outputs_difference(graph: PendingGraph, expected: tuple, output_refs: tuple) -> str:
    missing = [ref for ref in expected if ref not in output_refs]
    added = [ref for ref in output_refs if ref not in expected]
    if not missing and not added:
        return "the same outputs in another order"
    parts = []
    if added:
        parts.append(f"{len(added)} more kept (first: op {added[0][0]}, {_node_name(graph, added[0][0])})")
    if missing:
        parts.append(f"{len(missing)} no longer kept (first: op {missing[0][0]}, {_node_name(graph, missing[0][0])})")
    return "outputs differ: " + "; ".join(parts)


def _node_name(graph: PendingGraph, node: int) -> str:
    return graph.nodes[node][0].op_name if node < len(graph.nodes) else "?"


def _first_spec_difference(old: tuple, new: tuple) -> str:
    if len(old) != len(new):
        return f"{len(new)} inputs, previously {len(old)}"
    for index, (before, after) in enumerate(zip(old, new)):
        if before != after:
            return f"input {index}: {after} where it was {before}"
    return "none found"

