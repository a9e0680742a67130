"""Runs a script with the time spent in the sharding records' hooks summed per rank (for
bench/sharding_records.py): the functions that tell causes, note round trips and repeated reductions,
and record placements are wrapped with a timer; at exit each rank writes its totals per step (the recorder's step
index when the hook ran) to `$SHARDING_HOOK_TIMES/rank<N>.json`.

    SHARDING_HOOK_TIMES=DIR tputrace run --nproc N bench/sharding_records_timed.py SCRIPT [ARGS ...]
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from script_runner import run_named_script

_by_step: dict[int, list[int]] = {}  # step index -> [nanoseconds in the hooks, calls]


def _timed(function: Callable[..., Any]) -> Callable[..., Any]:
    from tputrace.recording.interface import active

    clock = time.perf_counter_ns

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return function(*args, **kwargs)
        finally:
            elapsed = clock() - start
            recorder = active()
            entry = _by_step.setdefault(recorder.step_index if recorder is not None else -1, [0, 0])
            entry[0] += elapsed
            entry[1] += 1

    return timed


def _write() -> None:
    directory = Path(os.environ["SHARDING_HOOK_TIMES"])
    rank = os.environ.get("RANK", "0")
    (directory / f"rank{rank}.json").write_text(json.dumps({str(step): values for step, values in _by_step.items()}))


def main() -> None:
    from tputrace.backend.distributed import causes, placements, redistributions, sharding_hooks

    for module, name in ((sharding_hooks, "_redistribute_cause"), (sharding_hooks, "_group_cause"), (redistributions, "before"),
                         (redistributions, "after"), (redistributions, "reduces_again"), (causes, "cause_id"), (placements, "record_pending")):
        setattr(module, name, _timed(getattr(module, name)))
    for name in ("__enter__", "__exit__"):
        setattr(causes.caused_by, name, _timed(getattr(causes.caused_by, name)))
    causes.DataParallelModel.read_buckets = _timed(causes.DataParallelModel.read_buckets)  # type: ignore[method-assign]
    atexit.register(_write)
    run_named_script()


if __name__ == "__main__":
    main()
