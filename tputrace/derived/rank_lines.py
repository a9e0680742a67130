"""One line per rank of a trace that holds several (a distributed run, or several captures imported together), so
that a summary shows how the ranks compare: steps and their median, how busy the devices were, and the collective
that took each rank longest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.imported_sources import imported_source
from tputrace.derived.steps import loop_step_durations, steady_median_ns
from tputrace.store.aggregates import merged_ns

if TYPE_CHECKING:
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class RankLine:
    """One rank: what names it (an import's torch.distributed rank, else its host), its wall time and loop steps,
    its compiles (how many, how many recompiled, their wall time), the time its devices ran anything (the union of its
    executions), and its collectives' time and longest kind."""

    rank: int
    label: str
    wall_ns: int
    steps: int
    median_step_ns: int | None
    compiles: int
    recompiles: int
    compile_ns: int
    busy_ns: int
    collective_ns: int
    top_collective: str | None
    top_collective_ns: int


def rank_lines(trace: Trace) -> tuple[RankLine, ...]:
    """A line per distributed rank (forked processes aside); none for a trace of one rank."""
    ranks = trace.distributed_ranks
    if len(ranks) < 2:
        return ()
    hosts = {run.rank: run.host for run in trace.runs}
    lines = []
    for rank in ranks:
        durations = loop_step_durations(trace, rank)
        busy = merged_ns(trace.sql(
            "SELECT start_ns, start_ns + COALESCE(dur_ns, 0) FROM executions WHERE rank = ? AND start_ns IS NOT NULL "
            "ORDER BY start_ns", (rank,)))
        collectives = trace.collective_stats(rank=rank)
        top_kind, top_ns = (collectives[0].kind, collectives[0].total_ns) if collectives else (None, 0)
        collective_ns = sum(stat.total_ns for stat in collectives)
        if collectives and not trace.meta.get("imported"):  # a rank's time with a call in flight: async calls overlap
            collective_ns = trace.time_split(rank=rank).collective_ns
        compiles = trace.compile_stats(rank=rank)
        lines.append(RankLine(rank, _label(trace, rank, hosts.get(rank)), trace.wall_ns(rank=rank), len(durations),
                              steady_median_ns(durations), compiles.count, compiles.recompiles, compiles.total_ns,
                              busy, collective_ns, top_kind, int(top_ns)))
    return tuple(lines)


def _label(trace: Trace, rank: int, host: str | None) -> str:
    """What names a rank beside its number: an imported capture's torch.distributed rank, else its host."""
    source = imported_source(trace, rank)
    if source is not None and source.get("distributed_rank") is not None:
        return f"distributed rank {source['distributed_rank']}"
    return host or "-"
