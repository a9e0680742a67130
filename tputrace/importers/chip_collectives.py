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
stands for the size only where it has not). The calls are kept until the rank's planes have all been read (a chip's calls are on its
own plane, or on the host threads that ran its ops), as columns of 8-byte integers (about 60 bytes a call, where a
row's tuple cost about 350), and the rows are made a batch at a time once the waits are known."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tputrace.importers.hlo_collectives import CollectiveSize

# (program id or None, op name, run id or None): one op's call in one run of its program.
CallKey = tuple[int | None, str, int | None]
# An op's device groups and message size from its program's HLO, each None where unknown.
CollectiveHlo = tuple[tuple[tuple[int, ...], ...] | None, CollectiveSize | None]
HloOf = Callable[[int | None, str], CollectiveHlo]

_POINT_TO_POINT = frozenset(("collective_permute",))
"""Kinds whose chips each wait for their own source, not for a group: their waits stay unknown."""
_BATCH = 1 << 16  # rows made at a time


class ChipCollectives:
    """A rank's collective calls with the chip and call each belongs to, until their waits are known."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.keys: dict[CallKey, int] = {}  # a call's key -> its number
        self.kinds: dict[str, int] = {}  # a collective's kind -> its number
        # Per call: its key's number, chip, kind's number, bytes accessed (0: unknown), frame id (-1: none), start
        # and duration (ns) and step.
        self.columns = tuple(array("q") for _ in range(8))

    def add(self, key: CallKey, chip: int, kind: str, nbytes: int | None, frame_id: int | None, start_ns: int,
            dur_ns: int, step: int) -> None:
        number = self.keys.get(key)
        if number is None:
            number = self.keys[key] = len(self.keys)
        kind_number = self.kinds.get(kind)
        if kind_number is None:
            kind_number = self.kinds[kind] = len(self.kinds)
        for column, value in zip(self.columns, (number, chip, kind_number, nbytes or 0,
                                                -1 if frame_id is None else frame_id, start_ns, dur_ns, step)):
            column.append(value)

    def write(self, extend: Callable[[str, list[tuple[Any, ...]]], None], rank: int, hlo_of: HloOf) -> None:
        """Hand rank `rank`'s `collectives` rows to `extend` (with the table's name), a batch at a time, in the order
        their calls were added, each with its size from the HLO and its chip's wait where its call ran on another chip
        of its group too; then forget the calls."""
        for rows in self._rows(rank, hlo_of):
            extend("collectives", rows)
        self._clear()

    def _rows(self, rank: int, hlo_of: HloOf) -> Iterator[list[tuple[Any, ...]]]:
        key_of, _, kind_of, nbytes_of, frame_of, start_of, dur_of, step_of = (
            np.frombuffer(column, dtype=np.int64) if len(column) else np.zeros(0, dtype=np.int64)
            for column in self.columns)
        kinds = list(self.kinds)
        waits, sizes = self._waits(hlo_of) if len(key_of) else (key_of, {})
        for first in range(0, len(key_of), _BATCH):
            batch = slice(first, first + _BATCH)
            yield [(rank, kinds[kind], *((size.nbytes, size.dtype) if size is not None else (nbytes or None, None)),
                    None, None, None if frame < 0 else frame, start, dur, None if wait < 0 else wait, None, None,
                    step, None)
                   for key, kind, nbytes, frame, start, dur, wait, step in zip(
                       key_of[batch].tolist(), kind_of[batch].tolist(), nbytes_of[batch].tolist(),
                       frame_of[batch].tolist(), start_of[batch].tolist(), dur_of[batch].tolist(),
                       waits[batch].tolist(), step_of[batch].tolist())
                   for size in (sizes.get(key),)]

    def _waits(self, hlo_of: HloOf) -> tuple[np.ndarray, dict[int, CollectiveSize]]:
        """Each call's wait (-1: unknown), and each key's size from the HLO (by its number) where it has one."""
        key_of, chip_of, kind_of, start_of, dur_of = (np.frombuffer(self.columns[column], dtype=np.int64)
                                                      for column in (0, 1, 2, 5, 6))
        # Each key's calls by chip (a segment), each chip's in start order (ties in the order they were added); a
        # call's number in its segment is its k.
        order = np.lexsort((start_of, chip_of, key_of))
        sorted_keys, sorted_chips = key_of[order], chip_of[order]
        new_segment = np.ones(len(order), dtype=bool)
        new_segment[1:] = (sorted_keys[1:] != sorted_keys[:-1]) | (sorted_chips[1:] != sorted_chips[:-1])
        segment_starts = np.flatnonzero(new_segment)
        segment_of = np.cumsum(new_segment) - 1
        call_number = np.arange(len(order)) - segment_starts[segment_of]
        # Each segment's group (a number; -1 for none): the chips of one group of one key wait for one another.
        group_of = [-1] * len(segment_starts)
        group_sizes: list[int] = []
        sizes: dict[int, CollectiveSize] = {}
        known: dict[tuple[int | None, str], CollectiveHlo] = {}  # (program, op) -> its groups and size
        segment_keys, segment_chips = sorted_keys[segment_starts].tolist(), sorted_chips[segment_starts].tolist()
        segment_kinds = kind_of[order[segment_starts]].tolist()
        kinds, keys = list(self.kinds), list(self.keys)
        first = 0
        while first < len(segment_keys):
            key = segment_keys[first]
            end = first + 1
            while end < len(segment_keys) and segment_keys[end] == key:
                end += 1
            op = keys[key][:2]
            if op not in known:
                known[op] = hlo_of(*op)
            groups, size = known[op]
            if size is not None:
                sizes[key] = size
            if end - first > 1 and kinds[segment_kinds[first]] not in _POINT_TO_POINT:
                segment_of_chip = dict(zip(segment_chips[first:end], range(first, end)))
                for members in _chip_groups(set(segment_of_chip), groups):
                    for chip in members:
                        group_of[segment_of_chip[chip]] = len(group_sizes)
                    group_sizes.append(len(members))
            first = end
        waits = np.full(len(order), -1, dtype=np.int64)
        call_groups = np.array(group_of, dtype=np.int64)[segment_of]
        grouped = call_groups >= 0
        if not grouped.any():
            return waits, sizes
        # One call: the k-th call of each chip of a group, where every chip of the group made a k-th call.
        calls, call_groups, call_number = order[grouped], call_groups[grouped], call_number[grouped]
        by_call = np.lexsort((call_number, call_groups))
        calls, call_groups, call_number = calls[by_call], call_groups[by_call], call_number[by_call]
        new_call = np.ones(len(calls), dtype=bool)
        new_call[1:] = (call_groups[1:] != call_groups[:-1]) | (call_number[1:] != call_number[:-1])
        call_starts = np.flatnonzero(new_call)
        complete = np.diff(np.append(call_starts, len(calls))) == np.array(group_sizes)[call_groups[call_starts]]
        last = np.maximum.reduceat(start_of[calls], call_starts)
        call_of = np.cumsum(new_call) - 1
        matched = calls[complete[call_of]]
        waits[matched] = np.maximum(0, np.minimum(last[call_of][complete[call_of]] - start_of[matched],
                                                  dur_of[matched]))
        return waits, sizes


def _chip_groups(chips: set[int], groups: tuple[tuple[int, ...], ...] | None) -> list[list[int]]:
    """The chips that ran an op, cut into the op's groups of two or more chips; one group of them all where the groups
    do not hold every one of those chips (no groups, or devices numbered otherwise than the chips)."""
    found = [sorted(chips & set(group)) for group in groups or ()]
    if {chip for group in found for chip in group} != chips:
        return [sorted(chips)]
    return [group for group in found if len(group) > 1]
