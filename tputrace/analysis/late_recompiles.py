"""The last, smaller batch compiled again: a loop over a dataset that the batch size does not divide ends with a
smaller batch, and every program that batch reaches compiles again for it, once, in the loop's last step; on a
short run that one recompile can take a large share of it (seconds against a step of milliseconds).

The storms of the `recompiles` family need a site compiled again and again, so a single recompile goes unnamed. This
names the last step of a loop of three steps or more when a recompile's diff there says dim 0 of an input shrank
(`arg 1 dim 0: 32 -> 5`, Dynamo's `size mismatch at index 0. expected 32, actual 5`) and the step's recompiles took at
least a median step and `MIN_WALL_SHARE` of the run; in a run of several epochs, the steady step that compiled the
smaller batch's programs when later steps ran them again from the program cache (each epoch's last batch). Left out: a step in which another finding names a recompile (a
storm whose last size it was, a failed size guard), or that compiled a program for the first time (new work, such as
an evaluation pass, whose other programs compile again for its inputs: one-time set-up, not a problem), and
recompiles of programs that ran other ops (structure changes). A new size in an earlier step is left to the storms: a
bucketed pipeline compiles each bucket once, by design.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tputrace.analysis import guard_recompiles
from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.analysis.imported import context_import_facts, jax_capture
from tputrace.analysis.set_up_work import LOCATION
from tputrace.analysis.storms import NAME
from tputrace.store.aggregates import merged_ns
from tputrace.wording import format_ns, plural

MIN_WALL_SHARE = 0.05  # of the run's wall: a large share, not one a long run would not notice
_SIZE_CHANGE = re.compile(r"dim (?P<dim>\d+): (?P<before>\d+) -> (?P<after>\d+)|index (?P<index>\d+)\. expected "
                          r"(?P<expected>\d+), actual (?P<actual>\d+)")
_STRUCTURE = "structure change"


@dataclass(frozen=True)
class LateRecompile:
    """The last step's recompiles for its smaller batch: the step, where the batch entered, their count and time
    (each instant once), the step's time against the median step's, and the batch's rows before and in it."""

    step: int
    where: str
    recompiles: int
    compile_ns: int
    step_ns: int
    median_step_ns: int
    before: int
    after: int
    ran_again: tuple[int, ...] = ()  # later steps that ran its programs from the cache (each later epoch's end)


@dataclass(frozen=True)
class _Row:
    compile_id: int
    step: int
    kind: str
    name: str
    diff: str
    start_ns: int
    dur_ns: int
    frame_id: int | None
    program_id: int | None = None


def findings(context: AnalysisContext, explained: set[int], not_evicted: str,
             evicted: list[int]) -> list[tuple[Finding, LateRecompile, set[int]]]:
    """The finding of the step whose batch was smaller, when the recompiles that caused, which no other finding
    explains, took a large share of the run; with its data and the compiles it explains. The step is the loop's last,
    else an earlier steady step whose smaller programs ran again, from the program cache, in a later step: the last
    batch of each epoch, compiled in the first epoch's end."""
    first_steady, loop = context.first_steady_after_warm_up, context.loop_range
    median = context.median_step_ns
    if first_steady is None or loop is None or not median:
        return []
    rows = [_Row(*row) for row in context.trace.sql(
        "SELECT c.id, c.step, c.kind, COALESCE(n.text, '?'), COALESCE(d.text, ''), c.start_ns, COALESCE(c.dur_ns, 0), "
        "c.frame_id, c.program_id FROM compiles c LEFT JOIN strings n ON n.id = c.name_sid "
        "LEFT JOIN strings d ON d.id = c.diff_sid "
        f"WHERE c.rank = ? AND c.reason IN ('recompile', 'guard_failure') AND c.step BETWEEN ? AND ? AND {not_evicted} "
        "ORDER BY c.start_ns",
        (context.rank, first_steady, loop[1], *evicted))]
    storming = _guard_storms(context)
    new_work = _new_work_steps(context, first_steady, loop[1])
    for step in sorted({row.step for row in rows if row.step not in new_work}, key=lambda step: step != loop[1]):
        step_rows = [row for row in rows if row.step == step]
        if any(row.compile_id in explained or (row.kind == "dynamo_frame" and (row.frame_id, row.name) in storming)
               for row in step_rows):
            continue  # another finding names the step's recompiles, and so the change (a storm's last size)
        step_rows = [row for row in step_rows if not row.diff.startswith(_STRUCTURE)]  # other ops, not other inputs
        again = () if step == loop[1] else _ran_again(context, step_rows, step)
        if step != loop[1] and not again:
            continue
        dim, before, after = _size_change(step_rows)
        # The compiles' time, an instant they overlap once (a graph's XLA compile inside Dynamo's).
        compile_ns = merged_ns(sorted((row.start_ns, row.start_ns + row.dur_ns) for row in step_rows))
        if (not (dim == 0 and 0 < after < before) or compile_ns < median
                or context.share_of_wall(compile_ns) < MIN_WALL_SHARE):
            continue
        step_ns = next((record.dur_ns or 0 for record in context.loop_steps if record.step == step), 0)
        frame_id = _entered_at(context, step_rows)
        late = LateRecompile(step, context.where(frame_id), len(step_rows), compile_ns, step_ns, int(median), before,
                             after, again)
        return [(_finding(context, late, step_rows, frame_id), late, {row.compile_id for row in step_rows})]
    return []


