"""The trace store: `TraceWriter` writes a trace file, `Trace` (from `open_trace`) reads one.

Submodules are imported on first use, so the recorder importing the writer does not load the reader.
"""

from __future__ import annotations

from typing import Any

from tputrace.store.errors import QueryError, TraceError, TraceWriteError, TputraceError

__all__ = ["QueryError", "Trace", "TraceError", "TraceWriteError", "TraceWriter", "TputraceError", "open_trace"]

_LAZY_NAMES = {"Trace": "reader", "open_trace": "reader", "TraceWriter": "writer"}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tputrace.store' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"tputrace.store.{module_name}"), name)
