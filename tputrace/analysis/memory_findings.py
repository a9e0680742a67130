"""The memory analyzer's findings where the trace has buffer lifetimes: an out-of-memory failure's live set,
the peak against the target with what holds it and the changes that would fit it, and lines that keep
buffers across steps."""

from __future__ import annotations

import os

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Evidence, Finding
from tputrace.analysis.imported import context_import_facts
from tputrace.analysis.kept_by import keeping_line
from tputrace.analysis.memory_fit import MemoryFit
from tputrace.analysis.memory_growth import SurvivingLine
from tputrace.analysis.memory_loops import PilingLine, kept_value_line, same_loop
from tputrace.analysis.memory_oom import OutOfMemoryData
from tputrace.analysis.memory_peak import PeakBreakdown, PeakPart
from tputrace.wording import format_bytes

NAME = "memory"
WARNING_HBM_SHARE = 0.85
GROWTH_MIN_BYTES_PER_STEP = 64 << 10
GROWTH_MIN_SHARE = 0.2
EVIDENCE_PARTS = 6


def buffer_findings(context: AnalysisContext, peaks: tuple[PeakBreakdown, ...], fits: tuple[MemoryFit, ...],
                    lines: tuple[SurvivingLine, ...], oom_error: OutOfMemoryData | None,
                    growth: tuple[float, int, int] | None, piling: tuple[PilingLine, ...] = ()) -> tuple[Finding, ...]:
    """Findings from buffer lifetimes; `oom_error` is the out-of-memory error the run failed with and the live set then."""
    findings: list[Finding] = []
    if oom_error is not None:
        findings.append(_oom_finding(context, oom_error))
    for peak, chip_fit in zip(peaks, fits):
        finding = _fit_finding(context, peak, chip_fit)
        if finding is not None:
            findings.append(finding)
    finding = _growth_finding(context, lines, growth)
    if finding is not None:
        findings.append(finding)
    finding = _piling_finding(context, piling)
    if finding is not None:
        findings.append(finding)
    return tuple(findings)


def _piling_finding(context: AnalysisContext, piling: tuple[PilingLine, ...]) -> Finding | None:
    """Live memory rising across the iterations of a loop without steps (a validation loop after training), at the
    line of the value each iteration keeps (made last of those piling up), with the lines whose buffers it keeps."""
    if not piling:
        return None
    kept = kept_value_line(piling)
    together = same_loop(piling)
    per_iteration = sum(line.bytes_per_iteration for line in together)
    if per_iteration < GROWTH_MIN_BYTES_PER_STEP:
        return None
    where = _short(kept)
    keeping = keeping_line(context.trace, kept.file, kept.line)
    kept_at = f"{where.rsplit(':', 1)[0]}:{keeping.line}" if keeping is not None else where
    kept_by = f", and `{keeping.text}` at {kept_at} keeps it" if keeping is not None else ": something keeps it"
    after = "after the training loop's last step" if context.step_count else "in a run without steps"
    held = "; ".join(f"{_short(line)} ({format_bytes(line.bytes_per_iteration)} an iteration)" for line in together[:4])
    evidence = [Evidence(f"{format_bytes(line.bytes_per_iteration)} an iteration piles up, {line.iterations} "
                         "iterations live at once", file=line.file, line=line.line, module=line.module, table="buffers")
                for line in together[:EVIDENCE_PARTS]]
    if keeping is not None:
        evidence.insert(0, Evidence(f"`{keeping.text}` keeps the value made at {where}", file=kept.file, line=keeping.line))
    return Finding(
        analyzer=NAME,
        severity="warning",
        title=(f"Live memory grows by {format_bytes(per_iteration)} every iteration of a loop without steps: the value "
               f"made at {where} is kept" + (f" at {kept_at}" if keeping is not None else "") + " with what it holds"),
        explanation=(f"In a loop {after}, {together[0].iterations} iterations' buffers were live at once, "
                     f"{format_bytes(sum(line.peak_bytes for line in together))} in all: {held}. The value made at "
                     f"{where} is the last of them each iteration{kept_by}: a value computed with autograd on keeps its "
                     "graph's activations alive with it."),
        suggestion=((f"At {kept_at}, keep" if keeping is not None else "Keep")
                    + f" what the loop needs of the value made at {where} without its graph: append `.detach()` "
                    "(or read `.item()` once after the loop) instead of the tensor, and run an evaluation loop under "
                    "`torch.no_grad()` (or `torch.inference_mode()`) so no graph is built."),
        cost_total_ns=0.0,
        cost_per_step_ns=None,
        evidence=tuple(evidence),
        file=kept.file,
        line=keeping.line if keeping is not None else kept.line,
        module=None if keeping is not None else kept.module,
    )


def _short(line: PilingLine) -> str:
    return f"{(line.file or '?').rsplit('/', 1)[-1]}:{line.line}"


