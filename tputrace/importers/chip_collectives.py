"""Each chip's wait in the collectives of one XProf capture of several chips (a TPU host's chips, or XLA:CPU's
devices: a `jax.pmap` or a sharded `jax.jit` whose program runs a `psum` on each).

Every chip runs its own copy of a collective op, and a chip that arrives early waits in it for the last of its group:
the op's calls on the chips of one group are one call. A call is known by its program, its op (the HLO instruction)
and its run (the launch's `run_id`, where the events carry one); the k-th such call on each chip of a group is the
same call. A group is one of the op's replica groups (its HLO, `hlo_placement`), as devices; where the HLO does not
name them, or names devices that are not the capture's chip numbers, the chips that ran the op are one group. A
chip's wait is the last arrival of its group less its own arrival, at most its call's duration, as `tputrace merge`
reckons the ranks' waits; a collective permute's chips each wait for their own source, not a group, so its waits
stay unknown. Each row's message size and element type are those its instruction's shapes in the HLO
give (`hlo_collectives`), where the HLO has them (the event's `bytes_accessed`, what the op read and wrote in memory,
stands for the size only where it has not). The rows are kept until the rank's planes have all been read (a chip's calls are on its
own plane, or on the host threads that ran its ops)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from tputrace.importers.hlo_collectives import CollectiveSize

# (program id or None, op name, run id or None): one op's call in one run of its program.
CallKey = tuple[int | None, str, int | None]
# An op's device groups and message size from its program's HLO, each None where unknown.
CollectiveHlo = tuple[tuple[tuple[int, ...], ...] | None, CollectiveSize | None]
HloOf = Callable[[int | None, str], CollectiveHlo]

_KIND, _BYTES, _DTYPE, _START, _DUR, _WAIT = 1, 2, 3, 7, 8, 9  # the `collectives` row's kind, bytes, dtype, start_ns, dur_ns, wait_ns
_POINT_TO_POINT = frozenset(("collective_permute",))
"""Kinds whose chips each wait for their own source, not for a group: their waits stay unknown."""


class ChipCollectives:
    """A rank's collective rows with the chip and call each belongs to, until their waits are known."""

    def __init__(self) -> None:
        self.calls: list[tuple[CallKey, int, tuple[Any, ...]]] = []

    def add(self, key: CallKey, chip: int, row: tuple[Any, ...]) -> None:
        self.calls.append((key, chip, row))

    def rows(self, hlo_of: HloOf) -> list[tuple[Any, ...]]:
        """The rows, each with its size from the HLO and its chip's wait where its call ran on another chip of its
        group too."""
        rows = [row for _, _, row in self.calls]
        by_key: dict[CallKey, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        for index, (key, chip, _) in enumerate(self.calls):
            by_key[key][chip].append(index)
        known: dict[tuple[int | None, str], CollectiveHlo] = {}  # (program, op) -> its groups and size
        for key, by_chip in by_key.items():
            op = (key[0], key[1])
            if op not in known:
                known[op] = hlo_of(*op)
            groups, size = known[op]
            if size is not None:
                for index in (index for indices in by_chip.values() for index in indices):
                    rows[index] = (*rows[index][:_BYTES], size.nbytes, size.dtype, *rows[index][_DTYPE + 1:])
            if len(by_chip) < 2 or rows[next(iter(by_chip.values()))[0]][_KIND] in _POINT_TO_POINT:
                continue
            for members in _chip_groups(set(by_chip), groups):
                calls = [sorted(by_chip[chip], key=lambda index: int(rows[index][_START])) for chip in members]
                for matched in zip(*calls):
                    last = max(int(rows[index][_START]) for index in matched)
                    for index in matched:
                        row = rows[index]
                        wait = max(0, min(last - int(row[_START]), int(row[_DUR])))
                        rows[index] = (*row[:_WAIT], wait, *row[_WAIT + 1:])
        self.calls = []
        return rows


def _chip_groups(chips: set[int], groups: tuple[tuple[int, ...], ...] | None) -> list[list[int]]:
    """The chips that ran an op, cut into the op's groups of two or more chips; one group of them all where the groups
    do not hold every one of those chips (no groups, or devices numbered otherwise than the chips)."""
    found = [sorted(chips & set(group)) for group in groups or ()]
    if {chip for group in found for chip in group} != chips:
        return [sorted(chips)]
    return [group for group in found if len(group) > 1]
