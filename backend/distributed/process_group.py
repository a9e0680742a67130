"""The c10d backend "tpu": `dist.init_process_group("tpu")`, with gloo moving the data between processes.

`TpuProcessGroup` is a Python `torch.distributed.ProcessGroup`. Every collective runs in four stages:
pending deferred work is flushed, the inputs are copied to host tensors, gloo runs the collective on
those asynchronously, and when gloo completes, a completion thread of the group writes the results
back into the tpu tensors and writes the call's trace row. The `Work` returned completes only after
the write-back, so `work.wait()`, `work.get_future()` (what DDP's reducer chains on) and `async_op=True`
behave as they do on other devices; a Python `wait()` on either finishes the call on the waiting thread
if the completion thread has not reached it yet. CPU tensors passed to the group go to gloo without a copy.

Gloo gets every host tensor as an alias this side keeps until gloo's threads have dropped it
(`handoff`): those threads then never need the GIL for the group's collectives, so the group may be
destroyed by a thread that holds it (gloo's destructor joins its threads), as DDP's reducer does.

A gloo process group is also registered as the group's CPU backend, which DeviceMesh, object
collectives and `pg._get_backend(torch.device("cpu"))` expect. `ReduceOp.PREMUL_SUM`, which gloo
refuses, runs as NCCL runs it: each rank scales its host copy, then gloo sums (see `premul_sum`).
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tputrace.backend.distributed import fsdp, op_handlers, premul_sum, tracing
from tputrace.backend.distributed.collective_errors import CollectiveError, FailedCollective, transport_message
from tputrace.backend.distributed.handoff import Handoff, quarantine
from tputrace.backend.distributed.staging import Staging

BACKEND_NAME = "tpu"
TRANSPORT = "gloo"
_DEFAULT_TIMEOUT = timedelta(minutes=30)
_SHUTDOWN_WAIT_S = 10.0  # how long a shutdown waits for the completion thread to finish its queue


class TpuProcessGroup(dist.ProcessGroup):
    """A process group whose collectives take tpu tensors; gloo carries the bytes between ranks."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta | None, global_ranks: Sequence[int]) -> None:
        super().__init__(rank, size)
        self._host = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout or _DEFAULT_TIMEOUT)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._host)
        self.global_ranks: tuple[int, ...] = tuple(global_ranks) if global_ranks else tuple(range(size))
        self._ranks_text = ",".join(str(rank) for rank in self.global_ranks)
        self._completion = _Completion()

    def __del__(self) -> None:
        self._completion.close()

    def shutdown(self) -> None:
        """`destroy_process_group` shuts the group down: its completion thread finishes the calls it
        holds (joined), and the host buffers gloo is done with go. Gloo's threads never need the GIL to
        drop a work (see `handoff`), so a thread holding the GIL may destroy the group whenever it goes
        (a DDP reducer freed later, the interpreter exiting)."""
        self._completion.close(wait_s=_SHUTDOWN_WAIT_S)
        quarantine.sweep()
        super().shutdown()

    # ----------------------------------------------------------------- identity
    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank={self.rank()}, size={self.size()}, ranks={list(self.global_ranks)})"

    def _group_label(self) -> str:
        try:
            return self.group_name or "?"
        except RuntimeError:
            return "?"

    # ----------------------------------------------------------------- the common path
    def _start(self, kind: str, tensors: Sequence[torch.Tensor], nbytes: int, ranks: str | None = None) -> tuple[Staging, tracing.CollectiveCall | None]:
        call = tracing.open_call(kind, tensors, nbytes, self._group_label(), ranks or self._ranks_text, 2 if ranks else len(self.global_ranks), TRANSPORT)
        return Staging(tensors, kind), call

    def _launch(self, staging: Staging, call: tracing.CollectiveCall | None, issue: Callable[[Handoff], Any], result: list[torch.Tensor]) -> dist.Work:
        """Run `issue(give)` (one gloo call, or a list of them, passing gloo `give(host)` for every host
        tensor) and return a Work that completes once the results are back in their tensors."""
        if call is not None:
            call.arrived()
        quarantine.sweep()
        handoff = Handoff()
        issued = issue(handoff)
        host_works = issued if isinstance(issued, list) else [issued]

        def finish(failed: bool = False) -> list[torch.Tensor]:
            """Write the results back and record the call; a failed call (a peer gone, a timeout) is recorded too."""
            if not failed:
                staging.write_back()
            if call is not None:
                if pending.source_rank is not None:  # a receive from any source: now its sender is known
                    call.ranks = self._pair(pending.source_rank, self.rank())
                call.finished(failed)
            return result

        pending = _Pending(staging.kind, host_works, finish, handoff, staging.kind == "recv")
        pending.result.call = call
        if call is not None:
            call.launched(result)
        self._completion.submit(pending, ordered=staging.kind not in ("send", "recv"))
        return CollectiveWork(pending, staging.kind)

    # ----------------------------------------------------------------- all-reduce
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        _some("all_reduce", tensors)
        options = opts if opts is not None else dist.AllreduceOptions()
        staging, call = self._start("all_reduce", tensors, tracing.message_bytes(tensors))
        flat = staging.flat_inout(tensors)
        host_options = dist.AllreduceOptions()
        host_options.reduceOp = premul_sum.scaled_to_sum(options.reduceOp, [flat], staging.read, "all_reduce")
        return self._launch(staging, call, lambda give: self._host.allreduce([give(flat)], host_options), tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self.allreduce(tensors, opts)  # all_reduce reads only the options' reduceOp

    # ----------------------------------------------------------------- all-gather
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        _single("all_gather", inputs)
        outputs = output_lists[0]
        if len({output.numel() for output in outputs}) > 1:
            return self._allgather_uneven(outputs, inputs[0])
        staging, call = self._start("all_gather", inputs, tracing.message_bytes(outputs))
        host_input = staging.read(inputs[0])
        host_outputs = [staging.output(output) for output in outputs]
        return self._launch(staging, call, lambda give: self._host.allgather([[give(output) for output in host_outputs]], [give(host_input)]), outputs)

    def _allgather_uneven(self, outputs: list[torch.Tensor], input: torch.Tensor) -> dist.Work:  # noqa: A002
        """An all-gather of pieces of different sizes, which NCCL takes and gloo's refuses: one flat
        `alltoall_base` in which every rank sends its whole input to each rank."""
        if len(outputs) != self.size():
            raise ValueError(f"all_gather on a tpu process group takes one output tensor per rank ({self.size()}), got {len(outputs)}")
        staging, call = self._start("all_gather", [input], tracing.message_bytes(outputs))
        host_input = torch.cat([staging.read(input).reshape(-1)] * self.size())
        host_output = staging.flat_output(outputs)
        out_splits, in_splits = [output.numel() for output in outputs], [input.numel()] * self.size()
        return self._launch(staging, call, lambda give: self._host.alltoall_base(give(host_output), give(host_input), out_splits, in_splits, dist.AllToAllOptions()), outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002 - c10d's name
        _gathered_counts_agree(output, input, self.size())
        staging, call = self._start("all_gather", [input], tracing.message_bytes([output]))
        host_input = staging.read(input).view(-1)
        host_output = staging.output(output).view(-1)
        return self._launch(staging, call, lambda give: self._host._allgather_base(give(host_output), give(host_input)), [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        for output, input in zip(outputs, inputs):
            _gathered_counts_agree(output, input, self.size())
        staging, call = self._start("all_gather", inputs, tracing.message_bytes(outputs))
        pairs = [(staging.output(output).view(-1), staging.read(input).view(-1)) for output, input in zip(outputs, inputs)]
        return self._launch(staging, call, lambda give: [self._host._allgather_base(give(host_output), give(host_input)) for host_output, host_input in pairs], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        flat_outputs = [output for outputs in output_lists for output in outputs]
        staging, call = self._start("all_gather", inputs, tracing.message_bytes(flat_outputs))
        host_inputs = [staging.read(input) for input in inputs]
        host_lists = [[staging.output(output) for output in outputs] for outputs in output_lists]
        return self._launch(
            staging, call, lambda give: [self._host.allgather([[give(output) for output in host_list]], [give(host_input)]) for host_list, host_input in zip(host_lists, host_inputs)], flat_outputs
        )

    # ----------------------------------------------------------------- reduce-scatter
    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        _single("reduce_scatter", outputs)
        inputs = input_lists[0]
        staging, call = self._start("reduce_scatter", inputs, tracing.message_bytes(inputs))
        host_inputs = [staging.copy(input) for input in inputs]
        host_output = staging.output(outputs[0])
        options = _reduce_scatter_options(opts, host_inputs, staging)
        return self._launch(staging, call, lambda give: self._host.reduce_scatter([give(host_output)], [[give(input) for input in host_inputs]], options), outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        _gathered_counts_agree(input, output, self.size())
        staging, call = self._start("reduce_scatter", [input], tracing.message_bytes([input]))
        host_input = staging.copy(input).view(-1)
        fsdp.release_reduce_scatter_input(input)  # FSDP2's packed gradients: the host copy is all that is read now
        host_output = staging.output(output).view(-1)
        options = _reduce_scatter_options(opts, [host_input], staging)
        return self._launch(staging, call, lambda give: self._host._reduce_scatter_base(give(host_output), give(host_input), options), [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        for output, input in zip(outputs, inputs):
            _gathered_counts_agree(input, output, self.size())
        staging, call = self._start("reduce_scatter", inputs, tracing.message_bytes(inputs))
        pairs = [(staging.output(output).view(-1), staging.copy(input).view(-1)) for output, input in zip(outputs, inputs)]
        options = _reduce_scatter_options(opts, [host_input for _, host_input in pairs], staging)
        return self._launch(
            staging, call, lambda give: [self._host._reduce_scatter_base(give(host_output), give(host_input), options) for host_output, host_input in pairs], outputs
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ----------------------------------------------------------------- broadcast, reduce, gather, scatter
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        _some("broadcast", tensors)
        options = opts if opts is not None else dist.BroadcastOptions()
        staging, call = self._start("broadcast", tensors, tracing.message_bytes(tensors))
        if self.rank() == options.rootRank:
            flat = torch.cat([staging.read(tensor).reshape(-1) for tensor in tensors]) if len(tensors) > 1 else staging.read(tensors[0]).reshape(-1)
        else:
            flat = staging.flat_inout(tensors) if len(tensors) > 1 else staging.output(tensors[0]).view(-1)
        host_options = dist.BroadcastOptions()
        host_options.rootRank = options.rootRank
        return self._launch(staging, call, lambda give: self._host.broadcast([give(flat)], host_options), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        _single("reduce", tensors)
        options = opts if opts is not None else dist.ReduceOptions()
        staging, call = self._start("reduce", tensors, tracing.message_bytes(tensors))
        host = staging.inout(tensors[0]) if self.rank() == options.rootRank else staging.copy(tensors[0])
        host_options = dist.ReduceOptions()
        host_options.rootRank = options.rootRank
        host_options.reduceOp = premul_sum.scaled_to_sum(options.reduceOp, [host], staging.read, "reduce")
        return self._launch(staging, call, lambda give: self._host.reduce([give(host)], host_options), tensors)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        _single("gather", inputs)
        options = opts if opts is not None else dist.GatherOptions()
        outputs = output_lists[0] if output_lists else []
        staging, call = self._start("gather", inputs, tracing.message_bytes(inputs) * self.size())
        host_input = staging.read(inputs[0])
        host_lists = [[staging.output(output) for output in outputs]] if outputs else []
        host_options = dist.GatherOptions()
        host_options.rootRank = options.rootRank
        return self._launch(staging, call, lambda give: self._host.gather([[give(output) for output in host_list] for host_list in host_lists], [give(host_input)], host_options), outputs)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        _single("scatter", outputs)
        options = opts if opts is not None else dist.ScatterOptions()
        inputs = input_lists[0] if input_lists else []
        staging, call = self._start("scatter", outputs, tracing.message_bytes(outputs) * self.size())
        host_inputs = [[staging.read(input) for input in inputs]] if inputs else []
        host_output = staging.output(outputs[0])
        host_options = dist.ScatterOptions()
        host_options.rootRank = options.rootRank
        return self._launch(staging, call, lambda give: self._host.scatter([give(host_output)], [[give(input) for input in host_list] for host_list in host_inputs], host_options), outputs)

    # ----------------------------------------------------------------- all-to-all
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int], opts: Any = None) -> dist.Work:  # noqa: A002
        staging, call = self._start("all_to_all", [input], tracing.message_bytes([input]))
        out_splits, in_splits = tracing.note_splits(call, output_split_sizes, input_split_sizes)
        host_input = staging.read(input)
        host_output = staging.output(output)
        return self._launch(staging, call, lambda give: self._host.alltoall_base(give(host_output), give(host_input), out_splits, in_splits, dist.AllToAllOptions()), [output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """One flat `alltoall_base` with a split per tensor: gloo's list form refuses tensors of
        different sizes, which NCCL (and so code written for CUDA) sends."""
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise ValueError(
                f"all_to_all on a tpu process group takes one input and one output tensor per rank ({self.size()}), "
                f"got {len(inputs)} inputs and {len(outputs)} outputs"
            )
        staging, call = self._start("all_to_all", inputs, tracing.message_bytes(inputs))
        host_input = torch.cat([staging.read(input).reshape(-1) for input in inputs])
        host_output = staging.flat_output(outputs)
        out_splits, in_splits = tracing.note_splits(call, [output.numel() for output in outputs], [input.numel() for input in inputs])
        return self._launch(staging, call, lambda give: self._host.alltoall_base(give(host_output), give(host_input), out_splits, in_splits, dist.AllToAllOptions()), outputs)

    # ----------------------------------------------------------------- barrier and point-to-point
    def barrier(self, opts: Any = None) -> dist.Work:
        staging, call = self._start("barrier", [], 0)
        return self._launch(staging, call, lambda give: self._host.barrier(dist.BarrierOptions()), [])

    def _pair(self, src: int, dst: int) -> str:
        """A point-to-point row's ranks: sender and receiver, as global ranks."""
        return f"{self.global_ranks[src]},{self.global_ranks[dst]}"

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        staging, call = self._start("send", tensors, tracing.message_bytes(tensors), ranks=self._pair(self.rank(), dst))
        hosts = [staging.read(tensor) for tensor in tensors]
        return self._launch(staging, call, lambda give: self._host.send([give(host) for host in hosts], dst, tag), tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        staging, call = self._start("recv", tensors, tracing.message_bytes(tensors), ranks=self._pair(src, self.rank()))
        hosts = [staging.output(tensor) for tensor in tensors]
        return self._launch(staging, call, lambda give: self._host.recv([give(host) for host in hosts], src, tag), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        staging, call = self._start("recv", tensors, tracing.message_bytes(tensors), ranks=f"?,{self.global_ranks[self.rank()]}")
        hosts = [staging.output(tensor) for tensor in tensors]
        return self._launch(staging, call, lambda give: self._host.recv_anysource([give(host) for host in hosts], tag), tensors)


class CollectiveWork(dist.Work):
    """The `Work` of one collective on a tpu process group: done when its results are back on the chip.

    `wait()` raises the transport's error (a peer that died, a timeout), which c10d's own
    future-wrapping work does not, and `exception()` returns it; `get_future()` is what DDP's reducer chains on."""

    def __init__(self, pending: _Pending, kind: str) -> None:
        super().__init__()
        self._pending = pending
        self._future = pending.result
        self._kind = kind

    def wait(self, timeout: Any = None) -> bool:
        if self._future.call is not None:
            self._future.call.waited()
        self._pending.run_if_unclaimed()
        try:
            self._future.wait()
        except RuntimeError as error:
            raise self._failure(error) from None
        return True

    def exception(self) -> CollectiveError | None:
        """The error a finished collective failed with, as `wait()` raises it; None while it runs or
        once it succeeded."""
        if not self._future.done():
            return None
        try:
            self._future.value()
        except Exception as error:  # noqa: BLE001 - the failure is the answer
            return self._failure(error)
        return None

    def _failure(self, error: BaseException) -> CollectiveError:
        if isinstance(error, CollectiveError):
            return CollectiveError(str(error))
        return CollectiveError(f"{self._kind} on the tpu process group failed: {transport_message(error)}")

    def is_completed(self) -> bool:
        done = self._future.done()
        if done and self._future.call is not None:
            self._future.call.waited()  # a poll that found the result back: what follows reads it after the call
        return done

    def is_success(self) -> bool:
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - failure is the answer
            return False
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def _source_rank(self) -> int:
        """The group rank a receive got its data from (what `dist.recv` without `src` returns)."""
        self.wait()
        if self._pending.source_rank is None:
            raise RuntimeError("sourceRank() may only be called on work objects that correspond to a recv or recv-from-any call.")
        return self._pending.source_rank

    source_rank = _source_rank

    def result(self) -> list[torch.Tensor]:
        return self._future.wait()


def _some(kind: str, tensors: Sequence[torch.Tensor]) -> None:
    """Refuse an empty tensor list, as gloo does (its dispatcher finds no tensor to dispatch on)."""
    if not tensors:
        raise ValueError(f"{kind} on a tpu process group needs at least one tensor, got an empty list")


def _single(kind: str, tensors: Sequence[torch.Tensor]) -> None:
    if len(tensors) != 1:
        raise ValueError(f"{kind} on a tpu process group takes one tensor per rank, got {len(tensors)}")


def _gathered_counts_agree(whole: torch.Tensor, piece: torch.Tensor, size: int) -> None:
    """The single-tensor all-gather and reduce-scatter take any shapes whose element counts agree (the
    whole is `size` pieces), as NCCL does: gloo's own would split the whole along dim 0."""
    if whole.numel() != piece.numel() * size:
        raise ValueError(
            f"the gathered tensor must have world_size ({size}) times the elements of the per-rank tensor, "
            f"got {whole.numel()} elements ({list(whole.shape)}) and {piece.numel()} ({list(piece.shape)})"
        )


def _reduce_scatter_options(opts: Any, host_inputs: list[torch.Tensor], staging: Staging) -> dist.ReduceScatterOptions:
    """Gloo's options for a reduce-scatter whose inputs are `host_inputs` (copies it owns: a
    PREMUL_SUM scales them)."""
    options = dist.ReduceScatterOptions()
    if opts is not None:
        options.reduceOp = premul_sum.scaled_to_sum(opts.reduceOp, host_inputs, staging.read, "reduce_scatter")
    return options


class _Pending:
    """One collective between issue and completion: its gloo works, how to finish it, its future.

    Whoever claims it first finishes it: the thread that waits on its Work (a synchronous call waits
    at once, so its results come back without a hand-over between threads), or the group's
    completion thread (for calls nobody is waiting on yet, such as DDP's buckets)."""

    __slots__ = ("kind", "host_works", "finish", "handoff", "result", "receives", "source_rank", "_claim")

    def __init__(self, kind: str, host_works: list[dist.Work], finish: Callable[..., list[torch.Tensor]], handoff: Handoff, receives: bool = False) -> None:
        self.kind = kind
        self.host_works = host_works
        self.finish: Callable[..., list[torch.Tensor]] | None = finish
        self.handoff: Handoff | None = handoff
        self.result: torch.futures.Future = _ClaimingFuture(self)
        self.receives = receives  # a recv: the transport's work knows which rank sent the data
        self.source_rank: int | None = None
        self._claim = threading.Lock()

    def run_if_unclaimed(self) -> None:
        if not self._claim.acquire(blocking=False):
            return
        try:
            for work in self.host_works:
                work.wait()
            if self.receives:
                self.source_rank = self.host_works[0]._source_rank()
            value = self.finish()  # type: ignore[misc] - set until claimed, and claimed once
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the work
            if self.finish is not None:
                self.finish(True)
            self.result.set_exception(FailedCollective(f"{self.kind} on the tpu process group failed: {transport_message(error)}"))
            return
        finally:
            # The staging goes now, and the host buffers once gloo's thread has dropped the works too;
            # only the Work's future keeps the results.
            self.host_works = []
            self.finish = None
            self.result._pending = None  # type: ignore[attr-defined] - a _ClaimingFuture; breaks the cycle
            quarantine.hold(self.handoff)  # type: ignore[arg-type] - set until claimed, and claimed once
            self.handoff = None
        self.result.set_result(value)


class _ClaimingFuture(torch.futures.Future):
    """The future of one collective. Waiting on it in Python finishes the collective on the waiting
    thread when no thread has claimed it yet: a callback chained on another collective's future runs on
    the group's completion thread, and one that issues a collective and waits on its future (DDP's
    PowerSGD hook) would otherwise wait for that same thread. `call` is the call's trace record (None while nothing
    records): a wait here is the user's, and once the future is collected nobody can wait any more."""

    def __init__(self, pending: _Pending) -> None:
        super().__init__()
        self._pending: _Pending | None = pending
        self.call: tracing.CollectiveCall | None = None

    def __del__(self) -> None:
        if self.call is not None:
            self.call.dropped()

    def wait(self) -> Any:
        if self.call is not None:
            self.call.waited()
        pending = self._pending
        if pending is not None:
            pending.run_if_unclaimed()
        return super().wait()


class _Completion:
    """Finishes the collectives of one group that no caller is waiting on, in issue order, on a
    thread of its own.

    Gloo's own threads never run Python here: a Python callback chained on a gloo future would need
    the GIL on gloo's thread, and a group destroyed by a thread that holds the GIL (at exit, or when
    DDP's reducer goes) joins gloo's threads and would wait forever. Collectives of one group complete
    in the same order on every rank, so finishing them in issue order delays none beyond its
    predecessors; point-to-point works, which need not complete in order, each get a short-lived
    thread (`ordered=False`).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        _completions.add(self)

    def submit(self, pending: _Pending, ordered: bool = True) -> None:
        if not ordered:
            _start(threading.Thread(target=pending.run_if_unclaimed, name="tputrace-p2p", daemon=True))
            return
        with self._lock:
            if self._thread is None:
                self._queue = queue.SimpleQueue()
                self._thread = _start(threading.Thread(target=_completion_loop, args=(self._queue,), name="tputrace-collectives", daemon=True))
            self._queue.put(pending)

    def close(self, wait_s: float = 0.0) -> None:
        """Stop the thread once it has finished the calls queued before; wait up to `wait_s` for that.
        A call submitted later starts a thread (and a queue) of its own; nothing is made here, as a
        group collected at interpreter exit closes after the modules are gone."""
        with self._lock:
            thread, pending_calls = self._thread, self._queue
            self._thread = None
        if thread is not None:
            pending_calls.put(None)
            if wait_s and thread is not threading.current_thread():
                thread.join(wait_s)


_completions: weakref.WeakSet[_Completion] = weakref.WeakSet()
_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # completion and point-to-point threads


def _start(thread: threading.Thread) -> threading.Thread:
    _threads.add(thread)
    thread.start()
    return thread


def _finish_threads_before_exit() -> None:
    """At interpreter exit, before finalization: stop every group's completion thread and wait (up to
    `_SHUTDOWN_WAIT_S` in all) for the threads still finishing a call. A daemon thread that drops a
    gloo work during finalization cannot take the GIL back and the process aborts ("terminate called
    without an active exception")."""
    for completion in list(_completions):
        completion.close()
    deadline = time.monotonic() + _SHUTDOWN_WAIT_S
    for thread in list(_threads):
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    quarantine.sweep()


def _completion_loop(pending_calls: queue.SimpleQueue) -> None:
    while True:
        pending = pending_calls.get()
        if pending is None:
            return
        pending.run_if_unclaimed()
        # Not held while waiting for the next call: a finished collective's tensors (an all-gather's
        # output, gloo's host buffers) would stay alive until then.
        del pending


def _create(options: Any, backend_options: Any) -> TpuProcessGroup:
    """c10d's creator for the "tpu" backend (extended API: it tells us the group's global ranks)."""
    op_handlers.install_op_handlers()
    return TpuProcessGroup(options.store, options.group_rank, options.group_size, options.timeout, list(options.global_ranks_in_group))


def register_backend() -> None:
    """Make "tpu" a c10d backend for tpu tensors, in groups made for it and in every other (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=[BACKEND_NAME])
    atexit.register(_finish_threads_before_exit)
    _serve_tpu_tensors_in_every_group()


def _serve_tpu_tensors_in_every_group() -> None:
    """A group made for another backend (`init_process_group("gloo")`, `new_group(backend="gloo")`,
    "cpu:gloo") gets the "tpu" backend for tpu tensors too, as gloo serves CUDA tensors itself. torch
    maps such a group's devices to that backend only (gloo: cpu and cuda), and a collective on tpu
    tensors then ran as a host fallback that left its outputs unwritten: `all_gather` gave zeros, and
    DDP refused the model ("inconsistent 0 params")."""
    config = dist.distributed_c10d.BackendConfig
    original_init = config.__init__

    def __init__(self: Any, backend: Any) -> None:
        original_init(self, backend)
        if self.device_backend_map and BACKEND_NAME not in self.device_backend_map:
            self.device_backend_map[BACKEND_NAME] = dist.Backend(BACKEND_NAME)

    config.__init__ = __init__
