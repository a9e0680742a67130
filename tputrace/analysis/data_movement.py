"""Device time spent moving data rather than computing, on a capture with device op (or kernel) times.

An imported capture's device ops and kernels that move data (`moved_arrays`: XLA's asynchronous copies,
`copy-start`/`copy-done`, between host memory and the device's; `infeed`/`outfeed`; `send`/`recv`; a GPU's
`Memcpy HtoD`/`DtoH` runs) are grouped by the op that waits, and each is counted only for the part of its time
no compute op or kernel ran on the same device: a copy overlapped with compute costs nothing. The waits'
share of the devices' busy time makes the finding. The data also holds how long the devices sat idle (the capture's
wall time on every device less their busy time); a capture without steps whose devices sat idle most of the time,
and moved no data worth a finding, gets an info finding saying so (with steps, `host_bound` judges that).
A trace tputrace recorded has no device op times (its ops are host dispatch): nothing is reported on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from tputrace.analysis.context import MIN_LISTED_COST_NS, WARNING_SHARE, AnalysisContext
from tputrace.analysis.data_movement_text import idle_finding, movement_finding
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Finding
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.moved_arrays import DataMovementData, MovedArray, is_movement, movement

NAME = "data_movement"
IDLE_SHARE = 0.5  # devices idle this share of the capture (wall time × devices) or more, with nothing else to say
MAX_ARRAYS = 8

__all__ = ["NAME", "DataMovementData", "MovedArray", "analyze"]


# A source of device activity: the names of its rows, and its rows (name sid, chip, start, duration, operands sid,
# output sid, program id, frame id).
_OPS = ("SELECT op_sid FROM ops WHERE rank = ? AND chip >= 0 GROUP BY op_sid",
        "SELECT op_sid, chip, start_ns, dur_ns, inputs_sid, outputs_sid, program_id, frame_id FROM ops "
        "WHERE rank = ? AND chip >= 0")
_KERNELS = ("SELECT name_sid FROM programs WHERE rank = ? AND kind = 'kernel' GROUP BY name_sid",
            "SELECT p.name_sid, e.chip, e.start_ns, e.dur_ns, NULL, NULL, NULL, NULL FROM executions e "
            "JOIN programs p ON p.id = e.program_id WHERE e.rank = ? AND p.kind = 'kernel'")


def analyze(context: AnalysisContext) -> AnalysisResult[DataMovementData]:
    facts = context_import_facts(context)
    if facts is None:
        return AnalysisResult(NAME, DataMovementData())
    trace = context.trace
    # An XProf capture's XLA ops ran on its devices (other formats' ops are host work); every format's kernels did.
    rows = [row for source in ((_OPS, _KERNELS) if facts.format == "xplane" else (_KERNELS,))
            for row in _rows(context, *source)]
    if not rows:
        return AnalysisResult(NAME, DataMovementData())
    chips = np.array([row[1] for row in rows], dtype=np.int64)
    starts = np.array([row[2] for row in rows], dtype=np.int64)
    ends = starts + np.array([row[3] or 0 for row in rows], dtype=np.int64)
    moving = np.array([row[8] for row in rows], dtype=bool)
    devices = max(trace.run.chips or 0, len(np.unique(chips)))
    busy_ns = sum(_union_length(starts[chips == chip], ends[chips == chip]) for chip in np.unique(chips).tolist())
    idle_ns = max(0, context.wall_ns * devices - busy_ns)
    waits = _waits(chips, starts, ends, moving)
    arrays = [_with_line(context, array) for array in _merge_pairs(_arrays(context, [row for row in rows if row[8]],
                                                                        waits[moving]))]
    arrays.sort(key=lambda array: -array.waiting_ns)
    waiting_ns = sum(array.waiting_ns for array in arrays)
    data = DataMovementData(devices, context.wall_ns, busy_ns, waiting_ns, idle_ns, tuple(arrays[:MAX_ARRAYS]))
    findings: list[Finding] = []
    share = waiting_ns / busy_ns if busy_ns else 0.0
    if share >= WARNING_SHARE and waiting_ns >= MIN_LISTED_COST_NS:
        # Severity: the wait on each device as a share of the capture's wall time (a mostly idle GPU's copies cost less).
        wall_share = waiting_ns / (context.wall_ns * devices) if context.wall_ns and devices else share
        findings.append(movement_finding(context, facts.device, data, arrays, context.severity(wall_share)))
    elif not context.steps and devices and busy_ns and idle_ns / (context.wall_ns * devices) >= IDLE_SHARE:
        findings.append(idle_finding(context, facts.device, data))
    return AnalysisResult(NAME, data, tuple(replace(finding, analyzer=NAME, cost_basis=MEASURED_ON_HOST)
                                            for finding in findings))


def _rows(context: AnalysisContext, names_sql: str, rows_sql: str) -> list[tuple[Any, ...]]:
    """A source's rows, each with whether it moves data."""
    trace, rank = context.trace, context.rank
    moving_sids = {sid for (sid,) in trace.sql(names_sql, (rank,)) if is_movement(trace.string(sid) or "")}
    return [(*row, row[0] in moving_sids) for row in trace.sql(rows_sql, (rank,))]


