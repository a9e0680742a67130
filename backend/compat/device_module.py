"""`torch.tpu`: the device module, with TorchTPU's names (device selection, RNG, memory, streams,
eager modes)."""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tputrace.backend.compat import process_sharing
from tputrace.backend.core import chips, memory, rng, routing

_state = threading.local()


class EagerMode(enum.Enum):
    """How eager ops run: deferred and fused into one program, or one program per op."""

    DEFER_AND_FUSE = "DEFER_AND_FUSE"
    DEFER_NEVER = "DEFER_NEVER"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "DEFER_NEVER_AND_LAUNCH_BLOCKING"


_eager_mode = EagerMode.DEFER_NEVER


def is_available() -> bool:
    return True


# Read by torch.utils.checkpoint (as `torch.cuda._initialized`): only then does it save and restore
# the device's RNG state, so a recomputed dropout draws the forward's mask.
_initialized = True


def is_initialized() -> bool:
    return _initialized


def _is_in_bad_fork() -> bool:
    return process_sharing.in_bad_fork()


def _lazy_init() -> None:
    process_sharing.check_not_forked()
    chips.devices()


def device_count() -> int:
    return chips.count()


def current_device() -> int:
    return getattr(_state, "device", 0)


def chip_index(device: Any) -> int:
    """The chip a device argument names: None or 'tpu' mean the current chip."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    parsed = torch.device(device) if isinstance(device, str) else device
    return current_device() if parsed.index is None else parsed.index


def set_device(device: Any) -> None:
    index = chip_index(device)
    chips.device(index)
    _state.device = index


class device:  # noqa: N801 - torch's name
    """Context manager that makes a chip the current one."""

    def __init__(self, device: Any) -> None:
        self.index = chip_index(device)
        self.previous = 0

    def __enter__(self) -> None:
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)


def synchronize(device: Any = None) -> None:
    """Wait until every program launched on the chips has finished; an index out of range since the
    last sync raises here (see `index_checks`). The wait is recorded as a host sync of kind
    `synchronize` (the script asked for it: `torch.tpu.synchronize()`, or `torch.cuda.synchronize()`
    under `--as-cuda`); events and streams wait without one (libraries use them)."""
    recorder = routing.active().recorder
    start = time.perf_counter_ns()
    _wait_for_chips()
    if recorder is not None:
        recorder.synced("synchronize", chip_index(device), start, time.perf_counter_ns() - start, 0)


def _wait_for_chips() -> None:
    """Wait until every program launched on the chips has finished (see `synchronize`)."""
    from tputrace.backend.indexing import index_checks
    dispatcher = routing.active()
    process_sharing.check_not_forked()
    dispatcher.executor.synchronize()
    index_checks.raise_if_out_of_range(dispatcher.recorder)


def manual_seed(seed: int) -> None:
    rng.manual_seed(current_device(), seed)


def manual_seed_all(seed: int) -> None:
    for index in range(max(device_count(), 1)):
        rng.manual_seed(index, seed)


def seed() -> None:
    manual_seed(torch.seed())


def seed_all() -> None:
    manual_seed_all(torch.seed())


def initial_seed() -> int:
    return rng.initial_seed()


def get_rng_state(device: Any = "tpu") -> torch.Tensor:
    return torch.frombuffer(bytearray(rng.get_state(chip_index(device))), dtype=torch.uint8)


def set_rng_state(new_state: torch.Tensor, device: Any = "tpu") -> None:
    rng.set_state(chip_index(device), bytes(new_state.to("cpu", torch.uint8).tolist()))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(index) for index in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


@dataclass(frozen=True)
class DeviceProperties:
    """What `get_device_properties` reports about a chip."""

    name: str
    platform: str
    index: int
    total_memory: int
    multi_processor_count: int  # CUDA's count of SMs: a chip's cores (`nn.DataParallel` compares the chips by it)
    # CUDA's compute capability, which scripts compare to gate bfloat16, TF32 and fused attention (8.0 and up):
    # features a tpu chip has, so it answers 8.0.
    major: int = 8
    minor: int = 0


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_properties(device: Any = None) -> DeviceProperties:
    index = chip_index(device)
    jax_device = chips.device(index)
    total = 0
    try:
        stats = jax_device.memory_stats() or {}
        total = int(stats.get("bytes_limit", 0))
    except Exception:  # noqa: BLE001 - not every platform reports memory
        total = 0
    if not total and jax_device.platform == "cpu":  # a virtual chip's memory is the host's
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    kind = getattr(jax_device, "device_kind", jax_device.platform)
    name = kind if jax_device.platform == "tpu" else f"tpu (virtual, on XLA {jax_device.platform}: {kind})"
    return DeviceProperties(name, jax_device.platform, index, total, int(getattr(jax_device, "num_cores", 1) or 1))


def memory_allocated(device: Any = None) -> int:
    return memory.live_bytes(chip_index(device))


def max_memory_allocated(device: Any = None) -> int:
    return memory.peak_bytes(chip_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    memory.reset_peak(chip_index(device))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """A cap for a caching allocator: tpu tensors have none, and XLA frees buffers when tensors die."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """No allocation counts accumulate beyond the peak, which `reset_peak_memory_stats` resets."""


def ipc_collect() -> None:
    """No memory is shared between processes by CUDA IPC."""


def memory_reserved(device: Any = None) -> int:
    """What tpu tensors hold: there is no caching allocator, so nothing is reserved beyond them."""
    return memory_allocated(device)


def max_memory_reserved(device: Any = None) -> int:
    return max_memory_allocated(device)


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of a chip: its memory (`get_device_properties`) less what tpu tensors hold."""
    total = get_device_properties(device).total_memory
    return max(total - memory_allocated(device), 0), total


