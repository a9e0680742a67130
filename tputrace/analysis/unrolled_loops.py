"""A loop run unrolled into one program: a run without steps (or the part of a run after its training loop's last
step) whose loop reads nothing until it ends.

With no step marks and no read inside the loop (a sampling loop that keeps its tokens on the chip), DeferAndFuse
records every iteration into one graph, flushed when the result is read after the loop: one program whose size and
compile time grow with the loop's length, compiled again for another length. A program is such a loop's when lines of
the function that read its result ran, per module, a multiple of `MIN_ITERATIONS` or more times in it, and those
lines make at least `MIN_LOOPED_SHARE` of its ops (a model's layers in a loop run in other modules, once each; a time
loop inside a module's `forward` is in another function than the read). The finding belongs to `fusion`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding
from tputrace.wording import format_ns

ANALYZER = "fusion"
MIN_ITERATIONS = 8
MIN_LOOPED_SHARE = 0.5
MIN_PROGRAM_OPS = 4 * MIN_ITERATIONS


@dataclass(frozen=True)
class UnrolledLoop:
    """One program that ran a loop unrolled: its iterations, the loop's lines, its ops and compile time."""

    iterations: int
    lines: tuple[int, ...]
    ops: int
    compile_ns: int
    flushed_at: str


def findings(context: AnalysisContext) -> list[Finding]:
    # With steps, only what ran after the loop's last step (a sampling loop after training) marks no steps.
    after_loop = context.end_step
    if context.steps and after_loop is None:
        return []
    in_steps, params = ("", ()) if after_loop is None else (" AND step = ?", (after_loop,))
    found = []
    for flush_id, program_id, frame_id, n_ops in context.trace.sql(
        f"SELECT id, program_id, frame_id, n_ops FROM flushes WHERE rank = ? AND cache_hit = 0 AND n_ops >= ?{in_steps}",
        (context.rank, MIN_PROGRAM_OPS, *params),
    ):
        loop = _unrolled(context, flush_id, program_id, frame_id, n_ops)
        if loop is not None:
            found.append(_finding(context, frame_id, loop))
    return found


def _unrolled(context: AnalysisContext, flush_id: int, program_id: int | None, frame_id: int | None,
              n_ops: int) -> UnrolledLoop | None:
    read_at = context.location(frame_id)
    if read_at is None:
        return None
    counts: Counter[tuple[int, int | None]] = Counter()  # (line of the reading function, module) -> its ops
    for op_frame, module_sid, count in context.trace.sql(
        "SELECT frame_id, module_sid, COUNT(*) FROM ops WHERE rank = ? AND flush_id = ? GROUP BY frame_id, module_sid",
        (context.rank, flush_id),
    ):
        location = context.location(op_frame)
        if location is not None and location.file == read_at.file and location.function == read_at.function:
            counts[(location.line, module_sid)] += count
    repeated = {key: count for key, count in counts.items() if count >= MIN_ITERATIONS}
    for iterations in sorted(set(repeated.values())):
        looped = {key: count for key, count in repeated.items() if count % iterations == 0}
        if sum(looped.values()) >= MIN_LOOPED_SHARE * n_ops:
            (compile_ns,) = context.trace.sql(
                "SELECT COALESCE(SUM(dur_ns), 0) FROM compiles WHERE rank = ? AND program_id IS ?", (context.rank, program_id),
            )[0]
            lines = tuple(sorted({line for line, _ in looped}))
            return UnrolledLoop(iterations, lines, n_ops, int(compile_ns), context.where(frame_id))
    return None


def _finding(context: AnalysisContext, frame_id: int | None, loop: UnrolledLoop) -> Finding:
    location = context.location(frame_id)
    name = location.file.rsplit("/", 1)[-1] if location else "?"
    first, last = loop.lines[0], loop.lines[-1]
    span = f"{name}:{first}" if first == last else f"{name}:{first}-{last}"
    saved_ns = loop.compile_ns * (1 - 1 / loop.iterations)
    share = context.share_of_wall(saved_ns)
    last_frame = context.frame_at_line(location.file, last) if location else None
    return Finding(
        analyzer=ANALYZER,
        severity=context.severity(share),
        title=(f"A loop ran unrolled: {loop.iterations} iterations of {span} fused into one program of {loop.ops} ops, "
               f"read at {loop.flushed_at}"),
        explanation=(
            ("The run marks no steps" if context.end_step is None else "The loop runs after the training loop's last "
             "step, where no steps are marked,") + f" and reads nothing, so DeferAndFuse recorded every iteration of {span} "
            f"({loop.iterations} times each) into one graph, flushed when {loop.flushed_at} read the result: one "
            f"program of {loop.ops} ops, compiled for {format_ns(loop.compile_ns)} ({context.share_of_wall(loop.compile_ns):.0%} "
            "of the run). Its size and compile time grow with the loop's length, and another length compiles another "
            "program; one iteration's program would compile once and run every time (estimate of the saving: the "
            "compile time less one iteration's share)."
        ),
        suggestion=(
            f"End each iteration's graph: call `tputrace.step()` at the end of the loop body (its ops run to {name}:{last}; "
            "`xm.mark_step()` under torch_xla), so one iteration is one program, compiled once and run "
            f"{loop.iterations} times. Write each iteration's result with a position kept on the chip (`index_copy_`) "
            "or into a Python list, not at the loop counter (`out[:, i] = ...`), and read per-iteration values with "
            "an index kept on the chip too (`betas[t]` with `t` a chip tensor, not a Python int), or each iteration "
            "compiles anew."
        ),
        cost_total_ns=saved_ns,
        cost_per_step_ns=None,
        evidence=(context.evidence_at(
            f"{loop.ops} ops in one program, {len(loop.lines)} lines {loop.iterations} times (or a multiple) each",
            frame_id, table="flushes"),),
        **context.location_fields(last_frame if last_frame is not None else frame_id),
    )
