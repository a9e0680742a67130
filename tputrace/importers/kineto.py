"""What Kineto (torch.profiler's tracer) writes on devices, read by the torch.profiler importer: the category names
of each Kineto version and device (CUDA, ROCm, MTIA), the runtime calls that block the host until the device is done
(host syncs), the collectives NCCL kernels and `record_param_comms` ops describe in their args, and timestamps
written with nanosecond digits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tputrace.dtypes import PROFILER_NAMES, SCALAR_TYPES, element_bytes
from tputrace.importers.json_events import read_header

# Category -> the category the importer reads it as: older Kineto's capitalised names, and other devices' names.
CATEGORIES = {
    "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime", "Driver": "cuda_runtime",
    "cuda_driver": "cuda_runtime", "Operator": "cpu_op", "Python": "python_function",
    # MTIA: the device's command processor events are its device ops; the runtime's calls are its launches.
    "mtia_ccp_events": "kernel", "mtia_runtime": "cuda_runtime",
}
# Categories whose device ops ran on a device other than a GPU: category -> the device's name.
DEVICE_OF_CATEGORY = {"mtia_ccp_events": "mtia", "mtia_runtime": "mtia"}
# `collectives.kind` of a process group's collective's name, lowercased, without `_` and suffixes.
_COLLECTIVE_KINDS = {
    "allreduce": "all_reduce", "allgather": "all_gather", "gather": "all_gather", "reducescatter": "reduce_scatter",
    "scatter": "reduce_scatter", "broadcast": "broadcast", "alltoall": "all_to_all", "send": "send", "recv": "recv",
    "recvanysource": "recv", "barrier": "barrier",
}

# Runtime calls that block the host until the device has done the work before them (CUDA runtime and driver, HIP, MTIA).
SYNC_CALLS = frozenset((
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH", "cuMemcpyDtoH_v2",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy", "hipMemcpyWithStream",
    "synchronizeStream",  # MTIA's host call (its `synchronize` events are the device's side, on the device's pid)
))
# The CPU op a sync happened in -> `syncs.kind` (else `synchronize`).
SYNC_OP_KINDS = {
    "aten::_local_scalar_dense": "item", "aten::item": "item", "aten::is_nonzero": "bool",
    "aten::copy_": "cpu", "aten::_to_copy": "cpu", "aten::to": "cpu",
    "aten::nonzero": "data_dependent", "aten::masked_select": "data_dependent", "aten::unique": "data_dependent",
    "aten::_unique2": "data_dependent", "aten::repeat_interleave": "data_dependent",
}

# The first pass's test for NCCL kernels that carry their collective in their args (Kineto 2023 on).
COLLECTIVE_KERNEL_TEXT = re.compile(r'"cat"\s*:\s*"kernel"[^}]*"Collective name"')
# ... and `record_param_comms` ops that do.
COLLECTIVE_OP_TEXT = re.compile(r'"name"\s*:\s*"record_param_comms"[^}]*"Collective name"')
COLLECTIVE_ARG = "Collective name"


def comms_facts(args: dict[str, Any]) -> tuple[str, int | None, str | None, str | None, str | None, int | None]:
    """(collective name, bytes, dtype, process group, its ranks, group size) from the args Kineto gives an NCCL kernel and the
    `record_param_comms` op that launched it: the larger of the input and output element counts (an all-gather's
    output, a reduce-scatter's input) times the dtype's size."""
    name = str(args.get(COLLECTIVE_ARG) or "")
    dtype = args.get("dtype")
    size = element_bytes(SCALAR_TYPES.get(str(dtype)))
    counts = [value for value in (args.get("In msg nelems"), args.get("Out msg nelems")) if isinstance(value, int)]
    nbytes = max(counts) * size if size and counts else None
    group = args.get("Process Group Description") or args.get("Process Group Name")
    ranks = args.get("Process Group Ranks")
    ranks_text = ",".join(re.findall(r"-?\d+", ranks)) if isinstance(ranks, str) else None
    size_arg = args.get("Group size")
    group_size = size_arg if isinstance(size_arg, int) else None
    return (name, nbytes, str(dtype).lower() if dtype else None, str(group) if group else None, ranks_text or None,
            group_size)


def bus_bandwidth(kind: str, nbytes: int | None, dur_ns: int, group_size: int | None) -> float | None:
    """Bus bandwidth (bytes/s) of a collective over `group_size` ranks, as nccl-tests counts it: an all-reduce
    moves 2(n-1)/n of its bytes over each rank's link, an all-gather, reduce-scatter or all-to-all (n-1)/n."""
    if not nbytes or dur_ns <= 0 or not group_size or group_size < 2:
        return None
    factor = {"all_reduce": 2 * (group_size - 1) / group_size, "all_gather": (group_size - 1) / group_size,
              "reduce_scatter": (group_size - 1) / group_size, "all_to_all": (group_size - 1) / group_size}.get(kind, 1.0)
    return nbytes * factor / (dur_ns / 1e9)


# A timestamp written with more digits than a double holds: Kineto's nanosecond `ts` in microseconds since the
# Unix epoch (`1712195495519689.047`), whose last digits a float loses (its step there is 0.25 µs). Times on a
# monotonic clock (`4458676524648.797`, 13 digits) lose under 2 ns and are read as floats.
_EXACT_TS = re.compile(r'"ts"\s*:\s*(\d{13,})\.(\d+)')


def exact_offset(head: str) -> int | None:
    """The whole microseconds to subtract from every timestamp of a file whose first `ts` (in `head`) has more
    digits than a float keeps, so that they keep their nanoseconds; None for a file whose times a float holds."""
    match = _EXACT_TS.search(head)
    if match is None or len(match.group(1)) < 14:  # below 10^13 µs a float's step is under 2 ns
        return None
    # About a second before that `ts`: the file's times stay small, and none of its events' lands on 0, the time of
    # metadata events, which a start must skip.
    return int(match.group(1)) - (1 << 20)


def exact_floats(offset_us: int) -> Callable[[str], float]:
    """A `parse_float` for `json.loads` that reads a number with at least 13 whole digits as its value less
    `offset_us`, exactly (the whole part as an integer, the fraction apart), and any other as a float."""

    def parse(text: str) -> float:
        if len(text) > 13 and text[0] != "-":
            whole, dot, fraction = text.partition(".")
            if dot and len(whole) >= 13 and whole.isdigit() and fraction.isdigit():
                return (int(whole) - offset_us) + float("0." + fraction)
        return float(text)

    return parse


def exact_or_float(offset_us: int | None) -> Callable[[str], float]:
    return float if offset_us is None else exact_floats(offset_us)


_WAITING_KEPT = 1 << 16


class LaunchSteps:
    """Puts each kernel in the step of the runtime call that launched it (`cudaLaunchKernel`, `hipLaunchKernel`,
    matched by their `correlation`), not the step during which the device ran it: the GPU runs a step's work
    while the host goes on to the next; and gives it where the launch was made (its time and thread, for the user's
    frame around it). Kineto writes a kernel next to its launch (CUDA: just before it; ROCm: a few dozen events
    after), so only the unmatched of each are kept, the latest 2^16; a kernel whose launch is not found is in the
    step during which it ran."""

    def __init__(self, emit: Callable[[Any, int, Any], None]) -> None:
        self.emit = emit  # writes a kernel's rows in a step, with where it was launched (None: not known)
        self.launches: dict[Any, tuple[int, Any]] = {}  # correlation -> the launch's step and place
        self.waiting: dict[Any, tuple[Any, int]] = {}  # correlation -> (kernel, the step it ran in)

    def kernel(self, correlation: Any, kernel: Any, step: int) -> None:
        if correlation is None:
            self.emit(kernel, step, None)
            return
        launched = self.launches.pop(correlation, None)
        if launched is not None:
            self.emit(kernel, *launched)
            return
        self.waiting[correlation] = (kernel, step)
        if len(self.waiting) > _WAITING_KEPT:
            for key in list(self.waiting)[:_WAITING_KEPT // 2]:
                self.emit(*self.waiting.pop(key), None)

    def launch(self, correlation: Any, step: int, where: Any) -> None:
        waiting = self.waiting.pop(correlation, None)
        if waiting is not None:
            self.emit(waiting[0], step, where)
            return
        self.launches[correlation] = (step, where)
        if len(self.launches) > _WAITING_KEPT:
            for key in list(self.launches)[:_WAITING_KEPT // 2]:
                del self.launches[key]

    def finish(self) -> None:
        """Write the kernels whose launch never came, in the step they ran in."""
        for kernel, step in self.waiting.values():
            self.emit(kernel, step, None)
        self.waiting.clear()
        self.launches.clear()


# CUPTI's range profiler (torch.profiler's `experimental_config` with `profiler_metrics`): a `cuda_profiler_range`
# event per kernel, its args the kernel's counters; the profiler replays each kernel to read them, so the range's time
# is the replay's, not the kernel's, and the CPU ops around the launches hold the replays.
PROFILER_RANGE = "cuda_profiler_range"
# Per-thread instruction counts of floating-point adds, multiplies and fused multiply-adds (double, single, half):
# a kernel's FLOPs are the adds and multiplies plus twice the FMAs.
_FLOP_COUNTER = re.compile(r"^smsp__sass_thread_inst_executed_op_[dfh](add|mul|fma)_pred_on\.sum$")
_UNNAMED_KERNEL = "__missing__"  # a range whose kernel's name CUPTI did not give


class ProfilerRanges:
    """The `cuda_profiler_range` events of a capture: per kernel name, its ranges and FLOPs (where the counters
    hold them), and the counters read."""

    def __init__(self) -> None:
        self.ranges = 0
        self.kernels: dict[str, list[float]] = {}  # name -> [ranges, FLOPs over them]
        self.counted: set[str] = set()  # kernels whose ranges hold FLOP counters
        self.metrics: set[str] = set()

    def add(self, name: str, args: Any) -> None:
        self.ranges += 1
        if name == _UNNAMED_KERNEL:
            return
        entry = self.kernels.setdefault(name, [0, 0.0])
        entry[0] += 1
        if not isinstance(args, dict):
            return
        for key, value in args.items():
            counter = _FLOP_COUNTER.match(key)
            if counter is not None and isinstance(value, (int, float)):
                entry[1] += value * (2 if counter.group(1) == "fma" else 1)
                self.counted.add(name)
            self.metrics.add(key)

    def program_rows(self, rank: int, kernel_programs: dict[str, int], next_id: Callable[[], int],
                     intern: Callable[[str], int]) -> list[tuple[Any, ...]]:
        """`programs` rows (kind `kernel`, `flops` a run's mean FLOPs) of the kernels no kernel event named."""
        rows = []
        for name, (runs, flops) in sorted(self.kernels.items()):
            if name in kernel_programs:
                continue
            program_id = kernel_programs[name] = next_id()
            name_sid = intern(name)
            rows.append((program_id, rank, "kernel", name_sid, name_sid, None, None,
                         flops / runs if name in self.counted else None, None, None))
        return rows

    def facts(self) -> dict[str, Any]:
        """`meta.imported`'s `profiler_ranges`: how many ranges and kernels, and the counters read."""
        return {"ranges": self.ranges, "kernels": len(self.kernels),
                "metrics": sorted(metric for metric in self.metrics if metric != "Ev Idx")}


def write_ranges(sink: Any, rank: int, ranges: ProfilerRanges, kernel_programs: dict[str, int], path: Any) -> None:
    """A capture's profiler ranges: their kernels' `programs` rows, `profiler_ranges` in `meta.imported`, and a warning
    that its CPU ops' times hold the profiler's replays of the kernels."""
    if not ranges.ranges:
        return
    sink.extend("programs", ranges.program_rows(rank, kernel_programs, lambda: sink.writer.next_id("programs"),
                                                sink.writer.intern))
    sink.note(rank, profiler_ranges=ranges.facts())
    sink.warn(f"{path}: {ranges.ranges} CUPTI range-profiler ranges ({PROFILER_RANGE}): each kernel was replayed to "
              "read its counters, so the CPU ops' times include the replays, and the kernels' own times were not recorded")


def empty_window(sink: Any, path: Path) -> bool:
    """Whether a file without any torch.profiler event is torch.profiler's own (Kineto's header before its events:
    `schemaVersion`), a profiling window in which nothing ran, which imports as such with a warning; a Chrome trace of
    another tool is not."""
    if "schemaVersion" not in read_header(path):
        return False
    sink.warn(f"{path}: torch.profiler recorded no events in this window (nothing ran while it profiled)")
    return True


def comms_source(found: set[str]) -> str:
    """Where a file's collectives come from: `kernel`, NCCL kernels whose args name their collective (device times);
    else `param`, `record_param_comms` ops with those args, when no backend records them on its own thread (gloo's
    `gloo:all_reduce`, whose time is the collective's); else `annotation`, the backends' `<backend>:<collective>`
    ranges. `nccl:` ranges are only NCCL's enqueueing, read only where nothing else describes its collectives."""
    if "kernel" in found:
        return "kernel"
    return "param" if "param" in found and "backend" not in found else "annotation"


def no_profiler_events(path: Path) -> str:
    """The error for a Chrome trace without torch.profiler's events (e.g. XProf's `*.trace.json.gz`)."""
    beside = sorted(path.parent.glob("*.xplane.pb"))
    hint = f"; import {beside[0]} beside it, which holds the same events" if beside else ""
    return f"{path} holds no torch.profiler events (cpu_op, python_function, user_annotation, kernel, [memory]){hint}"


def collective_kind(name: str) -> str | None:
    """`collectives.kind` of a process group's collective (`all_reduce`, `_allgather_base`, `alltoall_base`)."""
    text = name.lower().lstrip("_")
    for suffix in ("_base", "_into_tensor", "_coalesced", "_tensor"):
        text = text.removesuffix(suffix)
    return _COLLECTIVE_KINDS.get(text.replace("_", ""))


def input_bytes(args: dict[str, Any]) -> tuple[int | None, str | None]:
    """The bytes of an op's tensors and the first one's dtype, from its `Input Dims` and `Input type` args (recorded
    with `record_shapes`; None, None without)."""
    types, dims = args.get("Input type"), args.get("Input Dims")
    nbytes: int | None = None
    dtype = None
    if isinstance(types, list) and isinstance(dims, list):
        for kind, shape in zip(types, dims):
            size = element_bytes(PROFILER_NAMES.get(str(kind)))
            if size and isinstance(shape, list) and all(isinstance(value, int) for value in shape):
                nbytes = (nbytes or 0) + size * math.prod(shape)
                dtype = dtype or str(kind)
    return nbytes, dtype
