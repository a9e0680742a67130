"""A numerics report as findings, for `tputrace report` on a numerics recording and for the views: the first
divergent module call, the first NaN/Inf, and the modules that could not be compared. Never imports torch.

Numerics cost no time, so each finding's cost is 0; the severity ranks them: values that leave the CPU's
beyond the tolerance, or a NaN/Inf the CPU does not give, are warnings (critical for a NaN/Inf); a NaN/Inf
the CPU gives too, and modules not compared, are info.
"""

from __future__ import annotations

from tputrace.analysis.findings import Evidence, Finding
from tputrace.numerics.findings import NumericsReport, given_text, nonfinite_mismatch, values_of
from tputrace.numerics.store import ModuleCall
from tputrace.wording import plural

ANALYZER = "numerics"


def numerics_findings(report: NumericsReport) -> tuple[Finding, ...]:
    """The findings of `report`, most severe first."""
    findings = []
    if report.first_divergence is not None:
        findings.append(_divergence_finding(report))
    if report.first_nonfinite is not None:
        findings.append(_nonfinite_finding(report))
    for module, reason, count in report.not_compared:
        findings.append(Finding(
            ANALYZER, "info", f"Not compared with the CPU: {module} ({plural(count, 'call')})",
            f"{reason}.", "Record it with --modules to keep its full tensors, or compare two recordings "
            "(tputrace numerics --compare A B) where its inputs are the same.", 0.0, module=module))
    order = {"critical": 0, "warning": 1, "info": 2}
    return tuple(sorted(findings, key=lambda finding: order[finding.severity]))


def _divergence_finding(report: NumericsReport) -> Finding:
    found = report.first_divergence
    assert found is not None
    call = found.call
    evidence = [Evidence(f"relative difference {found.divergence:.3g}, tolerance {found.tolerance:.0e}"
                         + (f" for {call.reference_dtype}" if call.reference_dtype else ""), call.path, call.line,
                         call.module)]
    if found.max_abs_difference is not None:
        evidence.append(Evidence(f"largest absolute difference {found.max_abs_difference:.3g}"))
    if found.note:
        evidence.append(Evidence(f"dtype: {found.note}"))
    mismatch = nonfinite_mismatch(call)
    if mismatch:
        evidence.append(Evidence(mismatch))
    op = report.first_divergent_op
    if op is not None:
        evidence.append(Evidence(f"first divergent op inside it: #{op.op_index} aten.{op.op_name} ({op.tpu_dtype} on the "
                                 f"tpu, {op.cpu_dtype} on the CPU), relative difference {op.divergence:.3g}"))
    if report.ops_only_on_tpu:
        evidence.append(Evidence("ops only the tpu run has: " + ", ".join(f"aten.{name}" for name in report.ops_only_on_tpu)))
    dtype_hint = (" The tpu computed it in another dtype than the CPU: look for an autocast region or a cast "
                  "in it." if found.note else "")
    if mismatch and call.nonfinite == 0:
        dtype_hint += (f" Here the CPU reference has NaN/Inf where the tpu has none: its {call.reference_dtype or ''} "
                       "kernel overflows; the model is close to its dtype's range there (an epsilon too small for "
                       "half precision, a value past its largest).")
    return Finding(
        ANALYZER, "warning", f"Numerics: {_where(call)} leaves the CPU's values ({found.divergence:.3g} relative, "
        f"tolerance {found.tolerance:.0e})",
        f"The first module call, in execution order, whose {_values(call)} differ from its CPU replay from the same "
        f"inputs beyond the tolerance of its dtype. Every call is judged from its own recorded inputs, so this is "
        f"where the difference starts.{dtype_hint}",
        _divergence_advice(report),
        0.0, evidence=tuple(evidence), file=call.path, line=call.line, module=call.module)


def _divergence_advice(report: NumericsReport) -> str:
    op = report.first_divergent_op
    if op is not None and op.cpu_dtype and op.tpu_dtype != op.cpu_dtype:
        return (f"Compute aten.{op.op_name} in {op.cpu_dtype}, as the CPU does: take the module out of the autocast "
                "region or remove the cast before it.")
    if op is not None:
        return (f"aten.{op.op_name} gives other values than the CPU's in the same dtype: compare it in strict mode "
                "(--mode strict) to tell the op's lowering from the fused program.")
    return ("Record again with --ops to name the op inside it, and in strict mode (--mode strict) to tell a lowering "
            "from the fused program; if a cast or autocast makes it, keep the module in float32.")


def _nonfinite_finding(report: NumericsReport) -> Finding:
    call = report.first_nonfinite
    assert call is not None
    if report.nonfinite_given:
        return _given_nonfinite_finding(report, call)
    if report.reference_nonfinite:
        return Finding(
            ANALYZER, "info", f"NaN/Inf first in {_where(call)}, as on the CPU",
            f"{plural(call.nonfinite, 'non-finite value')} in its {_values(call)}; the CPU replay gives them too, "
            "so they come from the model's own arithmetic, not the device.",
            "Guard the operation that makes them (a log or a division of zero, an overflow in a low precision).",
            0.0, file=call.path, line=call.line, module=call.module)
    cpu = "the CPU replay has none there" if report.reference_nonfinite is False else "it was not replayed on the CPU"
    return Finding(
        ANALYZER, "critical", f"NaN/Inf first in {_where(call)} on the tpu",
        f"{plural(call.nonfinite, 'non-finite value')} in its {_values(call)}; {cpu}.",
        "Run it in strict mode with --ops to find the op, and compare its dtype with the CPU's.",
        0.0, file=call.path, line=call.line, module=call.module)


def _where(call: ModuleCall) -> str:
    return f"{call.module} ({call.module_type}) {call.phase}, step {call.step}"


def _values(call: ModuleCall) -> str:
    return values_of(call.phase)


def _given_nonfinite_finding(report: NumericsReport, call: ModuleCall) -> Finding:
    """The first NaN/Inf reached a module in its inputs: made by code between module calls, before the line
    that called it."""
    maker = f"{report.nonfinite_given_by}'s forward" if report.nonfinite_given_by else "the script"
    cpu = {True: "; the CPU replay of that forward gives them too, so they come from the model's own arithmetic",
           False: "; the CPU replay of that forward has none", None: ""}[report.reference_nonfinite]
    return Finding(
        ANALYZER, "info" if report.reference_nonfinite else "critical",
        f"NaN/Inf first made in {maker} before it calls {call.module} ({call.module_type}), step {call.step}",
        f"{given_text(report)}{cpu}.",
        f"Guard the operations of {maker} that run before this line (an exp or a division that overflows, a log of "
        "zero, a softmax written without subtracting the maximum).",
        0.0, file=call.path, line=call.line, module=report.nonfinite_given_by)
