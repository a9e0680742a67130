"""The words of the `data_movement` findings: devices waiting for data to move, and devices sitting idle."""

from __future__ import annotations

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Evidence, Finding, Severity
from tputrace.analysis.moved_arrays import DEVICE_TO_HOST, HOST_TO_DEVICE, DataMovementData, MovedArray
from tputrace.wording import format_bytes, format_ns, plural

MAX_EVIDENCE = 5
MIN_EVIDENCE_SHARE = 0.01  # an op with a smaller share of the waits is not listed


def movement_finding(context: AnalysisContext, device: str, data: DataMovementData, arrays: list[MovedArray],
                     severity: Severity) -> Finding:
    """The devices' waits for data movement, the arrays moved, and what to change."""
    share = data.waiting_ns / data.busy_ns
    per_device = data.waiting_ns / max(data.devices, 1)
    host_ns = sum(array.waiting_ns for array in arrays if array.direction in (HOST_TO_DEVICE, DEVICE_TO_HOST))
    host = host_ns > 0
    kinds = sorted({array.kind for array in arrays})
    directions = sorted({array.direction for array in arrays if array.waiting_ns}, key=lambda direction: -sum(
        array.waiting_ns for array in arrays if array.direction == direction))
    memory = "HBM" if device == "tpu" else "device memory"
    what = (f"copies between host memory and {memory}" if host_ns * 2 >= data.waiting_ns else
            f"data movement ({', '.join(directions)})")
    time_name = "device op time" if device == "tpu" else "busy time"
    unit = unit_name(device)
    located = next((array for array in arrays if array.frame_id is not None), None)
    wall_share = data.waiting_ns / (data.wall_ns * data.devices) if data.wall_ns and data.devices else 0.0
    return Finding(
        analyzer="data_movement",
        severity=severity,
        title=(f"The {unit}s wait for {what}: {share:.0%} of their {time_name} ({format_ns(per_device)} per {unit})"
               if data.devices > 1 else f"The {unit} waits for {what}: {share:.0%} of its {time_name}"),
        explanation=(
            f"{format_ns(data.waiting_ns)} of the {_owners(data.devices, unit)} {format_ns(data.busy_ns)} of {time_name} "
            f"({share:.0%}; {wall_share:.0%} of the capture's {format_ns(data.wall_ns)} wall time on every {unit}) "
            f"went to ops that move data while no compute ran on the same {unit}: "
            + ("each waits in `copy-done` for an asynchronous copy started by its `copy-start`. "
               if "async copy" in kinds else "")
            + _moved_text(arrays) + "."),
        suggestion=_advice(arrays, host, device),
        cost_total_ns=float(per_device),
        cost_per_step_ns=context.per_step(per_device),
        evidence=tuple(_evidence(context, array, data, unit) for array in
                       [array for array in arrays if array.waiting_ns >= data.waiting_ns * MIN_EVIDENCE_SHARE][:MAX_EVIDENCE]),
        **context.location_fields(located.frame_id if located else None),
    )


def idle_finding(context: AnalysisContext, device: str, data: DataMovementData) -> Finding:
    """Devices that sat idle most of a capture without steps."""
    capacity = data.wall_ns * data.devices
    idle_ns = max(data.idle_ns - data.compile_ns * data.devices, 0)  # compiles explain the rest
    unit = unit_name(device)
    subject = f"The {unit}s" if data.devices > 1 else f"The {unit}"
    return Finding(
        analyzer="data_movement",
        severity="info",
        title=(f"{subject} sat idle for {idle_ns / capacity:.0%} of the capture"
               + (" outside compiles" if data.compile_ns else "")
               + f" ({format_ns(data.busy_ns / data.devices)} busy per {unit} in {format_ns(data.wall_ns)})"),
        explanation=(f"Over the capture's {format_ns(data.wall_ns)} on {plural(data.devices, unit)}, the ops and kernels "
                     f"ran for {format_ns(data.busy_ns)} in all"
                     + (f" (and compiles took {format_ns(data.compile_ns)})" if data.compile_ns else "")
                     + ", and they waited for no data movement worth a finding: "
                     "the devices were waiting for the host to give them work, or the capture spans time outside the "
                     "work (start-up, a pause)."),
        suggestion=("Capture a window of the steady loop (mark steps, e.g. `jax.profiler.StepTraceAnnotation` or "
                    "torch.profiler's `schedule`, so the report can judge each step), and look at the host's timeline in "
                    "that window for what keeps the devices waiting: input loading, host syncs, Python between steps."),
        cost_total_ns=float(idle_ns / data.devices),
    )