def part_evidence(parts: tuple[PeakPart, ...], limit: int = EVIDENCE_PARTS) -> tuple[Evidence, ...]:
    return tuple(
        Evidence(f"{format_bytes(part.bytes)} {part.kind.replace('_', ' ')}"
                 f"{' (estimated share of a fused program)' if part.estimated else ''}: {part.where}",
                 file=part.file, line=part.line, module=part.module, table="buffers")
        for part in parts[:limit]
    )


def describe_peak(peak: PeakBreakdown, moment: str = "At the peak") -> str:
    """One paragraph: what was live at the peak (or another `moment`) by kind, the modules and lines holding most,
    and what is unattributed."""
    kinds = ", ".join(f"{kind.replace('_', ' ')} {format_bytes(nbytes)}" for kind, nbytes in peak.by_kind)
    modules = ", ".join(f"{module} {format_bytes(nbytes)}" for module, nbytes in peak.by_module[:4])
    text = (f"{moment} (step {peak.step}) {format_bytes(peak.bytes)} was live: {kinds}. Modules holding most: {modules}. "
            f"The largest part: {format_bytes(peak.parts[0].bytes)} of {peak.parts[0].kind.replace('_', ' ')} made at "
            f"{peak.parts[0].where}." if peak.parts else f"{moment} (step {peak.step}) {format_bytes(peak.bytes)} was live.")
    if peak.unattributed_bytes:
        text += f" {format_bytes(peak.unattributed_bytes)} was made outside the script's own lines (no user line)."
    if abs(peak.coverage - 1) > 0.05:
        text += (f" The buffers sum to {peak.coverage:.0%} of the measured peak ({format_bytes(peak.measured_peak_bytes)}): "
                 "some memory was allocated before recording began or outside the tracked buffers.")
    return text


def _oom_finding(context: AnalysisContext, oom: OutOfMemoryData) -> Finding:
    live = oom.live
    top = live.parts[0] if live.parts else None
    failed_at = f"{os.path.basename(oom.file)}:{oom.line}" if oom.file and oom.line else None
    held = f"most held by {top.where}" if top else ""
    title = f"The run ran out of memory on tpu:{live.chip}" + (f" at {failed_at}" if failed_at else "")
    title += (f"; {held}" if failed_at else f": {held}") if held else ""
    failed_evidence = (Evidence(f"the allocation that failed: {failed_at}", file=oom.file, line=oom.line),) if failed_at else ()
    return Finding(
        analyzer=NAME,
        severity="critical",
        title=title,
        explanation=f"It failed with `{oom.message}`" + (f" at {failed_at}" if failed_at else "")
        + f". {describe_peak(live, 'When it failed')}",
        suggestion=_oom_suggestion(live),
        cost_total_ns=float(context.wall_ns),
        cost_per_step_ns=context.per_step(context.wall_ns),
        evidence=failed_evidence + part_evidence(live.parts),
        file=oom.file if failed_at else top.file if top else None,
        line=oom.line if failed_at else top.line if top else None,
        module=top.module if top else None,
        cost_basis="measured on this host",
    )


def _oom_suggestion(live: PeakBreakdown) -> str:
    kinds = dict(live.by_kind)
    if kinds.get("parameter", 0) + kinds.get("gradient", 0) + kinds.get("optimizer_state", 0) < live.bytes / 2:
        return ("Most of it is activations and temporaries: a smaller batch with gradient accumulation, activation "
                "checkpointing on the largest blocks, or bfloat16 activations. `tputrace report --target CHIP` estimates each.")
    return ("Most of it is parameters, gradients and optimizer state: shard them (FSDP, fully_shard) or keep them in "
            "bfloat16. `tputrace report --target CHIP` estimates each.")


def _fit_finding(context: AnalysisContext, peak: PeakBreakdown, chip_fit: MemoryFit) -> Finding | None:
    share = chip_fit.padded_peak_bytes / chip_fit.hbm_bytes if chip_fit.hbm_bytes else 0.0
    if share < WARNING_HBM_SHARE:
        return None
    top = peak.parts[0] if peak.parts else None
    padding = chip_fit.padded_peak_bytes - chip_fit.peak_bytes
    padded = f" ({format_bytes(chip_fit.padded_peak_bytes)} padded to its tiles)" if padding > 0 else ""
    if chip_fit.fits:
        title = (f"Peak memory on tpu:{peak.chip} is {format_bytes(chip_fit.peak_bytes)}{padded}, {share:.0%} of "
                 f"{chip_fit.target}'s {format_bytes(chip_fit.hbm_bytes)} HBM")
    else:
        title = (f"tpu:{peak.chip}'s peak of {format_bytes(chip_fit.peak_bytes)}{padded} would not fit the "
                 f"{format_bytes(chip_fit.hbm_bytes)} HBM of {chip_fit.target}: {format_bytes(chip_fit.over_bytes)} over")
    fitting = [change for change in chip_fit.changes if change.fits]
    listed = fitting or list(chip_fit.changes[:3])
    changes = "; ".join(f"{change.description}: peak about {format_bytes(change.peak_bytes)}"
                        f"{'' if change.fits else ' (still over)'}" for change in listed)
    suggestion = (f"Changes that fit it, each estimated: {changes}." if fitting else
                  f"No single change estimated here fits it; the closest: {changes}." if listed else
                  "Reduce the peak: a smaller batch with accumulation, activation checkpointing, bfloat16 or FSDP.")
    return Finding(
        analyzer=NAME,
        severity="critical" if not chip_fit.fits else "warning",
        title=title,
        explanation=describe_peak(peak),
        suggestion=suggestion,
        # A run that does not fit loses all of its time; one near the limit costs nothing measurable yet.
        cost_total_ns=float(context.wall_ns) if not chip_fit.fits else 0.0,
        cost_per_step_ns=context.per_step(context.wall_ns) if not chip_fit.fits else None,
        evidence=part_evidence(peak.parts),
        file=top.file if top else None,
        line=top.line if top else None,
        module=top.module if top else None,
    )


