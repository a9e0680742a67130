"""tpu tensors and other processes: a one-line error with CUDA's advice, not a hang.

CUDA shares a tensor with another process through an IPC handle (`share_memory_()` is a no-op for
it; torch.multiprocessing sends the handle), which is how Hogwild training (`model.share_memory()`,
then `mp.Process(target=train, args=(model,))`) updates one model from several processes. Chip memory
held by JAX has no such handle, so neither route can work on tpu:

- A process forked after JAX's runtime started in its parent (a tpu tensor made, a tpu op run, the
  chips counted; the default start method on Linux) inherits a runtime whose threads did not
  survive the fork: its first tpu op hung. It raises instead, as CUDA raises `Cannot re-initialize
  CUDA in forked subprocess` only when the parent had initialised CUDA, and
  `torch.tpu._is_in_bad_fork()` says so (torch then skips seeding the chips, as for CUDA). A process
  forked from one that had only imported the backend starts its own runtime and uses tpu; a forked
  process that touches only host data (a DataLoader worker) is unaffected.
- Sending a tpu tensor to another process (spawn's arguments, a `multiprocessing.Queue`) raised an
  error about saving storages; it raises one saying to send a host copy.
"""

from __future__ import annotations

import os
from multiprocessing.reduction import ForkingPickler
from typing import Any, NoReturn

from tputrace.backend.core import routing

FORKED_MESSAGE = (
    "Cannot use tpu in a forked subprocess: the parent's JAX runtime does not survive a fork. "
    "To use tpu with multiprocessing, you must use the 'spawn' start method"
)
SEND_MESSAGE = (
    "a tpu tensor cannot be sent to another process: chip memory has no inter-process handle as CUDA "
    "memory has (share_memory_() makes none); send tensor.cpu() and move it to tpu in that process"
)

_forked = False
_installed = False


def in_bad_fork() -> bool:
    """Whether this process was forked from one where JAX's runtime had started."""
    return _forked


def check_not_forked() -> None:
    """Raise the forked-subprocess error in a process forked from one where JAX's runtime had started."""
    if _forked:
        raise RuntimeError(FORKED_MESSAGE)


def _refuse_op(*args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError(FORKED_MESSAGE)


def runtime_started() -> bool:
    """Whether JAX's XLA runtime (its clients, with their threads) has started in this process.

    JAX says so only in a private module; where that is gone, the answer is yes, which refuses a
    forked child as every fork was refused before."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


def _after_fork_in_child() -> None:
    """In a child of a parent whose runtime had started, route every tpu op to the error (JAX is
    never reached, so nothing hangs): the routes cached in the parent go, so each op reaches
    `dispatch`, which refuses. The runtime's state is the parent's, copied by the fork."""
    global _forked
    if not runtime_started():
        return
    _forked = True
    dispatcher = routing.active()
    dispatcher.routes.clear()
    dispatcher.dispatch = _refuse_op
    dispatcher.dispatch_on_worker = _refuse_op


def _refuse_to_send(tensor: Any) -> NoReturn:
    raise RuntimeError(SEND_MESSAGE)


def install() -> None:
    """Mark forked children and refuse to pickle tpu tensors for another process (idempotent)."""
    global _installed
    if _installed:
        return
    from tputrace.backend.core.tensor import TpuTensor

    os.register_at_fork(after_in_child=_after_fork_in_child)
    ForkingPickler.register(TpuTensor, _refuse_to_send)
    _installed = True
