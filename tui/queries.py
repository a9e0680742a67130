"""What the TUI reads from a trace: pure functions of a `Trace`, each returning small dataclasses.

Every view's data comes from here, so it can be tested without Textual. Aggregation happens in
SQL (`trace.sql`); a function returns aggregated rows or one page of records, never a whole table.
Full-table aggregates over `ops` read it `NOT INDEXED`: on a million-op trace a scan is about four
times faster than walking the `op_sid` index and looking up every row.

All functions take the rank to show (views show one rank at a time; the collectives view also
compares ranks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tputrace.analysis.call_sites import call_name
from tputrace.source_digests import SourceDigest
from tputrace.store.aggregates import RECOMPILE, CompileStats, TimeSplit, compile_wall_ns, merged_ns
from tputrace.store.records import SourceLocation
from tputrace.store.sources import copy_as_run_saw, source_candidates
from tputrace.wording import printable

if TYPE_CHECKING:
    from tputrace.analysis.findings import Finding
    from tputrace.store.reader import Trace

OpGrouping = Literal["op", "op_shapes", "source", "module"]
OP_GROUPINGS: tuple[OpGrouping, ...] = ("op", "op_shapes", "source", "module")
OP_GROUPING_LABELS: dict[str, str] = {
    "op": "op",
    "op_shapes": "op + input shapes",
    "source": "source line",
    "module": "module path",
}
GroupOrder = Literal["total", "count", "mean"]
GROUP_ORDERS: tuple[GroupOrder, ...] = ("total", "count", "mean")
MAX_GROUPS = 50_000
"""At most this many aggregated rows are fetched for one grouping (a pathological trace could have more)."""

TIMELINE_LANE_TABLES: tuple[tuple[str, str], ...] = (
    ("dispatch", "ops"),
    ("compile", "compiles"),
    ("syncs", "syncs"),
    ("transfers", "transfers"),
    ("fallbacks", "fallbacks"),
    ("collectives", "collectives"),
)
"""Host lanes of the timeline: (lane name, table). Chip lanes come from `executions`."""


def _rank_clause(rank: int | None, column: str = "rank") -> tuple[str, tuple[Any, ...]]:
    if rank is None:
        return "1", ()
    return f"{column} = ?", (rank,)


def like_pattern(text: str) -> str:
    """A case-insensitive `LIKE ... ESCAPE '\\'` pattern that matches `text` anywhere, literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# -- run facts and overview -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFacts:
    """What the Overview shows at the top: the run and the file."""

    path: str
    size_bytes: int
    created: str | None
    ranks: tuple[int, ...]
    rank: int
    script: str | None
    argv: tuple[str, ...]
    cwd: str | None
    host: str | None
    platform: str | None
    eager_mode: str | None
    chips: int | None
    world_size: int | None
    versions: str
    wall_ns: int
    finished: bool
    exit_status: int | None
    error: str | None
    counts: dict[str, int]


def default_rank(trace: Trace) -> int:
    """The rank the TUI shows first: 0, or the lowest recorded rank."""
    ranks = trace.ranks
    return 0 if 0 in ranks else ranks[0]


def run_facts(trace: Trace, rank: int) -> RunFacts:
    """The run of `rank` and the trace file's facts (cheap: no scan of the event tables)."""
    run = next((candidate for candidate in trace.runs if candidate.rank == rank), trace.run)
    try:
        size_bytes = os.path.getsize(trace.path)
    except OSError:
        size_bytes = 0
    versions = ", ".join(
        f"{name} {version}"
        for name, version in (("torch", run.torch_version), ("jax", run.jax_version), ("tputrace", run.tputrace_version))
        if version
    )
    return RunFacts(
        path=str(trace.path),
        size_bytes=size_bytes,
        created=trace.created,
        ranks=tuple(trace.ranks),
        rank=rank,
        script=run.script,
        argv=tuple(run.argv),
        cwd=run.cwd,
        host=run.host,
        platform=run.platform,
        eager_mode=run.eager_mode,
        chips=run.chips,
        world_size=run.world_size,
        versions=versions,
        wall_ns=trace.wall_ns(rank=rank),
        finished=run.finished,
        exit_status=run.exit_status,
        error=run.error,
        counts=trace.counts(),
    )


