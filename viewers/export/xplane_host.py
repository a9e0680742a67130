"""The `/host:CPU` plane of an XProf file: the Python side, one line per kind of host activity (op
dispatch, flushes, compiles with their reasons, syncs, transfers, CPU fallbacks, collectives,
annotated ranges, graph breaks)."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any, BinaryIO

from tputrace.derived.trace_tables import DISPATCH_KEY, DUR, START, OpBatch, TraceTables
from tputrace.viewers.export.collective_causes import cause_args, cause_column
from tputrace.viewers.export.xplane_builder import PS_PER_NS, PlaneBuilder, Stats

HOST_PLANE = "/host:CPU"
# XProf's overview takes MXU and HBM utilization from hardware counters, read as these host-plane stats. A trace
# holds no counter readings (XLA:CPU has none; the backend does not read a TPU's), so the export says they are
# unknown (a negative value) instead of leaving XProf to show 0.0%.
UNMEASURED_COUNTERS: Stats = (("matrix_unit_utilization_percent", -1.0), ("hbm_utilization_percent", -1.0))
_DUR_OF = operator.itemgetter(DUR)


class HostPlane:
    """The `/host:CPU` plane of one rank: one line per kind of host activity."""

    LINE_NAMES = ("Steps", "Annotations", "Python dispatch", "Flushes", "XLA Compile", "Syncs", "Transfers",
                  "CPU fallbacks", "Collectives", "Graph breaks")

    def __init__(self, tables: TraceTables, plane_id: int, spill_folder: Path) -> None:
        self.tables = tables
        self.builder = PlaneBuilder(plane_id, HOST_PLANE, spill_folder)
        self.builder.add_stats(self.builder.plane.stats, UNMEASURED_COUNTERS)
        self.lines = {name: self.builder.add_line(name) for name in self.LINE_NAMES}
        self.dispatch = self.lines["Python dispatch"]
        self._dispatch_metadata: dict[tuple[Any, ...], int] = {}

    @property
    def event_count(self) -> int:
        return sum(len(line) for line in self.lines.values())

    def add_dispatches(self, rows: OpBatch) -> None:
        """Ops' dispatch on the host (`ops` rows); each op's event metadata holds shapes, module and line."""
        keys = list(map(DISPATCH_KEY, rows))
        metadata = self._dispatch_metadata
        metadata_ids = list(map(metadata.get, keys))
        if None in metadata_ids:
            for index, metadata_id in enumerate(metadata_ids):
                if metadata_id is None:
                    metadata_ids[index] = self._dispatch_metadata_id(keys[index])
        self.dispatch.extend(metadata_ids, [row[START] * PS_PER_NS for row in rows],
                             [dur * PS_PER_NS if dur and dur > 0 else 0 for dur in map(_DUR_OF, rows)])

    def _dispatch_metadata_id(self, key: tuple[Any, ...]) -> int:
        metadata_id = self._dispatch_metadata.get(key)
        if metadata_id is None:
            op_sid, inputs_sid, outputs_sid, frame_id, module_sid = key
            text = self.tables.text
            metadata_id = self._dispatch_metadata[key] = self.builder.add_event_metadata(("dispatch", *key), text(op_sid) or "op", (
                ("inputs", text(inputs_sid)), ("outputs", text(outputs_sid)), ("module", text(module_sid)),
                ("source", self.tables.source(frame_id)),
            ))
        return metadata_id

    def clear_dispatch(self) -> None:
        self.dispatch.clear()

    def add(self, line: str, key: Any, name: str, start_ns: int, dur_ns: int | None,
            metadata_stats: Stats = (), event_stats: Stats | None = None) -> None:
        if start_ns < 0:
            # An XLine's events start at or after the line (the run's start); an imported profile's compiles from its
            # process's TORCH_TRACE log can precede the profile's window: their part inside it is shown.
            if start_ns + (dur_ns or 0) <= 0:
                return
            start_ns, dur_ns = 0, start_ns + (dur_ns or 0)
        metadata_id = self.builder.add_event_metadata(key, name, metadata_stats)
        self.lines[line].add(metadata_id, start_ns * PS_PER_NS, (dur_ns or 0) * PS_PER_NS, event_stats)

    def add_records(self, rank: int) -> None:
        """Everything on the host but op dispatch, from the rank's rows."""
        trace, text, source, add = self.tables.trace, self.tables.text, self.tables.source, self.add
        # No root (`_r`) stat on host steps: the device Steps lines define the steps for XProf.
        for step, start_ns, end_ns, origin in trace.sql(
            "SELECT step, start_ns, end_ns, source FROM steps WHERE rank = ? ORDER BY step", (rank,)
        ):
            add("Steps", ("host step", step), f"step {step}", start_ns, (end_ns - start_ns) if end_ns is not None else 0,
                (("marked_by", origin),), (("step_num", step),))
        for name_sid, origin, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT name_sid, source, start_ns, dur_ns, frame_id, step FROM annotations WHERE rank = ? "
            "ORDER BY start_ns, dur_ns DESC", (rank,)
        ):
            add("Annotations", ("annotation", name_sid, origin, frame_id), text(name_sid) or "range", start_ns, dur_ns,
                (("origin", origin), ("source", source(frame_id))), (("step", step),))
        for flush_id, program_id, trigger, frame_id, n_ops, cache_hit, chip_index, start_ns, dur_ns, input_bytes, output_bytes, step in trace.sql(
            "SELECT id, program_id, trigger, frame_id, n_ops, cache_hit, chip, start_ns, dur_ns, input_bytes, output_bytes, step "
            "FROM flushes WHERE rank = ?", (rank,)
        ):
            add("Flushes", ("flush", trigger, frame_id, program_id), f"flush ({trigger})", start_ns, dur_ns, (
                ("trigger", trigger), ("source", source(frame_id)), ("program_id", program_id),
                ("program", self.tables.program_name(program_id) if program_id is not None else None),
            ), (
                ("flush_id", flush_id), ("ops", n_ops), ("cache_hit", bool(cache_hit)), ("chip", chip_index),
                ("input_bytes", input_bytes), ("output_bytes", output_bytes), ("step", step),
            ))
        for compile_id, program_id, kind, name_sid, signature_sid, chip_index, start_ns, dur_ns, frame_id, step, reason, diff_sid, detail in trace.sql(
            "SELECT id, program_id, kind, name_sid, signature_sid, chip, start_ns, dur_ns, frame_id, step, reason, diff_sid, detail "
            "FROM compiles WHERE rank = ?", (rank,)
        ):
            add("XLA Compile", ("compile", compile_id), f"compile {text(name_sid) or kind or ''}".strip(), start_ns, dur_ns, (
                ("reason", reason), ("what_changed", text(diff_sid)), ("kind", kind), ("signature", text(signature_sid)),
                ("source", source(frame_id)), ("program_id", program_id), ("chip", chip_index), ("step", step),
                ("detail", detail),
            ))
        for kind, frame_id, chip_index, start_ns, dur_ns, pending_ops, step in trace.sql(
            "SELECT kind, frame_id, chip, start_ns, dur_ns, pending_ops, step FROM syncs WHERE rank = ?", (rank,)
        ):
            add("Syncs", ("sync", kind, frame_id), f"sync ({kind})", start_ns, dur_ns,
                (("kind", kind), ("source", source(frame_id))),
                (("pending_ops", pending_ops), ("chip", chip_index), ("step", step)))
        for direction, nbytes, src_chip, dst_chip, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT direction, bytes, src_chip, dst_chip, start_ns, dur_ns, frame_id, step FROM transfers WHERE rank = ?", (rank,)
        ):
            add("Transfers", ("transfer", direction, frame_id, src_chip, dst_chip), f"transfer {direction}", start_ns, dur_ns,
                (("direction", direction), ("source", source(frame_id)), ("src_chip", src_chip), ("dst_chip", dst_chip)),
                (("bytes", nbytes), ("step", step)))
        for op_sid, inputs_sid, chip_index, start_ns, dur_ns, frame_id, step in trace.sql(
            "SELECT op_sid, inputs_sid, chip, start_ns, dur_ns, frame_id, step FROM fallbacks WHERE rank = ?", (rank,)
        ):
            add("CPU fallbacks", ("fallback", op_sid, inputs_sid, frame_id), f"{text(op_sid) or 'op'} (CPU fallback)",
                start_ns, dur_ns, (("aten_op", text(op_sid)), ("inputs", text(inputs_sid)), ("source", source(frame_id))),
                (("chip", chip_index), ("step", step)))
        causes = cause_args(trace, rank)
        for kind, nbytes, dtype, group_sid, ranks_sid, frame_id, start_ns, dur_ns, wait_ns, algorithm, bus_bandwidth, step, cause_id in trace.sql(
            "SELECT kind, bytes, dtype, group_sid, ranks_sid, frame_id, start_ns, dur_ns, wait_ns, algorithm, bus_bandwidth, step, "
            f"{cause_column(trace)} FROM collectives WHERE rank = ?", (rank,)
        ):
            add("Collectives", ("collective", kind, group_sid, ranks_sid, frame_id, dtype, algorithm, cause_id), kind or "collective",
                start_ns, dur_ns,
                (("kind", kind), ("group", text(group_sid)), ("ranks", text(ranks_sid)), ("source", source(frame_id)),
                 ("dtype", dtype), ("algorithm", algorithm), *(causes.get(cause_id, ()) if cause_id is not None else ())),
                (("bytes", nbytes), ("wait_ns", wait_ns), ("bus_bandwidth_bytes_per_second", bus_bandwidth), ("step", step)))
        for reason_sid, frame_id, t_ns, step in trace.sql(
            "SELECT reason_sid, frame_id, t_ns, step FROM graph_breaks WHERE rank = ?", (rank,)
        ):
            add("Graph breaks", ("graph break", reason_sid, frame_id), "graph break", t_ns, 0,
                (("reason", text(reason_sid)), ("source", source(frame_id))), (("step", step),))

    def write(self, file: BinaryIO, timestamp_ns: int) -> None:
        self.builder.write(file, timestamp_ns, keep_empty_lines=False)