def _merged(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of some intervals as disjoint intervals, in time order."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    merged_ends = np.zeros(int(group[-1]) + 1, dtype=np.int64)
    np.maximum.at(merged_ends, group, ends)
    return starts[new], merged_ends


def _union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    merged_starts, merged_ends = _merged(starts, ends)
    return int((merged_ends - merged_starts).sum())


def _waits(chips: np.ndarray, starts: np.ndarray, ends: np.ndarray, moving: np.ndarray) -> np.ndarray:
    """Per row, the part of a data-moving row's time no computing row overlapped on its chip (0 for the others)."""
    waits = np.zeros(len(chips), dtype=np.int64)
    for chip in np.unique(chips[moving]).tolist():
        on_chip = chips == chip
        compute_starts, compute_ends = _merged(starts[on_chip & ~moving], ends[on_chip & ~moving])
        covered = np.concatenate(([0], np.cumsum(compute_ends - compute_starts)))

        def covered_until(times: np.ndarray) -> np.ndarray:
            index = np.searchsorted(compute_starts, times, side="right") - 1
            inside = np.clip(times - compute_starts[np.maximum(index, 0)], 0,
                             (compute_ends - compute_starts)[np.maximum(index, 0)]) if len(compute_starts) else 0
            return np.where(index >= 0, covered[np.maximum(index, 0)] + inside, 0)

        chosen = on_chip & moving
        overlap = covered_until(ends[chosen]) - covered_until(starts[chosen])
        waits[chosen] = np.maximum(ends[chosen] - starts[chosen] - overlap, 0)
    return waits


def _arrays(context: AnalysisContext, rows: list[tuple[Any, ...]], waits: np.ndarray) -> list[MovedArray]:
    """The data-moving rows grouped by op (or kernel) name and program."""
    trace = context.trace
    groups: dict[tuple[int, int | None], list[tuple[tuple[Any, ...], int]]] = {}
    for row, wait in zip(rows, waits.tolist()):
        groups.setdefault((row[0], row[6]), []).append((row, wait))
    arrays = []
    for (name_sid, program_id), members in groups.items():
        first = members[0][0]
        name = trace.string(name_sid) or "?"
        moved = movement(name, trace.string(first[4]), trace.string(first[5]))
        program = trace.sql("SELECT s.text FROM programs p JOIN strings s ON s.id = p.name_sid WHERE p.id = ?",
                            (program_id,)) if program_id is not None else []
        made_by = moved.operand or moved.start_op
        arrays.append(MovedArray(
            name, moved.kind, moved.direction, moved.shape, moved.bytes, made_by, program[0][0] if program else None,
            next((row[7] for row, _ in members if row[7] is not None), None), len(members),
            len({row[1] for row, _ in members}), sum(row[3] or 0 for row, _ in members), sum(wait for _, wait in members)))
    return arrays


def _merge_pairs(arrays: list[MovedArray]) -> list[MovedArray]:
    """Each `copy-done` with its `copy-start` (their waits summed under the done, which names the start): the array
    is the start's operand, whose line (an op's frame in the same program) is where it was made."""
    by_name = {(array.op, array.program): array for array in arrays}
    merged = []
    for array in arrays:
        start = by_name.get((array.made_by or "", array.program)) if array.kind == "async copy" else None
        if array.op.startswith("copy-start") and any(other.made_by == array.op and other.program == array.program
                                                     and other.op != array.op for other in arrays):
            continue
        if start is not None and start.op.startswith("copy-start"):
            array = replace(array, made_by=start.made_by, device_ns=array.device_ns + start.device_ns,
                            waiting_ns=array.waiting_ns + start.waiting_ns)
        merged.append(array)
    return merged


def _with_line(context: AnalysisContext, array: MovedArray) -> MovedArray:
    """`array` with the line of the op that made what it moves (an op of its program with a frame), where it has none."""
    if array.frame_id is not None or not array.made_by:
        return array
    found = context.trace.sql(
        "SELECT o.frame_id FROM ops o JOIN strings s ON s.id = o.op_sid JOIN programs p ON p.id = o.program_id "
        "JOIN strings n ON n.id = p.name_sid WHERE o.rank = ? AND s.text = ? AND n.text = ? AND o.frame_id IS NOT NULL "
        "LIMIT 1", (context.rank, array.made_by, array.program))
    return replace(array, frame_id=found[0][0]) if found else array