@dataclass(frozen=True)
class StepRow:
    """One training step: its time and the compiles and syncs in it."""

    step: int
    start_ns: int
    end_ns: int | None
    compiles: int
    compile_ns: int
    syncs: int
    sync_ns: int
    source: str | None = None  # optimizer, explicit, or end (the work after the last optimizer step)

    @property
    def dur_ns(self) -> int:
        return 0 if self.end_ns is None else self.end_ns - self.start_ns

    @property
    def in_loop(self) -> bool:
        """Whether this is one of the loop's steps, not the trailing `end` step."""
        return self.source != "end"


def step_rows(trace: Trace, rank: int) -> list[StepRow]:
    """Every step of `rank` with a start time, in order, with compile and sync counts (small tables only: no op scan)."""
    per_step: dict[str, dict[int, tuple[int, int]]] = {}
    for table in ("compiles", "syncs"):
        per_step[table] = {
            step: (count, total)
            for step, count, total in trace.sql(
                f"SELECT step, COUNT(*), COALESCE(SUM(dur_ns), 0) FROM {table} WHERE rank = ? GROUP BY step", (rank,)
            )
        }
    compile_ns_per_step = {step: ns for (_, step), ns in compile_wall_ns(trace, rank=rank, by="step").items()}
    rows = []
    for step, start_ns, end_ns, source in trace.sql(
        # A step whose start a damaged file lost cannot be placed in time; the views leave it out.
        "SELECT step, start_ns, end_ns, source FROM steps WHERE rank = ? AND typeof(start_ns) = 'integer' ORDER BY step, start_ns",
        (rank,),
    ):
        compiles, compile_ns = per_step["compiles"].get(step, (0, 0))[0], compile_ns_per_step.get(step, 0)
        syncs, sync_ns = per_step["syncs"].get(step, (0, 0))
        rows.append(StepRow(step, start_ns, end_ns, compiles, compile_ns, syncs, sync_ns, _shown(source)))
    return rows


@dataclass(frozen=True)
class Overview:
    """Everything the Overview shows except the findings (which come from the analysis)."""

    facts: RunFacts
    steps: list[StepRow]
    split: TimeSplit
    compiles: CompileStats


def overview(trace: Trace, rank: int) -> Overview:
    return Overview(run_facts(trace, rank), step_rows(trace, rank), trace.time_split(rank=rank), trace.compile_stats(rank=rank))


# -- findings ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FindingsResult:
    """The ranked findings, or why there are none to show (`unavailable` is then a sentence)."""

    findings: tuple[Finding, ...] = ()
    unavailable: str | None = None


SEPARATE_ANALYZERS: tuple[str, ...] = ("memory",)
"""Analyzers run on a connection of their own, beside the others (`load_findings` with a reader
factory): on a million-op trace the memory analyzer's scan of every op's outputs takes about as long
as all the other analyzers together, so two connections halve the wait on two cores."""


def load_findings(trace: Trace, rank: int | None = None, *,
                  reader: Callable[[], AbstractContextManager[Trace]] | None = None) -> FindingsResult:
    """Run the analysis for `rank` (default: the first rank) if this build has it
    (`tputrace.analysis.analyze`), and rank its findings.

    With `reader` (a factory of `Trace`s on the same file, one per thread), the analyzers in
    `SEPARATE_ANALYZERS` run in a thread of their own while `trace` runs the rest: SQLite runs
    queries without holding the GIL, so the two overlap.
    """
    try:
        from tputrace.analysis import ANALYZERS, analyze  # type: ignore[attr-defined]
    except ImportError:
        return FindingsResult(unavailable="diagnoses unavailable: this build of tputrace has no analysis (tputrace.analysis.analyze)")
    from tputrace.analysis.findings import rank as rank_findings

    separate = {name: analyzer for name, analyzer in ANALYZERS.items() if name in SEPARATE_ANALYZERS} if reader else {}
    rest = {name: analyzer for name, analyzer in ANALYZERS.items() if name not in separate}

    def run_separately(open_reader: Callable[[], AbstractContextManager[Trace]]) -> list[Finding]:
        with open_reader() as own_trace:
            return list(analyze(own_trace, rank=rank, analyzers=separate).findings)

    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tputrace-analysis") as pool:
            separate_findings = pool.submit(run_separately, reader) if separate and reader else None
            report = analyze(trace, rank=rank, analyzers=rest)
            findings = list(getattr(report, "findings", report))
            if separate_findings is not None:
                findings.extend(separate_findings.result())
    except Exception as error:  # the analysis is another layer: a failure there must not take the UI down
        return FindingsResult(unavailable=f"diagnoses unavailable: the analysis failed ({type(error).__name__}: {error})")
    try:
        ranked = rank_findings(findings)
    except (TypeError, KeyError, AttributeError):
        ranked = findings
    return FindingsResult(findings=tuple(ranked))


