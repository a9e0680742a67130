"""The graphs each flush site (trigger and source line) flushed, step by step: what a newly compiled
fused graph is compared against to say why it recompiled.

A site may flush several graphs in one step (two host reads on one line, two micro-batches before one
backward), so a site keeps every graph of the last step it flushed in and of the step before that. A
new graph is compared with the earlier step's graph that runs the same ops in the same order, else
with the one that shares the longest run of leading ops. A site that flushed no graph in an earlier step (a loop
that marks no step) compares a new graph with its own step's graph of the same ops, wiring and input ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from tputrace.backend.eager.step_sites import StepSites

Nodes = tuple[tuple[Any, tuple], ...]  # (plan, input refs) per op, as a pending graph holds them


@dataclass(frozen=True)
class FlushedGraph:
    """A graph a site flushed: its nodes, its program's input specs, each node's op as the user called
    it (`_foreach_mul_` where the node runs `_foreach_mul`; the plan's name where no op was recorded)
    and `locate(index)`: a node's source location as ' (file:line)' ('' unknown), read only when a
    later graph's diff names the node."""

    nodes: Nodes
    in_specs: tuple
    op_names: tuple[str, ...]
    locate: Callable[[int], str] = lambda index: ""


class FlushSites:
    """Per site, the graphs of its last two steps."""

    def __init__(self) -> None:
        self._sites: StepSites[FlushedGraph] = StepSites()

    def clear(self) -> None:
        self._sites.clear()

    def remember(self, site: Hashable, step: int, graph: FlushedGraph) -> None:
        """`site` flushed `graph` in `step`."""
        self._sites.remember(site, step, graph)

    def counterpart(self, site: Hashable, step: int, nodes: Sequence[tuple[Any, tuple]]) -> FlushedGraph | None:
        """The graph an earlier step flushed at `site` that `nodes` most likely is another version of
        (None: the site never flushed in an earlier step)."""
        candidates = self._sites.earlier(site, step)
        if not candidates:
            return None
        names = [plan.op_name for plan, _ in nodes]
        return max(candidates, key=lambda old: _likeness(names, old.nodes))

    def same_program(self, site: Hashable, step: int, nodes: Sequence[tuple[Any, tuple]], in_specs: tuple) -> FlushedGraph | None:
        """The latest graph `site` flushed in `step` itself that runs the same ops on the same wiring, with inputs of the
        same dtypes and ranks: the same program at other sizes (a decoding loop that marks no step, its cache one
        token longer at each read). None when there is none: other graphs of one step are not recompiles of each other."""
        for old in reversed(self._sites.current(site, step)):
            if _same_wiring(nodes, old.nodes) and _layout(in_specs) == _layout(old.in_specs):
                return old
        return None


def _same_wiring(nodes: Sequence[tuple[Any, tuple]], old: Nodes) -> bool:
    """Whether two graphs run the same ops, in order, each reading the same inputs and earlier results."""
    return len(nodes) == len(old) and all(
        plan.op_name == old_plan.op_name and refs == old_refs for (plan, refs), (old_plan, old_refs) in zip(nodes, old))


def _layout(in_specs: tuple) -> tuple:
    """Each input's rank, dtype and placement (a tensor's spec is (shape, dtype, ...); a non-tensor's is kept whole)."""
    return tuple((len(spec[0]), *spec[1:]) if isinstance(spec, tuple) and spec and isinstance(spec[0], tuple) else spec
                 for spec in in_specs)


def _likeness(names: Sequence[str], old: Nodes) -> tuple[bool, int, int]:
    """How alike two graphs' op sequences are: all ops the same, leading ops in common, and closeness in
    length, in that order of weight."""
    old_names = [plan.op_name for plan, _ in old]
    common = 0
    for name, old_name in zip(names, old_names):
        if name != old_name:
            break
        common += 1
    return (names == old_names, common, -abs(len(names) - len(old_names)))
