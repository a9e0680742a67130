"""`torch.compile(model, backend="tpu")`: Dynamo graphs lowered through AOTAutograd to XLA programs.

`register()` (called when `tputrace.backend` is imported) makes `"tpu"` a Dynamo backend. Each FX graph
Dynamo captures goes through AOTAutograd with core ATen decompositions; each forward, backward or
inference graph becomes one XLA program per concrete input signature, built from the same ATen
lowerings as eager ops. `mode` is accepted as Inductor accepts it; `options={"shape_buckets": ...}`
pads dynamic dims to buckets (see `settings.py` and `buckets.py`).

While a trace is recorded, every Dynamo frame compile (with its Dynamo / AOT / XLA time split),
graph break, recompile (with its guard failure), XLA compile per shape, execution and XLA fusion is
written to it.
"""

from __future__ import annotations

from tputrace.backend.compile.settings import CompileSettings

BACKEND_NAME = "tpu"
_backend = None


def register() -> None:
    """Register the Dynamo backend `"tpu"` (idempotent)."""
    global _backend
    if _backend is not None:
        return
    from torch._dynamo.backends.registry import register_backend

    from tputrace.backend.compile.backend import TpuBackend
    from tputrace.backend.compile.events import events

    _backend = TpuBackend(events)
    register_backend(compiler_fn=_backend, name=BACKEND_NAME)
    events.install()


__all__ = ["BACKEND_NAME", "CompileSettings", "register"]
