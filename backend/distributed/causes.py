"""Why a collective happened: the cause the issuing thread is inside of, read when the call is opened.

The hooks in `sharding_hooks` set a cause (a tuple of `collective_causes` values, see `Cause`) on the
thread around the torch code that issues collectives: a DTensor redistribution, an FSDP2 group's
all-gather or reduce-scatter, DDP's constructor. `cause_id(recorder, kind, group)` turns the thread's
cause into a `collective_causes` id when a call is opened; a DDP gradient all-reduce, which DDP's C++
reducer issues with no Python frame of its own, is told apart by its process group and the backward
pass it runs in (buckets are reduced in index order in every backward).

Nothing here runs while nothing records: the hooks check `tracing.active_recorder()` first.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from tputrace.recording.interface import Recording

# The values of one `collective_causes` row after `id` and `rank`, in column order:
# (kind, phase, module, tensor, op, mesh_id, src_placements, dst_placements, global_shape, local_shape,
#  bucket_index, bucket_bytes, prefetch, origin_frame_id)
Cause = tuple[Any, ...]

REDUCE_AGAIN = "reduce_again"  # a reduction of a partial sum that was reduced already this step
ROUND_TRIP = "round_trip"  # a split back to the Shard that a gather this step left (no collective of its own)


class _ThreadState(threading.local):
    cause: Cause | None = None
    op: str | None = None  # the op whose sharding propagation is redistributing its arguments
    prefetch: bool = False  # inside FSDP2's prefetch of a later group


state = _ThreadState()


def make(kind: str, *, module: str | None = None, tensor: str | None = None, op: str | None = None, mesh_id: int | None = None,
         src: str | None = None, dst: str | None = None, global_shape: str | None = None, local_shape: str | None = None,
         bucket_index: int | None = None, bucket_bytes: int | None = None, prefetch: int | None = None,
         origin_frame_id: int | None = None) -> Cause:
    """A cause's values; the phase (forward or backward) is the issuing thread's now."""
    return (kind, phase(), module, tensor, op, mesh_id, src, dst, global_shape, local_shape, bucket_index, bucket_bytes, prefetch, origin_frame_id)


def phase() -> str:
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


@dataclass
class DataParallelModel:
    """One DDP model (the wrapper), its constructor line and bucket cap, which backward pass its bucket
    counter belongs to, and the parameter names of each bucket (as `buckets_read` last read them)."""

    model: Any
    origin_frame_id: int | None
    bucket_cap_bytes: int
    graph_task: int = -1
    next_bucket: int = 0
    bucket_parameters: tuple[str, ...] = ()  # per bucket index: its parameter names, comma-separated
    buckets_rebuilt: bool = False

    def read_buckets(self) -> None:
        """Read the reducer's bucket assignment, between backward passes (the reducer's lock is free then);
        once DDP has rebuilt its buckets in gradient order the assignment stays, and is not read again."""
        if self.buckets_rebuilt:
            return
        try:
            logged = self.model._get_ddp_logging_data()
        except (AttributeError, RuntimeError):
            return
        names = [name for name, parameter in self.model.named_parameters() if parameter.requires_grad]  # paths under the DDP model
        indices_text = logged.get("rebuilt_per_bucket_param_indices")
        if indices_text:
            self.buckets_rebuilt = True
            buckets = [[int(index) for index in bucket.split()] for bucket in str(indices_text).split(",")]
        elif len(str(logged.get("bucket_sizes", "")).split(",")) == 1:
            buckets = [list(range(len(names)))]  # before the rebuild DDP reduces every gradient in one bucket
        else:
            return
        self.bucket_parameters = tuple(first_names([names[index] for index in bucket if index < len(names)]) for bucket in buckets)

    def bucket_cause(self, recorder: Recording) -> Cause:
        task = torch._C._current_graph_task_id()
        if task != self.graph_task:
            self.graph_task, self.next_bucket = task, 0
        index = self.next_bucket
        self.next_bucket += 1
        parameters = self.bucket_parameters[index] if index < len(self.bucket_parameters) else None
        return make("ddp_bucket", module=recorder.module_names.get(id(self.model)), tensor=parameters, bucket_index=index,
                    bucket_bytes=self.bucket_cap_bytes, origin_frame_id=self.origin_frame_id)


def first_names(names: list[str], limit: int = 8) -> str:
    """The first `limit` names, comma-separated, and how many more."""
    shown = ", ".join(name for name in names[:limit] if name)
    return shown + (f", and {len(names) - limit} more" if len(names) > limit else "")


# DDP models by the name of their process group.
data_parallel_models: dict[str, DataParallelModel] = {}


def cause_id(recorder: Recording, kind: str, group: str, reduced_already: bool = False) -> int | None:
    """The `collective_causes` id of a call of `kind` on `group` opened now on this thread (None: the user's
    own); `reduced_already`: the call all-reduces what a DTensor reduction produced this step."""
    cause = state.cause
    if cause is None:
        model = data_parallel_models.get(group) if kind == "all_reduce" and data_parallel_models else None
        if model is not None and torch._C._current_graph_task_id() != -1 and not _issued_outside_a_comm_hook():
            cause = model.bucket_cause(recorder)
        elif reduced_already:
            cause = make(REDUCE_AGAIN, op="all_reduce")
        else:
            return None
    return recorder.collective_cause(cause)


_C10D_FILE = c10d.__file__
MAX_FRAMES_READ = 64  # the frames above a call read for torch.distributed's function and a communication hook


def _issued_outside_a_comm_hook() -> bool:
    """Whether the call opened now went through `torch.distributed`'s Python functions from code that is no DDP
    communication hook (no frame above holds a `GradBucket`): DDP's reducer calls the group from C++, and a hook
    (`fp16_compress_hook`, or one of the script's) is given its bucket."""
    frame = sys._getframe(2)
    issued = False
    for _ in range(MAX_FRAMES_READ):
        if frame is None:
            break
        if frame.f_code.co_filename == _C10D_FILE:
            issued = True
        elif issued and any(isinstance(value, dist.GradBucket) for value in frame.f_locals.values()):
            return False
        frame = frame.f_back
    return issued


class caused_by:  # noqa: N801 - used as a context manager, like contextlib's
    """Collectives issued inside have `cause` (a plain class: entered on the path of every redistribution)."""

    __slots__ = ("cause", "previous")

    def __init__(self, cause: Cause | None) -> None:
        self.cause = cause
        self.previous: Cause | None = None

    def __enter__(self) -> None:
        self.previous = state.cause
        if self.cause is not None:
            state.cause = self.cause

    def __exit__(self, *exc_info: object) -> None:
        state.cause = self.previous