def unit_name(device: str) -> str:
    """What one of a capture's devices is called: a TPU's chip, a GPU."""
    return {"tpu": "chip", "gpu": "GPU", "mtia": "MTIA device"}.get(device, "device")


def _owners(devices: int, unit: str) -> str:
    return f"{unit}'s" if devices == 1 else f"{devices} {unit}s'"


def _moved_text(arrays: list[MovedArray]) -> str:
    sized = [array for array in arrays if array.bytes]
    directions = sorted({array.direction for array in arrays})
    text = f"{plural(len(arrays), 'op')} moved data ({', '.join(directions)})"
    if sized:
        calls = sum(array.calls for array in sized)
        moved = sum((array.bytes or 0) * array.calls for array in sized)
        text += f", {format_bytes(moved)} in {plural(calls, 'copy', 'copies')}"
    return text


def _evidence(context: AnalysisContext, array: MovedArray, data: DataMovementData, unit: str) -> Evidence:
    size = (f" {array.shape} ({format_bytes(array.bytes)})" if array.shape and array.bytes else
            f", {format_bytes(array.bytes)} a run" + (" on average" if array.calls > 1 else "") if array.bytes else "")
    made = ""
    if array.made_by:
        made = f", the result of {array.made_by}" if not array.made_by.startswith("param") else f", parameter {array.made_by}"
        made += f" ({array.made_by_name})" if array.made_by_name else ""
    program = f" in {array.program}" if array.program else ""
    share = array.waiting_ns / data.waiting_ns if data.waiting_ns else 0.0
    text = (f"{array.op}{program}: {array.kind} {array.direction}{size}{made}; "
            f"{plural(array.calls, 'run')} on {plural(array.devices, unit)}, waited {format_ns(array.waiting_ns)} "
            f"({format_ns(array.waiting_ns / array.calls)} a run; {share:.0%} of the waits) of its {format_ns(array.device_ns)}")
    return context.evidence_at(text, array.frame_id, table="ops" if array.kind != "memcpy" else "executions")


def _advice(arrays: list[MovedArray], host: bool, device: str) -> str:
    if device == "tpu" or any(array.kind == "async copy" for array in arrays):
        advice = []
        if host:
            advice.append("keep these arrays in device memory where they fit (JAX: place them with "
                          "`memory_kind=\"device\"` rather than `\"pinned_host\"`, or drop the host-offload policy "
                          "that moves them)")
        advice.append("start each copy earlier so that it overlaps compute (its `copy-start` well before the op that "
                      "needs it, e.g. prefetching the next layer's weights while this one computes)")
        advice.append("move fewer bytes: a lower precision (bf16 halves f32) or smaller arrays")
        text = "; ".join(advice)
        return text[0].upper() + text[1:] + "."
    if host:
        return ("Copy host data from pinned memory (`pin_memory()`, a DataLoader's `pin_memory=True`) with "
                "`.to(device, non_blocking=True)` so that the copy overlaps kernels; keep tensors on the device between "
                "steps (no `.cpu()`/`.item()` every step); move fewer bytes (a lower precision, smaller batches of "
                "metrics).")
    return "Avoid copies the computation does not need (`.clone()`, `.contiguous()` of large tensors), or overlap them with compute."
