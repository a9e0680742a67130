"""Memory: peak live bytes per chip against the target's HBM, growth across steps, and what holds memory at
the peak.

Where the trace has buffer lifetimes (`buffers`, format 3) the peak is broken down by kind, module and line
(`memory_peak`), fitted to the target with padding and the changes that would fit it (`memory_fit`), surviving
lines explain growth (`memory_growth`), and an out-of-memory failure leads with its live set (`memory_oom`).
Without them (an older trace) the "largest tensors" are the largest outputs each module produced: candidates
for what fills memory at the peak, not a measured breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.analysis.memory_findings import buffer_findings
from tputrace.analysis.memory_batch import model_batch
from tputrace.analysis.memory_fit import MemoryFit, fit
from tputrace.analysis.memory_growth import SurvivingLine, step_ends, surviving_lines
from tputrace.analysis.memory_loops import PilingLine, piling_lines
from tputrace.analysis.memory_oom import OutOfMemoryData, out_of_memory
from tputrace.analysis.memory_peak import PeakBreakdown, breakdown
from tputrace.analysis.op_facts import module_outputs
from tputrace.analysis.shapes import tensors
from tputrace.derived.memory_timeline import buffer_lifetimes, chips_of, peak_of
from tputrace.wording import format_bytes

NAME = "memory"
WARNING_HBM_SHARE = 0.85
GROWTH_MIN_BYTES_PER_STEP = 1 << 20
GROWTH_MIN_SHARE = 0.2


@dataclass(frozen=True)
class ChipMemory:
    """One chip's peak and largest live bytes, and the peak's share of the target's HBM. Chip -1 is an imported
    capture's host memory (torch.profiler's CPU samples): labelled so, and never weighed against HBM."""

    chip: int
    peak_bytes: int
    max_live_bytes: int
    hbm_share: float | None  # None for host memory
    label: str  # "tpu:N" or "host memory"

    @property
    def is_host(self) -> bool:
        return self.chip < 0


@dataclass(frozen=True)
class LargestTensor:
    """The largest output tensor a module produced."""

    module: str
    bytes: int
    tensor: str


@dataclass(frozen=True)
class MemoryData:
    chips: tuple[ChipMemory, ...] = ()
    largest_tensors_by_module: tuple[LargestTensor, ...] = ()
    live_bytes_growth_per_step: float | None = None  # None unless live bytes grew every steady step
    peaks: tuple[PeakBreakdown, ...] = ()  # per chip, then host memory's, from buffer lifetimes (none in an older trace)
    fits: tuple[MemoryFit, ...] = ()  # per chip of `peaks`, in its order, against the target; none for host memory
    surviving_lines: tuple[SurvivingLine, ...] = ()
    out_of_memory: OutOfMemoryData | None = None
    piling_lines: tuple[PilingLine, ...] = ()  # outside the loop's steps (see `memory_loops`)


def analyze(context: AnalysisContext) -> AnalysisResult[MemoryData]:
    trace = context.trace
    findings: list[Finding] = []
    hbm = context.target.hbm_bytes
    chips = trace.sql(
        "SELECT chip, MAX(COALESCE(peak_bytes, 0)), MAX(COALESCE(live_bytes, 0)) FROM memory WHERE rank = ? "
        "GROUP BY chip ORDER BY chip",
        (context.rank,),
    )
    chip_memory = tuple(ChipMemory(chip, peak, live, None, "host memory") if chip < 0 else
                        ChipMemory(chip, peak, live, peak / hbm, f"tpu:{chip}") for chip, peak, live in chips)
    largest = _largest_by_module(context)
    measured = {chip: peak for chip, peak, _ in chips}
    lifetimes = _from_buffers(context, measured)
    if lifetimes is not None:
        peaks, fits, lines, oom, piling = lifetimes
        growth = _growth(context)
        data = MemoryData(chip_memory, tuple(largest), growth[0] if growth else None, peaks, fits, lines, oom, piling)
        oom_error = oom if oom is not None and oom.cause == "error" else None
        return AnalysisResult(NAME, data, buffer_findings(context, peaks, fits, lines, oom_error, growth, piling))
    module_evidence = tuple(
        Evidence(f"{row.module}: largest output {row.tensor} ({format_bytes(row.bytes)})", module=row.module,
                 table="ops")
        for row in largest[:5]
    )
    for chip, peak, _ in chips:
        share = peak / hbm
        if chip < 0 or share < WARNING_HBM_SHARE:
            continue
        fits = share <= 1.0
        findings.append(Finding(
            analyzer=NAME,
            severity="warning" if fits else "critical",
            title=(
                f"Peak memory on tpu:{chip} is {format_bytes(peak)}, {share:.0%} of {context.target.label}'s "
                f"{format_bytes(hbm)} HBM" + ("" if fits else ": it would not fit")
            ),
            explanation=(
                f"Live tensors on tpu:{chip} peaked at {format_bytes(peak)}. "
                + ("That leaves little room for XLA's temporaries and padding on the target."
                   if fits else "On the target this run would fail with an out-of-memory error.")
            ),
            suggestion=(
                "Reduce the peak: a smaller batch per chip with gradient accumulation, activation checkpointing "
                "(`torch.utils.checkpoint`) on the largest blocks, bfloat16 activations, or sharding the model "
                "across chips (FSDP)."
            ),
            # A run that does not fit loses all of its time; one near the limit costs nothing measurable yet.
            cost_total_ns=float(context.wall_ns) if not fits else 0.0,
            cost_per_step_ns=context.per_step(context.wall_ns) if not fits else None,
            evidence=module_evidence,
        ))
    growth = _growth(context)
    data = MemoryData(chip_memory, tuple(largest), growth[0] if growth else None)
    if growth is not None:
        per_step, first, last = growth
        if per_step >= GROWTH_MIN_BYTES_PER_STEP and last >= first * (1 + GROWTH_MIN_SHARE):
            findings.append(Finding(
                analyzer=NAME,
                severity="warning",
                title=f"Live memory grows by {format_bytes(per_step)} every step",
                explanation=(
                    f"Live bytes at the end of each steady step rose from {format_bytes(first)} to "
                    f"{format_bytes(last)}: something keeps tensors from every step alive."
                ),
                suggestion=(
                    "Look for tensors kept across steps: losses or outputs appended to a list without `.detach()` "
                    "(they keep the whole graph), growing caches, or state created inside the loop."
                ),
                cost_total_ns=0.0,
                cost_per_step_ns=None,
                evidence=module_evidence,
            ))
    return AnalysisResult(NAME, data, tuple(findings))


def _from_buffers(context: AnalysisContext, measured: dict[int, int]) -> tuple[
        tuple[PeakBreakdown, ...], tuple[MemoryFit, ...], tuple[SurvivingLine, ...], OutOfMemoryData | None,
        tuple[PilingLine, ...]] | None:
    """Peak breakdowns, fits, surviving lines, the out-of-memory moment and the lines piling up buffers outside the
    loop's steps, from buffer lifetimes; None without them."""
    trace = context.trace
    buffers = buffer_lifetimes(trace, context.rank)
    if not buffers:
        return None
    peaks, fits = [], []
    # Chips first, then host memory (chip -1), whose peak is broken down but never fitted to the target's HBM.
    for chip in sorted(chips_of(buffers), key=lambda chip: (chip < 0, chip)):
        peak = peak_of(buffers, chip)
        if peak is None:
            continue
        chip_breakdown = breakdown(trace, context.rank, peak, measured.get(chip, peak.bytes))
        peaks.append(chip_breakdown)
        if chip < 0:
            continue
        parameter_shapes = {buffer.shape for buffer in peak.live if buffer.kind == "parameter" and buffer.shape}
        batch = model_batch(trace, context.rank, chip_breakdown.step, parameter_shapes)
        fits.append(fit(chip_breakdown, peak.live, context.target, batch))
    lines = surviving_lines(trace, buffers, step_ends(trace, context.rank))
    run = context.rank_run
    oom = out_of_memory(buffers, run.error if run is not None else None, int(context.target.hbm_bytes),
                        run.script if run is not None else None)
    oom_data = None
    if oom is not None:
        oom_data = OutOfMemoryData(oom.cause, oom.message, breakdown(trace, context.rank, oom.live, measured.get(oom.live.chip, oom.live.bytes)),
                                   oom.file, oom.line)
    piling = piling_lines(trace, context.rank, buffers, {step.step for step in context.loop_steps})
    return tuple(peaks), tuple(fits), lines, oom_data, piling


