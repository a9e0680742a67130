"""Device time spent moving data rather than computing, on a capture with device op (or kernel) times.

An imported capture's device ops and kernels that move data (`moved_arrays`: XLA's asynchronous copies,
`copy-start`/`copy-done`, between host memory and the device's; `infeed`/`outfeed`; `send`/`recv`; a GPU's
`Memcpy HtoD`/`DtoH` runs) are grouped by the op that waits, and each is counted only for the part of its time
no compute op or kernel ran on the same device: a copy overlapped with compute costs nothing. The waits'
share of the devices' busy time makes the finding. The data also holds how long the devices sat idle (the capture's
wall time on every device less their busy time) and the compile time in the capture, which explains idle time; a
capture of accelerators (TPU, GPU, MTIA) without steps whose devices sat idle most of the time outside compiles, and
moved no data worth a finding, gets an info finding saying so (with steps, `host_bound` judges that).
A trace tputrace recorded has no device op times (its ops are host dispatch): nothing is reported on it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from typing import Any

from tputrace.analysis.context import MIN_LISTED_COST_NS, WARNING_SHARE, AnalysisContext
from tputrace.analysis.data_movement_text import idle_finding, movement_finding, unit_name
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Finding
from tputrace.analysis.host_callbacks import callback_finding, host_callbacks, is_callback
from tputrace.analysis.imported import context_import_facts
from tputrace.derived.imported_sources import imported_source
from tputrace.analysis.moved_arrays import DataMovementData, MovedArray, is_movement, movement

NAME = "data_movement"
IDLE_SHARE = 0.5  # devices idle this share of the capture (wall time × devices) or more, with nothing else to say
MAX_ARRAYS = 8
ACCELERATORS = ("tpu", "gpu", "mtia")  # a CPU capture's device is the host itself: its idle time is the host's work

__all__ = ["NAME", "DataMovementData", "MovedArray", "analyze"]


# A source of device activity: the names of its rows, and its rows (name sid, chip, start, duration, operands sid,
# output sid, program id, frame id, module sid: JAX's name of what a copy copies).
_OPS = ("SELECT op_sid FROM ops WHERE rank = ? AND chip >= 0 GROUP BY op_sid",
        "SELECT op_sid, chip, start_ns, dur_ns, inputs_sid, outputs_sid, program_id, frame_id, module_sid FROM ops "
        "WHERE rank = ? AND chip >= 0")
_MOVING, _CALLBACK = 9, 10  # the columns `_rows` adds: whether the row moves data, whether it is a host callback
_KERNELS = ("SELECT name_sid FROM programs WHERE rank = ? AND kind = 'kernel' GROUP BY name_sid",
            "SELECT p.name_sid, e.chip, e.start_ns, e.dur_ns, NULL, NULL, NULL, NULL, NULL FROM executions e "
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
    by_chip: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        by_chip.setdefault(row[1], []).append((row[2], row[2] + (row[3] or 0)))
    devices = max(trace.run.chips or 0, len(by_chip))
    busy_ns = sum(end - start for intervals in by_chip.values() for start, end in _merged(intervals))
    idle_ns = max(0, context.wall_ns * devices - busy_ns)
    compile_ns = sum(end - start for start, end in _merged(
        [(start, start + (dur or 0)) for start, dur in trace.sql("SELECT start_ns, dur_ns FROM compiles WHERE rank = ?",
                                                                (context.rank,))]))
    moving = [row for row in rows if row[_MOVING]]
    arrays = [_with_line(context, array) for array in _merge_pairs(_arrays(context, moving, _waits(rows, moving)))]
    called = [row for row in rows if row[_CALLBACK]]
    callbacks = host_callbacks(context, called, _waits(rows, called), lambda program_id: _program_name(context, program_id))
    arrays.sort(key=lambda array: -array.waiting_ns)
    waiting_ns = sum(array.waiting_ns for array in arrays)
    callback_ns = sum(callback.waiting_ns for callback in callbacks)
    data = DataMovementData(devices, context.wall_ns, busy_ns, waiting_ns, idle_ns, compile_ns,
                            tuple(arrays[:MAX_ARRAYS]), callback_ns, tuple(callbacks[:MAX_ARRAYS]))
    findings: list[Finding] = []
    if busy_ns and callback_ns / busy_ns >= WARNING_SHARE and callback_ns >= MIN_LISTED_COST_NS:
        wall_share = callback_ns / (context.wall_ns * devices) if context.wall_ns and devices else 1.0
        findings.append(callback_finding(context, unit_name(facts.device), _time_name(facts.device), devices, busy_ns,
                                         context.wall_ns, callbacks, context.severity(wall_share)))
    share = waiting_ns / busy_ns if busy_ns else 0.0
    if share >= WARNING_SHARE and waiting_ns >= MIN_LISTED_COST_NS:
        # Severity: the wait on each device as a share of the capture's wall time (a mostly idle GPU's copies cost less).
        wall_share = waiting_ns / (context.wall_ns * devices) if context.wall_ns and devices else share
        findings.append(movement_finding(context, facts.device, data, arrays, context.severity(wall_share)))
    elif (not findings and not context.steps and facts.device in ACCELERATORS and busy_ns
          and (idle_ns - compile_ns * devices) / (context.wall_ns * devices) >= IDLE_SHARE):
        findings.append(idle_finding(context, facts.device, data))
    return AnalysisResult(NAME, data, tuple(replace(finding, analyzer=NAME, cost_basis=MEASURED_ON_HOST)
                                            for finding in findings))


def _rows(context: AnalysisContext, names_sql: str, rows_sql: str) -> list[tuple[Any, ...]]:
    """A source's rows, each with whether it moves data."""
    trace, rank = context.trace, context.rank
    moving_sids = {sid for (sid,) in trace.sql(names_sql, (rank,)) if is_movement(trace.string(sid) or "")}
    callback: dict[tuple[int, int | None], bool] = {}
    rows = []
    for row in trace.sql(rows_sql, (rank,)):
        key = (row[0], row[8])
        if key not in callback:
            callback[key] = row[0] not in moving_sids and is_callback(trace.string(row[0]) or "", trace.string(row[8]))
        rows.append((*row, row[0] in moving_sids, callback[key]))
    return rows


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of some (start, end) intervals as disjoint intervals, in time order."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _waits(rows: list[tuple[Any, ...]], moving: list[tuple[Any, ...]]) -> list[int]:
    """Per data-moving row, the part of its time no computing row (of `rows`) overlapped on its chip."""
    compute: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        if not row[_MOVING] and not row[_CALLBACK]:
            compute.setdefault(row[1], []).append((row[2], row[2] + (row[3] or 0)))
    covers = {chip: _Cover(_merged(intervals)) for chip, intervals in compute.items()}
    waits = []
    for row in moving:
        start, end = row[2], row[2] + (row[3] or 0)
        cover = covers.get(row[1])
        overlap = cover.until(end) - cover.until(start) if cover is not None else 0
        waits.append(max(end - start - overlap, 0))
    return waits


