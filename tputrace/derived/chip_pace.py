"""The chip's pace: how often the chip finished a loop step, where the host ran ahead of it.

A step's record spans the host's loop iteration. A loop that reads nothing back from the chip each step (losses kept
on the chip and read after the loop) lets the host queue step after step while the chip works through them, so the
host's steps are shorter than the chip's: the chip's pace, not the host's, sets how long the loop takes. A step is
finished on the chip when its host iteration has ended and the last program it launched is ready; the time between
one step's finish and the next is the chip's step time. The watcher that sees programs ready can see several end
together (it waits for the interpreter lock), so the chip's figure is the steady steps' mean (the time from the first
step's finish to the last's, over the steps between), which such batching does not move. Time the chip spent waiting for
the host to launch a step's first program (a step whose host iteration compiled a program) is left out of it: the host,
not the chip, set that step's pace.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tputrace.derived.steps import LOOP_STEPS_WHERE, steady_median_ns

if TYPE_CHECKING:
    from tputrace.store.reader import Trace

PACE_SHOWN_RATIO = 1.2
"""The chip's median step is told beside the host's when it is at least this many times as long."""
READY_LAG_NS = 5_000_000
"""How late a program's end may be recorded after it was ready: the watcher polls every 2 ms at most, then waits for
Python's interpreter lock (`executions.dur_ns`)."""


@dataclass(frozen=True)
class ChipPace:
    """The chip's mean time per steady loop step, the host's median, and how many steps the host ran ahead at most."""

    mean_step_ns: int
    host_median_step_ns: int
    steps_ahead: int

    @property
    def text(self) -> str:
        from tputrace.wording import format_ns, plural

        return (f"the chip finished a step every {format_ns(self.mean_step_ns)} on average, the host's loop every "
                f"{format_ns(self.host_median_step_ns)}: the host ran up to {plural(self.steps_ahead, 'step')} ahead, "
                "so the chip's pace sets the loop's time")


def chip_pace(trace: Trace, rank: int) -> ChipPace | None:
    """The chip's pace over `rank`'s loop steps, when it is markedly slower than the host's and the host ran at
    least one step ahead of it; else None (no executions recorded, fewer than two loop steps, or the host waited
    for the chip each step)."""
    launched_and_ready = {step: (launch_ns, ready_ns) for step, launch_ns, ready_ns in trace.sql(
        "SELECT step, MIN(start_ns), MAX(start_ns + dur_ns) FROM executions WHERE rank = ? AND dur_ns IS NOT NULL "
        "GROUP BY step", (rank,))}
    loop_steps = trace.sql(f"SELECT step, start_ns, end_ns FROM steps WHERE {LOOP_STEPS_WHERE} ORDER BY step", (rank,))
    steps = [(start_ns, end_ns, launched_and_ready.get(step, (None, None))[1]) for step, start_ns, end_ns in loop_steps]
    launches = [launched_and_ready.get(step, (None, None))[0] for step, _, _ in loop_steps]
    if len(steps) < 2 or all(ready_ns is None for *_, ready_ns in steps):
        return None
    host_ends = [end_ns for _, end_ns, _ in steps]
    finishes: list[int] = []
    for _, end_ns, ready_ns in steps:
        finish_ns = max(end_ns, ready_ns or end_ns, finishes[-1] if finishes else end_ns)
        finishes.append(finish_ns)
    host_median = steady_median_ns([end_ns - start_ns for start_ns, end_ns, _ in steps])
    # The steady steps, as the medians take them: after the first, or all of them in a loop of two.
    first = 1 if len(finishes) >= 3 else 0
    since_ns = finishes[0] if first else steps[0][0]
    # The chip idle until the host launched a step's first program: the host's time, not the chip's.
    waited_ns = sum(max(0, launch_ns - previous_ns) for launch_ns, previous_ns in zip(
        launches[first:], [since_ns, *finishes[first:-1]]) if launch_ns is not None)
    chip_mean = (finishes[-1] - since_ns - waited_ns) // (len(finishes) - first)
    if not host_median or chip_mean < host_median * PACE_SHOWN_RATIO:
        return None
    # How many later host steps had ended when each step finished on the chip (the watcher's lag in seeing a program
    # ready left out): none means the host waited for every step (a read each step), and the steps' spread is then
    # the host's own (a step that compiled).
    ahead = max(bisect_left(host_ends, finish_ns - READY_LAG_NS) - index - 1 for index, finish_ns in enumerate(finishes))
    return ChipPace(chip_mean, host_median, ahead) if ahead >= 1 else None
