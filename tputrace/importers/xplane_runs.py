"""An XProf capture's program runs and when the host launched each, in compact columns: a long capture runs a program
per step, hundreds of thousands of runs, which as Python objects would take hundreds of bytes each.

Records are appended as the events are read (one per run and window of events) and merged now and then into one per
run, so that memory follows the number of runs at about 40 bytes each."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

from tputrace.importers.xevents import EventColumns, int_stat_columns, int_stats, isin_few

# Run ids are compared as unsigned 64-bit integers (a producer may write them as int64 or uint64).
U64 = 1 << 64
_MERGE_FLOOR = 1 << 16


class LaunchTimes:
    """When the host launched each run (its earliest event with the run's `run_id` that is no XLA op)."""

    def __init__(self) -> None:
        self.run_ids = array("Q")
        self.starts = array("q")
        self._merged = 0

    def __len__(self) -> int:
        return len(self.run_ids)

    def add(self, run_id: int, start: int) -> None:
        self.run_ids.append(run_id % U64)
        self.starts.append(start)
        if len(self.run_ids) >= 2 * self._merged + _MERGE_FLOOR:
            self._merge()

    def add_many(self, run_ids: np.ndarray, starts: np.ndarray) -> None:
        """`add` of launches given as columns (run ids as uint64)."""
        self.run_ids.frombytes(run_ids.astype(np.uint64).tobytes())
        self.starts.frombytes(starts.astype(np.int64).tobytes())
        if len(self.run_ids) >= 2 * self._merged + _MERGE_FLOOR:
            self._merge()

    def extend(self, other: LaunchTimes, offset: int) -> None:
        """Add `other`'s launches, moved by `offset` ns."""
        self.run_ids += other.run_ids
        self.starts.frombytes((np.asarray(other.starts, dtype=np.int64) + offset).tobytes())
        self._merge()

    def sorted(self, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The run ids (ascending, uint64) and each one's launch (moved by `offset` ns)."""
        self._merge()
        return np.asarray(self.run_ids, dtype=np.uint64).copy(), np.asarray(self.starts, dtype=np.int64) + offset

    def _merge(self) -> None:
        run_ids = np.asarray(self.run_ids, dtype=np.uint64)
        starts = np.asarray(self.starts, dtype=np.int64)
        order = np.lexsort((starts, run_ids))
        run_ids, starts = run_ids[order], starts[order]
        first = np.concatenate(([True], run_ids[1:] != run_ids[:-1])) if len(run_ids) else np.ones(0, dtype=bool)
        merged_ids, merged_starts = run_ids[first].tobytes(), starts[first].tobytes()
        del run_ids, starts  # views of the arrays, which cannot change size while viewed
        self.run_ids, self.starts = array("Q", merged_ids), array("q", merged_starts)
        self._merged = len(self.run_ids)


def launched_at(run_ids: np.ndarray, launches: np.ndarray, ids: list[Any], times: np.ndarray) -> np.ndarray:
    """Per event: its run's launch where its run id (`ids`, None for none) has one, else its own time (`times`)."""
    wanted = np.array([0 if run_id is None else run_id % U64 for run_id in ids], dtype=np.uint64)
    return launched_at_ids(run_ids, launches, wanted, np.array([run_id is not None for run_id in ids], dtype=bool),
                           times)


def launched_at_ids(run_ids: np.ndarray, launches: np.ndarray, wanted: np.ndarray, has_run: np.ndarray,
                    times: np.ndarray) -> np.ndarray:
    """`launched_at` of run ids given as a column (uint64), each one where `has_run`. An event of its run id after the
    event is no launch of it: XLA:CPU gives a run's `wait for completion` its id, and where the host launched the run
    before the capture (a warm-up call not waited for), that wait, after the loop, is the only event of the id."""
    if not len(run_ids) or not len(wanted):
        return times
    positions = np.minimum(np.searchsorted(run_ids, wanted), len(run_ids) - 1)
    found = (run_ids[positions] == wanted) & has_run & (launches[positions] <= times)
    return np.where(found, launches[positions], times)


class RunSpans:
    """Each program run: its chip, run id (where the capture has one), program, earliest start and latest end (ns); a
    run without an id is a run of its own."""

    def __init__(self) -> None:
        self.chips = array("q")
        self.run_ids = array("Q")
        self.keyed = bytearray()  # 1 where the run has an id
        self.programs = array("q")
        self.starts = array("q")
        self.ends = array("q")
        self._merged = 0

    def add(self, chip: int, run_id: int | None, program_id: int, start_ns: int, end_ns: int) -> None:
        self.chips.append(chip)
        self.run_ids.append(0 if run_id is None else run_id % U64)
        self.keyed.append(run_id is not None)
        self.programs.append(program_id)
        self.starts.append(start_ns)
        self.ends.append(end_ns)
        if len(self.chips) >= 2 * self._merged + _MERGE_FLOOR:
            self._merge()

    def add_many(self, chips: np.ndarray, run_ids: np.ndarray, program_ids: np.ndarray, starts: np.ndarray,
                 ends: np.ndarray) -> None:
        """`add` of runs given as columns, each with an id (uint64)."""
        if not len(chips):
            return
        self.chips.frombytes(chips.astype(np.int64).tobytes())
        self.run_ids.frombytes(run_ids.astype(np.uint64).tobytes())
        self.keyed += bytes([1]) * len(chips)
        self.programs.frombytes(program_ids.astype(np.int64).tobytes())
        self.starts.frombytes(starts.astype(np.int64).tobytes())
        self.ends.frombytes(ends.astype(np.int64).tobytes())
        if len(self.chips) >= 2 * self._merged + _MERGE_FLOOR:
            self._merge()

    def blocks_in_start_order(self) -> Iterator[tuple[list[int], list[int], list[int | None], np.ndarray, np.ndarray]]:
        """The runs by start (runs that start together: in the order first met), a block at a time: their program ids,
        chips, run ids (None for none), starts and ends."""
        self._merge()
        columns = [np.asarray(column) for column in (self.programs, self.chips, self.run_ids, self.starts, self.ends)]
        keyed = np.frombuffer(self.keyed, dtype=np.uint8).astype(bool) if len(self.keyed) else np.ones(0, dtype=bool)
        order = np.argsort(columns[3], kind="stable")
        for at in range(0, len(order), _MERGE_FLOOR):
            chosen = order[at:at + _MERGE_FLOOR]
            run_ids = [run_id if has_id else None for run_id, has_id in zip(columns[2][chosen].tolist(),
                                                                             keyed[chosen].tolist())]
            yield columns[0][chosen].tolist(), columns[1][chosen].tolist(), run_ids, columns[3][chosen], columns[4][chosen]

    def _merge(self) -> None:
        """One record per run: the first one's program, the earliest start and latest end; runs in the order first met."""
        count = len(self.chips)
        chips, run_ids, programs, starts, ends = (np.asarray(column) for column in (
            self.chips, self.run_ids, self.programs, self.starts, self.ends))
        keyed = np.frombuffer(self.keyed, dtype=np.uint8).astype(bool) if count else np.ones(0, dtype=bool)
        positions = np.arange(count, dtype=np.int64)
        own = np.where(keyed, 0, positions + 1)  # a run without an id is a group of its own
        order = np.lexsort((positions, own, run_ids, chips))
        if count:
            changes = (np.diff(chips[order]) != 0) | (np.diff(run_ids[order]) != 0) | (np.diff(own[order]) != 0)
            bounds = np.flatnonzero(np.concatenate(([True], changes)))
        else:
            bounds = np.zeros(0, dtype=np.int64)
        firsts = order[bounds]  # each run's first record (positions ascend within a run)
        merged = [chips[firsts], run_ids[firsts], keyed[firsts], programs[firsts],
                  np.minimum.reduceat(starts[order], bounds) if count else starts,
                  np.maximum.reduceat(ends[order], bounds) if count else ends]
        by_first = np.argsort(firsts, kind="stable")
        data = [column[by_first].tobytes() for column in merged]
        del chips, run_ids, programs, starts, ends, merged  # views of the arrays, which cannot change size while viewed
        self.chips, self.run_ids, self.programs = array("q", data[0]), array("Q", data[1]), array("q", data[3])
        self.keyed = bytearray(data[2])
        self.starts, self.ends = array("q", data[4]), array("q", data[5])
        self._merged = len(self.chips)


class SingleDeviceLaunches:
    """XLA:CPU's launches that name no run (`…ExecuteHelperOnSingleDevice`: a program launched on one device, as every
    jitted call of a one-device process is), and each run's first op, so that runs can be tied to their launches in
    order: one device runs its programs in the order the host launched them."""

    def __init__(self) -> None:
        self.starts = array("q")
        self.first_ops = LaunchTimes()  # per run id, its earliest op's start
        self.devices: set[int] = set()  # the devices the runs' ops ran on

    def scan(self, columns: EventColumns, starts: np.ndarray, op_events: np.ndarray,
             stat_and_event_ids: tuple[set[int], set[int], list[int]]) -> None:
        """Add some events' single-device launches (`starts` are the events'), and their ops' (`op_events`) runs
        and devices; the ids are those of the `run_id` and `device_ordinal` stats and of the launches' metadata."""
        run_ids, device_ids, single_ids = stat_and_event_ids
        self.starts.extend(starts[isin_few(columns.metadata_id, single_ids)].tolist())
        runs = int_stat_columns(columns, op_events, run_ids) if len(op_events) and run_ids else None
        if runs is not None:
            _, numbers, has = runs
            self.first_ops.add_many(numbers[has].view(np.uint64), starts[op_events[has]])
        elif len(op_events) and run_ids:  # stats read through the protobuf classes
            for index, run_id in zip(op_events.tolist(), int_stats(columns, op_events, run_ids)):
                if run_id is not None:
                    self.first_ops.add(run_id % (1 << 64), int(starts[index]))
        devices = int_stat_columns(columns, op_events, device_ids) if len(op_events) and device_ids else None
        if devices is not None:
            self.devices.update(np.unique(devices[1][devices[2]]).tolist())
        elif len(op_events) and device_ids:
            self.devices.update(device for device in int_stats(columns, op_events, device_ids) if device is not None)

    def extend(self, other: SingleDeviceLaunches, offset: int) -> None:
        """Add `other`'s launches and runs, moved by `offset` ns."""
        self.starts.frombytes((np.asarray(other.starts, dtype=np.int64) + offset).tobytes())
        self.first_ops.extend(other.first_ops, offset)
        self.devices |= other.devices

    def pairs(self, launches: LaunchTimes) -> tuple[np.ndarray, np.ndarray]:
        """The run ids and launch times of the runs that `launches` has no launch for at or before their first op (the
        earliest event XLA:CPU gives a run's id besides its ops is its `wait for completion`, after them), each tied
        to the next single-device launch at or before its first op, in time order (a run that starts before any
        launch was launched before the capture). None where the runs are on several devices, each of which runs its
        own launches in order."""
        none = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        if len(self.devices) != 1 or not len(self.starts):
            return none
        run_ids, firsts = self.first_ops.sorted()
        launch_ids, launch_starts = launches.sorted()
        if len(launch_ids):
            positions = np.minimum(np.searchsorted(launch_ids, run_ids), len(launch_ids) - 1)
            launched = (launch_ids[positions] == run_ids) & (launch_starts[positions] <= firsts)
            run_ids, firsts = run_ids[~launched], firsts[~launched]
        order = np.argsort(firsts, kind="stable")
        singles = np.sort(np.asarray(self.starts, dtype=np.int64)).tolist()
        paired_ids, paired_starts = [], []
        at = 0
        for run_id, first in zip(run_ids[order].tolist(), firsts[order].tolist()):
            if at < len(singles) and singles[at] <= first:
                paired_ids.append(run_id)
                paired_starts.append(singles[at])
                at += 1
        return np.array(paired_ids, dtype=np.uint64), np.array(paired_starts, dtype=np.int64)