def _ran_again(context: AnalysisContext, rows: list[_Row], step: int) -> tuple[int, ...]:
    """The later steps that ran a program `rows` compiled, from the program cache (each epoch's last batch)."""
    programs = sorted({row.program_id for row in rows if row.program_id is not None})
    if not programs or not context.trace.has_table("executions"):
        return ()
    return tuple(int(later) for (later,) in context.trace.sql(
        f"SELECT DISTINCT step FROM executions WHERE rank = ? AND step > ? AND program_id IN "
        f"({', '.join('?' for _ in programs)}) ORDER BY step", (context.rank, step, *programs)))


def last_batch_compiles(context: AnalysisContext, not_evicted: str, evicted: list[int]) -> set[int]:
    """The recompiles of the loop's last step when they are its only recompiles after warm-up (but for those of steps
    that ran new work) and one says dim 0 of an input shrank (a remainder batch): the storms leave them out, since per-op programs of other layers' shapes
    compiled in the warm-up step would otherwise read as sizes of one storm (strict mode)."""
    first_steady, loop = context.first_steady_after_warm_up, context.loop_range
    if first_steady is None or loop is None:
        return set()
    rows = [_Row(*row) for row in context.trace.sql(
        "SELECT c.id, c.step, c.kind, COALESCE(n.text, '?'), COALESCE(d.text, ''), c.start_ns, COALESCE(c.dur_ns, 0), "
        "c.frame_id FROM compiles c LEFT JOIN strings n ON n.id = c.name_sid LEFT JOIN strings d ON d.id = c.diff_sid "
        f"WHERE c.rank = ? AND c.reason IN ('recompile', 'guard_failure') AND c.step BETWEEN ? AND ? AND {not_evicted}",
        (context.rank, first_steady, loop[1], *evicted))]
    new_work = _new_work_steps(context, first_steady, loop[1])
    if loop[1] in new_work or any(row.step != loop[1] for row in rows if row.step not in new_work):
        return set()
    dim, before, after = _size_change(rows)
    return {row.compile_id for row in rows} if dim == 0 and 0 < after < before else set()


def _new_work_steps(context: AnalysisContext, first: int, last: int) -> set[int]:
    """The steps from `first` to `last` that compiled a program for the first time: work the loop had not run before
    (an evaluation pass on held-out data, a checkpoint), whose recompiles are part of that one-time work."""
    return {step for (step,) in context.trace.sql(
        "SELECT DISTINCT step FROM compiles WHERE rank = ? AND reason = 'first' AND step BETWEEN ? AND ?",
        (context.rank, first, last))}


def _entered_at(context: AnalysisContext, rows: list[_Row]) -> int | None:
    """Where the batch entered: the line the step's first recompile's diff names (the op that first took it,
    `op 0 aten.addmm.default (train.py:8): arg 1 dim 0: 32 -> 5`), else where that first recompile was compiled."""
    first = min(rows, key=lambda row: row.start_ns)
    named = LOCATION.search(first.diff)
    frame_id = context.frame_at_line(named["file"], int(named["line"])) if named is not None else None
    return frame_id if frame_id is not None else first.frame_id


