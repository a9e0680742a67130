"""The dispatcher handlers for the functional collectives and FSDP2's ops on tpu tensors, installed when the
first tpu process group is created, so that importing the backend does not import FSDP and DTensor."""

from __future__ import annotations

_handlers_installed = False


def install_op_handlers() -> None:
    """Route the functional collectives and FSDP2's ops on tpu tensors to their handlers (once)."""
    global _handlers_installed
    if _handlers_installed:
        return
    from tputrace.backend.distributed import fsdp, functional, sharding_hooks

    functional.register()
    fsdp.register()
    sharding_hooks.install()
    _handlers_installed = True
