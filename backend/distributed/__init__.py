"""Distributed training on `tpu`: the c10d backend "tpu" (`dist.init_process_group("tpu")`), the
functional collectives DTensor and FSDP2 use, FSDP2's storage freeing, and collective trace rows.

`register()` runs once when the backend loads (from `tputrace.backend.registration`).
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
    from tputrace.backend.distributed import functional, process_group

    process_group.register_backend()
    functional.register()
    _registered = True
