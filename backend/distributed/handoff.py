"""The host tensors a collective hands to gloo, kept so that gloo's threads never need the GIL.

Gloo runs a collective on one of its worker threads and drops its reference to the work (and so to
the work's tensors) on that thread. A tensor with a Python object is kept alive by C++ references:
when its C++ reference count falls from 2 to 1, c10 decrefs the Python object, which takes the GIL.
If gloo's thread does that while another thread holds the GIL and destroys the gloo backend (its
destructor joins gloo's threads: a DDP reducer freed after its group, the group dropped at exit), the
process hangs. So gloo never gets a tensor that Python owns: it gets a fresh alias (`detach()`, same
memory) that this side also holds from C++ (a `torch.ScriptList`), so gloo's references are never the
last two. A collective's handoff is released once gloo holds none of its aliases (their use counts
say so); until then the process-wide `quarantine` keeps it.
"""

from __future__ import annotations

import threading

import torch

# References to an alias that gloo does not hold: its Python object and the ScriptList pin.
_OWN_REFERENCES = 2


class Handoff:
    """The aliases of one collective's host tensors that gloo holds, and the pin that keeps each of
    them above one C++ reference while gloo may drop its own."""

    __slots__ = ("_aliases", "_pin")

    def __init__(self) -> None:
        self._aliases: list[torch.Tensor] = []
        self._pin = torch.ScriptList([])  # type: ignore[attr-defined] - torch.ScriptList holds C++ references

    def __call__(self, host: torch.Tensor) -> torch.Tensor:
        """The alias of `host` to pass to gloo (gloo reads and writes `host`'s memory through it)."""
        alias = host.detach()
        self._pin.append(alias)
        self._aliases.append(alias)
        return alias

    def released_by_gloo(self) -> bool:
        return all(alias._use_count() <= _OWN_REFERENCES for alias in self._aliases)


class Quarantine:
    """Handoffs of finished collectives that gloo's threads may still reference; each goes as soon
    as a sweep finds gloo done with it (a gloo thread drops a finished work right after finishing it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Handoff] = []

    def hold(self, handoff: Handoff) -> None:
        with self._lock:
            self._held.append(handoff)
        self.sweep()

    def sweep(self) -> None:
        """Release the handoffs gloo is done with (outside the lock: releasing frees host buffers)."""
        with self._lock:
            flags = [handoff.released_by_gloo() for handoff in self._held]
            released = [handoff for handoff, done in zip(self._held, flags) if done]
            self._held = [handoff for handoff, done in zip(self._held, flags) if not done]
        del released  # the last references go here, after the lock is released

    def __len__(self) -> int:
        return len(self._held)


quarantine = Quarantine()
