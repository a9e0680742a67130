"""XProf lines that hold no ops of their own: a plane's `_counters_` line (samples of counters, each a zero-length
event named for its counter, its value a stat: a chip's or the host's performance counters), and a TPU plane's
`Async XLA Ops` line (an asynchronous op's span from its `-start` to its `-done`: a copy or collective in flight,
which the `XLA Ops` line holds as the two short ops)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from tputrace.importers.xevents import EventColumns
from tputrace.importers.xstats import StatDecoder

COUNTERS_LINE = "_counters_"
ASYNC_OPS_LINE = "Async XLA Ops"
# A SparseCore of a TPU chip: its ops run beside the chip's TensorCore ops, on lines of their own.
SPARSECORE_PLANE = re.compile(r"^/device:TPU:(\d+) SparseCore (\d+)$")
OP_LINES = frozenset(("XLA Ops", "Sparse Core Ops"))
MODULE_LINES = frozenset(("XLA Modules", "Sparse Core Modules"))


@dataclass
class CounterSeries:
    """One counter's samples on one plane: how many, the least, the greatest and the last (in time) value."""

    samples: int = 0
    least: float = float("inf")
    greatest: float = float("-inf")
    last: float = 0.0
    last_at_ps: int = -1

    def add(self, value: float, at_ps: int) -> None:
        self.samples += 1
        self.least = min(self.least, value)
        self.greatest = max(self.greatest, value)
        if at_ps >= self.last_at_ps:
            self.last, self.last_at_ps = value, at_ps

    def as_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "min": _plain(self.least), "max": _plain(self.greatest),
                "last": _plain(self.last)}


@dataclass
class Counters:
    """The counters of a capture's `_counters_` lines, by plane and counter name."""

    series: dict[str, dict[str, CounterSeries]] = field(default_factory=dict)

    def read(self, plane: Any, decoder: StatDecoder, columns: EventColumns, base_ps: int) -> None:
        """Add a window of a `_counters_` line's events: each one's first numeric stat is its counter's value."""
        by_name = self.series.setdefault(plane.name, {})
        event_metadata = plane.event_metadata
        for index, (metadata_id, offset_ps) in enumerate(zip(columns.metadata_id.tolist(),
                                                             columns.offset_ps.tolist())):
            metadata = event_metadata.get(metadata_id)
            if metadata is None:
                continue
            value = _first_number(decoder, columns.message(index).stats) or _first_number(decoder, metadata.stats)
            if value is not None:
                name = metadata.display_name or metadata.name
                by_name.setdefault(name, CounterSeries()).add(value, base_ps + offset_ps)

    def as_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {plane: {name: series.as_dict() for name, series in sorted(by_name.items())}
                for plane, by_name in sorted(self.series.items()) if by_name}


def async_annotations(rank: int, intern: Callable[[str], int], plane: Any, columns: EventColumns, starts: np.ndarray,
                      durations: np.ndarray, steps: np.ndarray) -> list[tuple[Any, ...]]:
    """`annotations` rows (origin `xla_async`) of a window of an `Async XLA Ops` line's events."""
    return list(zip(repeat(rank), map(intern, async_op_names(plane, columns.metadata_id.tolist())),
                    repeat("xla_async"), starts.tolist(), durations.tolist(), repeat(None), steps.tolist()))


def async_op_names(plane: Any, metadata_ids: list[int]) -> list[str]:
    """The annotation names of `Async XLA Ops` events: what XProf calls the span (`async-copy`) and the instruction that
    starts it (`copy-start.2`, from the event metadata's HLO text `%copy-start.2 = ... copy-start(...)`)."""
    names = []
    for metadata_id in metadata_ids:
        metadata = plane.event_metadata.get(metadata_id)
        if metadata is None:
            names.append("async op")
            continue
        instruction = metadata.name.split(" = ", 1)[0].lstrip("%")
        names.append(f"{metadata.display_name} {instruction}" if metadata.display_name else instruction)
    return names


def _first_number(decoder: StatDecoder, stats: Any) -> float | None:
    for stat in stats:
        kind = stat.WhichOneof("value")
        if kind in ("double_value", "int64_value", "uint64_value"):
            return float(decoder.value(stat))
    return None


def _plain(value: float) -> float | int:
    return int(value) if value.is_integer() else value
