"""Reading a rank's sharding records: its meshes, parameter placements, collective causes, and each
caused collective's time (a file from before format 2 has none of them and reads as empty)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tputrace.store.reader import Trace
from tputrace.store.records import CollectiveCauseRecord, DeviceMeshRecord, ParameterPlacementRecord


@dataclass(frozen=True)
class CausedCollective:
    """One collective with the cause it had (None: the user's own call)."""

    kind: str
    bytes: int
    start_ns: int
    dur_ns: int
    step: int
    frame_id: int | None
    cause_id: int | None


@dataclass
class ShardingRecords:
    meshes: dict[int, DeviceMeshRecord] = field(default_factory=dict)
    parameters: list[ParameterPlacementRecord] = field(default_factory=list)
    causes: dict[int, CollectiveCauseRecord] = field(default_factory=dict)
    collectives: list[CausedCollective] = field(default_factory=list)

    def mesh_dim_sizes(self, mesh_id: int | None) -> list[int]:
        mesh = self.meshes.get(mesh_id) if mesh_id is not None else None
        if mesh is None or not mesh.shape:
            return []
        return [int(size) for size in mesh.shape.split("x") if size.isdigit()]


def read_sharding(trace: Trace, rank: int) -> ShardingRecords:
    """The sharding records of `rank`, collectives in start order."""
    records = ShardingRecords()
    params = (rank,)
    records.meshes = {mesh.id: mesh for mesh in trace.records("device_meshes", where="rank = ?", params=params)
                      if isinstance(mesh, DeviceMeshRecord)}
    records.parameters = [parameter for parameter in trace.records("parameter_placements", where="rank = ?", params=params)
                          if isinstance(parameter, ParameterPlacementRecord)]
    records.causes = {cause.id: cause for cause in trace.records("collective_causes", where="rank = ?", params=params)
                      if isinstance(cause, CollectiveCauseRecord)}
    if not trace.has_table("collectives"):
        return records
    has_cause = any(row[1] == "cause_id" for row in trace.sql("PRAGMA table_info(collectives)"))
    cause_column = "cause_id" if has_cause else "NULL"
    records.collectives = [
        CausedCollective(kind or "", nbytes or 0, start_ns or 0, dur_ns or 0, step or 0, frame_id, cause_id)
        for kind, nbytes, start_ns, dur_ns, step, frame_id, cause_id in trace.sql(
            f"SELECT kind, bytes, start_ns, dur_ns, step, frame_id, {cause_column} FROM collectives WHERE rank = ? ORDER BY start_ns", params
        )
    ]
    return records
