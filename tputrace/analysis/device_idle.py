"""The devices idle between steps while the host prepares the next one (an XProf capture with steps).

A JAX loop whose input comes from Python (a generator that builds batches, a prefetch queue fed too slowly) keeps
its devices waiting: in each steady step the union of the programs' runs on all chips covers little of the step.
The idle time is the steady loop's time that no chip's program run, and no compile (the recompile findings' to
tell), covers (to the end of the last program its steps
launched: JAX dispatches asynchronously, so a step's programs may run after its marker ends). What the host did meanwhile is read
from its Python tracer frames (`$data.py:12 batches`) and TraceMe ranges (`jax.profiler.TraceAnnotation("load")`):
of the ranges that launched the programs of few steps (the loop's own frames launch them all; the capture does
not say which thread a range ran on, so a prefetching thread's ranges are read alike), the one that overlaps the idle
time most (at least a quarter of it), and the innermost of those that overlap nearly as much, is the host-side cause; the frameless or standard
library call inside it that took most of its time (`time sleep`, `queue get`) says what it waited on.

A capture's Python frames name a file by its basename only, so a frame is the standard library's when its basename is
a standard library module's and the function it names is defined there (in this Python's copy of the module): a
user's `data/random.py:6 make_batch` is the user's frame, a candidate cause, not `random`'s. A function the module
also defines (`get` in a user's `queue.py`) cannot be told apart and reads as the library's.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from bisect import bisect_left
from functools import lru_cache
from pathlib import Path
from dataclasses import dataclass

from tputrace.analysis.context import CRITICAL_SHARE, MIN_LISTED_COST_NS, AnalysisContext
from tputrace.analysis.findings import MEASURED_ON_HOST, Evidence, Finding
from tputrace.analysis.imported import jax_capture
from tputrace.importers.range_names import runtime_traceme
from tputrace.wording import format_ns, plural

MIN_STEPS = 3  # steady steps: fewer do not tell a loop's idle time from the start of a capture
MIN_IDLE_SHARE = 0.5  # of the steady steps' time: the devices idle most of each step
MIN_CAUSE_SHARE = 0.25  # of the idle time: a host range overlapping less of it is not what the devices waited for
NEAR_SHARE = 0.8  # a range overlapping this share of the best range's idle time is as much the cause
# Host ranges that are a jitted call or a launch of a program: the loop's body, not what kept the devices waiting.
_LAUNCHES = ("PjitFunction(%", "PmapFunction(%", "%::Execute%", "%ExecuteHelper%")
_STANDARD_LIBRARY = frozenset(sys.stdlib_module_names) | {"builtins"}
_HOST_BOUND_FIX = (
    "Find what the host does between the programs (a capture with the Python tracer's frames, or "
    "`jax.profiler.TraceAnnotation` ranges around the loop's parts, names it): Python work per step (input "
    "making, logging that reads device values), or many small jitted calls each launched alone. Jit the whole step "
    "as one function, run several steps per call (`jax.lax.scan` over a stack of batches), and make inputs ahead on "
    "another thread.")
_TORCH_INPUT_FIX = (
    "Make the next batch while the devices run the current step: load batches in DataLoader worker processes "
    "(`num_workers`, `persistent_workers=True`, a larger `prefetch_factor`) and copy them to the device ahead of use "
    "(PyTorch/XLA's `MpDeviceLoader`); move per-example Python work out of the loop or onto the device.")
_HAND_OFF_MODULES = frozenset(("queue", "threading", "multiprocessing", "concurrent", "asyncio"))


@dataclass(frozen=True)
class HostRange:
    """A host range (`data.py:12 batches`, a TraceMe's name): its time inside the idle time, its calls, the call inside
    it that took most of its time (`time sleep`), its frame."""

    name: str
    idle_ns: int
    calls: int
    waits_in: str | None
    frame_id: int | None
    hands_off: bool = False  # most of its time went to waiting for another thread's hand-off (`queue get`)


@dataclass(frozen=True)
class DeviceIdle:
    """The steady loop's time (`step_ns`: from its first step's start to the end of its last step or program run), the
    part of it no chip ran a program, the host range that overlapped it most and,
    where that range waited for a hand-off (a queue), the range that fed it."""

    steps: int
    step_ns: int
    idle_ns: int
    cause: HostRange | None
    fed_by: HostRange | None


def device_idle(context: AnalysisContext) -> DeviceIdle | None:
    """The devices' idle time in the steady loop, with its host-side cause; None without `MIN_STEPS` steady steps or
    program runs.

    The loop's span runs from its first steady step's start to its last's end, or to the end of the last program run
    launched before the next step (JAX dispatches asynchronously: a step's marker may end before its program runs,
    and the steps' programs run on after the loop's markers end while the host waits for the result)."""
    steady = [step for step in context.steady_steps if step.end_ns is not None]
    if len(steady) < MIN_STEPS or not context.trace.has_table("executions"):
        return None
    runs = sorted((int(start), int(start + dur)) for start, dur in context.trace.sql(
        "SELECT start_ns, dur_ns FROM executions WHERE rank = ? AND dur_ns IS NOT NULL", (context.rank,)))
    if not runs:
        return None
    compiling = sorted((int(start), int(start + dur)) for start, dur in context.trace.sql(
        "SELECT start_ns, dur_ns FROM compiles WHERE rank = ? AND dur_ns IS NOT NULL", (context.rank,))
    ) if context.trace.has_table("compiles") else []
    begin, end = steady[0].start_ns, max(int(step.end_ns or 0) for step in steady)
    later = [step.start_ns for step in context.steps
             if step.start_ns >= end and step.step > steady[-1].step and step.source != "end"]
    limit = min(later, default=None)
    end = max([end] + [stop for start, stop in runs if begin <= start and (limit is None or start < limit)])
    idle = _gaps([(begin, end)], sorted(runs + compiling))  # compiling is the recompile findings' to tell
    spans = [(step.start_ns, int(step.end_ns or 0)) for step in steady]
    return DeviceIdle(len(steady), end - begin, sum(stop - start for start, stop in idle), *_host_cause(context, idle, spans))


def device_idle_finding(context: AnalysisContext, analyzer: str, idle: DeviceIdle) -> Finding | None:
    share = idle.idle_ns / idle.step_ns if idle.step_ns else 0.0
    if share < MIN_IDLE_SHARE or idle.idle_ns < MIN_LISTED_COST_NS:
        return None
    per_step = idle.idle_ns / idle.steps
    title = f"The devices idle {share:.0%} of each step ({format_ns(per_step)} a step) waiting for the host"
    explanation = (f"Over the {plural(idle.steps, 'steady step')} ({format_ns(idle.step_ns)}, to the end of their last "
                   f"program's run) no chip ran a program, and nothing compiled, for "
                   f"{format_ns(idle.idle_ns)}: the loop is bound by the host, which had not launched the next step. ")
    evidence = [Evidence(f"programs ran {format_ns(idle.step_ns - idle.idle_ns)} of the steady loop's "
                         f"{format_ns(idle.step_ns)}", table="executions")]
    cause, fed_by = idle.cause, idle.fed_by
    frame_id = None
    if cause is not None:
        waits = f", most of it in `{cause.waits_in}`" if cause.waits_in else ""
        explanation += (f"Meanwhile the host was in {cause.name}, {format_ns(cause.idle_ns)} of the idle time over "
                        f"{plural(cause.calls, 'call')}{waits}, in no jitted call")
        evidence.append(context.evidence_at(f"{cause.name}: {format_ns(cause.idle_ns)} while no program ran{waits}",
                                            cause.frame_id, table="annotations"))
        shown, frame_id = cause, cause.frame_id
        if fed_by is not None:
            fed_waits = f", most of it in `{fed_by.waits_in}`" if fed_by.waits_in else ""
            explanation += (f": it waits for a hand-off, and the busiest range meanwhile is {fed_by.name} "
                            f"({format_ns(fed_by.idle_ns)} of the idle time over {plural(fed_by.calls, 'call')}"
                            f"{fed_waits}), which makes what it waits for too slowly")
            evidence.append(context.evidence_at(f"{fed_by.name}: {format_ns(fed_by.idle_ns)} while no program ran"
                                                f"{fed_waits}", fed_by.frame_id, table="annotations"))
            shown, frame_id = fed_by, fed_by.frame_id if fed_by.frame_id is not None else frame_id
        title += f": meanwhile the host is in {shown.name}"
        explanation += (". Whatever the host does there (making the next input in Python, a prefetch queue fed too "
                        "slowly, logging), the devices wait for it.")
    else:
        explanation += ("The host's capture names no range outside the jitted calls to tell what it did meanwhile: "
                        "a capture with the Python tracer's frames, or a `jax.profiler.TraceAnnotation` around the "
                        "input code, names it.")
    return Finding(
        analyzer=analyzer,
        severity="critical" if share >= 1 - CRITICAL_SHARE else "warning",
        title=title,
        explanation=explanation,
        suggestion=(_HOST_BOUND_FIX if cause is None else _TORCH_INPUT_FIX if not jax_capture(context) else
            "Make the next batch while the devices run the current step: prepare batches on background threads or "
            "processes (a `tf.data` or Grain pipeline with its own workers and `prefetch`, or a thread filling a "
            "`queue.Queue` a few batches ahead) and put them on the devices ahead of use (`jax.device_put` of the next "
            "batch before calling the step; Flax's `jax_utils.prefetch_to_device`); move per-example Python work "
            "into vectorised NumPy or into the jitted step. JAX dispatches asynchronously, so a step's launch returns "
            "at once and the input of the next one can be made meanwhile."),
        cost_total_ns=per_step * context.step_count,
        cost_per_step_ns=per_step,
        cost_basis=MEASURED_ON_HOST,
        evidence=tuple(evidence),
        **context.location_fields(frame_id),
    )


def _gaps(spans: list[tuple[int, int]], runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `spans` that no run covers (runs sorted by start)."""
    gaps: list[tuple[int, int]] = []
    for begin, end in spans:
        cursor = begin
        for start, stop in runs:
            if stop <= cursor:
                continue
            if start >= end:
                break
            if start > cursor:
                gaps.append((cursor, start))
            cursor = max(cursor, stop)
        if cursor < end:
            gaps.append((cursor, end))
    return gaps


