"""Waiting at interpreter exit for the programs still running and for autograd's worker thread.

JAX runs a launched program on XLA's own threads and returns at once. A script whose last lines
launch one (a backward pass's flush, a step whose values nobody reads) reaches the end of the
interpreter while it runs, and the teardown of XLA's C++ state under the running program crashed
the process with a segmentation fault after the script had finished.

Backward through tpu tensors runs on torch's C++ worker thread for the device. `backward()` returns
once the pass is done, but the worker drops its last reference to the pass's state (a copy of the
caller's thread-local state) a moment later, and that state holds a Python object: the
`contextvars` context torch stashes for each backward (`torch.autograd.graph._engine_run_backward`).
Its release takes the GIL; when the main thread has begun finalizing by then, Python ends the worker
thread inside C++ code that cannot unwind, and the process aborts after the script has finished
("terminate called without an active exception"). So the exit waits until the worker has released
the contexts of the last passes.
"""

from __future__ import annotations

import atexit
import collections
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import torch

WORKER_WAIT_S = 5.0  # a bound only: the worker releases a finished pass's state within microseconds
_GRACE_S = 0.005  # the rest of that release after the context: members that may take the GIL too
_registered = False
# Each backward's stashed context, while the worker may still hold it; popped when released.
_backward_contexts: collections.deque[object] = collections.deque(maxlen=16)


def wait_for_running_programs() -> None:
    """Block until every array still alive is computed (the outputs of every program running)."""
    try:
        jax.block_until_ready(jax.live_arrays())
    except Exception:  # noqa: BLE001 - a program that failed has nothing left running; exit as the script asked
        pass


def wait_for_autograd_worker(timeout_s: float = WORKER_WAIT_S) -> bool:
    """Block (releasing the GIL) until autograd's worker has released the state of every backward
    pass it ran; False when `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    waited = False
    while _backward_contexts:
        context = _backward_contexts[0]
        # References: the deque's, `context`'s and getrefcount's argument; any more is a pass's state.
        while sys.getrefcount(context) > 3:
            if time.monotonic() > deadline:
                return False
            waited = True
            time.sleep(0.001)
        del context
        _backward_contexts.popleft()
    if waited:
        time.sleep(_GRACE_S)
    return True


def _at_exit() -> None:
    wait_for_running_programs()
    wait_for_autograd_worker()


def _keeping_backward_contexts(stash: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    def stash_obj_in_tls(key: str, value: Any) -> None:
        if key == "context":
            _backward_contexts.append(value)
        stash(key, value)

    return stash_obj_in_tls


def register() -> None:
    """Wait for running programs and autograd's worker at exit (idempotent)."""
    global _registered
    if not _registered:
        torch._C._stash_obj_in_tls = _keeping_backward_contexts(torch._C._stash_obj_in_tls)  # type: ignore[assignment]
        atexit.register(_at_exit)
        _registered = True
