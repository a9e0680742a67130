"""XLA ops that XProf records as host-thread events (XLA:CPU's thunks, or a GPU stream's kernels of XLA ops): each
event names its op, module and program (`hlo_op`, `hlo_module`, `program_id`: XLA's unique id of the module, which
tells apart programs of one name, as `jit_f` compiled for new shapes), run and device in its own stats."""

from __future__ import annotations

from typing import Any

import numpy as np

from tputrace.importers.xevents import REF_VALUE, UINT64_VALUE, EventColumns, isin_few
from tputrace.importers.xla_ops import LineNesting
from tputrace.importers.xplane_ops import OpEvents, OpMeta, group_rows
from tputrace.importers.xplane_runs import U64
from tputrace.importers.xplane_streams import HOST_OP_STATS
from tputrace.importers.xstats import StatDecoder, stat_numbers

# A stat an event does not carry.
_ABSENT = object()


class HostOps:
    """The part of the XProf importer that reads XLA op events with their own stats (mixed into `XPlaneImporter`,
    whose `_ops` and `_op_meta` it uses)."""

    host_op_metas: dict[tuple[int, str, int | None], OpMeta]
    host_op_stats: dict[int, str]
    host_chips: set[int]

    def _ops(self, events: OpEvents, nesting: LineNesting) -> None:
        raise NotImplementedError

    def _op_meta(self, plane: Any, metadata_id: int, decoder: StatDecoder, module: str | None,
                 op_name: str | None = None, program_id: int | None = None) -> OpMeta:
        raise NotImplementedError

    def _host_ops(self, plane: Any, decoder: StatDecoder, columns: EventColumns, events: np.ndarray,
                  starts: np.ndarray, durations: np.ndarray, nesting: LineNesting, chip: int | None = None) -> None:
        """XLA ops run on a host thread (XLA:CPU), or a GPU's kernels of them (on `chip`): op, module, program, run and
        device from each event's stats."""
        found = self._host_op_columns(decoder, columns, events)
        if found is None:  # a stat of another kind: read each event's stats through its message
            op_events = self._host_op_messages(plane, decoder, columns, events, starts, durations, chip)
        else:
            present, kinds, numbers = found
            count = len(events)
            # The op of each event: its metadata and module (its name from the first event of the two).
            module_key = np.where(present["hlo_module"], numbers["hlo_module"], 0)
            program_key = np.where(present["program_id"], numbers["program_id"], -1)
            groups = group_rows(columns.metadata_id[events], present["hlo_module"], kinds["hlo_module"], module_key,
                                program_key)
            metas = []
            for first, metadata_id in zip(groups.firsts.tolist(), columns.metadata_id[events[groups.firsts]].tolist()):
                module = str(stat_numbers(decoder, kinds["hlo_module"][first:first + 1],
                                          numbers["hlo_module"][first:first + 1])[0]) if present["hlo_module"][first] else ""
                op_name = stat_numbers(decoder, kinds["hlo_op"][first:first + 1], numbers["hlo_op"][first:first + 1])[0]
                program_id = int(numbers["program_id"][first]) if present["program_id"][first] else None
                metas.append(self._host_op_meta(plane, decoder, metadata_id, module, op_name, program_id))
            chips = (np.full(count, chip, dtype=np.int64) if chip is not None
                     else np.where(present["device_ordinal"], numbers["device_ordinal"], 0))
            op_events = _unique_metas(metas, groups.of_row, chips, numbers["run_id"].view(np.uint64), present["run_id"],
                                      starts, durations)
        self.host_chips.update(np.unique(op_events.chips).tolist())
        self._ops(op_events, nesting)

    def _host_op_meta(self, plane: Any, decoder: StatDecoder, metadata_id: int, module: str, op_name: Any,
                      program_id: int | None) -> OpMeta:
        meta = self.host_op_metas.get((metadata_id, module, program_id))
        if meta is None:
            meta = self.host_op_metas[(metadata_id, module, program_id)] = self._op_meta(
                plane, metadata_id, decoder, module, str(op_name), program_id)
        return meta

    def _host_op_messages(self, plane: Any, decoder: StatDecoder, columns: EventColumns, events: np.ndarray,
                          starts: np.ndarray, durations: np.ndarray, chip: int | None) -> OpEvents:
        """`_host_ops`' columns from each event's stats read through its message."""
        values: dict[str, list[Any]] = {name: [_ABSENT] * len(events) for name in HOST_OP_STATS}
        for position, index in enumerate(events.tolist()):
            for stat in columns.message(index).stats:
                name = self.host_op_stats.get(stat.metadata_id)
                if name is not None:
                    values[name][position] = decoder.value(stat)
        modules = ["" if module is _ABSENT else str(module) for module in values["hlo_module"]]
        programs = [program_id if isinstance(program_id, int) else None for program_id in values["program_id"]]
        metas = [self._host_op_meta(plane, decoder, metadata_id, module, op_name, program_id)
                 for metadata_id, module, op_name, program_id
                 in zip(columns.metadata_id[events].tolist(), modules, values["hlo_op"], programs)]
        chips = [chip if chip is not None else 0 if ordinal is _ABSENT else int(ordinal or 0)
                 for ordinal in values["device_ordinal"]]
        run_ids = np.array([0 if run_id is _ABSENT else run_id % U64 for run_id in values["run_id"]], dtype=np.uint64)
        return _unique_metas(metas, np.arange(len(metas)), np.array(chips, dtype=np.int64), run_ids,
                             np.array([run_id is not _ABSENT for run_id in values["run_id"]], dtype=bool), starts,
                             durations)

    def _host_op_columns(self, decoder: StatDecoder, columns: EventColumns, events: np.ndarray
                         ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """Per stat name of `HOST_OP_STATS`: whether each of `events` holds it, and its value's kind and integer;
        None where a stat is no integer or reference, a run id or device a reference, a device beyond int64, or an
        event holds a stat twice."""
        table = columns.stat_values(list(self.host_op_stats))
        if table is None:
            return None
        stat_events, stat_ids, kinds, numbers = table
        kept = isin_few(stat_events, events)
        stat_events, stat_ids, kinds, numbers = stat_events[kept], stat_ids[kept], kinds[kept], numbers[kept]
        positions = np.searchsorted(events, stat_events)
        present, kinds_of, numbers_of = {}, {}, {}
        for name in HOST_OP_STATS:
            chosen = isin_few(stat_ids, [key for key, stat in self.host_op_stats.items() if stat == name])
            at = positions[chosen]  # ascending
            if (at[1:] == at[:-1]).any():
                return None
            present[name] = np.zeros(len(events), dtype=bool)
            present[name][at] = True
            kinds_of[name] = np.zeros(len(events), dtype=np.uint8)
            kinds_of[name][at] = kinds[chosen]
            numbers_of[name] = np.zeros(len(events), dtype=np.int64)
            numbers_of[name][at] = numbers[chosen]
        if any((kinds_of[name] == REF_VALUE).any() for name in ("run_id", "device_ordinal", "program_id")) or \
                ((kinds_of["device_ordinal"] == UINT64_VALUE) & (numbers_of["device_ordinal"] < 0)).any():
            return None
        return present, kinds_of, numbers_of


def _unique_metas(metas: list[OpMeta], meta_of_event: np.ndarray, chips: np.ndarray, run_ids: np.ndarray,
                  has_run: np.ndarray, starts: np.ndarray, durations: np.ndarray) -> OpEvents:
    """Op events whose ops are `metas` (indexed by `meta_of_event`, an op maybe more than once), each op once."""
    index_of: dict[int, int] = {}
    distinct: list[OpMeta] = []
    for meta in metas:
        if index_of.setdefault(id(meta), len(distinct)) == len(distinct):
            distinct.append(meta)
    renumbered = np.array([index_of[id(meta)] for meta in metas], dtype=np.int64)
    return OpEvents(distinct, renumbered[meta_of_event] if len(metas) else meta_of_event, chips, run_ids, has_run,
                    starts, durations)
