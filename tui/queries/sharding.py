"""Sharding for the TUI: a rank's meshes, its parameters' placements, and its collectives grouped by
the cause recorded for each (cause -> module -> line)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.text import shown
from tputrace.store.sharding import ShardingRecords, read_sharding
from tputrace.wording import format_bytes

if TYPE_CHECKING:
    from tputrace.store.reader import Trace
    from tputrace.store.records import CollectiveCauseRecord, SourceLocation

USER_CALL = "user call"
"""The cause shown for collectives the recorder found no cause for (the user's own call)."""


@dataclass(frozen=True)
class MeshRow:
    id: int
    shape: str
    dim_names: str
    ranks: str


@dataclass(frozen=True)
class ParameterRow:
    name: str
    module: str
    wrapper: str
    placements: str
    global_shape: str
    local_shape: str
    bytes: int
    bytes_per_rank: int


@dataclass(frozen=True)
class CauseGroup:
    """The collectives of one cause kind, module and line: calls, bytes moved and time."""

    cause: str
    phase: str
    module: str
    line: str
    count: int
    bytes: int
    total_ns: int
    details: tuple[str, ...] = ()  # one line per distinct cause in the group: its bucket or placements and tensors


@dataclass(frozen=True)
class ShardingTables:
    meshes: tuple[MeshRow, ...]
    parameters: tuple[ParameterRow, ...]
    causes: tuple[CauseGroup, ...]

    @property
    def empty(self) -> bool:
        return not (self.meshes or self.parameters or any(group.cause != USER_CALL for group in self.causes))


def _text(value: str | None) -> str:
    return shown(value) or ""


def location_text(location: SourceLocation | None) -> str:
    """`file:line` of a recorded location, control characters escaped; empty when none."""
    if location is None or not location.file:
        return ""
    return f"{_text(location.file)}:{location.line}"


def sharding_tables(trace: Trace, rank: int) -> ShardingTables:
    """`rank`'s meshes, parameters (most bytes per rank first) and collectives by cause, most time first."""
    records = read_sharding(trace, rank)
    return ShardingTables(_meshes(records), _parameters(records), _cause_groups(trace, records))


def _meshes(records: ShardingRecords) -> tuple[MeshRow, ...]:
    return tuple(MeshRow(mesh.id, _text(mesh.shape), _text(mesh.dim_names), _text(mesh.ranks))
                 for mesh in sorted(records.meshes.values(), key=lambda mesh: mesh.id))


def _parameters(records: ShardingRecords) -> tuple[ParameterRow, ...]:
    rows = [
        ParameterRow(_text(parameter.name), _text(parameter.module), _text(parameter.wrapper), _text(parameter.placements),
                     _text(parameter.global_shape), _text(parameter.local_shape), parameter.bytes or 0, parameter.bytes_per_rank or 0)
        for parameter in records.parameters
    ]
    return tuple(sorted(rows, key=lambda row: (-row.bytes_per_rank, row.name)))


def _cause_groups(trace: Trace, records: ShardingRecords) -> tuple[CauseGroup, ...]:
    totals: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    details: dict[tuple[str, str, str, str], dict[str, None]] = defaultdict(dict)
    frames: dict[int, str] = {}
    for collective in records.collectives:
        cause = records.causes.get(collective.cause_id) if collective.cause_id is not None else None
        if cause is not None:
            key = (_text(cause.kind) or "?", _text(cause.phase), _text(cause.module), location_text(cause.origin))
            details[key][cause_detail(cause, collective.bytes)] = None
        else:
            if collective.frame_id is not None and collective.frame_id not in frames:
                frames[collective.frame_id] = location_text(trace.frame(collective.frame_id))
            key = (USER_CALL, "", "", frames.get(collective.frame_id, "") if collective.frame_id is not None else "")
        entry = totals[key]
        entry[0] += 1
        entry[1] += collective.bytes
        entry[2] += collective.dur_ns
    groups = [CauseGroup(cause, phase, module, line, count, nbytes, total_ns, tuple(detail for detail in details[(cause, phase, module, line)] if detail))
              for (cause, phase, module, line), (count, nbytes, total_ns) in totals.items()]
    return tuple(sorted(groups, key=lambda group: (-group.total_ns, group.cause, group.module, group.line)))


def cause_detail(cause: CollectiveCauseRecord, message_bytes: int) -> str:
    """One line about a cause: a DDP bucket's index, size and parameters; an FSDP2 group's parameters; a
    redistribution's placements, shape, op and tensor (control characters escaped)."""
    tensors = _text(cause.tensor)
    if cause.kind == "ddp_bucket":
        size = format_bytes(message_bytes)
        return f"bucket {cause.bucket_index}: {size}" + (f" · {tensors}" if tensors else "")
    if (cause.kind or "").startswith("fsdp_"):
        prefetch = " (prefetch)" if cause.prefetch else ""
        return f"{_text(cause.kind)}{prefetch}: {tensors}" if tensors else ""
    if cause.src_placements or cause.dst_placements:
        text = f"{_text(cause.src_placements)} -> {_text(cause.dst_placements)}, shape {_text(cause.global_shape)}"
        if cause.op:
            text += f", {_text(cause.op)}"
        return text + (f" · {tensors}" if tensors else "")
    return f"{_text(cause.op)}" if cause.op else ""
