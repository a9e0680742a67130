"""What every analyzer needs besides the trace: the rank, the target chip and the run's steps.

`AnalysisContext` is built once per analysis; analyzers read the trace only through it (the reader's
SQL and aggregates) and never import torch or jax.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, TypedDict, TypeVar

from tputrace.analysis.chips import Chip
from tputrace.analysis.findings import Evidence, Severity
from tputrace.store.aggregates import OUTERMOST_COMPILE, execution_spans_sql
from tputrace.store.records import RunInfo, SourceLocation, StepRecord
from tputrace.wording import format_ns, plural

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

# Share of the step time (or of the run) at which a cost becomes a warning, and critical.
WARNING_SHARE = 0.05
CRITICAL_SHARE = 0.25
# The largest step count `per_step_text` names in "N every M steps"; rarer rates say "N in M steps".
MAX_RATE_DENOMINATOR = 12
# A finding whose estimated cost is below this is noise: a sync or copy that costs nothing measurable.
MIN_LISTED_COST_NS = 1_000


class Cost(TypedDict):
    """A finding's estimated cost: keyword arguments of `Finding`."""

    cost_total_ns: float
    cost_per_step_ns: float | None


class LocationFields(TypedDict, total=False):
    """A finding's source line: keyword arguments of `Finding` (none when the line is unknown)."""

    file: str
    line: int


