"""Where an imported trace's ranks came from: the provenance `tputrace import` stores as `meta.imported`
(one JSON object per rank: format, path, host, device)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

IMPORTED_META_KEY = "imported"
THIS_HOST = "this host"


def imported_source(trace: Trace, rank: int | None) -> dict[str, Any] | None:
    """The provenance of `rank` (None: the trace's first run) in an imported trace; None for a trace tputrace
    recorded, or a provenance that is not a list of objects."""
    text = trace.meta.get(IMPORTED_META_KEY)
    if not text:
        return None
    try:
        sources = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(sources, list):
        return None
    wanted = trace.run.rank if rank is None else rank
    return next((item for item in sources if isinstance(item, dict) and item.get("rank") == wanted), None)


def imported_device(trace: Trace, rank: int | None) -> str | None:
    """The device an imported rank's times were measured on (cpu, gpu, tpu, host); None when not imported."""
    source = imported_source(trace, rank)
    return None if source is None else str(source.get("device", "?"))


def measured_on(device: str | None) -> str:
    """Where times were measured, for a label: this host, or an imported capture's device."""
    return f"the capture's {device}" if device else THIS_HOST


def recorded_windows_ns(trace: Trace, rank: int | None) -> int | None:
    """An import's profiling windows' time without the gaps between them (`recorded_ns`), where the capture had
    several windows; None otherwise or where the file holds no whole positive number there."""
    value = (imported_source(trace, rank) or {}).get("recorded_ns")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
