"""What Kineto (torch.profiler's tracer) writes on devices, read by the torch.profiler importer: the category names
of each Kineto version and device (CUDA, ROCm, MTIA), the runtime calls that block the host until the device is done
(host syncs), the collectives NCCL kernels and `record_param_comms` ops describe in their args, and timestamps
written with nanosecond digits.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# Category -> the category the importer reads it as: older Kineto's capitalised names, and other devices' names.
CATEGORIES = {
    "Kernel": "kernel", "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Runtime": "cuda_runtime", "Driver": "cuda_runtime",
    "cuda_driver": "cuda_runtime", "Operator": "cpu_op", "Python": "python_function",
    # MTIA: the device's command processor events are its device ops; the runtime's calls are its launches.
    "mtia_ccp_events": "kernel", "mtia_runtime": "cuda_runtime",
}
# Categories whose device ops ran on a device other than a GPU: category -> the device's name.
DEVICE_OF_CATEGORY = {"mtia_ccp_events": "mtia", "mtia_runtime": "mtia"}

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

# Bytes per element of `record_param_comms`'s `dtype` (c10's ScalarType names).
_COMMS_DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
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
    size = _COMMS_DTYPE_BYTES.get(str(dtype))
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
