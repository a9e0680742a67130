"""Stragglers among the ranks of a run: which rank the others wait for in its collectives, and what it does
meanwhile that they do not (work at lines only it runs, recompiles, extra op calls, host time no record
covers). On virtual chips sharing one host's cores a late rank cannot be told from the host's scheduling unless
it spends the time outside anything recorded, and the finding says so.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Evidence, Finding
from tputrace.analysis.host_gaps import line_of_extra_host_time
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.rank_extra_ops import (extra_compiles, extra_ops, own_compiles_finding, own_ops_finding,
                                              wait_in_steps)
from tputrace.analysis.straggler_finding import LateRank, straggler_finding
from tputrace.store.aggregates import merged_ns
from tputrace.store.records import SourceLocation
from tputrace.wording import format_ns, plural

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

NAME = "collectives"  # the analyzer whose findings these are
STRAGGLER_WAIT_SHARE = 0.2
STRAGGLER_OWN_WAIT_SHARE = 0.5  # of the others' mean wait: a late rank waits clearly less than the ranks waiting for it


@dataclass(frozen=True)
class RankWait:
    """A rank's time in collectives and the part of it spent waiting for the last rank, calls in flight (or waiting)
    together counted once, so neither exceeds the rank's wall time."""

    rank: int
    wait_ns: int
    dur_ns: int


@dataclass(frozen=True)
class Straggler:
    """The rank that arrived last: in what share of the steps, whether the ranks shared one host's cores,
    and how much more of its time than the others' no recorded activity covers (its own host work)."""

    rank: int
    late_share_of_steps: float
    shared_host: bool
    unrecorded_excess_ns: int



def has_causes(trace: Trace) -> bool:
    """Whether the trace records why collectives happened (format 2 and later)."""
    return trace.has_table("collective_causes") and trace.count("collective_causes") > 0


def shared_host(trace: Trace) -> bool:
    """Ranks that are virtual chips of one host: their processes share its CPU cores."""
    runs = [run for run in trace.runs if run.rank in trace.distributed_ranks]
    return len(runs) > 1 and len({run.host for run in runs}) == 1 and all(run.platform == "cpu" for run in runs)


def _late_rank_by_step(trace: Trace) -> dict[int, int]:
    """Per step, the rank that waited least in its collectives (the last to arrive)."""
    late: dict[int, int] = {}
    best: dict[int, int] = {}
    for step, rank, wait in trace.sql("SELECT step, rank, SUM(wait_ns) FROM collectives WHERE wait_ns IS NOT NULL GROUP BY step, rank"):
        if step not in best or wait < best[step]:
            best[step], late[step] = wait, rank
    return late


# Every table whose rows are time a rank spent doing something tputrace sees.
_ACTIVITY_TABLES = ("ops", "executions", "flushes", "compiles", "syncs", "transfers", "fallbacks", "collectives")


def _unrecorded_by_rank(trace: Trace, ranks: list[int], *, unmarked: bool = False) -> dict[int, int]:
    """Per rank, the time inside its steps (after the first) covered by no recorded activity; with `unmarked`, of a
    rank without steps (an import's capture that marks none), inside the span of its collectives."""
    unrecorded: dict[int, int] = {}
    for rank in ranks:
        steps = trace.sql("SELECT start_ns, end_ns FROM steps WHERE rank = ? AND step >= 1 AND source != 'end' ORDER BY start_ns", (rank,))
        if not steps and unmarked:
            steps = [span for span in trace.sql("SELECT MIN(start_ns), MAX(start_ns + COALESCE(dur_ns, 0)) FROM collectives "
                                                "WHERE rank = ?", (rank,)) if span[0] is not None]
        if not steps:
            continue
        first, last = steps[0][0], steps[-1][1]
        intervals: list[tuple[int, int]] = []
        for table in _ACTIVITY_TABLES:
            if trace.has_table(table):
                intervals.extend((start, start + (dur or 0)) for start, dur in trace.sql(
                    f"SELECT start_ns, dur_ns FROM {table} WHERE rank = ? AND start_ns BETWEEN ? AND ?", (rank, first, last)))
        covered = merged_ns(sorted(intervals))
        unrecorded[rank] = max(sum(end - start for start, end in steps) - covered, 0)
    return unrecorded


