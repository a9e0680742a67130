"""Strict mode's op times, split into the host's dispatch and the chip's work inside them.

Strict mode (DEFER_NEVER) records no executions: each op's time runs from its dispatch until its program's call
returns. XLA:CPU runs small programs on the calling thread, after the programs queued before them, and a full queue
makes any platform's call wait; so an op's recorded time can hold the chip's run time and waits, not dispatch (a
bf16[48] cast recorded at 65 ms behind a convolution's backward). The host's own cost of an op hardly depends on the
data, so each call counts as dispatch at most the median time of its op's calls in the steady steps (the warm-up
step left out: its first calls compile); the rest, less the compiles of the ops' programs in the step (which their
calls hold), is the chip's work, which the analyzers take for the chip's busy time in strict mode (an estimate: work
that ran beside the host's dispatch is not in it). A run that switched eager modes part-way has such steps too: its
steps without executions that ran ops as programs of their own.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext

CACHE_KEY = "strict_times"
_NESTED_OPS = 8  # ops started inside an op: an op that holds a compile is among the last ones started before it


@dataclass(frozen=True)
class StrictStep:
    """One step's ops: their host dispatch, the chip's work inside their recorded time, and their count."""

    dispatch_ns: int
    chip_ns: int
    ops: int


def is_strict(context: AnalysisContext) -> bool:
    """Whether the rank ran ops and recorded no execution (strict mode)."""
    executions = context.trace.sql("SELECT 1 FROM executions WHERE rank = ? LIMIT 1", (context.rank,))
    return not executions and bool(context.trace.sql("SELECT 1 FROM ops WHERE rank = ? LIMIT 1", (context.rank,)))


def strict_steps(context: AnalysisContext) -> dict[int, StrictStep]:
    """Each of the loop's steps with ops, in a strict trace (empty otherwise, or without steps)."""
    return strict_mode_steps(context) if is_strict(context) else {}


def strict_mode_steps(context: AnalysisContext) -> dict[int, StrictStep]:
    """Each of the loop's steps in strict mode: every step with ops of a strict trace, and in a run that switched eager
    modes part-way (a DeferAndFuse warm-up, then strict steps, or the reverse) each step that recorded no execution
    and ran an op as its own program.
    A step that first compiled an op's program in strict mode after the loop's first step (the first step of a mode
    entered part-way) is no reference of an op's dispatch: its calls' recorded time holds their compiles."""
    cached = context.cache.get(CACHE_KEY)
    if isinstance(cached, dict):
        return cached
    result: dict[int, StrictStep] = {}
    loop = context.loop_range
    if loop is not None:
        trace, rank = context.trace, context.rank
        measured = {step for (step,) in trace.sql(
            "SELECT DISTINCT step FROM executions WHERE rank = ? AND step BETWEEN ? AND ?", (rank, *loop))}
        strict_run = not measured and is_strict(context)
        rows = _op_times(context, loop)
        if not strict_run:
            own_programs = {step for (step,) in trace.sql(  # a strict op: its own program, no flush
                "SELECT DISTINCT o.step FROM ops o JOIN programs p ON p.id = o.program_id AND p.rank = o.rank "
                "WHERE o.rank = ? AND o.step BETWEEN ? AND ? AND o.flush_id IS NULL AND COALESCE(p.kind, 'op') = 'op'",
                (rank, *loop))} - measured
            rows = [row for row in rows if row[1] in own_programs]
        steady = context.steady_range or loop
        compiling = set() if strict_run else first_compile_steps(context)
        reference: dict[int, list[int]] = {}
        for op_sid, step, dur_ns in rows:
            if steady[0] <= step <= steady[1] and step != context.warm_up_in_steady and step not in compiling:
                reference.setdefault(op_sid, []).append(dur_ns)
        typical = {op_sid: statistics.median(durations) for op_sid, durations in reference.items()}
        totals: dict[int, list[int]] = {}
        for op_sid, step, dur_ns in rows:
            dispatch = int(min(dur_ns, typical.get(op_sid, dur_ns)))
            total = totals.setdefault(step, [0, 0, 0])
            total[0] += dispatch
            total[1] += dur_ns - dispatch
            total[2] += 1
        result = {step: StrictStep(*total) for step, total in totals.items()}
    context.cache[CACHE_KEY] = result
    return result


def first_compile_steps(context: AnalysisContext) -> set[int]:
    """The loop's steps that first compiled an op's own program (strict mode), after the loop's first step."""
    loop = context.loop_range
    if loop is None:
        return set()
    return {step for (step,) in context.trace.sql(
        "SELECT DISTINCT step FROM compiles WHERE rank = ? AND kind = 'op' AND reason = 'first' AND step BETWEEN ? AND ?",
        (context.rank, loop[0] + 1, loop[1]))}


def _op_times(context: AnalysisContext, loop: tuple[int, int]) -> list[tuple[int, int, int]]:
    """(op, step, recorded time less the compiles inside it) of each op in the loop's steps: a strict op's call that
    compiled its program holds the compile, which is neither dispatch nor the chip's work."""
    trace, rank = context.trace, context.rank
    ops = trace.sql("SELECT op_sid, step, start_ns, COALESCE(dur_ns, 0) FROM ops WHERE rank = ? AND step BETWEEN ? AND ? "
                    "ORDER BY start_ns", (rank, *loop))
    held = [0] * len(ops)
    starts = [start_ns for _, _, start_ns, _ in ops]
    for start_ns, dur_ns in trace.sql("SELECT start_ns, COALESCE(dur_ns, 0) FROM compiles WHERE rank = ? AND kind = 'op' "
                                      "AND step BETWEEN ? AND ?", (rank, *loop)):
        last = bisect.bisect_right(starts, start_ns) - 1
        for index in range(last, max(last - _NESTED_OPS, -1), -1):  # the innermost op the compile ran inside
            if starts[index] + ops[index][3] >= start_ns + dur_ns:
                held[index] += dur_ns
                break
    return [(op_sid, step, max(dur_ns - compiled_ns, 0))
            for (op_sid, step, _, dur_ns), compiled_ns in zip(ops, held)]