def finding_location(finding: Finding) -> tuple[str, int] | None:
    """The source line a finding points at: its own, or its first piece of evidence with one."""
    if finding.file and finding.line:
        return finding.file, finding.line
    for evidence in finding.evidence:
        if evidence.file and evidence.line:
            return evidence.file, evidence.line
    return None


# -- ops --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpGroup:
    """Ops with one key (op, op and shapes, source line or module): count, time and share."""

    key: tuple[Any, ...]
    label: str
    count: int
    total_ns: int
    mean_ns: float
    share: float
    source: SourceLocation | None = None


_GROUP_COLUMNS: dict[str, tuple[str, ...]] = {
    "op": ("op_sid",),
    "op_shapes": ("op_sid", "inputs_sid"),
    "source": ("frame_id",),
    "module": ("module_sid",),
}


def _text_filter(group_by: OpGrouping, text: str) -> tuple[str, tuple[Any, ...]]:
    """SQL matching ops whose group label contains `text` (case-insensitive, literal)."""
    pattern = like_pattern(text)
    matching_strings = "SELECT id FROM strings WHERE text LIKE ? ESCAPE '\\'"
    if group_by == "op":
        return f"op_sid IN ({matching_strings})", (pattern,)
    if group_by == "op_shapes":
        return f"(op_sid IN ({matching_strings}) OR inputs_sid IN ({matching_strings}))", (pattern, pattern)
    if group_by == "module":
        return f"module_sid IN ({matching_strings})", (pattern,)
    return (
        "frame_id IN (SELECT frames.id FROM frames JOIN strings AS file ON file.id = frames.file_sid "
        "JOIN strings AS function ON function.id = frames.function_sid "
        "WHERE file.text LIKE ? ESCAPE '\\' OR function.text LIKE ? ESCAPE '\\' "
        "OR (file.text || ':' || frames.line) LIKE ? ESCAPE '\\')",
        (pattern, pattern, pattern),
    )


def ops_total_ns(trace: Trace, rank: int) -> int:
    """The time of all ops of `rank` (what an op group's share is a share of)."""
    where, params = _rank_clause(rank)
    return trace.sql(f"SELECT COALESCE(SUM(dur_ns), 0) FROM ops NOT INDEXED WHERE {where}", params)[0][0]


def op_groups(trace: Trace, group_by: OpGrouping, rank: int, text: str = "", *, all_ns: int | None = None) -> list[OpGroup]:
    """Ops of `rank` grouped by `group_by` (optionally only groups whose label contains `text`), biggest total first.

    `share` is of all ops' time on the rank (`all_ns`; computed when not given), filter or not.
    """
    if group_by not in _GROUP_COLUMNS:
        raise ValueError(f"unknown op grouping {group_by!r}")
    columns = ", ".join(_GROUP_COLUMNS[group_by])
    where, params = _rank_clause(rank)
    if text:
        if all_ns is None:
            all_ns = ops_total_ns(trace, rank)
        match_sql, match_params = _text_filter(group_by, text)
        where, params = f"{where} AND {match_sql}", params + match_params
    rows = trace.sql(
        f"SELECT {columns}, COUNT(*), COALESCE(SUM(dur_ns), 0) AS total_ns FROM ops NOT INDEXED WHERE {where} "
        f"GROUP BY {columns} ORDER BY total_ns DESC LIMIT {MAX_GROUPS}",
        params,
    )
    if all_ns is None:  # unfiltered and uncapped groups add up to all ops: no second scan
        all_ns = sum(row[-1] for row in rows) if len(rows) < MAX_GROUPS else ops_total_ns(trace, rank)
    groups = []
    for row in rows:
        key, (count, total_ns) = tuple(row[:-2]), row[-2:]
        source = None
        if group_by == "op":
            label = trace.string(key[0]) or "?"
        elif group_by == "op_shapes":
            label = f"{trace.string(key[0]) or '?'}({trace.string(key[1]) or ''})"
        elif group_by == "module":
            label = trace.string(key[0]) or "(no module)"
        else:
            source = trace.frame(key[0])
            label = str(source) if source else "(no source)"
        groups.append(OpGroup(key, label, count, total_ns, total_ns / count if count else 0.0, total_ns / all_ns if all_ns else 0.0, source))
    return groups


