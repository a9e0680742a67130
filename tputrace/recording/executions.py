"""When launched programs finish: a watcher thread polls each execution's outputs and writes an
`executions` row once they are ready."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Any

from tputrace.store.writer import TraceWriter

_perf_ns = time.perf_counter_ns
_Execution = tuple[int | None, int, int, int | None, int, list[weakref.ref]]


def _finished(reference: weakref.ref) -> bool:
    """Whether a watched output is ready (or gone: freed, donated, or its program failed)."""
    try:
        return reference() is None or reference().is_ready()
    except Exception:  # noqa: BLE001 - a deleted or failed array: its program is over
        return True


class ExecutionWatcher:
    """Writes one `executions` row per launched program of one rank; its thread starts at the first launch.

    The watcher holds weak references only: a strong one would keep an output array from being
    donated to the next program (DeferAndFuse donates arrays nothing else holds), and whether it
    still held one would depend on the watcher's timing, changing the program from step to step."""

    def __init__(self, writer: TraceWriter, rank: int, t0: int) -> None:
        self._writer = writer
        self._rank = rank
        self._t0 = t0
        self._executions: queue.SimpleQueue[_Execution | None] | None = None
        self._thread: threading.Thread | None = None

    def launched(self, program_id: int | None, chip: int, launch_ns: int, flush_id: int | None, step: int, results: Any) -> None:
        """A program was launched at `launch_ns` (a perf_counter time) with `results` (its output arrays)."""
        if self._executions is None:
            self._executions = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._watch, args=(self._executions,), name="tputrace-executions", daemon=True)
            self._thread.start()
        # The outputs of one execution are ready together: the watcher polls the first array only.
        watched = next(([weakref.ref(value)] for value in results if hasattr(value, "block_until_ready")), [])
        self._executions.put((program_id, chip, launch_ns, flush_id, step, watched))

    def _watch(self, executions: queue.SimpleQueue[_Execution | None]) -> None:
        while True:
            item = executions.get()
            if item is None:
                return
            program_id, chip, launch_ns, flush_id, step, watched = item
            del item
            if watched:
                # The outputs of one execution are ready together: polling one suffices. Polling
                # never holds it across a thread switch (see the class's docstring).
                delay = 50e-6
                while not _finished(watched[0]):
                    time.sleep(delay)
                    delay = min(delay * 2, 2e-3)
            end = _perf_ns()
            self._writer.append("executions", (self._rank, program_id, chip, launch_ns - self._t0, end - launch_ns, step, flush_id))

    def stop(self) -> None:
        """Write what is still watched, then end the thread (it is given 30 s)."""
        if self._executions is not None and self._thread is not None:
            self._executions.put(None)
            self._thread.join(timeout=30)
            self._executions = None
