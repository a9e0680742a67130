"""Source lines for the TUI: per file and line, the time and the events attributed to it, and where a
recorded file is on this machine."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tputrace.source_digests import SourceDigest
from tputrace.store.sources import copy_as_run_saw, source_candidates
from tputrace.tui.queries.ops import OpGroup

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass
class LineStat:
    """What happened at one source line: time attributed to it and counts per kind."""

    time_ns: int = 0
    ops: int = 0
    compiles: int = 0
    caused: int = 0  # compiles a recompile storm finding puts on this line (where the changing shape is made)
    syncs: int = 0
    fallbacks: int = 0
    transfers: int = 0
    collectives: int = 0


@dataclass
class FileStat:
    """A user file in the trace with its per-line stats."""

    file: str
    lines: dict[int, LineStat] = field(default_factory=dict)
    shared_ns: int = 0  # time in which events of several of its lines nested (a compile frame's graphs at other lines)

    @property
    def time_ns(self) -> int:
        """The lines' time, each instant once."""
        return sum(stat.time_ns for stat in self.lines.values()) - self.shared_ns

    @property
    def ops(self) -> int:
        return sum(stat.ops for stat in self.lines.values())


_LINE_TABLES = ("ops", "compiles", "syncs", "fallbacks", "transfers", "collectives")
_NESTING_TABLES = _LINE_TABLES[1:]
"""Tables whose events at one line nest in each other: a CPU fallback holds its sync, a sync the compile it
waited for, a `torch.compile` frame's compile its graphs' compiles."""


def source_stats(trace: Trace, rank: int, ops_by_source: Sequence[OpGroup] | None = None,
                 caused: Sequence[tuple[str, int, int]] = ()) -> list[FileStat]:
    """Every file in the trace with per-line time and counts for `rank`; most time first.

    A line's time is its ops' host dispatch and the time its other events (compiles, syncs, CPU fallbacks,
    transfers, collectives) held the host, each instant once: events of the line nested in each other count once,
    and so do a file's events nested in each other across its lines in the file's time.
    `ops_by_source`: the ops already grouped by source line (`op_groups(trace, "source", rank)`,
    uncapped), so that the ops, by far the biggest table, are not scanned again. `caused`: (file, line,
    compiles) that the recompile findings put on a line (`caused_compiles`).
    """
    parts = [f"SELECT frame_id, '{table}', COUNT(*) FROM {table} WHERE rank = ? AND frame_id IS NOT NULL GROUP BY frame_id"
             for table in _NESTING_TABLES]
    rows: list[tuple[Any, ...]] = [(*row, 0) for row in trace.sql(" UNION ALL ".join(parts), (rank,) * len(parts))]  # time: below
    if ops_by_source is not None:
        rows += [(group.key[0], "ops", group.count, group.total_ns) for group in ops_by_source if group.key[0] is not None]
    else:
        rows += trace.sql("SELECT frame_id, 'ops', COUNT(*), COALESCE(SUM(dur_ns), 0) FROM ops NOT INDEXED "
                          "WHERE rank = ? AND frame_id IS NOT NULL GROUP BY frame_id", (rank,))
    files: dict[str, FileStat] = {}
    for frame_id, table, count, total_ns in rows:
        location = trace.frame(frame_id)
        if location is None:
            continue
        file_stat = files.setdefault(location.file, FileStat(location.file))
        line = file_stat.lines.setdefault(location.line, LineStat())
        line.time_ns += total_ns
        setattr(line, table, getattr(line, table) + count)
    busy_by_line, busy_by_file = _busy_by_line(trace, rank)
    for (file, line_number), busy_ns in busy_by_line.items():
        files.setdefault(file, FileStat(file)).lines.setdefault(line_number, LineStat()).time_ns += busy_ns
    for file, busy_ns in busy_by_file.items():
        files[file].shared_ns = sum(busy_by_line[line] for line in busy_by_line if line[0] == file) - busy_ns
    for file, line_number, compiles in caused:
        file_stat = files.setdefault(file, FileStat(file))
        file_stat.lines.setdefault(line_number, LineStat()).caused += compiles
    for location_file in _all_frame_files(trace):
        files.setdefault(location_file, FileStat(location_file))
    return sorted(files.values(), key=lambda file_stat: (-file_stat.time_ns, file_stat.file))


def _busy_by_line(trace: Trace, rank: int) -> tuple[dict[tuple[str, int], int], dict[str, int]]:
    """Per (file, line) and per file, the time covered by the `_NESTING_TABLES` events there: the union of their
    intervals (a line's events may have several frames, one per call's columns)."""
    events = " UNION ALL ".join(f"SELECT frame_id, start_ns, dur_ns FROM {table} WHERE rank = ? AND frame_id IS NOT NULL "
                                "AND dur_ns > 0 AND start_ns IS NOT NULL" for table in _NESTING_TABLES)
    by_line: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for frame_id, start_ns, dur_ns in trace.sql(events, (rank,) * len(_NESTING_TABLES)):
        location = trace.frame(frame_id)
        if location is not None:
            by_line.setdefault((location.file, location.line), []).append((start_ns, start_ns + dur_ns))
    by_file: dict[str, list[tuple[int, int]]] = {}
    for (file, _), spans in by_line.items():
        by_file.setdefault(file, []).extend(spans)
    return ({line: _covered_ns(spans) for line, spans in by_line.items()},
            {file: _covered_ns(spans) for file, spans in by_file.items()})


def _covered_ns(spans: list[tuple[int, int]]) -> int:
    """The time the (start, end) intervals cover, each instant once."""
    total = covered_to = 0
    for start_ns, end_ns in sorted(spans):
        if end_ns > covered_to:
            total += end_ns - max(start_ns, covered_to)
            covered_to = end_ns
    return total


def caused_compiles(trace: Trace, rank: int) -> list[tuple[str, int, int]]:
    """(file, line, compiles) for each recompile storm finding of `rank`: the line that made the changing shape (or,
    not knowing it, where the shape enters) and the compiles it explains; none when the analysis cannot run."""
    try:
        from tputrace.analysis import ANALYZERS, analyze

        report = analyze(trace, rank=rank, analyzers={"recompiles": ANALYZERS["recompiles"]})
        data = report.results["recompiles"].data
    except Exception:  # noqa: BLE001 - the analysis is another layer: the Source view shows what it has without it
        return []
    return [(caused.file, caused.line, caused.compiles) for caused in data.caused]


def _all_frame_files(trace: Trace) -> list[str]:
    """Every recorded file, as the reader resolves frames (`?` for a damaged file's missing or non-text name)."""
    locations = (trace.frame(frame_id) for (frame_id,) in trace.sql("SELECT id FROM frames"))
    return list(dict.fromkeys(location.file for location in locations if location is not None))


def resolve_source(recorded: str, roots: Sequence[str | os.PathLike[str]], seen: SourceDigest | None = None) -> Path | None:
    """Find a recorded source file on this machine (`tputrace.store.sources.source_candidates`): the first
    candidate whose content is the one the run saw (`seen`) wins, else the first that exists."""
    if seen is not None:
        copy = copy_as_run_saw(recorded, roots, (seen,))
        if copy is not None:
            return copy
    return next(source_candidates(recorded, roots), None)