def _guard_storms(context: AnalysisContext) -> set[tuple[int | None, str]]:
    """The compiled functions `guard_recompiles` names: Dynamo recompiled them again and again."""
    return {(frame_id, name or "?") for frame_id, name, count in context.trace.sql(
        "SELECT c.frame_id, n.text, COUNT(*) FROM compiles c LEFT JOIN strings n ON n.id = c.name_sid "
        "WHERE c.rank = ? AND c.kind = 'dynamo_frame' AND c.reason = 'recompile' AND c.signature_sid IS NULL "
        "GROUP BY c.frame_id, c.name_sid", (context.rank,)) if count >= guard_recompiles.MIN_RECOMPILES}


def _size_change(rows: list[_Row]) -> tuple[int, int, int]:
    """The size the recompiles' diffs most often say changed, (dim, before, after), a change of dim 0 first (each diff
    compares with the program's latest compile, which for a few programs may be another pass's, such as an
    evaluation's); (0, 0, 0) where none did."""
    changes: Counter[tuple[int, int, int]] = Counter()
    for row in rows:
        match = _SIZE_CHANGE.search(row.diff)
        if match is not None:
            changes[(int(match["dim"]), int(match["before"]), int(match["after"])) if match["dim"] is not None else
                    (int(match["index"]), int(match["expected"]), int(match["actual"]))] += 1
    if not changes:
        return 0, 0, 0
    return max(changes, key=lambda change: (change[0] == 0, changes[change]))


def _finding(context: AnalysisContext, late: LateRecompile, rows: list[_Row], frame_id: int | None) -> Finding:
    share = context.share_of_wall(late.compile_ns)
    names = ", ".join(sorted({row.name for row in rows})[:4])
    suggestion = ("Give every batch the size the loop compiled for: `DataLoader(..., drop_last=True)`, or pad the last "
                  "batch to the full batch size and mask the padded rows out of the loss")
    if jax_capture(context, [row.name for row in rows]):
        suggestion = ("Give every batch the size the loop compiled for: drop the remainder (`drop_remainder=True` in "
                      "tf.data's or Grain's batching, or stop a slicing loop at the last full batch), or pad the last "
                      "batch to the full batch size (`np.pad`) and mask the padded rows out of the loss")
    imported = context_import_facts(context) is not None
    if imported and any(row.kind == "dynamo_frame" for row in rows):
        suggestion += (", or mark the batch dim dynamic before the first call (`torch._dynamo.mark_dynamic(x, 0)`), so "
                       "that one graph serves every batch size")
    elif not imported:
        suggestion += " (the tpu backend compiles one program per size, so marking the dim dynamic does not save it)"
    return Finding(
        analyzer=NAME,
        # Paid once a run: its share of a short traced run says more than of a long one's, so it is never critical.
        severity="warning",
        title=(f"The last batch{' of an epoch' if late.ran_again else ''}, smaller ({late.after} rows, not "
               f"{late.before}), compiled again in step {late.step}: {format_ns(late.compile_ns)}, {share:.0%} of the run"),
        explanation=(
            f"Step {late.step}, {_which_step(late)}, took {format_ns(late.step_ns)} against a median step of "
            f"{format_ns(late.median_step_ns)}: its batch had {late.after} rows where the steps before had {late.before} "
            f"(a dataset the batch size does not divide), so {plural(late.recompiles, 'program')} the loop had compiled "
            f"already ({names}) compiled again for it ({rows[0].diff}). It is paid once a run (or an epoch, where the "
            "compiled programs are not kept), for the few samples of one batch."),
        suggestion=suggestion + ".",
        cost_total_ns=float(late.compile_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(context.evidence_at(f"{row.name} ({row.kind}) in step {row.step}, {format_ns(row.dur_ns)}: "
                                           f"{row.diff or 'no diff recorded'}", row.frame_id, table="compiles")
                       for row in sorted(rows, key=lambda row: -row.dur_ns)[:6]),
        **context.location_fields(frame_id),
    )


def _which_step(late: LateRecompile) -> str:
    """The step's place: the loop's last, or an epoch's end whose programs later epochs' ends ran again."""
    if not late.ran_again:
        return "the loop's last"
    steps = ", ".join(str(step) for step in late.ran_again[:4]) + (", ..." if len(late.ran_again) > 4 else "")
    return (f"the end of the first epoch (the programs compiled for it ran again, from the program cache, in "
            f"{'step' if len(late.ran_again) == 1 else 'steps'} {steps}, each later epoch's last batch)")