@dataclass
class AnalysisContext:
    """The trace, the rank analysed, the target chip and the run's steps.

    Steps: `steps` are the rank's step records; the first is warm-up (it compiles), a trailing step
    recorded at exit (`source == "end"`) holds what ran after the loop. `steady` is the range of step
    numbers in between (every step when there are fewer than three). A run that marked no step (no
    optimizer step, no `tputrace.step()`) has no steps: its one `end` record is the whole run, not a
    step, and per-step figures would call every loop iteration's work one step's.
    """

    trace: Trace
    rank: int
    target: Chip
    target_is_default: bool
    steps: list[StepRecord] = field(default_factory=list)
    wall_ns: int = 0
    cache: dict[str, object] = field(default_factory=dict)  # results analyzers share (e.g. the run's matmuls)

    @classmethod
    def build(cls, trace: Trace, target: Chip, target_is_default: bool, rank: int | None = None) -> AnalysisContext:
        chosen = trace.run.rank if rank is None else rank
        steps = list(trace.records("steps", where="rank = ?", params=(chosen,), order_by="step"))
        if all(step.source == "end" for step in steps):
            steps = []
        return cls(trace, chosen, target, target_is_default, steps, trace.wall_ns(rank=chosen))

    @property
    def rank_run(self) -> RunInfo | None:
        """The analysed rank's run record; None where the trace has none for it (the writer died first)."""
        return next((run for run in self.trace.runs if run.rank == self.rank), None)

    # -- steps ------------------------------------------------------------------------------------

    @property
    def loop_steps(self) -> list[StepRecord]:
        """Steps of the training loop: every step but a trailing `end` step (when there are others)."""
        loop = [step for step in self.steps if step.source != "end"]
        return loop or list(self.steps)

    @property
    def step_count(self) -> int:
        return len(self.loop_steps)

    @property
    def steady_steps(self) -> list[StepRecord]:
        """Loop steps after the first (warm-up) one; all loop steps when there are fewer than three."""
        return steady(self.loop_steps)

    @property
    def warm_up_in_steady(self) -> int | None:
        """The warm-up step's number when the steady steps include it (a loop of two steps), else None. Its
        one-time work (the set-up before the loop, each op's first dispatch) belongs to no later step, so a
        judgement of what every step does leaves it out where a later step exists."""
        loop = self.loop_steps
        return loop[0].step if len(loop) >= 2 and self.steady_steps[0] is loop[0] else None

    @property
    def steady_range(self) -> tuple[int, int] | None:
        """(first, last) step number of the steady steps, or None without steps."""
        steady = self.steady_steps
        if not steady:
            return None
        return steady[0].step, steady[-1].step

    @property
    def steady_line_range(self) -> tuple[int, int] | None:
        """`steady_range` plus the trailing `end` step, as `loop_line_where` adds it: work a loop line does after the
        optimizer step (an evaluation every 4 iterations, after `optimizer.step()`) lands in the next step, and in its
        last iteration in the `end` step, where its period shows."""
        steady, tail = self.steady_range, self.end_step
        return steady if steady is None or tail is None else (steady[0], tail)

    @property
    def end_step(self) -> int | None:
        """The trailing `end` step's number, after the loop's steps (what ran after the loop, and a loop line's work
        after the last optimizer step); None without one or without loop steps before it."""
        loop = self.loop_range
        tail = self.steps[-1] if self.steps and self.steps[-1].source == "end" else None
        return tail.step if loop is not None and tail is not None and tail.step > loop[1] else None

    @property
    def first_steady_after_warm_up(self) -> int | None:
        """The first steady step of a loop of three steps or more, after which a compile is not the warm-up's; None
        in shorter runs, where every step's compiles count."""
        steady = self.steady_range
        return steady[0] if steady and self.step_count >= 3 else None

    @property
    def loop_range(self) -> tuple[int, int] | None:
        """(first, last) step number of the loop steps, or None without steps."""
        loop = self.loop_steps
        if not loop:
            return None
        return loop[0].step, loop[-1].step

    def loop_where(self, alias: str = "") -> tuple[str, tuple[int, ...]]:
        """SQL condition (and parameters) selecting rows of this rank in the loop's steps (all rows without steps)."""
        return _step_condition(self.rank, self.loop_range, alias)

    def loop_line_where(self, alias: str = "") -> tuple[str, tuple[int, ...]]:
        """`loop_where` plus the trailing `end` step, for rows grouped by source line and kept with
        `loop_line_having`: a line the loop runs after its last optimizer step (a loss printed after
        `optimizer.step()`) runs there once more, in the loop's last iteration."""
        loop = self.loop_range
        tail = self.steps[-1] if self.steps and self.steps[-1].source == "end" else None
        if loop is None or tail is None or tail.step <= loop[1]:
            return self.loop_where(alias)
        return _step_condition(self.rank, (loop[0], tail.step), alias)

    def loop_line_having(self, alias: str = "") -> str:
        """SQL HAVING condition for `loop_line_where` groups: the line also ran in the loop's steps."""
        loop = self.loop_range
        prefix = f"{alias}." if alias else ""
        return "1" if loop is None else f"MIN({prefix}step) <= {int(loop[1])}"

    @property
    def steady_count(self) -> int:
        return len(self.steady_steps)

    @property
    def median_step_ns(self) -> float | None:
        durations = [step.dur_ns for step in self.steady_steps if step.dur_ns is not None]
        return float(int(statistics.median(durations))) if durations else None  # whole ns, as every view shows it

    @property
    def steady_ns(self) -> int:
        """Total duration of the steady steps."""
        return sum(step.dur_ns or 0 for step in self.steady_steps)

    def steady_where(self, alias: str = "") -> tuple[str, tuple[int, ...]]:
        """SQL condition (and parameters) selecting rows of this rank in steady steps (`alias.` prefixes columns)."""
        return _step_condition(self.rank, self.steady_range, alias)

    def loop_cost(self, steady_ns: float, total_ns: float) -> Cost:
        """`cost_total_ns` and `cost_per_step_ns` for a cost paid every step: the steady steps' mean, times the
        loop's steps (the warm-up step's share would include compiles); the plain total without a warm-up."""
        if self.steps and self.steady_count and self.steady_count < self.step_count:
            per_step = steady_ns / self.steady_count
            return {"cost_total_ns": float(per_step * self.step_count), "cost_per_step_ns": float(per_step)}
        return {"cost_total_ns": float(total_ns), "cost_per_step_ns": self.per_step(total_ns)}

    def once_in_loop(self, loop_steps_with: int, steady_with: int) -> bool:
        """Whether work that ran in `loop_steps_with` of the loop's steps, `steady_with` times in the steady steps,
        is a one-off: one steady step of a loop of three or more (a table made on a condition, a value logged once),
        which recurs in no other step. Work of the warm-up step only is set-up, which no per-line finding costs."""
        return loop_steps_with == 1 and steady_with > 0 and self.step_count >= 3

    def line_cost(self, steady_ns: float, total_ns: float, loop_steps_with: int, steady_with: int) -> Cost:
        """`loop_cost` for a line's work in the loop; a one-off's (`once_in_loop`) is its time, once, with no per-step
        figure, so that it is not ranked as if it recurred every step."""
        if self.once_in_loop(loop_steps_with, steady_with):
            return {"cost_total_ns": float(total_ns), "cost_per_step_ns": None}
        return self.loop_cost(steady_ns, total_ns)

    def per_step(self, total_ns: float) -> float | None:
        """A run total spread over the loop's steps; None for a run without steps."""
        return total_ns / self.step_count if self.step_count else None

    # -- chip time ----------------------------------------------------------------------------------

    def busy_by_step(self, *, steady: bool = False) -> dict[int, float]:
        """Chip busy time per step from the executions: the length of the union of their intervals per chip.

        An execution's recorded duration runs from its launch to its results being ready, which includes
        waiting behind programs launched before it; counting only the part of each interval after every
        earlier one has ended gives the time the chip was actually running something.
        """
        key = f"busy_by_step:{steady}"
        cached = self.cache.get(key)
        if cached is not None:
            return cached  # type: ignore[return-value]
        steps = self.steady_range if steady else self.loop_range
        step_filter = "" if steps is None else " WHERE step BETWEEN ? AND ?"
        rows = self.trace.sql(
            f"SELECT step, SUM(busy_ns) FROM ({_BUSY_SQL}){step_filter} GROUP BY step",
            (self.rank,) + (() if steps is None else steps),
        )
        busy = {step: float(total or 0) for step, total in rows}
        self.cache[key] = busy
        return busy

    def busy_of_programs(self, program_ids: list[int]) -> float:
        """Chip busy time (as in `busy_by_step`) of the executions of `program_ids`, in the loop's steps."""
        if not program_ids:
            return 0.0
        steps = self.loop_range
        step_filter = "" if steps is None else " AND step BETWEEN ? AND ?"
        (busy,) = self.trace.sql(
            f"SELECT COALESCE(SUM(busy_ns), 0) FROM ({_BUSY_SQL}) WHERE program_id IN {in_list(program_ids)}{step_filter}",
            (self.rank, *program_ids) + (() if steps is None else steps),
        )[0]
        return float(busy)

    # -- severity ---------------------------------------------------------------------------------

    def share_of_steps(self, steady_cost_ns: float) -> float:
        """A cost incurred in the steady steps as a share of their time (of the wall time without steps)."""
        denominator = self.steady_ns if self.steps else self.wall_ns
        return steady_cost_ns / denominator if denominator else 0.0

    def share_of_steps_less_compiles(self, steady_cost_ns: float) -> float:
        """`share_of_steps` for a cost that leaves compiles out (a sync's stall less the compiles in it): a share
        of the steady steps' time less their compiles, so that one steady step that compiled (a second-step
        recompile) does not make a cost paid every step look small. Costs that can overlap a compile (a
        collective's interval) keep `share_of_steps`, whose share never passes 100%."""
        if not self.steps:
            return self.share_of_steps(steady_cost_ns)
        denominator = self.steady_ns - self.steady_compile_ns
        if denominator <= 0:
            denominator = self.steady_ns
        return steady_cost_ns / denominator if denominator else 0.0

    @property
    def steady_compile_ns(self) -> int:
        """The compile time in the steady steps (outermost compiles: a Dynamo frame's holds its XLA compiles)."""
        cached = self.cache.get("steady_compile_ns")
        if isinstance(cached, int):
            return cached
        where, params = self.steady_where("c")
        ((total,),) = self.trace.sql(
            f"SELECT COALESCE(SUM(c.dur_ns), 0) FROM compiles c WHERE {where} AND {OUTERMOST_COMPILE}", params,
        )
        compile_ns = int(total)
        self.cache["steady_compile_ns"] = compile_ns
        return compile_ns

    def share_of_step(self, total_ns: float) -> float:
        """A cost summed over the loop's steps, per step, as a share of the median steady step."""
        median = self.median_step_ns
        per_step = self.per_step(total_ns)
        if per_step is None or not median:
            return self.share_of_wall(total_ns)
        return per_step / median

    def share_text(self, share: float) -> str:
        """`12% of the steady steps' time` (`of the run` for a run without steps)."""
        return f"{share:.0%} of the steady steps' time" if self.steps else f"{share:.0%} of the run"

    def share_of_wall(self, cost_ns: float) -> float:
        return cost_ns / self.wall_ns if self.wall_ns else 0.0

    @staticmethod
    def severity(share: float, *, warning: float = WARNING_SHARE, critical: float = CRITICAL_SHARE) -> Severity:
        if share >= critical:
            return "critical"
        if share >= warning:
            return "warning"
        return "info"

    # -- source locations -------------------------------------------------------------------------

    def location(self, frame_id: int | None) -> SourceLocation | None:
        return self.trace.frame(frame_id)

    def where(self, frame_id: int | None) -> str:
        """`file.py:12` for a frame id, `an unknown line` without one."""
        location = self.location(frame_id)
        return location.short if location is not None else "an unknown line"

    def frames_at_line(self, file: str, line: int) -> list[int]:
        """The recorded frames at `line` of the file a recompile's diff names (`train.py`, its folder left
        out, or its path), by id."""
        name = os.path.basename(file)
        pattern = "%/" + name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self.trace.sql(
            "SELECT f.id FROM frames f JOIN strings s ON s.id = f.file_sid WHERE f.line = ? AND (s.text = ? OR s.text LIKE ? ESCAPE '\\') "
            "ORDER BY f.id",
            (line, file, pattern),
        )
        return [row[0] for row in rows]

    def frame_at_line(self, file: str, line: int) -> int | None:
        """A recorded frame at `line` of the file a recompile's diff names: the line's own frame, which ops
        have, before a call's."""
        frames = self.frames_at_line(file, line)
        line_frames = [frame_id for frame_id in frames if (location := self.trace.frame(frame_id)) is not None and location.col is None]
        return line_frames[0] if line_frames else frames[0] if frames else None

    def location_fields(self, frame_id: int | None) -> LocationFields:
        """`file` and `line` keyword arguments of a `Finding` for a frame id (none when unknown)."""
        location = self.location(frame_id)
        return {"file": location.file, "line": location.line} if location else {}

    def evidence_at(self, text: str, frame_id: int | None, *, module: str | None = None, table: str | None = None) -> Evidence:
        location = self.location(frame_id)
        return Evidence(
            text,
            file=location.file if location else None,
            line=location.line if location else None,
            module=module,
            table=table,
        )


