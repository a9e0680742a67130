"""The dispatcher's table of special routes, and the process's one dispatcher, low in the import graph.

A module that gives ops a route of its own (collectives, in-place views, packed sequences...) registers
the handler here (`register_special`) from its `register()`; the dispatcher reads the table when it
first routes an op. A module that runs ops through the dispatcher gets it from `active()`, typed by
`DispatcherApi`, rather than importing the dispatch module, which imports the modules it routes to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

Handler = Callable[[tuple, dict], Any]

SPECIAL_ROUTES: dict[Any, Handler] = {}  # op -> handler(args, kwargs)


class DispatcherApi(Protocol):
    """What the backend's modules use of the Dispatcher (`core.dispatch.Dispatcher`)."""

    executor: Any
    recorder: Any
    thread_lock: threading.RLock
    routes: dict[int, tuple[Callable, Any]]
    special: dict[Any, Handler]
    plans: dict[Any, Any]
    length_recompiles: Any
    worker_errors: list[BaseException]

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any: ...

    def dispatch_on_worker(self, func: Any, args: tuple, kwargs: dict) -> Any: ...

    def raise_worker_errors(self) -> None: ...

    def register_special(self, op: Any, handler: Handler) -> None: ...

    def compute(self, entry: Any, args: Sequence[Any], kwargs: dict, record_as: str | None = None, flat: Any = ...) -> Any: ...

    def read(self, tensor: Any) -> Any: ...

    def write(self, tensor: Any, value: Any) -> None: ...

    def to_host(self, tensor: Any, sync_kind: str) -> torch.Tensor: ...

    def from_host(self, host: torch.Tensor, chip: int) -> Any: ...

    def compile_reason(self, structure_key: Any, in_specs: tuple, names: Sequence[str] | None = None, precision: str | None = None,
                       *, evicted: bool = False) -> tuple[str, str | None]: ...

    def record_compile(self, plan: Any, kind: str, *, evicted: bool = False) -> None: ...

    def _entry(self, op: Any) -> Any: ...

    def _route(self, func: Any) -> tuple[Callable, Any]: ...

    def _new_output(self, value: Any, spec: Any, chip: int) -> Any: ...

    def _append_tensor(self, tensor: Any, dynamic: list, specs: list) -> None: ...


_active: DispatcherApi | None = None


def install(dispatcher: DispatcherApi) -> None:
    """Make `dispatcher` the process's dispatcher (`core.dispatch` does, once, when it makes it)."""
    global _active
    _active = dispatcher


def active() -> DispatcherApi:
    """The process's dispatcher."""
    dispatcher = _active
    if dispatcher is None:
        raise RuntimeError("the tpu dispatcher is not made yet: import tputrace.backend first")
    return dispatcher


def register_special(op: Any, handler: Handler) -> None:
    """Route `op` to `handler(args, kwargs)`, replacing any route the dispatcher has cached for it."""
    SPECIAL_ROUTES[op] = handler
    if _active is not None:
        _active.routes.pop(id(op), None)