def stragglers(context: AnalysisContext) -> tuple[tuple[RankWait, ...], Straggler | None, Finding | None]:
    """Every rank's waiting, the rank that arrived last, and a finding when the other ranks wait long for it."""
    trace = context.trace
    per_rank = _in_flight_by_rank(trace)
    wait_by_rank = tuple(RankWait(rank, wait, dur) for rank, wait, dur in per_rank)
    if len(per_rank) < 2:
        return wait_by_rank, None, None
    waits = {rank: wait for rank, wait, _ in per_rank}
    durations = {rank: dur for rank, _, dur in per_rank}
    late_by_step = _late_rank_by_step(trace)
    last_share = {rank: sum(1 for late in late_by_step.values() if late == rank) / len(late_by_step) for rank in waits} if late_by_step else {}
    # the rank last in most steps that runs ops no other rank runs is the straggler, whatever a few long waits of a
    # shared host's scheduling add to the totals; else the rank that waited least
    mostly_last = max(last_share, key=lambda rank: last_share[rank]) if last_share else None
    extra = (lines_only_on(trace, mostly_last, [rank for rank in waits if rank != mostly_last])
             if mostly_last is not None and last_share[mostly_last] >= 0.5 else [])
    straggler = mostly_last if extra and mostly_last is not None else min(waits, key=lambda rank: waits[rank])
    others = [rank for rank in waits if rank != straggler]
    waited = statistics.mean(waits[rank] for rank in others)
    share = waited / statistics.mean(durations[rank] for rank in others) if others else 0.0
    if share < STRAGGLER_WAIT_SHARE:
        return wait_by_rank, None, None
    consistent = last_share.get(straggler, 0.0)
    imported = context_import_facts(context) is not None
    # An import's ranks share a host only where their captures name the same one (a recording's ranks name theirs).
    hosts = {run.host for run in trace.runs if run.rank in waits}
    on_shared_host = shared_host(trace) and (not imported or "" not in hosts and None not in hosts)
    idle = _unrecorded_by_rank(trace, list(waits), unmarked=imported)
    excess_idle = int(idle.get(straggler, 0) - statistics.mean(idle.get(rank, 0) for rank in others)) if others else 0
    # A rank late because of its own host work (data loading, logging, a sleep) spends that time outside anything
    # recorded; a rank late because it got less of a shared host's cores is slower in what is recorded.
    own_work = excess_idle >= 0.5 * waited
    late = Straggler(straggler, consistent, on_shared_host, excess_idle)
    evidence = tuple(Evidence(f"rank {rank} waited {format_ns(waits[rank])}", table="collectives") for rank in sorted(waits))
    late_rank = LateRank(NAME, straggler, waited, share, consistent, evidence)
    own_lines = {other: lines_only_on(trace, other, [rank for rank in waits if rank != other]) for other in others} if extra else {}
    if extra and all(own_lines.values()):
        # every rank runs lines of its own (pipeline stages, a role per rank): not one rank's extra work
        return wait_by_rank, late, _own_roles(context, {straggler: extra, **own_lines}, waited, share, evidence)
    if not extra and waits[straggler] > STRAGGLER_OWN_WAIT_SHARE * waited:
        # the rank that waited least, with no work of its own, waited about as long as the others: the ranks took
        # turns arriving last, none is the late one
        return wait_by_rank, None, None
    if extra:
        # the late rank runs ops at lines the others never run (an evaluation or a log on one rank): recorded work of its
        # own, which the trace can tell from the host's scheduling
        where = ", ".join(location.short for location, _ in extra[:3])
        return wait_by_rank, late, straggler_finding(
            context, late_rank, last_in_most=False,
            title=f"Straggler: rank {straggler} runs work the other ranks do not, at {where}; they wait {format_ns(waited)} for it",
            explanation=(
                f"was last in {consistent:.0%} of the steps, and in the steps it ran ops at {plural(len(extra), 'line')} that no "
                f"other rank ran, so every collective after them waits for it."
            ),
            suggestion=(
                f"Take the rank-dependent work at {where} out of the steps (run it every N steps, or after the loop), or spread it over "
                f"every rank; a value only rank {straggler} reports can stay on the chip and be read once at the end."
            ),
            evidence=tuple(Evidence(f"rank {straggler} only: {plural(calls, 'op call')} in the steps", file=location.file, line=location.line,
                                    table="ops") for location, calls in extra[:5]),
            file=extra[0][0].file,
            line=extra[0][0].line,
        )
    # a recompile makes its rank late in its step only: the others' waits in that step, not how many steps the rank is
    # last in, tie the two
    beyond_ns, compiled = (0, []) if extra else extra_compiles(trace, straggler, others)
    if beyond_ns >= 0.5 * waited and wait_in_steps(trace, others, {step for _, step, _ in compiled}) >= 0.5 * waited:
        return wait_by_rank, late, own_compiles_finding(context, late_rank, beyond_ns, compiled)
    own_ops = [] if extra or consistent < 0.5 else extra_ops(trace, straggler, others)
    if own_ops and sum(item.ns_per_step for item in own_ops) >= 0.5 * (context.per_step(waited) or 0.0):
        return wait_by_rank, late, own_ops_finding(context, late_rank, own_ops)
    if on_shared_host and not own_work:
        # Virtual chips of one host take turns on its cores: who arrives last is the host's scheduling as much as the
        # program's, and nothing in the trace tells the two apart; the wait is not counted as the program's cost.
        return wait_by_rank, late, Finding(
            analyzer=NAME,
            severity="info",
            title=(f"Ranks wait {format_ns(waited)} for each other; on "
                   + ("one host's shared CPU cores" if imported else "virtual chips sharing one host") + " this cannot be told from skew"),
            explanation=(
                f"Ranks other than {straggler} spent {share:.0%} of their collective time waiting for the last rank. All ranks ran "
                + (f"on one host ({next(iter(hosts))}), " if imported else "as virtual chips on one host, ")
                + f"sharing its CPU cores, so the waits include the host's scheduling of the ranks' processes; "
                f"rank {straggler} was last in {consistent:.0%} of the steps."
            ),
            suggestion=("Judge skew on a capture whose ranks have cores of their own (a host each, or fewer ranks than the "
                        "host has cores)." if imported else
                        "Judge skew on real chips (one process per chip), or run with fewer ranks than the host has cores."),
            cost_total_ns=0.0,
            cost_per_step_ns=context.per_step(0.0),
            evidence=evidence,
        )
    before = line_of_extra_host_time(trace, straggler, others) if own_work and consistent >= 0.5 else None
    if before is not None and before[1] >= 0.5 * waited:
        # its host work outside anything recorded sits before one line: the gap before the first record of that line
        where, extra_ns = before[0].short, before[1]
        return wait_by_rank, late, straggler_finding(
            context, late_rank,
            title=f"Straggler: rank {straggler} spends {format_ns(extra_ns)} more than the others on the host before {where}; they wait {format_ns(waited)}",
            explanation=(
                f"was last in {consistent:.0%} of the steps, and before {where} it spent {format_ns(extra_ns)} more than the "
                "other ranks on average in host work the trace does not record (Python, NumPy or a library between two recorded "
                "calls), so every collective after it waits for it."
            ),
            suggestion=(
                f"Look at what runs on the host before {where} on rank {straggler} (loading or preprocessing its batch, a Python loop, a "
                "sleep): give every rank the same work (shards of equal size and kind), move it off the step (a DataLoader with "
                "workers, data prepared ahead), or run it on the chip."
            ),
            evidence=(Evidence(f"rank {straggler}: {format_ns(extra_ns)} more host time before this line", file=before[0].file,
                               line=before[0].line, table="ops"),),
            file=before[0].file,
            line=before[0].line,
        )
    return wait_by_rank, late, straggler_finding(
        context, late_rank,
        title=f"Straggler: rank {straggler} arrives last; other ranks wait {format_ns(waited)} on average",
        explanation=(
            (f"waited least, was last in {consistent:.0%} of the steps, and spent {format_ns(excess_idle)} more "
             "than the others outside anything the trace records (host work of its own)"
             + (", so it is the late one." if consistent >= 0.5 else ": the late rank changes from step to step, which points at noise more than at one rank's work.")
             if context.steps else
             "waited least, so it is the late one (the capture marks no steps, so the time each rank "
             "spent outside what it records is not measured).")
        ),
        suggestion=(
            f"Look at what rank {straggler} does before its collectives (uneven data loading, extra logging or "
            "evaluation on that rank, uneven shards)."
        ),
    )


