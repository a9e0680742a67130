"""A GPU's XProf device plane (`/device:GPU:n`): its stream lines (`Stream #13(Compute)`, `Stream #63(MemcpyH2D)`)
hold an event per kernel or copy; the lines XProf derives from them (`TensorFlow Ops`, `TensorFlow Name Scope`, `XLA
Ops`) are not read as streams. A kernel XLA launched (JAX, PyTorch/XLA) carries the HLO op
and module it computes (`hlo_op`, `hlo_module` stats): it is an XLA op's `ops` row, as XLA:CPU's ops on host threads
are; any other (TensorFlow's own kernels, a copy) is a kernel: a `programs` row of kind kernel per name and an
`executions` row per run, as torch.profiler's kernels are."""

from __future__ import annotations

from typing import Any

import numpy as np

from tputrace.importers.wire import LineHead
from tputrace.importers.xevents import EventColumns
from tputrace.importers.xla_ops import LineNesting
from tputrace.importers.xstats import StatDecoder

# The stats of an XLA op event on a host thread (or a GPU's stream) that the import reads.
HOST_OP_STATS = ("hlo_op", "hlo_module", "program_id", "run_id", "device_ordinal")


class StreamLines:
    """The part of the XProf importer that reads a GPU plane's stream lines (mixed into `XPlaneImporter`, whose
    `_host_ops`, `_steps_at`, `sink`, `writer` and `rank` it uses)."""

    sink: Any
    writer: Any
    rank: int
    stream_kernels: dict[str, int]
    stream_plane: Any
    stream_ops: bool  # the plane's kernels of XLA ops are its ops (it has no `XLA Ops` line)
    host_op_metas: dict[Any, Any]
    host_op_stats: dict[int, str]

    def _host_ops(self, plane: Any, decoder: StatDecoder, columns: EventColumns, events: np.ndarray,
                  starts: np.ndarray, durations: np.ndarray, nesting: LineNesting, chip: int | None = None) -> None:
        raise NotImplementedError

    def _steps_at(self, starts: np.ndarray, run_ids: list[Any] | None = None) -> np.ndarray:
        raise NotImplementedError

    def _stream_events(self, plane: Any, lines: list[LineHead], decoder: StatDecoder, columns: EventColumns,
                       starts: np.ndarray, durations: np.ndarray, chip: int, nesting: LineNesting) -> None:
        """One window of a stream line's events: XLA's kernels as ops of `chip` (left out where the plane has an `XLA
        Ops` line, which has them already), the others as kernel runs."""
        if self.stream_plane is not plane:  # event and stat metadata ids are the plane's own
            self.stream_plane, self.host_op_metas = plane, {}
            self.host_op_stats = {key: name for name in HOST_OP_STATS for key in decoder.ids_named(name)}
            self.stream_ops = not any(line.name == "XLA Ops" and line.has_events for line in lines)
        op_events = columns.with_stat(set(decoder.ids_named("hlo_op")))
        if len(op_events) and self.stream_ops:
            self._host_ops(plane, decoder, columns, op_events, starts[op_events], durations[op_events], nesting, chip)
        others = np.ones(len(columns), dtype=bool)
        others[op_events] = False
        if not others.any():
            return
        program_ids = []
        for metadata_id in columns.metadata_id[others].tolist():
            name = plane.event_metadata[metadata_id].name or "?"
            program_id = self.stream_kernels.get(name)
            if program_id is None:
                program_id = self.stream_kernels[name] = self.writer.next_id("programs")
                name_sid = self.writer.intern(name)
                self.sink.append("programs", (program_id, self.rank, "kernel", name_sid, name_sid, None, None, None,
                                              None, None))
            program_ids.append(program_id)
        kernel_starts = starts[others]
        self.sink.extend("executions", [
            (self.rank, program_id, chip, start, dur, step, None) for program_id, start, dur, step in zip(
                program_ids, kernel_starts.tolist(), durations[others].tolist(), self._steps_at(kernel_starts).tolist())])
