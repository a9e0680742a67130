"""The eager modes a recorded run ran in, in order, read from its ops.

`runs.eager_mode` holds one mode: the one active when the recording stopped. A script that calls
`torch.tpu.set_eager_mode(...)` part-way ran its earlier ops in another mode, which its ops show: an op run by a
DeferAndFuse flush has a `flush_id`; an op run as its own program (strict eager) has a program of kind `op` and no
flush. Views (no program), CPU fallbacks and torch.compile graphs tell no mode and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tputrace.store.reader import Trace
    from tputrace.store.records import RunInfo, SourceLocation

DEFER_AND_FUSE = "DEFER_AND_FUSE"
STRICT_MODES = ("DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING")

# Each op that tells its mode, 'D' (a flush ran it) or 'S' (its own program), with the previous such op's mode.
_OP_MODES = """
    SELECT o.seq, o.step, o.frame_id, o.mode, LAG(o.mode) OVER (ORDER BY o.seq) AS previous
    FROM (SELECT ops.seq, ops.step, ops.frame_id, CASE WHEN ops.flush_id IS NOT NULL THEN 'D' ELSE 'S' END AS mode
          FROM ops LEFT JOIN programs ON programs.id = ops.program_id AND programs.rank = ops.rank
          WHERE ops.rank = ? AND (ops.flush_id IS NOT NULL
                                  OR (ops.program_id IS NOT NULL AND COALESCE(programs.kind, 'op') = 'op'))) AS o
"""


@dataclass(frozen=True)
class ModeSpan:
    """A stretch of the run's ops in one eager mode: the mode, the step and line of its first op."""

    mode: str
    first_step: int
    first_location: SourceLocation | None


def eager_mode_spans(trace: Trace, run: RunInfo) -> tuple[ModeSpan, ...]:
    """The modes `run` ran its ops in, in order; one span of `run.eager_mode` when its ops show one mode (or none,
    or the trace is an import or a `--mode compile` run). Cheap for a run in one mode: the ops are read only when
    the run has both flushes and programs of one op."""
    recorded = run.eager_mode
    whole_run = (ModeSpan(recorded, 0, None),) if recorded else ()
    if trace.meta.get("imported") or recorded not in (DEFER_AND_FUSE, *STRICT_MODES):
        return whole_run
    both = trace.sql("SELECT EXISTS (SELECT 1 FROM flushes WHERE rank = ? AND n_ops > 0),"
                     " EXISTS (SELECT 1 FROM programs WHERE rank = ? AND kind = 'op')", (run.rank, run.rank))
    if not both or not all(both[0]):
        return whole_run
    strict_name = recorded if recorded in STRICT_MODES else STRICT_MODES[0]
    spans = tuple(
        ModeSpan(DEFER_AND_FUSE if mode == "D" else strict_name, int(step or 0), trace.frame(frame_id))
        for _seq, step, frame_id, mode, previous in trace.sql(
            f"SELECT * FROM ({_OP_MODES}) WHERE previous IS NULL OR previous != mode ORDER BY seq", (run.rank,))
    )
    return spans if len(spans) > 1 else whole_run


def eager_modes_text(spans: tuple[ModeSpan, ...]) -> str | None:
    """The modes as one phrase: `DEFER_AND_FUSE` for one; `DEFER_AND_FUSE, then DEFER_NEVER from step 3
    (train.py:13)` for a run that switched, each later mode with the step and line of its first op."""
    if not spans:
        return None
    parts = [spans[0].mode]
    for span in spans[1:]:
        line = f" ({span.first_location.short})" if span.first_location is not None else ""
        parts.append(f"then {span.mode} from step {span.first_step}{line}")
    return ", ".join(parts)
