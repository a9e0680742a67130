"""Asynchronous collectives whose result a rank did not wait for: a call made with `async_op=True` (or any user call
whose Work, future or functional result the code holds) that was never waited on, or was first waited on only after
the step it was issued in had ended; and calls whose output tensor the code read before waiting on them
(`collectives.read_early_frame_id`: the line of the first op, copy or print that read it in between).

The recording keeps, for each of the user's own calls (no recorded cause: DDP's and FSDP's calls are waited on by
their libraries), how long after the call its first wait came (`collectives.waited_after_ns`, NULL when none came).
Until the wait, the result is not defined: on a TPU (as with NCCL) the tensor may still hold its old value, or change
under the ops that read it. On the virtual chips of one host the transport is fast and the result usually lands
before it is read, so the run's values seldom show it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.wording import plural

NAME = "collectives"


@dataclass(frozen=True)
class UnwaitedLine:
    """A line's user collectives of one kind on the rank: how many, how many never waited, how many waited late."""

    kind: str
    frame_id: int | None
    calls: int
    never: int
    late: int


@dataclass(frozen=True)
class EarlyRead:
    """A line that read the output of a user collective of one kind and line before the call's first wait."""

    kind: str
    frame_id: int | None  # the call's line
    read_frame_id: int  # the reading line
    reads: int
    calls: int


def early_read_findings(context: AnalysisContext) -> list[Finding]:
    """One finding per reading line and call line: the tensor was read before the call that writes it was waited on."""
    trace = context.trace
    if trace.meta.get("imported") or not all(trace.has_column("collectives", column) for column in ("read_early_frame_id", "cause_id")):
        return []
    rows = trace.sql(
        "SELECT kind, frame_id, read_early_frame_id, COUNT(*) FROM collectives WHERE rank = ? AND cause_id IS NULL "
        "AND read_early_frame_id IS NOT NULL GROUP BY kind, frame_id, read_early_frame_id ORDER BY read_early_frame_id, frame_id",
        (context.rank,))
    calls = dict(((kind, frame_id), count) for kind, frame_id, count in trace.sql(
        "SELECT kind, frame_id, COUNT(*) FROM collectives WHERE rank = ? AND cause_id IS NULL GROUP BY kind, frame_id", (context.rank,)))
    return [_early_finding(context, EarlyRead(kind, frame_id, read_frame_id, reads, calls.get((kind, frame_id), reads)))
            for kind, frame_id, read_frame_id, reads in rows]


def _early_finding(context: AnalysisContext, read: EarlyRead) -> Finding:
    at, where = context.where(read.read_frame_id), context.where(read.frame_id)
    share = "every call" if read.reads == read.calls else f"{read.reads} of {plural(read.calls, 'call')}"
    return Finding(
        analyzer=NAME,
        severity="warning",
        title=f"{at} reads the result of the {read.kind} at {where} before waiting on it (rank {context.rank}, {share})",
        explanation=(
            f"Rank {context.rank} issued the {read.kind} at {where} asynchronously and, before the first wait on its Work, "
            f"{at} read a tensor the call writes ({share}). Until the wait, the output is not defined: on a TPU the read may "
            "see the tensor's old value or a partly reduced one, and each rank a different one. On the virtual chips of one "
            "host the transport usually finishes first, so this run's values may not show it."
        ),
        suggestion=(
            f"Call `wait()` on the {read.kind}'s Work before {at} (or move that read after the wait): keep only the compute "
            "that does not touch the call's tensors between the call and the wait. Without such compute, drop `async_op=True`."
        ),
        cost_total_ns=0.0,
        evidence=(context.evidence_at(f"{read.kind} issued here: {plural(read.calls, 'call')}", read.frame_id, table="collectives"),
                  context.evidence_at(f"read before the wait: {share}", read.read_frame_id, table="collectives")),
        **context.location_fields(read.read_frame_id),
    )


def unwaited_findings(context: AnalysisContext) -> list[Finding]:
    """One finding per line and kind whose calls' results the rank did not wait for within their step."""
    trace = context.trace
    run = context.rank_run
    if (trace.meta.get("imported") or not all(trace.has_column("collectives", column) for column in ("waited_after_ns", "cause_id"))
            or (run is not None and (run.error or run.exit_status))):  # a failed call's row has no wait either
        return []
    return [_finding(context, line) for line in unwaited_lines(context)]


def unwaited_lines(context: AnalysisContext) -> list[UnwaitedLine]:
    """The rank's lines whose user calls were never waited on, or waited on after their step had ended (steps only:
    without them a loop's iteration is not known)."""
    step_end = "s.end_ns" if context.steps else "NULL"
    rows = context.trace.sql(
        "SELECT c.kind, c.frame_id, COUNT(*), SUM(c.waited_after_ns IS NULL), "
        f"COALESCE(SUM(c.waited_after_ns IS NOT NULL AND c.start_ns + c.waited_after_ns > {step_end}), 0) "
        "FROM collectives c LEFT JOIN steps s ON s.rank = c.rank AND s.step = c.step AND s.source != 'end' "
        "WHERE c.rank = ? AND c.cause_id IS NULL GROUP BY c.kind, c.frame_id ORDER BY c.frame_id, c.kind",
        (context.rank,))
    return [UnwaitedLine(kind, frame_id, calls, never, late) for kind, frame_id, calls, never, late in rows if never or late]


def _finding(context: AnalysisContext, line: UnwaitedLine) -> Finding:
    where = context.where(line.frame_id)
    if line.never and not line.late:
        how = "never waited on" if line.never == line.calls else f"never waited on in {line.never} of {plural(line.calls, 'call')}"
    else:
        how = (f"not waited on before its step ended in {line.never + line.late} of {plural(line.calls, 'call')}"
               + (f" ({line.never} never waited on)" if line.never else ""))
    return Finding(
        analyzer=NAME,
        # never waited: nothing orders the reads after it; waited a step later: safe only if nothing read it before
        severity="warning" if line.never else "info",
        title=f"{line.kind} at {where} is {how} (rank {context.rank}): its result may be read before it arrives",
        explanation=(
            f"Rank {context.rank} issued {plural(line.calls, line.kind + ' call')} at {where}"
            + (f"; {line.never} {'was' if line.never == 1 else 'were'} never waited on (the Work that `async_op=True` "
               "returns was dropped or never waited)" if line.never else "")
            + (f"; {line.late} {'was' if line.late == 1 else 'were'} first waited on only after the step {'it was' if line.late == 1 else 'they were'} "
               "issued in had ended" if line.late else "")
            + ". Until its Work's `wait()`, an asynchronous collective's output tensor is not defined: on a TPU the ops "
            "that read it may see its old value or a partly written one, and each rank may see a different one. "
            "On the virtual chips of one host the transport usually finishes first, so this run's values may not show it."
            + (" A wait in a later step is safe only where no op of the steps between reads the tensor." if line.late else "")
        ),
        suggestion=(
            "Keep the handle (`work = dist.all_reduce(t, async_op=True)`) and call `work.wait()` before the first op "
            "that reads the tensor, and within the step; put the compute that does not need the result between the "
            "call and the wait to overlap them. Without such compute, drop `async_op=True` and let the call wait."
        ),
        cost_total_ns=0.0,
        evidence=(context.evidence_at(
            f"{line.kind}: {plural(line.calls, 'call')}, {line.never} never waited, {line.late} waited after their step",
            line.frame_id, table="collectives"),),
        **context.location_fields(line.frame_id),
    )
