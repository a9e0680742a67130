"""Compiles for the TUI: one page of compiles with the compile each replaced, and compiles per call site."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tputrace.analysis.call_sites import call_name
from tputrace.derived.text import shown
from tputrace.store.aggregates import RECOMPILE, merged_ns
from tputrace.store.records import SourceLocation

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class CompileRow:
    """One compile, with the compile it replaced (`old`): the nearest earlier compile of the same
    structure, or, for a recompile whose structure changed, the nearest earlier one at the same call site."""

    id: int
    step: int
    start_ns: int
    dur_ns: int
    kind: str
    name: str
    reason: str
    diff: str | None
    signature: str
    old_signature: str | None
    source: SourceLocation | None
    detail: dict[str, Any] | None
    old_id: int | None = None
    old_name: str | None = None
    old_relation: Literal["structure", "call site"] | None = None
    """How `old` was found: an earlier compile of the same "structure", or at the same "call site"."""
    call: str | None = None  # which call on its line the source is (`call_sites.call_name`), when it has a column


_EARLIER_COMPILE = (
    "SELECT earlier.id FROM compiles AS earlier {join} WHERE earlier.rank = c.rank AND earlier.start_ns < c.start_ns "
    "AND {match} ORDER BY earlier.start_ns DESC, earlier.id DESC LIMIT 1"
)
_SAME_STRUCTURE = _EARLIER_COMPILE.format(join="JOIN programs AS earlier_program ON earlier_program.id = earlier.program_id",
                                          match="earlier_program.structure_sid = program.structure_sid")
_SAME_CALL_SITE = _EARLIER_COMPILE.format(join="", match="earlier.frame_id = c.frame_id")


def compile_rows(trace: Trace, rank: int, *, offset: int = 0, limit: int = 500) -> list[CompileRow]:
    """One page of the compiles of `rank` in time order."""
    rows = trace.sql(
        "SELECT c.id, c.step, c.start_ns, c.dur_ns, c.kind, c.name_sid, c.reason, c.diff_sid, c.signature_sid, "
        f"({_SAME_STRUCTURE}), CASE WHEN COALESCE(c.reason, 'first') != 'first' THEN ({_SAME_CALL_SITE}) END, "
        "c.frame_id, c.detail FROM compiles AS c LEFT JOIN programs AS program ON program.id = c.program_id "
        "WHERE c.rank = ? ORDER BY c.start_ns, c.id LIMIT ? OFFSET ?",
        (rank, int(limit), int(offset)),
    )
    old_ids = {old_id for row in rows for old_id in (row[9] or row[10],) if old_id is not None}
    olds: dict[int, tuple[Any, Any]] = {}
    if old_ids:
        marks = ", ".join("?" * len(old_ids))
        olds = {old_id: (name_sid, signature_sid) for old_id, name_sid, signature_sid in trace.sql(
            f"SELECT id, name_sid, signature_sid FROM compiles WHERE id IN ({marks})", tuple(old_ids))}
    result = []
    for (compile_id, step, start_ns, dur_ns, kind, name_sid, reason, diff_sid, signature_sid, same_structure_id,
         same_site_id, frame_id, detail) in rows:
        old_id = same_structure_id or same_site_id
        old_name_sid, old_signature_sid = olds.get(old_id, (None, None)) if old_id is not None else (None, None)
        relation: Literal["structure", "call site"] | None = (
            None if old_id is None else "structure" if same_structure_id is not None else "call site")
        source = trace.frame(frame_id)
        result.append(
            CompileRow(compile_id, step, start_ns, dur_ns or 0, shown(kind) or "?", trace.string(name_sid) or "?",
                       shown(reason) or "?", trace.string(diff_sid), trace.string(signature_sid) or "", trace.string(old_signature_sid),
                       source, _decode_detail(detail), old_id, trace.string(old_name_sid), relation,
                       None if source is None or source.col is None else call_name(source, trace))
        )
    return result


def _decode_detail(detail: str | None) -> dict[str, Any] | None:
    if not detail:
        return None
    try:
        decoded = json.loads(detail)
    except ValueError:
        return {"detail": detail}
    return decoded if isinstance(decoded, dict) else {"detail": decoded}


@dataclass(frozen=True)
class CompileSite:
    """Compiles caused at one source line, or at one call on it when several calls on the line compiled."""

    source: SourceLocation | None
    count: int
    recompiles: int
    total_ns: int
    reasons: str
    call: str | None = None  # `col 15 (q @ w)`: the call on its line, for a line with several


def compile_sites(trace: Trace, rank: int) -> list[CompileSite]:
    """Compiles of `rank` per source line, most compile time first; a line where several calls compiled (`(q @ w)
    @ (w @ k)`) has a row per call instead, most time first, kept together where the line's total puts them.
    A site's time is wall time: its compiles' nested or overlapping intervals count each instant once."""
    rows = trace.sql(
        f"SELECT frame_id, COUNT(*), COALESCE(SUM({RECOMPILE}), 0), "
        "GROUP_CONCAT(DISTINCT reason) FROM compiles WHERE rank = ? GROUP BY frame_id",
        (rank,),
    )
    intervals: dict[Any, list[tuple[int, int]]] = {}
    for frame_id, start_ns, end_ns in trace.sql(
            "SELECT frame_id, start_ns, start_ns + COALESCE(dur_ns, 0) FROM compiles WHERE rank = ? ORDER BY start_ns",
            (rank,)):
        intervals.setdefault(frame_id, []).append((start_ns, end_ns))
    calls_by_line: dict[SourceLocation | None, dict[Any, list[tuple[Any, ...]]]] = {}
    for frame_id, count, recompiles, reasons in rows:
        source = trace.frame(frame_id)
        call_key = None if source is None else source.call_key
        calls_by_line.setdefault(source, {}).setdefault(call_key, []).append(
            (source, count, recompiles, intervals.get(frame_id, []), reasons))
    lines = [_line_sites(calls, trace) for calls in calls_by_line.values()]
    lines.sort(key=lambda sites: -sum(site.total_ns for site in sites))
    return [site for sites in lines for site in sites]


def _line_sites(calls: dict[Any, list[tuple[Any, ...]]], trace: Trace) -> list[CompileSite]:
    """The sites of one line: the line itself when one call on it compiled, else one per call."""
    if len(calls) == 1:
        return [_compile_site([row for rows in calls.values() for row in rows], None)]
    sites = [_compile_site(rows, call_name(rows[0][0], trace)) for rows in calls.values()]
    return sorted(sites, key=lambda site: -site.total_ns)


def _compile_site(rows: list[tuple[Any, ...]], call: str | None) -> CompileSite:
    """One site from its (source, count, recompiles, intervals, reasons) rows; `call` names its call on the line."""
    reasons = {reason for row in rows for reason in (row[4] or "").split(",")}
    wall_ns = merged_ns(sorted(interval for row in rows for interval in row[3]))
    return CompileSite(rows[0][0], sum(row[1] for row in rows), sum(row[2] for row in rows), wall_ns,
                       ", ".join(sorted(reasons)), call)

