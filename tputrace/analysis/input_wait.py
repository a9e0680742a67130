"""The loop waiting for its next batch from a DataLoader, on an imported torch.profiler capture.

torch wraps each batch a DataLoader hands out in a `record_function` range, `enumerate(DataLoader)#<iterator>.__next__`:
with workers (`_MultiProcessingDataLoaderIter`) the main process waits there for them to hand over a batch; without
(`_SingleProcessDataLoaderIter`) it loads the batch there itself. Either way the step waits. The ranges' time inside
the steady steps, as a share of the steps' time (of the capture's wall time where it marks no steps), makes the
finding, at the user's function around the loop (the innermost of the user's `python_function` frames around a range).
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.analysis.context import MIN_LISTED_COST_NS, WARNING_SHARE, AnalysisContext
from tputrace.analysis.device_idle import device_idle, device_idle_finding
from tputrace.analysis.findings import MEASURED_ON_HOST, AnalysisResult, Finding
from tputrace.analysis.imported import context_import_facts
from tputrace.importers.chrome_json import is_user_frame
from tputrace.wording import format_ns, plural

NAME = "input_wait"
_RANGE = "enumerate(DataLoader)#%"
_MULTI_PROCESS = "_MultiProcessingDataLoaderIter"


@dataclass(frozen=True)
class InputWaitData:
    calls: int = 0  # the DataLoader's batches handed out in the judged span
    wait_ns: int = 0  # their time inside it
    span_ns: int = 0  # the steady steps' time (the capture's wall time without steps)
    steps: int = 0  # the steady steps judged (0: the capture marks none)
    iterators: tuple[str, ...] = ()  # `_MultiProcessingDataLoaderIter`, `_SingleProcessDataLoaderIter`


def analyze(context: AnalysisContext) -> AnalysisResult[InputWaitData]:
    facts = context_import_facts(context)
    if facts is None:
        return AnalysisResult(NAME, InputWaitData())
    if facts.format == "xplane":
        idle = device_idle(context)
        found = device_idle_finding(context, NAME, idle) if idle is not None else None
        return AnalysisResult(NAME, InputWaitData(), (found,) if found is not None else ())
    rows = context.trace.sql(
        "SELECT a.start_ns, a.dur_ns, s.text FROM annotations a JOIN strings s ON s.id = a.name_sid "
        "WHERE a.rank = ? AND s.text LIKE ? AND a.source = 'record_function' ORDER BY a.start_ns", (context.rank, _RANGE))
    if not rows:
        return AnalysisResult(NAME, InputWaitData())
    spans = [(step.start_ns, step.end_ns) for step in context.steady_steps if step.end_ns is not None]
    if not spans:
        spans = [(0, context.wall_ns)]
    wait_ns, calls = 0, 0
    for start, dur, _ in rows:
        inside = sum(max(0, min(start + (dur or 0), end) - max(start, begin)) for begin, end in spans)
        wait_ns += inside
        calls += inside > 0
    span_ns = sum(end - begin for begin, end in spans)
    iterators = tuple(sorted({text.split("#", 1)[-1].split(".", 1)[0] for _, _, text in rows}))
    steps = len(spans) if context.steps else 0
    data = InputWaitData(calls, wait_ns, span_ns, steps, iterators)
    share = wait_ns / span_ns if span_ns else 0.0
    if share < WARNING_SHARE or wait_ns < MIN_LISTED_COST_NS:
        return AnalysisResult(NAME, data)
    return AnalysisResult(NAME, data, (_finding(context, data, share, _loop_frame(context, rows[-1][0])),))


def _finding(context: AnalysisContext, data: InputWaitData, share: float, frame_id: int | None) -> Finding:
    workers = _MULTI_PROCESS in data.iterators
    per_step = data.wait_ns / data.steps if data.steps else None
    total = per_step * context.step_count if per_step is not None else float(data.wait_ns)
    span = (f"{plural(data.steps, 'steady step')}' {format_ns(data.span_ns)}" if data.steps else
            f"capture's {format_ns(data.span_ns)} (it marks no steps)")
    return Finding(
        analyzer=NAME,
        severity=context.severity(share),
        title=(f"The loop waits for its DataLoader: {share:.0%} of "
               + (f"its steps ({format_ns(per_step)} a step)" if per_step is not None else "the capture")),
        explanation=(
            f"{format_ns(data.wait_ns)} of the {span} went to taking {plural(data.calls, 'batch', 'batches')} from the "
            f"DataLoader ({', '.join(data.iterators)}): "
            + ("the main process waited there for its worker processes to hand over a batch, so they make batches more "
               "slowly than the steps use them." if workers else
               "the main process loaded each batch itself (no workers) while nothing else ran.")),
        suggestion=(
            ("Make batches faster than the steps use them: more worker processes (`num_workers`, up to the host's free "
             "cores), `persistent_workers=True` so they are not restarted each epoch, a larger `prefetch_factor`, "
             "`pin_memory=True`; " if workers else
             "Load batches in worker processes (`DataLoader(..., num_workers=N, pin_memory=True, persistent_workers=True)`) "
             "so that they are made while the steps run; ")
            + "move costly per-sample work (decoding, augmentation) out of `__getitem__`: precompute it, or run it "
              "batched on the device."),
        cost_total_ns=float(total),
        cost_per_step_ns=per_step,
        cost_basis=MEASURED_ON_HOST,
        **context.location_fields(frame_id),
    )


def _loop_frame(context: AnalysisContext, t_ns: int) -> int | None:
    """The frame of the innermost user function around the moment `t_ns` (the loop that takes the batch)."""
    for name, frame_id in context.trace.sql(
            "SELECT s.text, a.frame_id FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.rank = ? AND "
            "a.source = 'python' AND a.frame_id IS NOT NULL AND a.start_ns <= ? AND a.start_ns + a.dur_ns >= ? "
            "ORDER BY a.start_ns DESC", (context.rank, t_ns, t_ns)):
        if is_user_frame(name):
            return int(frame_id)
    return None
