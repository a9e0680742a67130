"""A run in which no op reached the tpu device: the script's tensors stayed elsewhere (most often a
script written for CUDA, `device = "cuda" if torch.cuda.is_available() else "cpu"`, which chooses the
CPU), so nothing in it was traced. A critical finding that leads the report, with the script's lines
that choose a device when the trace holds the script's source."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tputrace.analysis.context import AnalysisContext
from tputrace.analysis.findings import AnalysisResult, Evidence, Finding
from tputrace.analysis.op_facts import op_count
from tputrace.derived.recording_window import recording_window
from tputrace.derived.run_endings import raised_line
from tputrace.wording import format_ns

NAME = "no_device_ops"
# Source lines that choose or name a device the way a CUDA script does.
DEVICE_CHOICE = re.compile(r"cuda|torch\.device\(|device\s*=|\.to\(")
MAX_LINES_SHOWN = 3
# the tpu backend's refusal of what a device written in Python cannot run
NOT_ON_TPU = re.compile(r"is not supported on tpu")
# torch's errors for a process group or device mesh made in a process no launcher started
RANKS_MISSING = re.compile(r"environment variable (RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT) expected|"
                           r"Default process group has not been initialized")


@dataclass(frozen=True)
class NoDeviceOpsData:
    """Whether any op reached the tpu device, and the script's device-choosing lines (file, line, text)."""

    device_ops: int
    device_lines: tuple[tuple[str, int, str], ...] = ()


def analyze(context: AnalysisContext) -> AnalysisResult[NoDeviceOpsData]:
    trace = context.trace
    where, params = "rank = ?", (context.rank,)
    device_ops = op_count(context) + trace.count("compiles", where=where, params=params)
    window = recording_window(trace)
    if device_ops or (window is not None and not window.recorded_steps):  # a window that never opened recorded nothing
        return AnalysisResult(NAME, NoDeviceOpsData(device_ops))
    script = trace.run.script
    lines = _device_lines(script, trace.source_copy(script)) if script else ()
    data = NoDeviceOpsData(0, lines)
    error = trace.run.error
    evidence = [
        Evidence(f"0 ops reached the tpu device in {format_ns(context.wall_ns)}: "
                 + ("the script raised before its first op" if error else "the script's tensors were made on another "
                    "device (the CPU, as torch.cuda.is_available() is false under tputrace run)")),
        *(Evidence(f"device named at line {line}: {text}", file=file, line=line) for file, line, text in lines),
    ]
    first = lines[0] if lines else None
    if error:
        # The script failed before it reached the device: the failure, not the device choice, is what to fix first.
        title = "The script raised before any op ran on the tpu device: nothing in this run was traced"
        explanation = (f"The run ended with {raised_line(error)} before any op reached the `tpu` device, so its ops, compiles and "
                       "syncs are not in the trace and no other finding can be made.")
        suggestion = ("Fix the error (its traceback is in the run's output) and run the script again; if the script "
                      "chooses its device the CUDA way, run it with `tputrace run --as-cuda` or choose `\"tpu\"`.")
        if NOT_ON_TPU.search(error):
            # the tpu backend's own refusal of an option (DDP's find_unused_parameters=True): its message says what instead
            suggestion = ("The tpu backend refused a call the script makes, and its error says what to write instead: "
                          "change the line it names and run the script again.")
        elif RANKS_MISSING.search(error):
            # a process group or device mesh made in one process that no launcher started (`--chips N` alone)
            suggestion = ("The script makes a process group or a device mesh, which needs one process per chip that a "
                          "launcher starts and tells its rank: run it with `tputrace run --nproc N` (N ranks, a mesh's size), "
                          "as torchrun would; `--chips N` gives one process N chips, which a model moves tensors between "
                          "itself (`tpu:0`, `tpu:1`).")
    else:
        title = "No op ran on the tpu device: nothing in this run was traced"
        explanation = ("tputrace records what runs on the `tpu` device. This run's tensors stayed on the CPU, so its "
                       "ops, compiles and syncs are not in the trace and no other finding can be made.")
        suggestion = ("Run the script unchanged with `tputrace run --as-cuda` (CUDA devices, `.cuda()` and "
                      "`torch.cuda.is_available()` then mean tpu), or choose the device `\"tpu\"` where the script "
                      "chooses its device.")
    finding = Finding(
        analyzer=NAME,
        severity="critical",
        title=title,
        explanation=explanation,
        suggestion=suggestion,
        cost_total_ns=float(context.wall_ns),
        evidence=tuple(evidence),
        file=first[0] if first else None,
        line=first[1] if first else None,
    )
    return AnalysisResult(NAME, data, (finding,))


def _device_lines(script: str, copy_path: str | None) -> tuple[tuple[str, int, str], ...]:
    """The first lines of the script (read from `copy_path`, a copy whose content the run saw) that
    choose or name a device."""
    if copy_path is None:
        return ()
    try:
        with open(copy_path, encoding="utf-8", errors="replace") as copy:
            source = copy.read()
    except OSError:
        return ()
    found: list[tuple[str, int, str]] = []
    for number, text in enumerate(source.splitlines(), start=1):
        code = text.split("#", 1)[0]
        if DEVICE_CHOICE.search(code):
            found.append((script, number, text.strip()))
            if len(found) == MAX_LINES_SHOWN:
                break
    return tuple(found)