def filter_groups(groups: Sequence[OpGroup], text: str) -> list[OpGroup] | None:
    """The groups whose label contains `text` (case-insensitive, literal), from groups already
    aggregated: no scan of the ops. None when `groups` were capped at `MAX_GROUPS` (groups past the
    cap could match: `op_groups(..., text)` filters in SQL then)."""
    if len(groups) >= MAX_GROUPS:
        return None
    wanted = text.casefold()
    return [group for group in groups if wanted in group.label.casefold()]


def sort_groups(groups: Sequence[OpGroup], order: GroupOrder) -> list[OpGroup]:
    """`groups` biggest first by total time, count or mean time (ties: label)."""
    if order == "count":
        return sorted(groups, key=lambda group: (-group.count, group.label))
    if order == "mean":
        return sorted(groups, key=lambda group: (-group.mean_ns, group.label))
    return sorted(groups, key=lambda group: (-group.total_ns, group.label))


@dataclass(frozen=True)
class OpInstance:
    """One dispatched op."""

    seq: int
    step: int
    chip: int
    start_ns: int
    dur_ns: int
    op: str
    inputs: str
    outputs: str
    source: SourceLocation | None
    module: str | None
    flush_id: int | None


def op_instances(
    trace: Trace, group_by: OpGrouping, key: tuple[Any, ...], rank: int, *, offset: int = 0, limit: int = 200
) -> list[OpInstance]:
    """One page of the ops in a group, longest first."""
    conditions = " AND ".join(f"{column} IS ?" for column in _GROUP_COLUMNS[group_by])
    rows = trace.sql(
        "SELECT seq, step, chip, start_ns, dur_ns, op_sid, inputs_sid, outputs_sid, frame_id, module_sid, flush_id "
        f"FROM ops WHERE rank = ? AND {conditions} ORDER BY dur_ns DESC, seq LIMIT ? OFFSET ?",
        (rank, *key, int(limit), int(offset)),
    )
    return [
        OpInstance(seq, step, chip, start_ns, dur_ns or 0, trace.string(op_sid) or "?", trace.string(inputs_sid) or "",
                   trace.string(outputs_sid) or "", trace.frame(frame_id), trace.string(module_sid), flush_id)
        for seq, step, chip, start_ns, dur_ns, op_sid, inputs_sid, outputs_sid, frame_id, module_sid, flush_id in rows
    ]


# -- compiles ---------------------------------------------------------------------------------------


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


