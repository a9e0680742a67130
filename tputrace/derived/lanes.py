"""Timeline rows: what a lane is and which table each kind of lane reads its events from."""

from __future__ import annotations

from dataclasses import dataclass

LANE_TABLES: dict[str, str] = {
    "step": "steps",
    "annotation": "annotations",
    "dispatch": "ops",
    "compile": "compiles",
    "sync": "syncs",
    "transfer": "transfers",
    "fallback": "fallbacks",
    "collective": "collectives",
    "program": "executions",
}
"""The table holding the events of each kind of lane."""


@dataclass(frozen=True)
class Lane:
    """One row of a timeline: the events of one kind (a key of `LANE_TABLES`) on one rank, on one chip
    for a chip's lanes, and how many of them the row covers."""

    name: str
    kind: str
    rank: int
    chip: int | None
    events: int

    @property
    def table(self) -> str:
        return LANE_TABLES[self.kind]