def _own_roles(context: AnalysisContext, lines: dict[int, list[tuple[SourceLocation, int]]], waited: float, share: float,
               waits: tuple[Evidence, ...]) -> Finding:
    """Ranks that each run lines no other rank runs (a pipeline's stages, a role per rank) and wait for each other."""
    tops = {rank: own[0][0] for rank, own in sorted(lines.items())}
    named = ", ".join(f"rank {rank} at {location.short}" for rank, location in tops.items())
    first = tops[min(tops)]
    return Finding(
        analyzer=NAME,
        severity="warning" if context.share_of_wall(waited) >= 0.05 else "info",
        title=f"Ranks run different work ({named}) and wait {format_ns(waited)} for each other",
        explanation=(
            f"Each rank runs ops at lines no other rank runs, in at least half its steps (pipeline stages, or a role per rank), and "
            f"the ranks spent {share:.0%} of their collective time waiting for the last one: each waits while another computes "
            "work it does not share."
        ),
        suggestion=(
            "Balance the work between the ranks (about as many FLOPs per stage), and overlap it: split the batch into more "
            "micro-batches and send with isend/irecv, so that a stage computes the next micro-batch while its neighbour works on "
            "this one (a GPipe or 1F1B schedule, as `torch.distributed.pipelining` runs)."
        ),
        cost_total_ns=float(waited),
        cost_per_step_ns=context.per_step(waited),
        evidence=tuple(Evidence(f"rank {rank} only: {plural(calls, 'op call')} in the steps", file=location.file, line=location.line, table="ops")
                       for rank, own in sorted(lines.items()) for location, calls in own[:2]) + waits,
        file=first.file,
        line=first.line,
    )


