"""Recompilations, for the report: compiles over time per call site, and the input dims that varied
between the compiles of one call site and program, with the bucket advisor's proposals from the
recompiles analyzer."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tputrace.analysis.call_sites import call_label
from tputrace.analysis.findings import plain
from tputrace.analysis.recompiles import RecompileData as RecompileAnalysis, SizeSource, StormData
from tputrace.analysis.shapes import parse_specs
from tputrace.derived.run_facts import rank_offsets
from tputrace.store.aggregates import RECOMPILE, merged_ns
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace
    from tputrace.viewers.report.analysis_data import AnalysisData

MAX_SCATTER_POINTS = 20_000


@dataclass
class CompilePoint:
    rank: int
    start_ns: int
    dur_ns: int
    site: str
    name: str | None
    kind: str | None
    reason: str | None
    diff: str | None
    signature: str | None
    step: int | None
    source: SourceLocation | None


@dataclass
class VaryingDim:
    """An input dim that took several values across the compiles of one call site and program, with the
    bucket advisor's proposal when the recompiles analyzer made one (a storm), or what the size is when the
    data chose it (a storm no padding fixes, e.g. "the count of a boolean mask at train.py:10")."""

    site: str
    name: str | None
    label: str
    values: list[int]
    compiles: int
    proposal: dict[str, Any] | None = None
    size_from: str | None = None
    copied_at: str | None = None  # the line copying the batch whose size this is: the proposal is the batch's
    made_at: str | None = None  # the host line that made that batch (the line to change)


@dataclass
class RecompileData:
    points: list[CompilePoint]
    total: int
    sites: list[str]
    site_counts: dict[str, tuple[int, int, int]]
    varying: list[VaryingDim]
    advisor_ran: bool


def _site_label(source: SourceLocation | None) -> str:
    return source.short if source is not None else "(no source line)"


def prepare_recompilations(
    trace: Trace, analysis: AnalysisData | None = None, *, max_points: int = MAX_SCATTER_POINTS
) -> RecompileData:
    """Compiles over time per call site; per call site and program, the input dims that varied, with
    the bucket advisor's proposals from the recompiles analyzer."""
    offsets = rank_offsets(trace)
    (total,) = trace.sql("SELECT COUNT(*) FROM compiles")[0]
    rows = trace.sql(
        "SELECT rank, start_ns, COALESCE(dur_ns, 0) AS d, frame_id, name_sid, kind, reason, diff_sid, signature_sid, step "
        f"FROM compiles ORDER BY d DESC LIMIT {int(max_points)}"
    )
    points = []
    for rank, start_ns, dur_ns, frame_id, name_sid, kind, reason, diff_sid, signature_sid, step in rows:
        source = trace.frame(frame_id)
        points.append(CompilePoint(
            rank, start_ns + offsets.get(rank, 0), dur_ns, _site_label(source), trace.string(name_sid), kind, reason,
            trace.string(diff_sid), trace.string(signature_sid), step, source,
        ))
    points.sort(key=lambda point: point.start_ns)
    site_counts: dict[str, list[int]] = {}
    labels: dict[int | None, str] = {}
    for frame_id, count, recompiles in trace.sql(
        f"SELECT frame_id, COUNT(*), SUM({RECOMPILE}) FROM compiles GROUP BY frame_id"
    ):
        site = labels[frame_id] = _site_label(trace.frame(frame_id))
        previous = site_counts.setdefault(site, [0, 0, 0])
        previous[0] += count
        previous[1] += recompiles or 0
    # A site's compile time: per rank, the union of its compiles' intervals (nested or overlapping
    # compiles, of one call or of several calls on its line, count each instant once), summed over ranks.
    intervals: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for rank, frame_id, start_ns, end_ns in trace.sql(
        "SELECT rank, frame_id, start_ns, start_ns + COALESCE(dur_ns, 0) FROM compiles ORDER BY start_ns"
    ):
        intervals[labels[frame_id], rank].append((start_ns, end_ns))
    for (site, _), site_intervals in intervals.items():
        site_counts[site][2] += merged_ns(site_intervals)
    sites = sorted(site_counts, key=lambda site: (-site_counts[site][0], site))
    storms = _storms(analysis)
    varying = _storm_dims(storms)
    covered = {(storm.where, storm.name) for storm in storms if storm.varying_dims}
    varying.extend(_varying_dims(trace, covered))
    return RecompileData(points, total, sites, {site: (c[0], c[1], c[2]) for site, c in site_counts.items()},
                         varying, advisor_ran=analysis is not None and "recompiles" in analysis.results)


def _storms(analysis: AnalysisData | None) -> tuple[StormData, ...]:
    data = analysis.results["recompiles"].data if analysis is not None and "recompiles" in analysis.results else None
    return data.storms if isinstance(data, RecompileAnalysis) else ()


def _storm_dims(storms: tuple[StormData, ...]) -> list[VaryingDim]:
    rows = []
    for storm in storms:
        for dim in storm.varying_dims:
            rows.append(VaryingDim(
                storm.call or storm.where, storm.name, dim.label, list(dim.values), storm.compiles,
                plain(storm.proposed) if storm.proposed is not None else None,
                _size_from(storm.size_from), storm.copied_at, storm.made_at,
            ))
    return rows


def _size_from(origin: SizeSource | None) -> str | None:
    """`the count of a boolean mask at train.py:10` from a storm's `size_from` (None without one)."""
    return None if origin is None else f"{origin.what} at {origin.where}"


def _varying_dims(trace: Trace, covered: set[tuple[str, str | None]]) -> list[VaryingDim]:
    """Dims that differ between the signatures compiled at one call site for one program name, but for the
    (line, name) pairs in `covered` (the storms'); a call is named by its column and text when its line has others."""
    rows = trace.sql(
        "SELECT frame_id, name_sid, signature_sid, COUNT(*) FROM compiles GROUP BY frame_id, name_sid, signature_sid"
    )
    groups: dict[tuple[Any, Any], list[tuple[Any, int]]] = defaultdict(list)
    for frame_id, name_sid, signature_sid, count in rows:
        groups[(frame_id, name_sid)].append((signature_sid, count))
    calls_per_line = Counter((_site_label(trace.frame(frame_id)), name_sid) for frame_id, name_sid in groups)
    varying: list[VaryingDim] = []
    for (frame_id, name_sid), signatures in groups.items():
        source = trace.frame(frame_id)
        line_site = _site_label(source)
        if len(signatures) < 2 or (line_site, trace.string(name_sid)) in covered:
            continue
        parsed = [parse_specs(trace.string(signature_sid)) for signature_sid, _ in signatures]
        compiles = sum(count for _, count in signatures)
        width = len(parsed[0])
        if any(len(specs) != width for specs in parsed):
            continue
        site = call_label(source, trace) if source is not None and calls_per_line[(line_site, name_sid)] > 1 else line_site
        for input_index in range(width):
            column = [specs[input_index] for specs in parsed]
            if any(spec is None for spec in column):
                continue
            ranks = {len(spec.shape) for spec in column if spec is not None}
            if len(ranks) != 1:
                continue
            for dim in range(ranks.pop()):
                values = sorted({spec.shape[dim] for spec in column if spec is not None})
                if len(values) > 1:
                    varying.append(VaryingDim(site, trace.string(name_sid), f"input {input_index} dim {dim}", values, compiles))
    varying.sort(key=lambda item: (-item.compiles, item.site, item.label))
    return varying