def _shown(value: Any) -> str | None:
    """A TEXT column read here in SQL, as the reader gives its own (`Trace.records`): control characters
    written as escapes, so that a trace's escape sequences cannot act on the terminal; a damaged file's
    number as its digits."""
    if value is None:
        return None
    return printable(value) if isinstance(value, str) else str(value)


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
            CompileRow(compile_id, step, start_ns, dur_ns or 0, _shown(kind) or "?", trace.string(name_sid) or "?",
                       _shown(reason) or "?", trace.string(diff_sid), trace.string(signature_sid) or "", trace.string(old_signature_sid),
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


# -- flushes and fusions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TriggerStat:
    """Flushes with one trigger."""

    trigger: str
    count: int
    total_ns: int
    ops: int
    cache_hits: int


def flush_triggers(trace: Trace, rank: int) -> list[TriggerStat]:
    rows = trace.sql(
        "SELECT trigger, COUNT(*), COALESCE(SUM(dur_ns), 0) AS total_ns, COALESCE(SUM(n_ops), 0), "
        "COALESCE(SUM(cache_hit), 0) FROM flushes WHERE rank = ? GROUP BY trigger ORDER BY total_ns DESC",
        (rank,),
    )
    return [TriggerStat(_shown(trigger) or "?", count, total_ns, ops, hits) for trigger, count, total_ns, ops, hits in rows]


FlushOrder = Literal["time", "duration"]


@dataclass(frozen=True)
class FlushRow:
    """One DeferAndFuse flush."""

    id: int
    step: int
    start_ns: int
    dur_ns: int
    trigger: str
    n_ops: int
    cache_hit: bool
    input_bytes: int
    output_bytes: int
    program_id: int | None
    program: str | None
    source: SourceLocation | None


def flush_rows(trace: Trace, rank: int, *, order: FlushOrder = "time", offset: int = 0, limit: int = 500) -> list[FlushRow]:
    """One page of the flushes of `rank`, in time order or longest first."""
    order_sql = "f.start_ns, f.id" if order == "time" else "f.dur_ns DESC, f.id"
    rows = trace.sql(
        "SELECT f.id, f.step, f.start_ns, f.dur_ns, f.trigger, f.n_ops, f.cache_hit, f.input_bytes, f.output_bytes, "
        "f.program_id, p.name_sid, f.frame_id FROM flushes AS f LEFT JOIN programs AS p ON p.id = f.program_id "
        f"WHERE f.rank = ? ORDER BY {order_sql} LIMIT ? OFFSET ?",
        (rank, int(limit), int(offset)),
    )
    return [
        FlushRow(flush_id, step, start_ns, dur_ns or 0, _shown(trigger) or "?", n_ops or 0, bool(cache_hit), in_bytes or 0,
                 out_bytes or 0, program_id, trace.string(name_sid), trace.frame(frame_id))
        for flush_id, step, start_ns, dur_ns, trigger, n_ops, cache_hit, in_bytes, out_bytes, program_id, name_sid, frame_id in rows
    ]


@dataclass(frozen=True)
class FusionRow:
    """One of XLA's fusions in a program."""

    name: str
    kind: str
    hlo_ops: str
    aten_ops: str


@dataclass(frozen=True)
class FlushContents:
    """What one flush ran: its ops (first `limit`, in dispatch order) and its program's XLA fusions."""

    flush_id: int
    ops: list[tuple[int, str, str, SourceLocation | None]]
    more_ops: int
    fusions: list[FusionRow]


def flush_contents(trace: Trace, flush_id: int, program_id: int | None, rank: int, *, limit: int = 300) -> FlushContents:
    rows = trace.sql(
        "SELECT seq, op_sid, inputs_sid, frame_id FROM ops WHERE rank = ? AND flush_id = ? ORDER BY seq LIMIT ?",
        (rank, flush_id, int(limit) + 1),
    )
    ops = [(seq, trace.string(op_sid) or "?", trace.string(inputs_sid) or "", trace.frame(frame_id))
           for seq, op_sid, inputs_sid, frame_id in rows[:limit]]
    more = 0
    if len(rows) > limit:
        (total,) = trace.sql("SELECT COUNT(*) FROM ops WHERE rank = ? AND flush_id = ?", (rank, flush_id))[0]
        more = total - limit
    fusions = []
    if program_id is not None:
        fusions = [
            FusionRow(trace.string(name_sid) or "?", trace.string(kind_sid) or "?", trace.string(ops_sid) or "",
                      trace.string(aten_sid) or "")
            for name_sid, kind_sid, ops_sid, aten_sid in trace.sql(
                "SELECT name_sid, kind_sid, ops_sid, aten_sid FROM fusions WHERE program_id = ? ORDER BY rowid", (program_id,)
            )
        ]
    return FlushContents(flush_id, ops, more, fusions)


# -- collectives ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveGroup:
    """Collectives of one kind and message size."""

    kind: str
    bytes: int
    count: int
    total_ns: int
    wait_ns: int
    bus_bandwidth: float | None

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0


def collective_groups(trace: Trace, rank: int) -> list[CollectiveGroup]:
    """Collectives of `rank` by kind and size, most time first; bandwidth is the mean bus bandwidth."""
    rows = trace.sql(
        "SELECT kind, bytes, COUNT(*), COALESCE(SUM(dur_ns), 0) AS total_ns, COALESCE(SUM(wait_ns), 0), "
        "AVG(bus_bandwidth) FROM collectives WHERE rank = ? GROUP BY kind, bytes ORDER BY total_ns DESC",
        (rank,),
    )
    return [CollectiveGroup(_shown(kind) or "?", nbytes or 0, count, total_ns, wait_ns, bandwidth)
            for kind, nbytes, count, total_ns, wait_ns, bandwidth in rows]


@dataclass(frozen=True)
class RankCollectives:
    """One rank's collectives: how long they took and how much of that was waiting for other ranks."""

    rank: int
    count: int
    total_ns: int
    wait_ns: int
    bytes: int


def collective_ranks(trace: Trace) -> list[RankCollectives]:
    rows = trace.sql(
        "SELECT rank, COUNT(*), COALESCE(SUM(dur_ns), 0), COALESCE(SUM(wait_ns), 0), COALESCE(SUM(bytes), 0) "
        "FROM collectives GROUP BY rank ORDER BY rank"
    )
    return [RankCollectives(*row) for row in rows]


# -- timeline ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lane:
    """One row of the timeline: how busy it is in each column (0..1) and how many events it has."""

    name: str
    busy: tuple[float, ...]
    events: int


def _bucket_busy(rows: Iterable[tuple[int, int, int]], columns: int, bucket_ns: int) -> tuple[tuple[float, ...], int]:
    """Fold (bucket, busy ns clipped to the window, count) rows into per-column fractions.

    SQL puts an event's whole (clipped) time in the bucket it starts in; whatever exceeds a
    bucket's width carries into the next ones, which is exact for events that do not overlap.
    """
    busy = [0.0] * columns
    events = 0
    for bucket, busy_ns, count in rows:
        if bucket is None:
            continue
        busy[min(max(int(bucket), 0), columns - 1)] += float(busy_ns or 0)
        events += count
    carry = 0.0
    for index in range(columns):
        total = busy[index] + carry
        busy[index] = min(total, bucket_ns)
        carry = total - busy[index]
    return tuple(value / bucket_ns for value in busy), events


def timeline_lanes(trace: Trace, rank: int, start_ns: int, end_ns: int, columns: int) -> list[Lane]:
    """Host lanes (dispatch, compile, syncs, transfers, fallbacks, collectives) and one lane per chip
    (program executions) for the window [start_ns, end_ns), `columns` wide."""
    columns = max(int(columns), 1)
    span = max(int(end_ns) - int(start_ns), 1)
    bucket_ns = max(-(-span // columns), 1)
    clip = "MIN(start_ns + COALESCE(dur_ns, 0), ?) - MAX(start_ns, ?)"
    bucket = "(MAX(start_ns, ?) - ?) / ?"
    params = (start_ns, start_ns, bucket_ns, end_ns, start_ns, rank, end_ns, start_ns)
    lanes = []
    for name, table in TIMELINE_LANE_TABLES:
        hint = " NOT INDEXED" if table == "ops" else ""
        rows = trace.sql(
            f"SELECT {bucket} AS b, SUM({clip}), COUNT(*) FROM {table}{hint} WHERE rank = ? AND start_ns < ? "
            "AND start_ns + COALESCE(dur_ns, 0) >= ? GROUP BY b",
            params,
        )
        busy, events = _bucket_busy(rows, columns, bucket_ns)
        lanes.append(Lane(name, busy, events))
    chip_rows: dict[int, list[tuple[int, int, int]]] = {}
    for chip, bucket_index, busy_ns, count in trace.sql(
        f"SELECT chip, {bucket} AS b, SUM({clip}), COUNT(*) FROM executions WHERE rank = ? AND start_ns < ? "
        "AND start_ns + COALESCE(dur_ns, 0) >= ? GROUP BY chip, b",
        params,
    ):
        chip_rows.setdefault(chip, []).append((bucket_index, busy_ns, count))
    chips = [chip for (chip,) in trace.sql("SELECT DISTINCT chip FROM executions WHERE rank = ? ORDER BY chip", (rank,))]
    for chip in chips:
        busy, events = _bucket_busy(chip_rows.get(chip, []), columns, bucket_ns)
        lanes.append(Lane(f"tpu:{chip} exec", busy, events))
    return lanes


@dataclass(frozen=True)
class WindowEvent:
    """One of the longest events in a timeline window."""

    lane: str
    start_ns: int
    dur_ns: int
    label: str
    source: SourceLocation | None


def window_events(trace: Trace, rank: int, start_ns: int, end_ns: int, *, limit: int = 12) -> list[WindowEvent]:
    """The `limit` longest events overlapping the window, across the timeline's tables."""
    queries = {
        "dispatch": ("SELECT start_ns, dur_ns, op_sid, frame_id FROM ops NOT INDEXED", "string"),
        "compile": ("SELECT start_ns, dur_ns, name_sid, frame_id FROM compiles", "string"),
        "syncs": ("SELECT start_ns, dur_ns, kind, frame_id FROM syncs", "text"),
        "transfers": ("SELECT start_ns, dur_ns, direction || ' ' || bytes || ' B', frame_id FROM transfers", "text"),
        "fallbacks": ("SELECT start_ns, dur_ns, op_sid, frame_id FROM fallbacks", "string"),
        "collectives": ("SELECT start_ns, dur_ns, kind || ' ' || bytes || ' B', frame_id FROM collectives", "text"),
        "exec": ("SELECT start_ns, dur_ns, (SELECT name_sid FROM programs WHERE programs.id = program_id), NULL FROM executions", "string"),
    }
    events = []
    for lane, (select, label_kind) in queries.items():
        for event_start, dur_ns, label, frame_id in trace.sql(
            f"{select} WHERE rank = ? AND start_ns < ? AND start_ns + COALESCE(dur_ns, 0) >= ? "
            "ORDER BY dur_ns DESC LIMIT ?",
            (rank, end_ns, start_ns, int(limit)),
        ):
            text = trace.string(label) if label_kind == "string" else _shown(label)
            events.append(WindowEvent(lane, event_start, dur_ns or 0, str(text) if text is not None else "?", trace.frame(frame_id)))
    events.sort(key=lambda event: (-event.dur_ns, event.start_ns))
    return events[:limit]


# -- source -----------------------------------------------------------------------------------------


@dataclass
class LineStat:
    """What happened at one source line: time attributed to it and counts per kind."""

    time_ns: int = 0
    ops: int = 0
    compiles: int = 0
    syncs: int = 0
    fallbacks: int = 0
    transfers: int = 0
    collectives: int = 0


@dataclass
class FileStat:
    """A user file in the trace with its per-line stats."""

    file: str
    lines: dict[int, LineStat] = field(default_factory=dict)

    @property
    def time_ns(self) -> int:
        return sum(stat.time_ns for stat in self.lines.values())

    @property
    def ops(self) -> int:
        return sum(stat.ops for stat in self.lines.values())


_LINE_TABLES = ("ops", "compiles", "syncs", "fallbacks", "transfers", "collectives")


def source_stats(trace: Trace, rank: int, ops_by_source: Sequence[OpGroup] | None = None) -> list[FileStat]:
    """Every file in the trace with per-line time and counts for `rank`; most time first.

    `ops_by_source`: the ops already grouped by source line (`op_groups(trace, "source", rank)`,
    uncapped), so that the ops, by far the biggest table, are not scanned again.
    """
    tables = _LINE_TABLES if ops_by_source is None else tuple(table for table in _LINE_TABLES if table != "ops")
    parts = []
    for table in tables:
        hint = " NOT INDEXED" if table == "ops" else ""
        parts.append(
            f"SELECT frame_id, '{table}', COUNT(*), COALESCE(SUM(dur_ns), 0) FROM {table}{hint} "
            "WHERE rank = ? AND frame_id IS NOT NULL GROUP BY frame_id"
        )
    rows: list[tuple[Any, ...]] = list(trace.sql(" UNION ALL ".join(parts), (rank,) * len(parts)))
    if ops_by_source is not None:
        rows += [(group.key[0], "ops", group.count, group.total_ns) for group in ops_by_source if group.key[0] is not None]
    files: dict[str, FileStat] = {}
    for frame_id, table, count, total_ns in rows:
        location = trace.frame(frame_id)
        if location is None:
            continue
        file_stat = files.setdefault(location.file, FileStat(location.file))
        line = file_stat.lines.setdefault(location.line, LineStat())
        line.time_ns += total_ns
        setattr(line, table, getattr(line, table) + count)
    for location_file in _all_frame_files(trace):
        files.setdefault(location_file, FileStat(location_file))
    return sorted(files.values(), key=lambda file_stat: (-file_stat.time_ns, file_stat.file))


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
