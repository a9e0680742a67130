"""Distributed training on `tpu`: the c10d backend "tpu" (`dist.init_process_group("tpu")`), the
functional collectives DTensor and FSDP2 use, FSDP2's storage freeing, collective trace rows, and the
DDP options refused on tpu.

`register()` runs when the backend loads (from `tputrace.backend.compat.registration`) and only registers the
c10d backend; the op handlers are installed when the first tpu process group is created, so that
importing the backend does not import FSDP and DTensor.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register the c10d backend and the dispatcher handlers for collective and FSDP ops (idempotent)."""
    global _registered
    if _registered:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    from tputrace.backend.core import worker_errors
    from tputrace.backend.distributed import collective_errors, ddp_options, process_group

    process_group.register_backend()
    ddp_options.install()
    if collective_errors.failed_collective not in worker_errors.FAILURE_READERS:
        worker_errors.FAILURE_READERS.append(collective_errors.failed_collective)
    _registered = True