# Per execution of a rank: the part of its launch-to-ready interval after every earlier execution on its chip
# had ended (so time spent queued behind other programs is not counted twice).
_BUSY_SQL = execution_spans_sql("rank = ?", "chip")


def outside_fallbacks(alias: str) -> str:
    """SQL condition: the row `alias` (with rank and start_ns) did not happen inside a CPU fallback.

    A fallback's own syncs and copies are part of its recorded time; this keeps them out of other
    analyzers. The latest fallback starting at or before the row must have ended before it.
    """
    return (
        f"COALESCE((SELECT f.start_ns + f.dur_ns FROM fallbacks f WHERE f.rank = {alias}.rank "
        f"AND f.start_ns <= {alias}.start_ns ORDER BY f.start_ns DESC LIMIT 1), -1) < {alias}.start_ns"
    )


def _step_condition(rank: int, steps: tuple[int, int] | None, alias: str) -> tuple[str, tuple[int, ...]]:
    prefix = f"{alias}." if alias else ""
    if steps is None:
        return f"{prefix}rank = ?", (rank,)
    return f"{prefix}rank = ? AND {prefix}step BETWEEN ? AND ?", (rank, steps[0], steps[1])


def per_call_text(context: AnalysisContext, total_ns: float, count: int, steady_ns: float, steady_count: int, each: str) -> str:
    """A cost per call (`2.1 ms stall each`, `each` being `stall each`): the steady steps' beside the loop's average
    when the warm-up step also made calls, whose first runs cost more, since a title's rate is the steady steps'."""
    if context.steps and steady_count and steady_count < count:
        return (f"{format_ns(steady_ns / steady_count)} {each} in the steady steps "
                f"({format_ns(total_ns / count)} on average with the warm-up step)")
    return f"{format_ns(total_ns / count)} {each}"


