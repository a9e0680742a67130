"""Strict mode's op times, split into the host's dispatch and the chip's work inside them.

Strict mode (DEFER_NEVER) records no executions: each op's time runs from its dispatch until its program's call
returns. XLA:CPU runs small programs on the calling thread, after the programs queued before them, and a full queue
makes any platform's call wait; so an op's recorded time can hold the chip's run time and waits, not dispatch (a
bf16[48] cast recorded at 65 ms behind a convolution's backward). The host's own cost of an op hardly depends on the
data, so each call counts as dispatch at most the median time of its op's calls in the steady steps (the warm-up
step left out: its first calls compile); the rest is the chip's work, which the analyzers take for the chip's busy
time in strict mode (an estimate: work that ran beside the host's dispatch is not in it).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext

CACHE_KEY = "strict_times"


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
    cached = context.cache.get(CACHE_KEY)
    if isinstance(cached, dict):
        return cached
    result: dict[int, StrictStep] = {}
    loop = context.loop_range
    if loop is not None and is_strict(context):
        rows = context.trace.sql("SELECT op_sid, step, COALESCE(dur_ns, 0) FROM ops WHERE rank = ? AND step BETWEEN ? AND ?",
                                 (context.rank, *loop))
        steady = context.steady_range or loop
        reference: dict[int, list[int]] = {}
        for op_sid, step, dur_ns in rows:
            if steady[0] <= step <= steady[1] and step != context.warm_up_in_steady:
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