class _Cover:
    """Disjoint intervals in time order, and how much of the time before any moment they cover."""

    def __init__(self, intervals: list[tuple[int, int]]) -> None:
        self.intervals = intervals
        self.starts = [start for start, _ in intervals]
        self.before = [0]
        for start, end in intervals:
            self.before.append(self.before[-1] + end - start)

    def until(self, time: int) -> int:
        index = bisect_right(self.starts, time) - 1
        if index < 0:
            return 0
        start, end = self.intervals[index]
        return self.before[index] + min(time, end) - start


def _arrays(context: AnalysisContext, rows: list[tuple[Any, ...]], waits: list[int]) -> list[MovedArray]:
    """The data-moving rows grouped by op (or kernel) name and program."""
    trace = context.trace
    groups: dict[tuple[int, int | None], list[tuple[tuple[Any, ...], int]]] = {}
    for row, wait in zip(rows, waits):
        groups.setdefault((row[0], row[6]), []).append((row, wait))
    copied = _copy_bytes(context)
    arrays = []
    for (name_sid, program_id), members in groups.items():
        first = members[0][0]
        name = trace.string(name_sid) or "?"
        moved = movement(name, trace.string(first[4]), trace.string(first[5]))
        made_by = moved.operand or moved.start_op
        arrays.append(MovedArray(
            name, moved.kind, moved.direction, moved.shape, moved.bytes or copied.get(name), made_by, trace.string(first[8]),
            _program_name(context, program_id),
            next((row[7] for row, _ in members if row[7] is not None), None), len(members),
            len({row[1] for row, _ in members}), sum(row[3] or 0 for row, _ in members), sum(wait for _, wait in members)))
    return arrays


def _merge_pairs(arrays: list[MovedArray]) -> list[MovedArray]:
    """Each `copy-done` with its `copy-start` (their waits summed under the done, which names the start): the array
    is the start's operand, whose line (an op's frame in the same program) is where it was made."""
    by_name = {(array.op, array.program): array for array in arrays}
    started = {(array.made_by, array.program) for array in arrays if array.kind == "async copy"
               and array.op.startswith("copy-done")}  # the copy-starts that a copy-done names
    merged = []
    for array in arrays:
        if array.op.startswith("copy-start") and (array.op, array.program) in started:
            continue
        start = by_name.get((array.made_by or "", array.program)) if array.op.startswith("copy-done") else None
        if start is not None and start.op.startswith("copy-start"):
            array = replace(array, made_by=start.made_by, made_by_name=start.made_by_name,
                            device_ns=array.device_ns + start.device_ns,
                            waiting_ns=array.waiting_ns + start.waiting_ns)
        merged.append(array)
    return merged


def _with_line(context: AnalysisContext, array: MovedArray) -> MovedArray:
    """`array` with the line of the op that made what it moves (an op of its program with a frame), where it has none."""
    if array.frame_id is not None or not array.made_by:
        return array
    name_sid = context.trace.string_id(array.made_by)
    found = context.trace.sql(
        "SELECT o.frame_id FROM ops o JOIN programs p ON p.id = o.program_id JOIN strings n ON n.id = p.name_sid "
        "WHERE o.op_sid = ? AND o.rank = ? AND n.text = ? AND o.frame_id IS NOT NULL LIMIT 1",
        (name_sid, context.rank, array.program)) if name_sid is not None else []
    return replace(array, frame_id=found[0][0]) if found else array


def _program_name(context: AnalysisContext, program_id: int | None) -> str | None:
    found = context.trace.sql("SELECT s.text FROM programs p JOIN strings s ON s.id = p.name_sid WHERE p.id = ?",
                              (program_id,)) if program_id is not None else []
    return str(found[0][0]) if found else None


def _time_name(device: str) -> str:
    return "device op time" if device == "tpu" else "busy time"


def _copy_bytes(context: AnalysisContext) -> dict[str, int]:
    """Each GPU memcpy's bytes a run (the mean of its runs), from the sizes the import counted (`copy_bytes` in
    `meta.imported`: Kineto gives each `Memcpy` its `bytes`)."""
    counted = (imported_source(context.trace, context.rank) or {}).get("copy_bytes")
    if not isinstance(counted, dict):
        return {}
    return {str(name): round(item["bytes"] / item["runs"]) for name, item in counted.items()
            if isinstance(item, dict) and isinstance(item.get("runs"), int) and item["runs"] > 0
            and isinstance(item.get("bytes"), int)}
