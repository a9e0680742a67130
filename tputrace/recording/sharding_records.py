"""The recorder's sharding records: device meshes, parameter placements and why each collective happened
(`device_meshes`, `parameter_placements`, `collective_causes`), as `Recorder` methods."""

from __future__ import annotations

from typing import Any

from tputrace.store.writer import TraceWriter


class ShardingRecords:
    """Mixed into `Recorder`: it holds the writer, the rank and the ids of the causes written so far."""

    writer: TraceWriter
    rank: int
    _cause_ids: dict[tuple[Any, ...], int]

    def device_mesh(self, shape: str, dim_names: str, ranks: str, frame_id: int | None) -> int:
        """A `device_meshes` row; returns its id."""
        writer = self.writer
        mesh_id = writer.next_id("device_meshes")
        writer.append("device_meshes", (mesh_id, self.rank, shape, dim_names, ranks, frame_id))
        return mesh_id

    def parameter_placement(self, name: str, module: str, wrapper: str, group: str | None, mesh_id: int | None, placements: str,
                            global_shape: str, local_shape: str, dtype: str, nbytes: int, bytes_per_rank: int, origin_frame_id: int | None) -> None:
        """A `parameter_placements` row: how one parameter is placed and what this rank holds."""
        writer = self.writer
        writer.append("parameter_placements", (
            self.rank, writer.intern(name), writer.intern(module), wrapper, None if group is None else writer.intern(group), mesh_id, placements,
            global_shape, local_shape, dtype, nbytes, bytes_per_rank, origin_frame_id,
        ))

    def collective_cause(self, cause: tuple[Any, ...]) -> int:
        """The id of a `collective_causes` row with these values (the table's columns after `id` and
        `rank`, texts for the `*_sid` ones), written the first time the cause is met."""
        cause_id = self._cause_ids.get(cause)
        if cause_id is None:
            writer = self.writer
            kind, phase, module, tensor, op, *rest = cause
            cause_id = writer.next_id("collective_causes")
            intern = writer.intern
            writer.append("collective_causes", (
                cause_id, self.rank, kind, phase, None if module is None else intern(module), None if tensor is None else intern(tensor),
                None if op is None else intern(op), *rest,
            ))
            self._cause_ids[cause] = cause_id
        return cause_id