def per_step_text(count: int, steps: int, noun: str, nouns: str | None = None,
                  every: tuple[int, int] | None = None) -> str:
    """`count` things over `steps` steps as a rate: `2 copies per step`, `2 copies every 3 steps`, or
    `3 copies in 40 steps` when no small fraction says it exactly, `about 29 copies per step` for many a step that no
    small numerator says (146 in 5 steps); one thing is `1 copy in 4 steps`, since a
    single event (a read in one step, `if step == 1:`) shows no period. With `every` (n, p), the things came n at a
    time in every p-th step (`step_period`): `1 copy every 2 steps`."""
    if steps <= 0:
        return plural(count, noun, nouns)
    if every is not None:
        return f"{plural(every[0], noun, nouns)} every {every[1]} steps"
    rate = Fraction(count, steps)
    if rate.denominator == 1:
        return f"{plural(rate.numerator, noun, nouns)} per step"
    if rate.numerator > MAX_RATE_DENOMINATOR:  # many a step, unevenly (an episode's reads): `146 every 5` reads as a period
        return f"about {plural(int(rate + Fraction(1, 2)), noun, nouns)} per step"
    if rate.denominator <= MAX_RATE_DENOMINATOR and count > 1:
        return f"{plural(rate.numerator, noun, nouns)} every {rate.denominator} steps"
    return f"{plural(count, noun, nouns)} in {plural(steps, 'step')}"