def memory_stats(device: Any = None) -> dict[str, int]:
    index = chip_index(device)
    return {"allocated_bytes.all.current": memory.live_bytes(index), "allocated_bytes.all.peak": memory.peak_bytes(index)}


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A chip's memory as text, as `torch.cuda.memory_summary` prints it: what tpu tensors hold now and at most
    (reserved is the same, with no caching allocator)."""
    index = chip_index(device)
    current, peak = memory.live_bytes(index), memory.peak_bytes(index)
    return (f"tpu:{index} memory summary\n"
            f"  allocated: {current / 2**20:.2f} MiB now, {peak / 2**20:.2f} MiB at most\n"
            f"  reserved:  {current / 2**20:.2f} MiB now, {peak / 2**20:.2f} MiB at most (no caching allocator)\n")


def empty_cache() -> None:
    """Nothing is cached beyond live tensors: XLA frees buffers when tensors die."""


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


class Event:
    """A point in a chip's work; recording it notes what was launched so far."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.recorded_at: float | None = None

    def record(self, stream: "Stream | None" = None) -> None:
        _wait_for_chips()
        self.recorded_at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _wait_for_chips()

    def wait(self, stream: "Stream | None" = None) -> None:
        _wait_for_chips()

    def elapsed_time(self, end_event: "Event") -> float:
        if self.recorded_at is None or end_event.recorded_at is None:
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return (end_event.recorded_at - self.recorded_at) * 1000.0


class Stream(torch.Stream):
    """The chip's single in-order queue of work (XLA orders programs on a device itself). A
    `torch.Stream`, so that torch's C++ functions taking one (`Tensor.record_stream`) accept it."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        return super().__new__(cls, device=torch.device("tpu", chip_index(device)), priority=priority)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        """Made by `__new__`."""

    def synchronize(self) -> None:
        _wait_for_chips()

    def query(self) -> bool:
        return True

    def wait_event(self, event: Event) -> None:
        event.synchronize()

    def wait_stream(self, stream: "Stream") -> None:
        stream.synchronize()

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Work stays on the chip's one queue."""


def current_stream(device: Any = None) -> Stream:
    return Stream(device)


def default_stream(device: Any = None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    yield


def set_stream(stream: Stream) -> None:
    """Only one stream per chip exists; selecting it changes nothing."""


def eager_mode() -> EagerMode:
    return _eager_mode


def set_eager_mode(mode: EagerMode | str) -> None:
    """Choose how eager ops run; pending deferred work is flushed first."""
    global _eager_mode
    from tputrace.backend.core import executor

    mode = EagerMode(mode.value if isinstance(mode, EagerMode) else str(mode).upper())
    executor.switch(mode.value)
    _eager_mode = mode
