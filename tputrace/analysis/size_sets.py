"""Sizes that settle: a program compiled once for each of a few sizes early in the loop, then run from the program
cache in every later step that needs it (multi-task heads of a few widths, images of a few sizes, a sampler that
buckets sequences). That is what bucketing gives: the compiles are a one-time cost, not a storm that a longer run
keeps paying. A storm whose sizes keep being new keeps compiling to the end and is left to the storm findings.

Sizes are a set only when the site takes them in turn: where every later step that ran the programs ran all of them,
the sizes are several tensors of one step (`loss.backward()` adding the gradients of a teacher's weights of several
shapes into their `.grad`), a fixed part of every step that compiled once: no finding.
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext, in_list
from tputrace.analysis.findings import MEASURED_ON_HOST, Finding
from tputrace.analysis.storms import NAME, Storm
from tputrace.wording import format_ns, plural

MIN_REUSING_STEPS = 3  # later steps that ran the programs without compiling, at least (and as many as compiled)
# The most sizes a settled set may have: more sizes than a bucketing's few are compiles that buckets would save.
MAX_SETTLED_SIZES = 4
MAX_LISTED_PROGRAMS = 4


@dataclass(frozen=True)
class SizeSet:
    """Programs compiled once per size of a fixed set in the loop's first steps, then reused: where the shape
    enters, the programs, the sizes, the compiles and their time beyond each program's first, the steps that
    compiled and the later steps that ran the programs from the program cache."""

    where: str
    programs: tuple[str, ...]
    sizes: tuple[int, ...]
    compiles: int
    recompile_ns: int
    compiling_steps: tuple[int, ...]
    reusing_steps: int

    @property
    def recompiles(self) -> int:
        """The compiles after each program's first."""
        return self.compiles - len(self.programs)


def settled(context: AnalysisContext, storm: Storm) -> bool:
    """Whether a storm's sizes are a few (`MAX_SETTLED_SIZES` at most) that settled: each input signature compiled
    once, and after the last compile at least `MIN_REUSING_STEPS` loop steps (and as many as compiled) ran its
    programs without compiling."""
    if not context.steps or len({row.signature for row in storm.rows}) != storm.count or storm.count > MAX_SETTLED_SIZES:
        return False
    compiling = storm.steps
    return reusing_steps(context, storm, compiling[-1]) >= max(MIN_REUSING_STEPS, len(compiling))


def reusing_steps(context: AnalysisContext, storm: Storm, after: int) -> int:
    """The loop steps after `after` that ran one of the storm's programs: executions, else ops the programs computed
    (strict mode)."""
    program_ids = sorted(set(storm.program_ids))
    if not program_ids:
        return 0
    loop = {step.step for step in context.loop_steps}
    steps: set[int] = set()
    for table in ("executions", "ops"):
        steps = {int(step) for (step,) in context.trace.sql(
            f"SELECT DISTINCT step FROM {table} WHERE rank = ? AND program_id IN {in_list(program_ids)} AND step > ?",
            (context.rank, *program_ids, after),
        ) if step is not None}
        if steps:
            break
    return len(steps & loop)


def taken_in_turn(context: AnalysisContext, storm: Storm) -> bool:
    """Whether the site took its sizes in turn: some loop step after its last compile ran some of its programs but not
    all. Steps that each ran every program took all the sizes at once (several tensors of one step)."""
    program_ids = sorted(set(storm.program_ids))
    if len(program_ids) < 2:
        return True
    loop = {step.step for step in context.loop_steps}
    for table in ("executions", "ops"):
        ran: dict[int, set[int]] = {}
        for step, program_id in context.trace.sql(
            f"SELECT DISTINCT step, program_id FROM {table} WHERE rank = ? AND program_id IN {in_list(program_ids)} "
            "AND step > ?", (context.rank, *program_ids, storm.steps[-1]),
        ):
            if step is not None and int(step) in loop:
                ran.setdefault(int(step), set()).add(int(program_id))
        if ran:
            return any(len(programs) < len(program_ids) for programs in ran.values())
    return True


def findings(context: AnalysisContext, storms: list[Storm]) -> list[tuple[Finding, SizeSet, set[int]]]:
    """One info finding per set of sizes (the settled storms that compiled in the same steps are one size's
    programs), with its data and the compiles it explains; sizes that one step takes all at once are no set."""
    by_steps: dict[tuple[int, ...], list[Storm]] = {}
    for storm in storms:
        if not taken_in_turn(context, storm):
            continue
        by_steps.setdefault(tuple(storm.steps), []).append(storm)
    return [_finding(context, sorted(group, key=lambda storm: -storm.recompile_ns)) for group in by_steps.values()]


def _finding(context: AnalysisContext, storms: list[Storm]) -> tuple[Finding, SizeSet, set[int]]:
    lead = storms[0]
    entry = lead.entry
    anchor = entry.frame_id if entry is not None and entry.frame_id is not None else lead.frame_id
    where = context.where(anchor)
    sizes = tuple(lead.main.distinct)
    compiling = tuple(lead.steps)
    reused = min(reusing_steps(context, storm, compiling[-1]) for storm in storms)
    compiles = sum(storm.count for storm in storms)
    recompile_ns = sum(storm.recompile_ns for storm in storms)
    names = [storm.name for storm in storms]
    programs = names[0] if len(names) == 1 else f"{len(names)} programs"
    listed = ", ".join(f"{storm.name} at {storm.site}" for storm in storms[:MAX_LISTED_PROGRAMS]) + (
        f" and {len(storms) - MAX_LISTED_PROGRAMS} more" if len(storms) > MAX_LISTED_PROGRAMS else "")
    size_text = ", ".join(str(size) for size in sizes)
    steps_text = f"{plural(len(compiling), 'step')} of {context.step_count}, the last step {compiling[-1]}"
    finding = Finding(
        analyzer=NAME,
        severity="info",
        title=(f"{len(sizes)} sizes compiled once each: {programs} at {where} took sizes {size_text}, then ran from "
               f"the program cache"),
        explanation=(
            f"The shape entering at {where} took a fixed set of {len(sizes)} sizes ({lead.main.label}: {size_text}"
            + (f"; it enters as {entry.describe(context)}" if entry is not None else "")
            + f"). Each size was compiled once ({listed}; {plural(compiles, 'compile')} in {steps_text}), and the "
            f"{plural(reused, 'later step')} ran the compiled programs from the program cache without compiling. "
            f"This is what bucketing gives: a one-time compile cost of {format_ns(recompile_ns)} beyond the first "
            f"size's ({context.share_of_wall(recompile_ns):.0%} of this run), which a longer run does not pay again, "
            "not a cost per step."
        ),
        suggestion=(
            "Nothing to change in the loop: each size compiles once. Where start-up time matters, a persistent compile "
            "cache (`tputrace run --compile-cache`, or the backend's own cache) loads these programs in later runs "
            "instead of compiling them."
        ),
        cost_total_ns=float(recompile_ns),
        cost_per_step_ns=None,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(
            context.evidence_at(
                f"{storm.name}: {plural(storm.count, 'compile')} for {storm.main.label} = "
                f"{', '.join(str(size) for size in storm.main.distinct)}, in steps "
                f"{', '.join(str(step) for step in storm.steps)}", storm.frame_id, table="compiles")
            for storm in storms[:MAX_LISTED_PROGRAMS]
        ),
        module=entry.module if entry is not None else None,
        **context.location_fields(anchor),
    )
    explained = {compile_id for storm in storms for compile_id in storm.compile_ids}
    return finding, SizeSet(where, tuple(names), sizes, compiles, recompile_ns, compiling, reused), explained
