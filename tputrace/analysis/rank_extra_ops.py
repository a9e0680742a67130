"""The op calls one rank makes in its steps beyond what every other rank makes: work of its own that a trace records
without the lines it ran at (a torch.profiler capture without `with_stack` gives its ops no frames), told apart from
a rank that runs the same ops as the others, only slower (less of a shared host's cores)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.analysis.findings import Evidence, Finding
from tputrace.analysis.straggler_finding import LateRank, straggler_finding
from tputrace.wording import format_ns

if TYPE_CHECKING:
    from tputrace.analysis.context import AnalysisContext
    from tputrace.store.reader import Trace


@dataclass(frozen=True)
class ExtraOps:
    """An op a rank calls more often a step than any other rank: its name, the calls beyond the others' a step, and
    the time those calls took a step (its mean call's time)."""

    op: str
    calls_per_step: float
    ns_per_step: float


def extra_ops(trace: Trace, rank: int, others: list[int]) -> list[ExtraOps]:
    """The ops `rank` calls more often a step than every rank of `others`, in the steps from 1 to before the last step
    any of them recorded, most time first (none where a rank has no such steps)."""
    members = (rank, *others)
    last_steps = dict(trace.sql("SELECT rank, MAX(step) FROM steps WHERE source != 'end' GROUP BY rank"))
    if any(member not in last_steps for member in members):
        return []
    last = min(last_steps[member] for member in members)
    step_counts = dict(trace.sql(
        "SELECT rank, COUNT(DISTINCT step) FROM steps WHERE step >= 1 AND step < ? AND source != 'end' GROUP BY rank",
        (last,)))
    if any(not step_counts.get(member) for member in members):
        return []
    calls: dict[str, dict[int, tuple[float, float]]] = {}
    for op_rank, op, count, total in trace.sql(
            "SELECT o.rank, s.text, COUNT(*), COALESCE(SUM(o.dur_ns), 0) FROM ops o JOIN strings s ON s.id = o.op_sid "
            "WHERE o.step >= 1 AND o.step < ? GROUP BY o.rank, o.op_sid", (last,)):
        if op_rank in members:
            calls.setdefault(op, {})[op_rank] = (count / step_counts[op_rank], total / step_counts[op_rank])
    found = []
    for op, by_rank in calls.items():
        count, total = by_rank.get(rank, (0.0, 0.0))
        beyond = count - max(by_rank.get(other, (0.0, 0.0))[0] for other in others)
        if beyond >= 1:
            found.append(ExtraOps(op, beyond, total * beyond / count))
    return sorted(found, key=lambda item: -item.ns_per_step)


def own_ops_finding(context: AnalysisContext, late: LateRank, own_ops: list[ExtraOps]) -> Finding:
    """The straggler finding of a rank late because it runs ops the others do not, or more of them, in its steps."""
    straggler = late.rank
    named = ", ".join(f"{item.op} ×{item.calls_per_step:.3g}" for item in own_ops[:3])
    extra_ns = sum(item.ns_per_step for item in own_ops)
    placed = bool(context.trace.sql("SELECT 1 FROM ops WHERE rank = ? AND frame_id IS NOT NULL LIMIT 1", (straggler,)))
    return straggler_finding(
        context, late, last_in_most=False,
        title=f"Straggler: rank {straggler} makes op calls the other ranks do not ({named} a step); they wait {format_ns(late.waited_ns)} for it",
        explanation=(
            f"was last in {late.last_in:.0%} of the steps, and in each step it made more op calls than any other rank, "
            f"which took {format_ns(extra_ns)} a step, so every collective after them waits for it"
            + (" (at lines the other ranks run too, fewer times)." if placed else
               " (the capture gives the ops no source lines; a torch.profiler capture with `with_stack=True` places them).")
        ),
        suggestion=(
            f"Find where rank {straggler} calls {own_ops[0].op} when the others do not (rank-dependent work: an evaluation, "
            "logging or extra preprocessing on one rank, or a larger shard), and take it out of the steps or spread it over "
            "every rank."
        ),
        evidence=tuple(Evidence(f"rank {straggler}: {item.op}, {item.calls_per_step:.3g} more call(s) a step than any other "
                                f"rank, {format_ns(item.ns_per_step)} a step", table="ops") for item in own_ops[:5]),
    )


def extra_compiles(trace: Trace, rank: int, others: list[int]) -> tuple[int, list[tuple[str, int, int]]]:
    """The time `rank` spent recompiling in its steps (from step 1) beyond the most any rank of `others` spent, and its
    recompiles there (name, step, ns), longest first: a rank compiling again where the others do not (its last batch
    smaller than theirs) keeps them waiting in the step's collectives. A first compile is not counted: ranks make theirs
    in different steps (one loads from a cache what another compiles)."""
    totals = dict(trace.sql("SELECT rank, COALESCE(SUM(dur_ns), 0) FROM compiles WHERE step >= 1 AND reason = 'recompile' "
                            "GROUP BY rank"))
    beyond = totals.get(rank, 0) - max((totals.get(other, 0) for other in others), default=0)
    if beyond <= 0:
        return 0, []
    compiles = trace.sql("SELECT s.text, c.step, COALESCE(c.dur_ns, 0) FROM compiles c LEFT JOIN strings s ON s.id = c.name_sid "
                         "WHERE c.rank = ? AND c.step >= 1 AND c.reason = 'recompile' ORDER BY c.dur_ns DESC", (rank,))
    return int(beyond), [(name or "?", step, dur) for name, step, dur in compiles]


def own_compiles_finding(context: AnalysisContext, late: LateRank, beyond_ns: int, compiles: list[tuple[str, int, int]]) -> Finding:
    """The straggler finding of a rank late because it recompiles in its steps where the others do not."""
    straggler = late.rank
    named = ", ".join(f"`{name}` in step {step}" for name, step, _ in compiles[:2])
    return straggler_finding(
        context, late, last_in_most=False,
        title=f"Straggler: rank {straggler} recompiles in its steps where the other ranks do not ({named}); they wait {format_ns(late.waited_ns)} for it",
        explanation=(
            f"spent {format_ns(beyond_ns)} more than any other rank compiling again in its steps, so the collectives after "
            "each compile wait for it: what it compiled for is in its recompiles (`tputrace report --rank "
            f"{straggler}`)."
        ),
        suggestion=(
            f"Let no rank compile alone in the loop: give rank {straggler} inputs of the sizes the other ranks compiled for "
            "(batches of one size on every rank: `drop_last=True`, or pad the last batch), or mark the size dynamic before "
            "the first call; compile a function only one rank runs before the loop (a warm-up call)."
        ),
        evidence=tuple(Evidence(f"rank {straggler}: a compile of `{name}` in step {step}, {format_ns(dur)}", table="compiles")
                       for name, step, dur in compiles[:5]),
    )


def wait_in_steps(trace: Trace, ranks: list[int], steps: set[int]) -> float:
    """The mean over `ranks` of their collectives' waits in `steps`."""
    if not ranks or not steps:
        return 0.0
    marks = ", ".join("?" * len(steps))
    totals = dict(trace.sql(f"SELECT rank, COALESCE(SUM(wait_ns), 0) FROM collectives WHERE step IN ({marks}) GROUP BY rank",
                            tuple(sorted(steps))))
    return float(sum(int(totals.get(rank, 0)) for rank in ranks)) / len(ranks)
