"""An on-disk cache of compiled programs across runs (`TPUTRACE_COMPILE_CACHE=DIR`, `tputrace run
--compile-cache DIR`), on JAX's persistent compilation cache.

With it, a program compiled by an earlier run with the same backend, XLA flags and chips is read from
`DIR` instead of compiled again: a script run a second time spends its first steps loading programs,
not compiling them. Every program is cached, however quickly it compiled, as strict eager's per-op
programs are many and small. `compile_lowered` tells, for each compile, whether it was such a load, from
JAX's monitoring event, which JAX sends on the thread that asked for the compile.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import jax
import jax.monitoring

from tputrace import settings

_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class _CompileEvents(threading.local):
    """This thread's count of programs loaded from the disk cache."""

    hits: int = 0


_events = _CompileEvents()


@dataclass(frozen=True)
class CompileOutcome:
    """A compiled program and whether it came from the on-disk cache."""

    compiled: Any
    loaded_from_disk: bool


def enable_from_environment() -> None:
    """Point JAX's persistent compilation cache at `TPUTRACE_COMPILE_CACHE`, if it is set; before any
    program is compiled."""
    path = settings.compile_cache_directory()
    if path is None:
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.monitoring.register_event_listener(_on_event)


def compile_lowered(lowered: Any) -> CompileOutcome:
    """Compile a lowered JAX computation, noting whether the disk cache supplied it."""
    hits = _events.hits
    compiled = lowered.compile()
    return CompileOutcome(compiled, _events.hits > hits)


def _on_event(name: str, **_: Any) -> None:
    if name == _HIT_EVENT:
        _events.hits += 1