def lines_only_on(trace: Trace, rank: int, others: list[int]) -> list[tuple[SourceLocation, int]]:
    """The lines at which `rank` ran ops in at least half its steps after the first, and no other rank ran any, with
    the op calls there, most first; only the steps every rank recorded whole count (before the last step any rank
    recorded: a rank killed early keeps fewer, its last one in part)."""
    by_line: dict[SourceLocation, dict[int, tuple[int, int]]] = defaultdict(dict)
    last_steps = dict(trace.sql("SELECT rank, MAX(step) FROM ops GROUP BY rank"))
    if any(member not in last_steps for member in (rank, *others)):
        return []
    last = min(last_steps[member] for member in (rank, *others))
    for op_rank, frame_id, calls, steps in trace.sql(
            "SELECT rank, frame_id, COUNT(*), COUNT(DISTINCT step) FROM ops WHERE step >= 1 AND step < ? AND frame_id IS NOT NULL "
            "GROUP BY rank, frame_id", (last,)):
        location = trace.frame(frame_id)
        if location is not None:
            before = by_line[location].get(op_rank, (0, 0))
            by_line[location][op_rank] = (before[0] + calls, max(before[1], steps))
    (step_count,) = trace.sql("SELECT COUNT(DISTINCT step) FROM steps WHERE rank = ? AND step >= 1 AND step < ? AND source != 'end'",
                              (rank, last))[0]
    lines = [(location, ranks[rank][0]) for location, ranks in by_line.items()
             if rank in ranks and ranks[rank][1] * 2 >= max(step_count, 1) and not any(other in ranks for other in others)]
    return sorted(lines, key=lambda item: -item[1])


def _in_flight_by_rank(trace: Trace) -> list[tuple[int, int, int]]:
    """Per rank: the time any of its calls waited for the last arrival (from its own, `start_ns`, for `wait_ns`) and the
    time any was in flight: asynchronous calls waited for together overlap, and their sums would pass the wall time."""
    waits: dict[int, list[tuple[int, int]]] = {}
    spans: dict[int, list[tuple[int, int]]] = {}
    for rank, start, wait, dur in trace.sql("SELECT rank, start_ns, COALESCE(wait_ns, 0), COALESCE(dur_ns, 0) FROM collectives "
                                            "ORDER BY rank, start_ns"):
        waits.setdefault(rank, []).append((start, start + wait))
        spans.setdefault(rank, []).append((start, start + dur))
    return [(rank, merged_ns(waits[rank]), merged_ns(spans[rank])) for rank in sorted(spans)]
