"""Host-bound steps: the host spends longer dispatching a step's ops than the chip spends running them.

Per steady step (the warm-up step left out even where a loop of two steps counts it steady: its
dispatch includes each op's first call): dispatch time (the ops' recorded host time) against the chip's busy time (the union
of the executions recorded in DeferAndFuse mode, see `AnalysisContext.busy_by_step`). Without executions (strict mode) the chip time is the
target's roofline time of the programs run, from XLA's FLOPs and bytes (an estimate), and an op's dispatch is at
most its op's median time (see `strict_times`: the rest of a call's recorded time is the chip running its program or
waiting for earlier ones). A run that switched eager modes part-way has both kinds of step: its strict steps' chip
time is the chip's work inside their ops' recorded times (`strict_times`), the first step in the mode entered left out
as the warm-up is (its ops' times hold their first compiles), and a step with neither is left out. The data also holds
that roofline estimate for every trace, to show what the step's work would take on the target.

A step whose first program was launched while the chip still ran the previous steps' programs found the host ahead
of the chip: it is no evidence of a host-bound step, and its busy time is not measured (the watcher sees a queue of
programs end together when it gets the interpreter lock, so the earlier step's execution holds the later ones' time).
Such steps are left out of the medians; where every steady step is, nothing is reported.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding, Severity
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.op_facts import dispatch_by_step
from tputrace.analysis.strict_times import first_compile_steps, strict_mode_steps
from tputrace.derived.eager_modes import eager_mode_spans
from tputrace.wording import format_ns

_STRICT_MODES = ("DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING")  # one program per op
NAME = "host_bound"
WARNING_RATIO = 2.0  # dispatch at least this many times the chip time ...
WARNING_IDLE_SHARE = 0.5  # ... and the chip idle for at least this share of the step


@dataclass(frozen=True)
class HostStep:
    """One steady step: its host dispatch time and ops, the chip's time, and the target's roofline estimate."""

    step: int
    dur_ns: int | None
    dispatch_ns: int
    ops: int
    chip_ns: float
    roofline_estimate_ns: float
    waited_ns: int = 0  # strict mode: the ops' recorded time that was the chip's work, not dispatch
    chip_behind: bool = False  # its first program was launched before the chip had run the earlier steps' programs


@dataclass(frozen=True)
class HostBoundData:
    """The steady steps and their medians (None without steady steps); `chip_time` says how the chip time
    was found (measured executions, or the target's roofline estimate)."""

    steps: tuple[HostStep, ...] = ()
    chip_time: str | None = None
    median_dispatch_ns: float | None = None
    median_chip_ns: float | None = None
    median_ops: float | None = None
    median_roofline_estimate_ns: float | None = None
    behind_steps: int = 0  # steady steps left out of the medians: the chip was behind the host when they began


# Per step of the rank: whether its first execution was launched before every earlier execution on its chip ended.
_BEHIND_SQL = (
    "SELECT step, MAX(earlier_end > start_ns) FROM (SELECT step, start_ns, ROW_NUMBER() OVER (PARTITION BY chip, step "
    "ORDER BY start_ns) AS position, MAX(start_ns + dur_ns) OVER (PARTITION BY chip ORDER BY start_ns ROWS BETWEEN "
    "UNBOUNDED PRECEDING AND 1 PRECEDING) AS earlier_end FROM executions WHERE rank = ? AND dur_ns IS NOT NULL) "
    "WHERE position = 1 AND earlier_end IS NOT NULL GROUP BY step"
)


def analyze(context: AnalysisContext) -> AnalysisResult[HostBoundData]:
    trace = context.trace
    if not context.steps:
        return AnalysisResult(NAME, HostBoundData())
    steady = context.steady_range
    dispatch = dispatch_by_step(context, *steady) if steady is not None else {}
    executed = context.busy_by_step(steady=True)
    peak, bandwidth = context.target.peak_bf16_flops, context.target.hbm_bandwidth
    e_where, e_params = context.steady_where("e")
    roofline = dict(trace.sql(
        "SELECT e.step, COALESCE(SUM(MAX(COALESCE(p.flops, 0) / ?, COALESCE(p.bytes_accessed, 0) / ?)), 0) * 1e9 "
        f"FROM executions e JOIN programs p ON p.id = e.program_id WHERE {e_where} GROUP BY e.step",
        (peak, bandwidth) + tuple(e_params),
    ))
    measured = bool(executed)
    behind = {step for step, late in trace.sql(_BEHIND_SQL, (context.rank,)) if late} if measured else set()
    strict = strict_mode_steps(context)
    if strict:  # strict mode's steps: the programs of the ops run outside flushes
        o_where, o_params = context.steady_where("o")
        roofline = dict(trace.sql(
            "SELECT o.step, COALESCE(SUM(MAX(COALESCE(p.flops, 0) / ?, COALESCE(p.bytes_accessed, 0) / ?)), 0) * 1e9 "
            f"FROM ops o JOIN programs p ON p.id = o.program_id WHERE {o_where} AND o.flush_id IS NULL GROUP BY o.step",
            (peak, bandwidth) + tuple(o_params),
        )) | roofline
    entered = first_compile_steps(context) & strict.keys() if measured else set()  # strict mode's first step, after a switch
    steps = []
    for step in context.steady_steps:
        if step.step == context.warm_up_in_steady or step.step in entered:
            continue  # its dispatch includes each op's first call
        step_dispatch_ns, step_ops = dispatch.get(step.step, (0, 0))
        step_waited_ns = 0
        if step.step in strict:
            step_dispatch_ns, step_waited_ns = strict[step.step].dispatch_ns, strict[step.step].chip_ns
        if not measured:
            step_chip_ns = roofline.get(step.step, 0.0)
        elif step.step in executed:
            step_chip_ns = executed[step.step]
        elif step.step in strict:  # a strict step of a run that switched modes: the chip's work in its ops' times
            step_chip_ns = float(step_waited_ns)
        else:
            continue  # no chip time recorded for the step
        steps.append(HostStep(step.step, step.dur_ns, step_dispatch_ns, step_ops, step_chip_ns,
                              roofline.get(step.step, 0.0), step_waited_ns, step.step in behind))
    chip_time = ("measured executions" + (" and strict ops' recorded times" if strict else "") if measured
                 else "target roofline estimate")
    behind_steps = sum(step.chip_behind for step in steps)
    all_steps, steps = tuple(steps), [step for step in steps if not step.chip_behind]
    if not steps:
        return AnalysisResult(NAME, HostBoundData(all_steps, chip_time, behind_steps=behind_steps))
    dispatch_ns = statistics.median(step.dispatch_ns for step in steps)
    chip_ns = statistics.median(step.chip_ns for step in steps)
    ops = statistics.median(step.ops for step in steps)
    roofline_ns = statistics.median(step.roofline_estimate_ns for step in steps)
    waited_ns = statistics.median(step.waited_ns for step in steps)
    data = HostBoundData(all_steps, chip_time, dispatch_ns, chip_ns, ops, roofline_ns, behind_steps)
    if dispatch_ns <= chip_ns or not ops:
        return AnalysisResult(NAME, data)
    gap_ns = dispatch_ns - chip_ns
    cost = gap_ns * context.step_count
    durations = [step.dur_ns for step in steps if step.dur_ns is not None]
    step_ns = float(statistics.median(durations)) if durations else 0.0
    idle_share = 1.0 - chip_ns / step_ns if step_ns else 0.0
    ratio = dispatch_ns / chip_ns if chip_ns else float("inf")
    severity: Severity = "warning" if ratio >= WARNING_RATIO and idle_share >= WARNING_IDLE_SHARE else "info"
    chip_label = "ran" if measured else "would run (target roofline estimate)"
    facts = context_import_facts(context)
    device = facts.device if facts is not None else "tpu"
    # An imported GPU (or MTIA) capture's device runs kernels; a TPU's (or this backend's) chip runs programs.
    chip, programs = (device, "kernels") if device in ("gpu", "mtia") else ("chip", "programs")
    evidence = [Evidence(f"median step {format_ns(step_ns)}: dispatch {format_ns(dispatch_ns)}, {chip} {format_ns(chip_ns)}",
                         table="ops")]
    if roofline_ns > 0:
        evidence.append(Evidence(f"roofline estimate on {context.target.label}: {format_ns(roofline_ns)} per step",
                                 table="programs"))
    if waited_ns:
        evidence.append(Evidence(f"{format_ns(waited_ns)} per step of the ops' recorded time was the {chip} running their "
                                 f"{programs} or waiting for earlier ones, not dispatch (each op counts at most its op's "
                                 "median time)", table="ops"))
    compile_text = ("`torch.compile(model, backend=\"tpu\")`" if device in ("tpu", "host") else
                    "`torch.compile(model)` (on a GPU, `mode=\"reduce-overhead\"` also replays the step as CUDA graphs)"
                    if device == "gpu" else "`torch.compile(model)`")
    finding = Finding(
        analyzer=NAME,
        severity=severity,
        title=(
            f"Host-bound steps: dispatching {ops:.0f} ops takes {format_ns(dispatch_ns)} per step, "
            f"the {chip} {chip_label} {format_ns(chip_ns)}"
        ),
        explanation=(
            f"In a median steady step the host spent {format_ns(dispatch_ns)} dispatching {ops:.0f} ops "
            f"({format_ns(dispatch_ns / ops)} each) while the {chip} {chip_label} {programs} for {format_ns(chip_ns)}: "
            f"the {chip} is idle about {idle_share:.0%} of the step waiting for Python.{_on_target(context, roofline_ns, chip_ns) if measured else ''}"
        ),
        suggestion=_outside_compiled_graphs(context) or _strict_mode_text(context) + (
            f"Give the {chip} more work per op: a larger batch per step, fewer tiny ops (fuse elementwise work, use "
            f"`foreach`/fused optimizers), or compile the step with {compile_text} so Python "
            "dispatches one graph instead of each op."
        ),
        cost_total_ns=float(cost),
        cost_per_step_ns=float(gap_ns),
        evidence=tuple(evidence),
    )
    return AnalysisResult(NAME, data, (finding,))


def _on_target(context: AnalysisContext, roofline_ns: float, chip_ns: float) -> str:
    """What the step's programs would take on the target, beside the measured chip time, where the trace has XLA's
    costs for them (an import of another device's capture has none)."""
    if roofline_ns <= 0:
        return ""
    outcome = "so the host would dominate even more" if roofline_ns < chip_ns else "so the chip's share would grow"
    return (f" On {context.target.label} the step's programs would take about {format_ns(roofline_ns)} (roofline "
            f"estimate from XLA's FLOPs and bytes), {outcome}.")


def _strict_mode_text(context: AnalysisContext) -> str:
    """For a run in a strict eager mode (one program launched per op, each waiting for its dispatch), the mode that
    fuses the step, first: the run's own choice, the cheapest change."""
    run = context.rank_run
    if run is None or run.eager_mode not in _STRICT_MODES:
        return ""
    option = "strict" if run.eager_mode == "DEFER_NEVER" else "blocking"
    spans = eager_mode_spans(context.trace, run)
    if len(spans) > 1:  # the script switched to the strict mode itself, part-way
        switch = spans[-1]
        where = f" (its first op in that mode at {switch.first_location.short})" if switch.first_location else ""
        return (f"The script switched from {spans[0].mode} to {run.eager_mode} in step {switch.first_step}{where}, "
                "one program launched per op from there: keep the steps in "
                "DEFER_AND_FUSE (switch back with `torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)` after "
                "the part that needs the strict mode), which runs each step's ops as a few fused programs. ")
    return (f"The run was in {run.eager_mode} mode (`--mode {option}`), one program launched per op: run it in "
            "DEFER_AND_FUSE (the default of `tputrace run`; in the script, "
            "`torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)`), which runs each step's ops as a few fused "
            f"programs, and keep `--mode {option}` for finding which op fails. ")


def _outside_compiled_graphs(context: AnalysisContext) -> str | None:
    """The advice for a recorded run whose steps run torch.compile graphs already: the ops dispatched one by one
    are those outside them (the loss, the optimizer step), which strict eager runs as a program each."""
    if context_import_facts(context) is not None or not context.trace.sql(
        "SELECT 1 FROM compiles WHERE rank = ? AND kind = 'dynamo_frame' LIMIT 1", (context.rank,),
    ):
        return None
    run = context.rank_run
    strict = run is not None and run.eager_mode in ("DEFER_NEVER", "COMPILE")
    return (
        "The model is compiled already: the ops Python dispatches one by one are those outside its graphs (the loss, "
        "the optimizer's update, metrics). Move them into the compiled function (compute the loss inside it; "
        "`torch.compile` a function that calls `optimizer.step()`)"
        + (", or run the eager ops in DeferAndFuse (`tputrace run --mode defer`, `torch.tpu.set_eager_mode`), which "
           "fuses them into a program per step." if strict else ".")
    )
