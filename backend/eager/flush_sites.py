"""The graphs each flush site (trigger and source line) flushed, step by step: what a newly compiled
fused graph is compared against to say why it recompiled.

A site may flush several graphs in one step (two host reads on one line, two micro-batches before one
backward), so a site keeps every graph of the last step it flushed in and of the step before that. A
new graph is compared with the earlier step's graph that runs the same ops in the same order, else
with the one that shares the longest run of leading ops.
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