def _growth_finding(context: AnalysisContext, lines: tuple[SurvivingLine, ...],
                    growth: tuple[float, int, int] | None) -> Finding | None:
    if growth is not None:
        per_step, first, last = growth
        if per_step < GROWTH_MIN_BYTES_PER_STEP or last < first * (1 + GROWTH_MIN_SHARE):
            return None
        explanation = (f"Live bytes at the end of each steady step rose from {format_bytes(first)} to {format_bytes(last)}: "
                       "something keeps tensors from every step alive.")
    else:
        kept = sum(line.bytes_per_step for line in lines if line.steps >= 3)
        if kept < GROWTH_MIN_BYTES_PER_STEP:
            return None
        per_step = kept
        explanation = "Buffers made in one step are still live steps later, step after step."
    by_function = _frames_are_functions(context)
    placed = [line for line in lines if line.file is not None] if by_function else list(lines)
    if lines and not placed:
        explanation += (" The capture has no Python stacks to say which code made them: profile with "
                        "`with_stack=True` to name the function that makes them.")
    elif by_function:
        explanation += (" torch.profiler's Python stacks name the function that made them, at its `def` line, not "
                        "the line in it.")
    if placed:
        explanation += " Lines whose buffers outlive their step: " + "; ".join(
            f"{_short_surviving(line, by_function)}{f' in {line.module}' if line.module else ''} ({format_bytes(line.bytes_per_step)} "
            f"a step, {line.steps} steps)" for line in placed[:3]) + "."
    top = placed[0] if placed else None
    evidence = [Evidence(f"{format_bytes(line.bytes_per_step)} a step of {line.kind} survives", file=line.file, line=line.line,
                         module=line.module, table="buffers") for line in lines[:EVIDENCE_PARTS]]
    keeping = keeping_line(context.trace, top.file, top.line, data_too=True) if top is not None else None
    title = f"Live memory grows by {format_bytes(per_step)} every step"
    suggestion = ("Look for tensors kept across steps: losses or outputs appended to a list without `.detach()` (or "
                  "`.item()`), growing caches, or state created inside the loop.")
    if top is not None and keeping is not None:
        made_at = _short_surviving(top)
        kept_at = f"{made_at.rsplit(':', 1)[0]}:{keeping.line}"
        title += f": the value made at {made_at} is kept at {kept_at} every step"
        graph = (" It was computed with autograd on, so it keeps its graph's activations alive with it."
                 if top.kind == "activation" and ".detach()" not in keeping.text else "")
        explanation += f" `{keeping.text}` at {kept_at} keeps the value made at {made_at} each step.{graph}"
        suggestion = (f"At {kept_at}, keep what later code needs instead of every step's tensor: a Python number "
                      "(`.item()` every N steps or after the loop), a running sum on the chip, or a bounded window "
                      "(drop old entries, move them to the host with `.cpu()`)"
                      + ("; compute the value under `torch.no_grad()` or keep `.detach()` of it so no graph is kept."
                         if graph else "."))
        evidence.insert(0, Evidence(f"`{keeping.text}` keeps the value made at {made_at}", file=top.file, line=keeping.line))
    elif top is not None:
        title += f": buffers made {'in' if by_function else 'at'} {_short_surviving(top, by_function)} survive"
    elif lines:
        title += ": the capture has no Python stacks to say where the kept tensors are made"
    return Finding(
        analyzer=NAME,
        severity="warning",
        title=title,
        explanation=explanation,
        suggestion=suggestion,
        cost_total_ns=0.0,
        cost_per_step_ns=None,
        evidence=tuple(evidence),
        file=top.file if top else None,
        line=(keeping.line if keeping is not None else top.line) if top else None,
        module=(None if keeping is not None else top.module) if top else None,
    )


def _short_surviving(line: SurvivingLine, by_function: bool = False) -> str:
    place = f"{(line.file or '?').rsplit('/', 1)[-1]}:{line.line}"
    return f"{line.function} ({place})" if by_function and line.function else place


def _frames_are_functions(context: AnalysisContext) -> bool:
    """Whether the rank's frames are functions at their `def` lines (a torch.profiler capture's Python stacks)."""
    facts = context_import_facts(context)
    return facts is not None and facts.format == "torch_profiler_json"