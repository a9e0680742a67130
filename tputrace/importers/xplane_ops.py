"""XProf XLA op events into `ops` rows a window at a time, a column at a time: each op's metadata is read once per
distinct op of the window, each row's values are columns indexed by the event's op, and what the events tell of their
programs' runs is gathered per (op, chip, run) with array operations, so that Python does per-event work only to
make the rows' tuples."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from tputrace.importers.chip_collectives import ChipCollectives, CollectiveHlo
from tputrace.importers.hlo_body import ProgramBody
from tputrace.importers.hlo_metadata import HloVersions
from tputrace.importers.xla_ops import COLLECTIVE_CATEGORIES, LineNesting
from tputrace.importers.xplane_runs import RunSpans


@dataclass
class Program:
    program_id: int
    name: str
    flops: float = 0.0
    bytes_accessed: float = 0.0
    first_run: tuple[int, int] | None = None  # (chip, run id as uint64) of the run whose ops are counted
    op_names: set[str] = field(default_factory=set)


@dataclass(frozen=True, eq=False)
class OpMeta:
    """What an XLA op's event metadata says, read once per metadata id (one object per op: compared and hashed
    by identity)."""

    name: str
    name_sid: int
    category: str | None
    flops: float
    bytes_accessed: float
    frame_id: int | None
    tf_op_sid: int | None
    program: Program | None
    shape_sids: tuple[int | None, int | None] = (None, None)  # a data-moving op's operands and output (`hlo_text`)


@dataclass(frozen=True)
class Groups:
    """Rows (given as columns) grouped by equal values: each group's first row (groups numbered in order of first
    occurrence) and each row's group."""

    firsts: np.ndarray
    of_row: np.ndarray
    _order: np.ndarray  # the rows sorted by group (in sorted-group order)
    _bounds: np.ndarray  # where each sorted group starts in `_order`
    _by_first: np.ndarray  # sorted groups in order of first occurrence

    def __len__(self) -> int:
        return len(self.firsts)

    def least(self, values: np.ndarray) -> np.ndarray:
        return np.minimum.reduceat(values[self._order], self._bounds)[self._by_first] if len(self) else values[:0]

    def greatest(self, values: np.ndarray) -> np.ndarray:
        return np.maximum.reduceat(values[self._order], self._bounds)[self._by_first] if len(self) else values[:0]


def group_rows(*columns: np.ndarray) -> Groups:
    """The groups of equal rows of `columns` (each one value per row)."""
    count = len(columns[0])
    order = np.lexsort(columns[::-1])  # stable: a group's rows keep their order
    change = np.zeros(count, dtype=bool)
    change[:1] = True
    for column in columns:
        ordered = column[order]
        change[1:] |= ordered[1:] != ordered[:-1]
    bounds = np.flatnonzero(change)
    sorted_firsts = order[bounds]
    by_first = np.argsort(sorted_firsts, kind="stable")
    numbers = np.empty(len(bounds), dtype=np.int64)
    numbers[by_first] = np.arange(len(bounds))
    of_row = np.empty(count, dtype=np.int64)
    of_row[order] = numbers[np.cumsum(change) - 1]
    return Groups(sorted_firsts[by_first], of_row, order, bounds, by_first)


