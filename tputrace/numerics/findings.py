"""The first divergent module call and the first non-finite value of a numerics recording, or of two
recordings of the same script compared call by call; and their text. Never imports torch."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tputrace.numerics.store import COMPARED, NOT_COMPARED, ModuleCall, NumericsRecording, OpRow
from tputrace.numerics.tolerance import digest_difference, tolerance_for
from tputrace.wording import plural


@dataclass(frozen=True)
class Divergence:
    """A module call whose values leave their reference: by how much, against which tolerance."""

    call: ModuleCall
    divergence: float
    tolerance: float
    max_abs_difference: float | None
    note: str | None


@dataclass(frozen=True)
class NumericsReport:
    """What `tputrace numerics` says about a recording (against the CPU) or a pair of recordings."""

    title: str
    calls: int
    steps: int
    compared: int
    first_divergence: Divergence | None
    first_nonfinite: ModuleCall | None
    reference_nonfinite: bool | None
    not_compared: list[tuple[str, str, int]]
    first_divergent_op: OpRow | None = None
    # Where the first NaN/Inf came into a call that was given it: the forward of the module that called it (its
    # own code, between module calls), or None for the script; unset when the call made it itself.
    nonfinite_given_by: str | None = None
    nonfinite_given: bool = False
    ops_only_on_tpu: tuple[str, ...] = ()

    @property
    def diverged(self) -> bool:
        return self.first_divergence is not None or self.first_nonfinite is not None


def replay_report(recording: NumericsRecording) -> NumericsReport:
    """The recording against its CPU replay."""
    calls = recording.calls
    divergent = next((call for call in calls if call.diverged), None)
    nonfinite = next((call for call in calls if call.nonfinite), None)
    given = nonfinite is not None and nonfinite.phase == "forward" and bool(nonfinite.input_nonfinite)
    given_by = nonfinite.module.rsplit(".", 1)[0] if given and nonfinite is not None and "." in nonfinite.module else None
    reference_nonfinite = None if nonfinite is None or not nonfinite.cpu else nonfinite.cpu_nonfinite > 0
    if given and nonfinite is not None:
        # The call's CPU replay was given the same NaN/Inf: what tells the model from the device is the replay of
        # the forward that made them (none for the script's own code).
        maker = next((call for call in calls[calls.index(nonfinite) + 1:] if call.phase == "forward"
                      and call.module == given_by and call.step == nonfinite.step), None) if given_by else None
        reference_nonfinite = None if maker is None or not maker.cpu else maker.cpu_nonfinite > 0
    skipped = Counter((call.module, call.reason or "") for call in calls if call.outcome == NOT_COMPARED)
    ops = recording.ops.get(divergent.event_id, []) if divergent is not None else []
    return NumericsReport(
        title=f"{recording.path} against its CPU replay",
        calls=len(calls),
        steps=max((call.step for call in calls), default=0),
        compared=sum(1 for call in calls if call.outcome == COMPARED),
        first_divergence=None
        if divergent is None
        else Divergence(
            divergent,
            divergent.divergence or math.inf,
            divergent.tolerance or 0.0,
            divergent.max_abs_difference,
            divergent.reason,
        ),
        first_nonfinite=nonfinite,
        reference_nonfinite=reference_nonfinite,
        not_compared=[(module, reason, count) for (module, reason), count in skipped.items()],
        first_divergent_op=next((op for op in ops if op.diverged), None),
        ops_only_on_tpu=tuple(dict.fromkeys(op.op_name for op in ops if op.cpu_dtype is None)),
        nonfinite_given_by=given_by,
        nonfinite_given=given,
    )


def _keyed(calls: Iterable[ModuleCall]) -> dict[tuple[int, str, str, int], ModuleCall]:
    """Calls keyed by (step, phase, module, how many calls of that module and phase came before in the step)."""
    seen: Counter[tuple[int, str, str]] = Counter()
    keyed = {}
    for call in calls:
        base = (call.step, call.phase, call.module)
        keyed[(*base, seen[base])] = call
        seen[base] += 1
    return keyed


def compare_report(recording: NumericsRecording, reference: NumericsRecording) -> NumericsReport:
    """`recording` against `reference` (two recordings of the same script), call by call on their tpu digests."""
    reference_calls = _keyed(reference.calls)
    first: Divergence | None = None
    nonfinite: ModuleCall | None = None
    reference_nonfinite: bool | None = None
    missing: Counter[tuple[str, str]] = Counter()
    compared = 0
    for key, call in _keyed(recording.calls).items():
        other = reference_calls.get(key)
        if other is None:
            missing[(call.module, "the reference recording has no such call")] += 1
            continue
        if nonfinite is None and call.nonfinite:
            nonfinite, reference_nonfinite = call, other.nonfinite > 0
        divergence = _digests_divergence(call, other)
        if divergence is None:
            missing[(call.module, "its tensors' shapes differ from the reference's")] += 1
            continue
        compared += 1
        if first is None and not divergence.divergence <= divergence.tolerance:
            first = divergence
    return NumericsReport(
        title=f"{recording.path} against {reference.path}",
        calls=len(recording.calls),
        steps=max((call.step for call in recording.calls), default=0),
        compared=compared,
        first_divergence=first,
        first_nonfinite=nonfinite,
        reference_nonfinite=reference_nonfinite,
        not_compared=[(module, reason, count) for (module, reason), count in missing.items()],
    )


def _digests_divergence(call: ModuleCall, reference: ModuleCall) -> Divergence | None:
    if set(call.tpu) != set(reference.tpu):
        return None
    worst: tuple[float, float, str | None] = (0.0, tolerance_for("float32"), None)
    for index, digest in call.tpu.items():
        expected = reference.tpu[index]
        if digest.shape != expected.shape:
            return None
        tolerance = tolerance_for(expected.dtype)
        if digest.nonfinite != expected.nonfinite:
            amount = math.inf
        else:
            amount = digest_difference(digest.l2_norm, digest.sample, expected.l2_norm, expected.sample)
        note = f"{digest.dtype} here, {expected.dtype} in the reference" if digest.dtype != expected.dtype else None
        if amount / tolerance > worst[0] / worst[1]:
            worst = (amount, tolerance, note)
    return Divergence(call, worst[0], worst[1], None, worst[2])


def nonfinite_mismatch(call: ModuleCall) -> str | None:
    """When a compared call's NaN/Inf differ between the tpu and its CPU reference, which side has how many (and,
    when only the reference has them, that its own kernel overflowed); else None."""
    if not call.cpu or call.nonfinite == call.cpu_nonfinite:
        return None
    counts = f"NaN/Inf: {call.nonfinite:,} on the tpu, {call.cpu_nonfinite:,} in the CPU reference"
    if call.nonfinite == 0:
        return (counts + ": the reference's own kernel overflows where the tpu's values are finite (the tpu computes "
                "half-precision normalisations, softmax and sums in float32 and rounds once)")
    return counts


def given_text(report: NumericsReport) -> str:
    """Where the first NaN/Inf came from when the call was given it in its inputs."""
    call = report.first_nonfinite
    assert call is not None
    maker = f"the code of {report.nonfinite_given_by}'s own forward" if report.nonfinite_given_by else "the script's code"
    return (f"its inputs already held {plural(call.input_nonfinite or 0, 'non-finite value')}: {maker} made them before "
            "this call, outside any module call")


def values_of(phase: str) -> str:
    """What a row of `phase` holds: a forward's outputs, a backward's input gradients, or (`parameters`) the
    module's own parameter gradients summed over the step."""
    return {"forward": "outputs", "backward": "input gradients", "parameters": "parameter gradients"}.get(phase, phase)


