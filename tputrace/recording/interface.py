"""The one way the backend reports to the recording: the `Recording` it reports to (the methods and
attributes the backend uses, nothing else) and `active()`, this process's recording or None; and
`DeviceReadings`, what the recorder reads from the device (the lifecycle gives it the backend's).

The backend imports nothing else of `tputrace.recording`; the recording's lifecycle, which loads the
backend, sets the active recording (`activate`). Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable
from contextlib import AbstractContextManager
from types import CodeType
from typing import Any, Protocol

# Set by a recording process for the processes it starts (see `tputrace.recording.lineage`).
PARENT_ENV = "TPUTRACE_PARENT_RECORDING"


class Recording(Protocol):
    """What the backend calls on the active recording (`tputrace.recording.recorder.Recorder`).

    Times are `time.perf_counter_ns()` values unless a parameter says otherwise; `frame_id`s come from
    `frame_id()`; `step` is a step index (`step_index` when the work was issued)."""

    rank: int
    enabled: bool  # False: a recording that writes no trace (`tputrace run --no-trace`)
    window_open: bool  # False: outside the recording window (`recording_window`): ops are not recorded now
    step_index: int
    start_unix_ns: int
    module_names: dict[int, str]  # nn.Module paths by id(module), filled as the backend sees modules called
    backward_frame: int | None  # the line that called backward(), for what autograd's thread records
    backward_call_frame: int | None
    last_frame_id: int | None  # what `frame_id()` last returned (an op's line, for the buffers its outputs fill)
    module_stacks: dict[int, list[int]]  # each thread's module stack (`module_stack`) by thread id

    # -- context of what is recorded
    def now(self) -> int:
        """ns since the recording started."""
        ...

    def frame_id(self, by_call: bool = False) -> int | None: ...

    def frame_text(self, frame_id: int | None) -> str | None: ...

    def dispatches_through(self, entry: CodeType) -> None:
        """The code of the backend's dispatch entry: the frames below it are never the user's."""
        ...

    def recording_at(self, location: tuple[str, int, str] | None) -> AbstractContextManager[None]: ...

    def module_sid(self) -> int | None: ...

    def intern(self, text: str) -> int:
        """The id of `text` in the trace's string table."""
        ...

    def module_stack(self) -> list[int]:
        """This thread's module stack: the string ids of the paths of the modules whose forward it runs, innermost last."""
        ...

    def optimizer_stepped(self) -> None: ...

    def keeps_lifetime(self, alloc_ns: int) -> bool:
        """Whether a buffer made at `alloc_ns` (as `now()`) and freed now lived while the recording window was open."""
        ...

    # -- ops, programs and their execution
    def next_flush_id(self) -> int: ...

    def op_ran(self, plan: Any, name: str, start_ns: int, dur_ns: int, flush_id: int | None) -> None: ...

    def op_deferred(self, op_records: list[tuple], name: str, plan: Any, start_ns: int) -> None:
        """A deferred op was dispatched: its record joins `op_records`, given to `ops_flushed` by its flush."""
        ...

    def ops_flushed(self, op_records: list[tuple], chip: int, program_id: int | None, flush_id: int | None) -> None: ...

    def view_op(self, name: str, base: Any, results: list[Any], site: Hashable | None = None) -> None: ...

    def compiled(self, plan: Any, kind: str, reason: str, diff: str | None, *, n_ops: int = 1, detail: dict | None = None,
                 program_kind: str = "op") -> int | None: ...

    def fusion(self, program_id: int, fusion: Any) -> None: ...

    def flushed(self, flush_id: int, program_id: int | None, trigger: str, n_ops: int, cache_hit: bool, chip: int, start_ns: int,
                dur_ns: int, input_bytes: int, output_bytes: int, replay: str | None = None, replay_break: str | None = None) -> None: ...

    def execution_started(self, program_id: int | None, chip: int, launch_ns: int, flush_id: int | None, results: Any,
                          done: Any = None) -> None: ...

    # -- torch.compile
    def dynamo_frame_compiled(self, *, name: str, signature: str, file: str, line: int, function: str, start_ns: int, dur_ns: int,
                              step: int, reason: str, diff: str | None, detail: dict, program_id: int | None) -> None: ...

    def graph_lowered(self, name: str, signature: str, chip: int, start_ns: int, dur_ns: int, detail: dict) -> None: ...

    def graph_break(self, reason: str, file: str | None, line: int | None, function: str | None) -> None: ...

    def bucket_hit(self, graph: str, buckets: str, start_ns: int, dur_ns: int) -> None: ...

    def recompile_limit_hit(self, text: str) -> None: ...

    # -- host work, data movement and collectives
    def synced(self, kind: str, chip: int, start_ns: int, dur_ns: int, pending_ops: int) -> None: ...

    def transferred(self, direction: str, nbytes: int, src_chip: int, dst_chip: int, start_ns: int, dur_ns: int,
                    origin: tuple[str, int, str] | None = None) -> None:
        """A copy; `origin` (file, line, function) is the user's line that made a host tensor copied to a chip."""
        ...

    def fell_back(self, op: str, inputs: str, chip: int, start_ns: int, dur_ns: int) -> None: ...

    def collective(self, kind: str, nbytes: int, dtype: str, group: str, ranks: str, frame_id: int | None, start_ns: int,
                   dur_ns: int, wait_ns: int | None, algorithm: str | None, bus_bandwidth: float | None, step: int,
                   cause_id: int | None = None, waited_after_ns: int | None = None, read_early_frame_id: int | None = None) -> None: ...

    # -- sharding: device meshes, parameter placements, what caused a collective
    def device_mesh(self, shape: str, dim_names: str, ranks: str, frame_id: int | None) -> int: ...

    def parameter_placement(self, name: str, module: str, wrapper: str, group: str | None, mesh_id: int | None, placements: str,
                            global_shape: str, local_shape: str, dtype: str, nbytes: int, bytes_per_rank: int,
                            origin_frame_id: int | None) -> None: ...

    def collective_cause(self, cause: tuple[Any, ...]) -> int: ...

    def commit_soon(self) -> None: ...

    # -- memory
    def buffer_rows(self) -> Callable[[tuple[Any, ...]], None]:
        """What appends `buffers` rows: each one chip buffer's lifetime, in the table's column order (id, rank,
        chip, bytes, dtype, shape sid, kind, frame_id, module_sid, alloc_ns, free_ns, step), times in ns since
        the recording started (`now()`), free_ns None while it is live. The caller writes only buffers that
        lived while the recording window was open (`window_open`, `keeps_lifetime`)."""
        ...

    def annotation(self, name: str, source: str, start_ns: int, dur_ns: int, frame_id: int | None) -> None:
        """A named range; `start_ns` in ns since the recording started (as `now()`)."""
        ...


class DeviceReadings(Protocol):
    """What the recorder reads from the device it records."""

    def memory_in_use(self) -> Iterable[tuple[int, int, int]]:
        """(chip, live bytes, peak bytes) of each chip in use."""
        ...

    def shape_text(self, tensor: Any) -> str:
        """A tensor's dtype and shape as the trace writes them: `f32[2,3]`."""
        ...

    def chip_of(self, tensor: Any) -> int:
        """The chip a tensor is on."""
        ...


_active: Recording | None = None


def active() -> Recording | None:
    """This process's recording, or None when nothing records."""
    return _active


def activate(recording: Recording | None) -> None:
    """Make `recording` this process's recording (None: nothing records). For the recording's lifecycle."""
    global _active
    _active = recording


def backend_loaded() -> None:
    """Called at the end of the backend's import: a process that a recorded one started (it has
    `PARENT_ENV`) begins recording as its child.

    The lifecycle is found by name, at run time: it imports the backend, so a static import of it here
    would tie the backend's import to the code that loads the backend."""
    if PARENT_ENV not in os.environ:
        return
    from importlib import import_module

    import_module("tputrace.recording.spawning").record_if_started_by_a_recording()
