"""When launched programs finish: a watcher thread polls each execution's outputs and writes an
`executions` row once they are ready."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from typing import Any

from tputrace.store.writer import TraceWriter

_perf_ns = time.perf_counter_ns
# Outputs of an execution the watcher keeps weak references to.
_WATCHED_OUTPUTS = 4
# An array the watcher alone holds, or weak references to some of the outputs.
_Watched = Any | list[weakref.ref]
_Execution = tuple[int | None, int, int, int | None, int, _Watched]


def _finished(references: list[weakref.ref]) -> bool:
    """Whether a watched execution's outputs are ready (they are ready together): one of them still alive is. An
    output freed, or deleted by a later program that it was donated to, says nothing, as the donation can come
    before the program that makes it has run; with all of them gone the program is taken as over."""
    for reference in references:
        try:
            value = reference()
            if value is None or value.is_deleted():
                continue
            return bool(value.is_ready())
        except Exception:  # noqa: BLE001 - a failed program's output: it is over
            return True
    return True


class ExecutionWatcher:
    """Writes one `executions` row per launched program of one rank; its thread starts at the first launch.

    The watcher holds an output of the program's own that nothing else reads where the program has one (a
    DeferAndFuse flush's `done`), else weak references to a few outputs: a strong one would keep an output array
    from being donated to the next program (DeferAndFuse donates arrays nothing else holds), and whether it
    still held one would depend on the watcher's timing, changing the program from step to step."""

    def __init__(self, writer: TraceWriter, rank: int, t0: int) -> None:
        self._writer = writer
        self._rank = rank
        self._t0 = t0
        self._executions: queue.SimpleQueue[_Execution | None] | None = None
        self._thread: threading.Thread | None = None

    def launched(self, program_id: int | None, chip: int, launch_ns: int, flush_id: int | None, step: int, results: Any,
                 done: Any = None) -> None:
        """A program was launched at `launch_ns` (a perf_counter time) with `results` (its output arrays) and `done`
        (None, or an output that only the watcher holds)."""
        if self._executions is None:
            self._executions = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._watch, args=(self._executions,), name="tputrace-executions", daemon=True)
            self._thread.start()
        watched: _Watched = done
        if done is None:
            # The watcher polls the first output still alive (see `_finished`), among a few spread over the outputs.
            arrays = [value for value in results if hasattr(value, "block_until_ready")]
            step_size = max(1, len(arrays) // _WATCHED_OUTPUTS)
            watched = [weakref.ref(value) for value in arrays[::step_size][:_WATCHED_OUTPUTS]]
        self._executions.put((program_id, chip, launch_ns, flush_id, step, watched))

    def _watch(self, executions: queue.SimpleQueue[_Execution | None]) -> None:
        while True:
            item = executions.get()
            if item is None:
                return
            program_id, chip, launch_ns, flush_id, step, watched = item
            del item
            if isinstance(watched, list):
                # The outputs of one execution are ready together: polling one suffices.
                delay = 50e-6
                while watched and not _finished(watched):
                    time.sleep(delay)
                    delay = min(delay * 2, 2e-3)
            elif watched is not None:
                # An array only the watcher holds: wait for it without the interpreter lock, woken once when ready.
                with contextlib.suppress(Exception):  # a failed program: it is over
                    watched.block_until_ready()
            del watched
            end = _perf_ns()
            self._writer.append("executions", (self._rank, program_id, chip, launch_ns - self._t0, end - launch_ns, step, flush_id))

    def stop(self) -> None:
        """Write what is still watched, then end the thread (it is given 30 s)."""
        if self._executions is not None and self._thread is not None:
            self._executions.put(None)
            self._thread.join(timeout=30)
            self._executions = None
