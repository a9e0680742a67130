"""Device time spent in host callbacks, on an imported capture with device op times (an XProf capture of JAX).

A host callback (`jax.debug.print`, `jax.debug.callback`, `jax.pure_callback`, `io_callback`) stops the program at
that op: its operands go to the host, the Python function runs there, and the program waits for its result. The op
is known by JAX's primitive, the last part of its `op_name` (the import's `module`: `jit(step)/pure_callback`), or
by its name (`debug_print.1`, XLA:CPU's) or its custom call's target (`xla_ffi_python_cpu_callback`). Its time not
overlapped by compute on the same device is the wait; the callbacks' share of the devices' busy time makes the finding.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import Finding, Severity
from tputrace.wording import format_ns, plural

MAX_EVIDENCE = 5
_PRIMITIVE = re.compile(r"^(?:pure_callback|io_callback|debug_callback|debug_print|python_callback|callback)"
                        r"(?:\.\d+|\[.*)?$")
_TARGET = re.compile(r"python_\w*callback|callback_\w*python")


@dataclass(frozen=True)
class HostCallback:
    """The runs of one callback op of a program: where it was called, its device time and the part of it waited."""

    op: str
    primitive: str
    program: str | None
    frame_id: int | None
    calls: int
    devices: int
    device_ns: int
    waiting_ns: int


def is_callback(name: str, module: str | None) -> bool:
    """Whether the device op `name` (JAX's `op_name` `module`) is a host callback."""
    scope = (module or "").rsplit("/", 1)[-1]
    return bool(_PRIMITIVE.match(scope) or _PRIMITIVE.match(name) or _TARGET.search(name))


def host_callbacks(context: AnalysisContext, rows: list[tuple[Any, ...]], waits: list[int],
                   program_name: Callable[[int | None], str | None]) -> list[HostCallback]:
    """The callback rows (name sid, chip, start, duration, …, program id, frame id, module sid) and their waits,
    grouped by op and program, most waited first."""
    trace = context.trace
    groups: dict[tuple[int, int | None], list[tuple[tuple[Any, ...], int]]] = {}
    for row, wait in zip(rows, waits):
        groups.setdefault((row[0], row[6]), []).append((row, wait))
    found = []
    for (name_sid, program_id), members in groups.items():
        name = trace.string(name_sid) or "?"
        module = trace.string(members[0][0][8])
        scope = (module or "").rsplit("/", 1)[-1]
        primitive = (scope if _PRIMITIVE.match(scope) else re.sub(r"\.\d+$", "", name)).split("[", 1)[0]
        found.append(HostCallback(
            name, primitive, program_name(program_id),
            next((row[7] for row, _ in members if row[7] is not None), None), len(members),
            len({row[1] for row, _ in members}), sum(row[3] or 0 for row, _ in members),
            sum(wait for _, wait in members)))
    return sorted(found, key=lambda callback: -callback.waiting_ns)


def callback_finding(context: AnalysisContext, unit: str, time_name: str, devices: int, busy_ns: int, wall_ns: int,
                     callbacks: list[HostCallback], severity: Severity) -> Finding:
    """The devices' waits for host callbacks, each callback's line, and what to change."""
    waiting_ns = sum(callback.waiting_ns for callback in callbacks)
    share = waiting_ns / busy_ns
    per_device = waiting_ns / max(devices, 1)
    wall_share = waiting_ns / (wall_ns * devices) if wall_ns and devices else 0.0
    located = next((callback for callback in callbacks if callback.frame_id is not None), None)
    primitives = sorted({callback.primitive for callback in callbacks},
                        key=lambda primitive: -sum(c.waiting_ns for c in callbacks if c.primitive == primitive))
    calls = sum(callback.calls for callback in callbacks)
    owners = f"{unit}'s" if devices == 1 else f"{devices} {unit}s'"
    return Finding(
        analyzer="data_movement",
        severity=severity,
        title=(f"The {unit}s wait for host callbacks ({', '.join(primitives)}): {share:.0%} of their {time_name} "
               f"({format_ns(per_device)} per {unit})" if devices > 1 else
               f"The {unit} waits for host callbacks ({', '.join(primitives)}): {share:.0%} of its {time_name}"),
        explanation=(
            f"{format_ns(waiting_ns)} of the {owners} {format_ns(busy_ns)} of {time_name} ({share:.0%}; "
            f"{wall_share:.0%} of the capture's {format_ns(wall_ns)} wall time on every {unit}) went to "
            f"{plural(calls, 'host callback run')} while no compute ran on the same {unit}: at each one the program "
            "stops, sends the callback's operands to the host, runs its Python function there and waits for the result."),
        suggestion=("Keep host callbacks out of the step once it is debugged: return the values to print or log from the "
                    "jitted function and print them outside it (every N steps) instead of `jax.debug.print`/"
                    "`jax.debug.callback` inside it; compute what a `jax.pure_callback` computes on the host with "
                    "`jnp`/`lax` ops that run on the device."),
        cost_total_ns=float(per_device),
        cost_per_step_ns=context.per_step(per_device),
        evidence=tuple(context.evidence_at(
            f"{callback.op} ({callback.primitive}){f' in {callback.program}' if callback.program else ''}: "
            f"{plural(callback.calls, 'run')} on {plural(callback.devices, unit)}, waited {format_ns(callback.waiting_ns)} "
            f"({format_ns(callback.waiting_ns / callback.calls)} a run) of its {format_ns(callback.device_ns)}",
            callback.frame_id, table="ops") for callback in callbacks[:MAX_EVIDENCE]),
        **context.location_fields(located.frame_id if located else None),
    )