def distinct_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(ids, return_inverse=True)` of metadata ids: counted in a table where the ids are small (as a
    plane's are: they number its metadata), without a sort."""
    if not len(ids) or ids.min() < 0 or ids.max() >= 4 * len(ids) + 4096:
        return np.unique(ids, return_inverse=True)
    distinct = np.flatnonzero(np.bincount(ids))
    index_of = np.zeros(int(distinct[-1]) + 1, dtype=np.int64)
    index_of[distinct] = np.arange(len(distinct))
    return distinct, index_of[ids]


@dataclass
class OpEvents:
    """A window's XLA op events as columns: each event's op (an index into `metas`), chip, run id (uint64; where
    `has_run`), start and duration (ns since the rank's start)."""

    metas: list[OpMeta]
    meta_of_event: np.ndarray
    chips: np.ndarray
    run_ids: np.ndarray
    has_run: np.ndarray
    starts: np.ndarray
    durations: np.ndarray


def per_event(values: list[Any], indices: np.ndarray) -> Any:
    """Per row, the value of its group (`indices` into `values`, one per group): `repeat` where every group has
    the same."""
    first = values[0]
    if all(value == first and type(value) is type(first) for value in values):
        return repeat(first)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column[indices].tolist()


class OpRows:
    """The part of the XProf importer that writes XLA op events' rows (mixed into `XPlaneImporter`, whose `sink`,
    `writer`, `rank`, `runs`, `seq` and `_steps_at` it uses)."""

    sink: Any
    writer: Any
    rank: int
    runs: RunSpans
    seq: int
    chip_calls: ChipCollectives  # the collectives' rows, until each chip's wait is known
    programs: dict[str, Program]
    hlo_versions: HloVersions
    hlo_bodies: dict[tuple[str, int], ProgramBody]

    def _collective_hlo(self, program_id: int | None, op_name: str) -> CollectiveHlo:
        """The device groups and the message size the HLO of a program (by id) gives its collective op `op_name`; each
        None where unknown."""
        name = next((program.name for program in self.programs.values() if program.program_id == program_id), None)
        match = re.fullmatch(r"(.*)\((\d+)\)", name or "")
        module = match.group(1) if match else name or ""
        versions = self.hlo_versions.get(module, ())
        version = int(match.group(2)) if match else versions[0][0] if len(versions) == 1 else None
        body = self.hlo_bodies.get((module, version)) if version is not None else None
        if body is None:
            return None, None
        return body.placement.groups.get(op_name), body.collectives.get(op_name)

    def _steps_of_runs(self, starts: np.ndarray, run_ids: np.ndarray, has_run: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _ops(self, events: OpEvents, nesting: LineNesting) -> None:
        """`ops` (and `collectives`) rows of some XLA op events, and what they tell of their programs' runs,
        op counts, costs and fusions."""
        metas, meta_of_event, starts, durations = events.metas, events.meta_of_event, events.starts, events.durations
        count = len(meta_of_event)
        if not count:
            return
        steps = self._steps_of_runs(starts, events.run_ids, events.has_run).tolist()
        starts_ns, durations_ns, chips = starts.tolist(), durations.tolist(), events.chips.tolist()
        first_seq = self.seq + 1
        self.seq += count
        shapes = [meta.shape_sids for meta in metas]
        program_ids = [meta.program.program_id if meta.program else None for meta in metas]
        self.sink.extend("ops", nesting.settle(list(zip(
            range(first_seq, self.seq + 1), repeat(self.rank),
            per_event([meta.name_sid for meta in metas], meta_of_event),
            per_event([shape[0] for shape in shapes], meta_of_event),
            per_event([shape[1] for shape in shapes], meta_of_event),
            chips, starts_ns, durations_ns,
            per_event([meta.frame_id for meta in metas], meta_of_event),
            per_event([meta.tf_op_sid for meta in metas], meta_of_event),
            steps, per_event(program_ids, meta_of_event), repeat(None))), starts, starts + durations))
        collective_ops = np.array([meta.category in COLLECTIVE_CATEGORIES for meta in metas])
        if collective_ops.any():
            run_ids, has_run = events.run_ids.tolist(), events.has_run.tolist()
            for index in np.flatnonzero(collective_ops[meta_of_event]).tolist():
                meta = metas[meta_of_event[index]]
                key = (program_ids[meta_of_event[index]], meta.name, int(run_ids[index]) if has_run[index] else None)
                self.chip_calls.add(key, chips[index], COLLECTIVE_CATEGORIES[str(meta.category)],
                                    int(meta.bytes_accessed), meta.frame_id, starts_ns[index], durations_ns[index],
                                    steps[index])
        self._program_ops(events)

    def _program_ops(self, events: OpEvents) -> None:
        """What the events tell of their programs: an op's effect depends only on (op, chip, run), so each such
        triple's earliest start and latest end stand for its events. Each run's span goes to `runs`; the ops of
        a program's first run (or of a run without an id) count toward its ops, costs and fusions."""
        metas = events.metas
        has_program = np.array([meta.program is not None for meta in metas])
        if not has_program.any():
            return
        groups = group_rows(events.meta_of_event, events.chips, events.run_ids, events.has_run)
        firsts = groups.firsts
        group_metas = events.meta_of_event[firsts]
        chips, run_ids, has_run = events.chips[firsts], events.run_ids[firsts], events.has_run[firsts]
        starts = groups.least(events.starts)
        ends = groups.greatest(events.starts + events.durations)
        with_program = has_program[group_metas]
        program_of_meta = np.array([meta.program.program_id if meta.program else -1 for meta in metas], dtype=np.int64)
        added = np.flatnonzero(with_program & has_run)
        self.runs.add_many(chips[added], run_ids[added], program_of_meta[group_metas[added]], starts[added], ends[added])
        counted = with_program & ~has_run
        if len(added):
            # A program's first run is that of its first op met with a run id.
            _, firsts_of_program = np.unique(program_of_meta[group_metas[added]], return_index=True)
            for group in added[firsts_of_program].tolist():
                program = metas[group_metas[group]].program
                if program is not None and program.first_run is None:
                    program.first_run = (int(chips[group]), int(run_ids[group]))
            first_runs = [meta.program.first_run if meta.program and meta.program.first_run else (-1, 0)
                          for meta in metas]
            first_chips = np.array([first_run[0] for first_run in first_runs], dtype=np.int64)
            first_run_ids = np.array([first_run[1] for first_run in first_runs], dtype=np.uint64)
            counted[added] = (chips[added] == first_chips[group_metas[added]]) & \
                (run_ids[added] == first_run_ids[group_metas[added]])
        for meta_index in group_metas[counted].tolist():
            self._program_op(metas[meta_index])

    def _program_op(self, meta: OpMeta) -> None:
        program = meta.program
        if program is None or meta.name in program.op_names:
            return
        program.op_names.add(meta.name)
        program.flops += meta.flops
        program.bytes_accessed += meta.bytes_accessed
        if "fusion" in meta.name or (meta.category or "").endswith(" fusion"):
            self.sink.append("fusions", (self.rank, program.program_id, self.writer.intern(meta.name),
                                         self.writer.intern(meta.category or "fusion"), None, None))
