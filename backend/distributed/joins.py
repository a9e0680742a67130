"""The collectives a rank that ran out of inputs issues inside `Join` (DDP's `with model.join():`, ZeroRedundancyOptimizer's
join hook): once its loop ends, the context's exit shadows the other ranks' all-reduces until every rank has joined,
from the `with` line, where the others issue theirs from the loop's lines. They are recorded with a `join` cause, so that
pairing them with calls of other lines is not read as ranks issuing collectives out of step.
"""

from __future__ import annotations

import functools
from typing import Any

from tputrace.backend.distributed import causes, tracing

_installed = False


def install() -> None:
    """Give the collectives inside `Join.__exit__` a `join` cause (once)."""
    global _installed
    if _installed:
        return
    from torch.distributed.algorithms.join import Join

    original = Join.__exit__

    @functools.wraps(original)
    def __exit__(self: Join, *exc_info: Any) -> Any:
        recorder = tracing.active_recorder()
        cause = None if recorder is None else causes.make("join", op="Join", origin_frame_id=recorder.frame_id())
        with causes.caused_by(cause):
            return original(self, *exc_info)

    Join.__exit__ = __exit__  # type: ignore[method-assign]
    _installed = True