def step_period(counts: dict[int, int], first: int, last: int) -> tuple[int, int] | None:
    """(n, p) for events that came n at a time in every p-th step of `first`..`last` (steps 1, 3, 5 of 1..5: p = 2),
    from the count per step that had some; None when they are not evenly spaced, come every step, or p exceeds
    `MAX_RATE_DENOMINATOR`."""
    steps = sorted(counts)
    if len(steps) < 2 or len(set(counts.values())) != 1:
        return None
    gaps = {later - earlier for earlier, later in zip(steps, steps[1:])}
    if len(gaps) != 1:
        return None
    (period,) = gaps
    if not 2 <= period <= MAX_RATE_DENOMINATOR or steps[0] - first >= period or last - steps[-1] >= period:
        return None
    return counts[steps[0]], period


def detail_object(text: str | None) -> dict[str, object]:
    """A record's `detail` JSON object (a compile's, a graph break's): empty where it is none or not an object."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def in_list(values: Iterable[object]) -> str:
    """`(?, ?, ?)` for an SQL IN clause over `values` (at least one placeholder)."""
    count = max(len(list(values)), 1)
    return "(" + ", ".join("?" for _ in range(count)) + ")"


_Step = TypeVar("_Step")


def steady(loop_steps: Sequence[_Step]) -> list[_Step]:
    """The steady steps of a loop's steps: those after the first (warm-up) one, or all of them when there
    are fewer than three. The report's median step is theirs, and every view that shows one uses this."""
    return list(loop_steps[1:] if len(loop_steps) >= 3 else loop_steps)
