"""Stats of XProf planes and events: names and values, a reference resolved to its string."""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np

from tputrace.importers.xevents import INT64_VALUE, REF_VALUE, UINT64_VALUE


def plane_stat(plane: Any, name: str) -> Any:
    """The value of a plane's stat `name` (None where it has none)."""
    names = {key: meta.name for key, meta in plane.stat_metadata.items()}
    for stat in plane.stats:
        if names.get(stat.metadata_id) == name:
            kind = stat.WhichOneof("value")
            return getattr(stat, kind) if kind else None
    return None


class StatDecoder:
    """Stat names and values of one plane (a `ref_value` resolves to the interned string it points at)."""

    def __init__(self, plane: Any) -> None:
        self._names = {key: meta.name for key, meta in plane.stat_metadata.items()}

    def name(self, metadata_id: int) -> str:
        return self._names.get(metadata_id, "")

    def names(self, metadata_ids: list[int]) -> list[str]:
        return list(map(self._names.get, metadata_ids, repeat("")))

    def ids_named(self, name: str) -> list[int]:
        return [key for key, value in self._names.items() if value == name]

    def value(self, stat: Any) -> Any:
        kind = stat.WhichOneof("value")
        if kind is None:
            return None
        if kind == "ref_value":
            return self._names.get(stat.ref_value, "")
        return getattr(stat, kind)


def stat_numbers(decoder: StatDecoder, kinds: np.ndarray, numbers: np.ndarray) -> list[Any]:
    """Stats' values from their integers: a reference's string, an unsigned or signed integer."""
    values = numbers.tolist()
    if (kinds == REF_VALUE).all():
        return decoder.names(values)
    if (kinds == INT64_VALUE).all():
        return values
    return [decoder.name(number) if kind == REF_VALUE else number % (1 << 64) if kind == UINT64_VALUE else number
            for kind, number in zip(kinds.tolist(), values)]