def _where(call: ModuleCall) -> str:
    place = f" at {Path(call.path).name}:{call.line}" if call.path else ""
    return f"{call.module} ({call.module_type}) {call.phase}, step {call.step}{',' if place else ''}{place}"


def render(report: NumericsReport) -> str:
    """The report as text lines."""
    lines = [
        f"numerics: {report.title}",
        f"  {plural(report.calls, 'module call')} (forward, backward and parameter gradients) in {plural(report.steps, 'step')}, {report.compared:,} compared",
    ]
    if report.first_divergence is None:
        lines.append("  no divergence beyond the tolerance")
    else:
        found = report.first_divergence
        lines.append(f"  first divergent module: {_where(found.call)}")
        detail = f"    relative difference {found.divergence:.3g} (tolerance {found.tolerance:.0e}"
        detail += f" for {found.call.reference_dtype})" if found.call.reference_dtype else ")"
        if found.max_abs_difference is not None:
            detail += f", largest absolute difference {found.max_abs_difference:.3g}"
        lines.append(detail)
        if found.note:
            lines.append(f"    dtype: {found.note}")
        mismatch = nonfinite_mismatch(found.call)
        if mismatch:
            lines.append(f"    {mismatch}")
        if found.call.path:
            lines.append(f"    called from {found.call.path}:{found.call.line}")
        op = report.first_divergent_op
        if op is not None:
            lines.append(
                f"    first divergent op inside it: #{op.op_index} aten.{op.op_name} ({op.tpu_dtype} on the tpu, {op.cpu_dtype} on the CPU), "
                f"relative difference {op.divergence:.3g}"
            )
        if report.ops_only_on_tpu:
            lines.append(
                f"    ops only the tpu run has: {', '.join('aten.' + name for name in report.ops_only_on_tpu)}"
            )
    if report.first_nonfinite is None:
        lines.append("  no NaN or Inf")
    else:
        call = report.first_nonfinite
        what = values_of(call.phase)
        lines.append(f"  first NaN/Inf: {_where(call)}: {plural(call.nonfinite, 'non-finite value')} in its {what}")
        if report.nonfinite_given:
            lines.append(f"    {given_text(report)}")
        if report.reference_nonfinite is True:
            lines.append("    the reference gives them too: the model's own arithmetic, not the device")
        elif report.reference_nonfinite is False:
            lines.append("    the reference has none there")
    for module, reason, count in report.not_compared:
        lines.append(f"  not compared: {module} ({plural(count, 'call')}): {reason}")
    return "\n".join(lines)