def _largest_by_module(context: AnalysisContext, limit: int = 10) -> list[LargestTensor]:
    """The largest output tensor each module produced, largest first."""
    trace = context.trace
    best: dict[str, tuple[int, str]] = {}
    for module_sid, outputs_sid in module_outputs(context):
        module = trace.string(module_sid) or "?"
        for spec in tensors(trace.string(outputs_sid)):
            if spec.nbytes > best.get(module, (0, ""))[0]:
                best[module] = (spec.nbytes, str(spec))
    ranked = sorted(best.items(), key=lambda item: -item[1][0])[:limit]
    return [LargestTensor(module, nbytes, text) for module, (nbytes, text) in ranked]


def _growth(context: AnalysisContext) -> tuple[float, int, int] | None:
    """(bytes per step, first, last) of live bytes at the end of the steady steps, per chip 0's samples, when they
    never fell and rose in at least half of the steps (and two)."""
    steady = context.steady_steps
    if len(steady) < 3:
        return None
    samples = []
    for step in steady:
        if step.end_ns is None:
            continue
        row = context.trace.sql(
            "SELECT SUM(live_bytes) FROM memory WHERE rank = ? AND t_ns = "
            "(SELECT MAX(t_ns) FROM memory WHERE rank = ? AND t_ns <= ?)",
            (context.rank, context.rank, step.end_ns),
        )
        if row and row[0][0] is not None:
            samples.append(int(row[0][0]))
    if len(samples) < 3:
        return None
    increasing = all(later >= earlier for earlier, later in zip(samples, samples[1:]))
    rises = sum(later > earlier for earlier, later in zip(samples, samples[1:]))
    if not increasing or rises < max(2, (len(samples) - 1) / 2):  # one jump (a table made once) is no growth
        return None
    return (samples[-1] - samples[0]) / (len(samples) - 1), samples[0], samples[-1]