def _overlap(start: int, end: int, intervals: list[tuple[int, int]]) -> int:
    return sum(max(0, min(end, stop) - max(start, begin)) for begin, stop in intervals)


def _host_cause(context: AnalysisContext, idle: list[tuple[int, int]], spans: list[tuple[int, int]]
                ) -> tuple[HostRange | None, HostRange | None]:
    """The host range that overlapped the idle time most (ranges that launched the programs of many steps are the
    loop's, not it) and, where it waited for a hand-off (`queue get`), the busiest other range meanwhile: what fed it."""
    first, last = spans[0][0], spans[-1][1]
    launches = sorted((int(start), int(step) if step is not None else -1) for start, step in context.trace.sql(
        "SELECT a.start_ns, a.step FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.rank = ? AND a.source = "
        f"'traceme' AND ({' OR '.join('s.text LIKE ?' for _ in _LAUNCHES)})", (context.rank, *_LAUNCHES)))
    step_names = {name for (name,) in context.trace.sql(
        "SELECT DISTINCT s.text FROM annotations a JOIN strings s ON s.id = a.name_sid JOIN steps st ON "
        "st.rank = a.rank AND a.start_ns = st.start_ns WHERE a.rank = ?", (context.rank,))}
    loop_launches = max(3, len(spans) // 2)  # steps a range launched that make it the loop's
    totals: dict[str, list[int]] = {}  # name -> [idle overlap, calls, time, frame]
    spans_of: dict[str, list[tuple[int, int]]] = {}
    library: list[tuple[int, int, str]] = []  # frameless or standard library calls: start, end, name
    for name, start, dur, frame_id, source in context.trace.sql(
        "SELECT s.text, a.start_ns, a.dur_ns, a.frame_id, a.source FROM annotations a JOIN strings s ON "
        "s.id = a.name_sid WHERE a.rank = ? AND a.source IN ('python', 'traceme') AND a.start_ns < ? AND "
        "a.start_ns + a.dur_ns > ?", (context.rank, last, first)):
        end = int(start) + int(dur or 0)
        if name in step_names or (source == "traceme" and runtime_traceme(name)):
            continue
        if source == "python" and (frame_id is None or _standard_library(name)):
            library.append((int(start), end, name))
            continue
        if _launches_in(launches, int(start), end) >= loop_launches:
            continue  # the loop's own frame (it launched the steps), not what a step waited for
        entry = totals.setdefault(name, [0, 0, 0, int(frame_id) if frame_id is not None else -1])
        entry[0] += _overlap(int(start), end, idle)
        entry[1] += 1
        entry[2] += end - int(start)
        spans_of.setdefault(name, []).append((int(start), end))
    least = MIN_CAUSE_SHARE * sum(end - start for start, end in idle)
    cause = _nearest(totals, spans_of, library, least)
    if cause is None or not cause.hands_off:
        return cause, None
    fed_by: HostRange | None = cause
    while fed_by is not None and fed_by.hands_off:  # past the ranges that wait for the hand-off too (those around it)
        del totals[fed_by.name]
        fed_by = _nearest(totals, spans_of, library, least)
    return cause, fed_by


def _nearest(totals: dict[str, list[int]], spans_of: dict[str, list[tuple[int, int]]],
             library: list[tuple[int, int, str]], least: float) -> HostRange | None:
    """Of the ranges overlapping the idle time most (at least `least`, and `NEAR_SHARE` of the most), the one with the
    least time of its own: the innermost of nested frames that each hold the wait."""
    best = max((value[0] for value in totals.values()), default=0)
    if not best or best < least:
        return None
    name, (overlap, calls, own, frame) = min(
        ((name, value) for name, value in totals.items() if value[0] >= NEAR_SHARE * best), key=lambda item: item[1][2])
    inside: dict[str, int] = {}
    for start, end in spans_of[name]:
        for call_start, call_end, call in library:
            if start <= call_start and call_end <= end:
                inside[call] = inside.get(call, 0) + call_end - call_start
    hand_offs = [call for call in inside if _hand_off(call)]
    hands_off = bool(hand_offs) and 2 * max(inside[call] for call in hand_offs) >= own
    waits_in = max(hand_offs if hands_off else inside, key=lambda call: inside[call]) if inside else None
    return HostRange(name, overlap, calls, waits_in, frame if frame >= 0 else None, hands_off)


def _hand_off(call: str) -> bool:
    """Whether a call waits for another thread or process to hand something over (`queue get`, a lock's `acquire`)."""
    module = call.split(" ", 1)[0].split(":", 1)[0].removesuffix(".py")
    return module in _HAND_OFF_MODULES or call.endswith((" acquire", " get", " wait", " recv"))


def _launches_in(launches: list[tuple[int, int]], start: int, end: int) -> int:
    """How many steps' launches (sorted by start) started in [start, end)."""
    first, stop = bisect_left(launches, (start, -1)), bisect_left(launches, (end, -1))
    return len({step for _, step in launches[first:stop]})


def _spans_of(context: AnalysisContext, name: str) -> list[tuple[int, int]]:
    return [(int(start), int(start) + int(dur or 0)) for start, dur in context.trace.sql(
        "SELECT a.start_ns, a.dur_ns FROM annotations a JOIN strings s ON s.id = a.name_sid WHERE a.rank = ? AND "
        "s.text = ?", (context.rank, name))]


def _standard_library(name: str) -> bool:
    """A Python tracer frame of the standard library (`queue.py:171 get`, `threading.py:320 wait`): a standard
    library module's basename, naming a function that module defines (or one no source tells: `<lambda>`)."""
    place, _, function = name.partition(" ")
    module = place.split(":", 1)[0].removesuffix(".py")
    if module not in _STANDARD_LIBRARY:
        return False
    if not place.split(":", 1)[0].endswith(".py") or not function.isidentifier():
        return True  # a builtin's call (`time sleep`), or a frame no definition names
    defined = _defined_names(module)
    return defined is None or function in defined


@lru_cache(maxsize=64)
def _defined_names(module: str) -> frozenset[str] | None:
    """The functions and classes a standard library module's source defines, from this Python's copy of it (read,
    not imported); None where it has no source."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in (root / f"{module}.py", root / module / "__init__.py"):
        try:
            source = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        return frozenset(re.findall(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)", source, re.MULTILINE))
    return None
