"""A bound on the compiled programs the backend keeps, oldest dropped first.

Every cached program (an op's, a fused graph's, a `torch.compile` graph's) is kept here with the
function that removes it from its owner's cache. Past `limit()` programs, the oldest kept goes: its
owner compiles it again when next needed, and that recompile's diff says why. Without a bound a
process whose shapes never repeat grows without end, and on XLA:CPU it crashes: each program maps
about four memory regions, and Linux caps a process at `vm.max_map_count` (65,530 by default).

The order is the order of compiles, not of use: a hot program is compiled again at most once per
`limit()` new compiles, and a use costs nothing to track.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from tputrace import settings
from tputrace.schema import EVICTED_DIFF_PREFIX

ENV_VARIABLE = settings.MAX_PROGRAMS[0]
EVICTED_DIFF = f"{EVICTED_DIFF_PREFIX} ({ENV_VARIABLE} keeps {{limit}})"

_lock = threading.RLock()  # reentrant: a weakref callback may run inside a locked block (a collection)
_kept: dict[int, tuple[weakref.ref, Callable[[], None]]] = {}  # in compile order: id -> (entry, forget)
# What eviction dropped, until its owner compiles it again: (id(owner), key or None) -> owner (plans compare by value).
_evicted: dict[tuple[int, Any], weakref.ref] = {}
_evictions = 0


_limit = settings.positive_int(settings.MAX_PROGRAMS)


def limit() -> int:
    """How many compiled programs are kept at most."""
    return _limit


def set_limit(count: int) -> None:
    """Keep at most `count` compiled programs from now on, dropping the oldest past it."""
    global _limit
    if count < 1:
        raise ValueError(f"the program cache must keep at least 1 program, not {count}")
    _limit = count
    _evict()


def keep_attribute(owner: Any, name: str, program: Any) -> None:
    """Keep `program`, which `owner.<name>` holds (a plan's program): dropping it sets that to None."""
    owner_ref = weakref.ref(owner)
    program_ref = weakref.ref(program)

    def forget() -> None:
        holder = owner_ref()
        if holder is not None and getattr(holder, name) is program_ref():
            setattr(holder, name, None)
            _mark_evicted(holder, None)

    _keep(program, forget)


def keep_item(owner: Any, cache_name: str, key: Any, entry: Any) -> None:
    """Keep `entry`, which the dict `owner.<cache_name>` holds at `key`: dropping it deletes that item."""
    owner_ref = weakref.ref(owner)
    entry_ref = weakref.ref(entry)

    def forget() -> None:
        holder = owner_ref()
        if holder is not None:
            cache = getattr(holder, cache_name)
            if cache.get(key) is entry_ref():
                del cache[key]
                _mark_evicted(holder, key)

    _keep(entry, forget)


def _keep(entry: Any, forget: Callable[[], None]) -> None:
    """Keep `entry` (an object that holds one compiled program) until it is freed or dropped; only
    weak references to it and its owner are held here."""
    key = id(entry)

    def freed(_: weakref.ref, key: int = key) -> None:
        with _lock:
            kept = _kept.get(key)
            if kept is not None and kept[0]() is None:
                del _kept[key]

    with _lock:
        _kept[key] = (weakref.ref(entry, freed), forget)
    _evict()


def _evict() -> None:
    global _evictions
    while True:
        with _lock:
            if len(_kept) <= _limit:
                return
            key = next(iter(_kept))
            reference, forget = _kept.pop(key)
        if reference() is not None:
            _evictions += 1
            forget()


def kept_count() -> int:
    """The compiled programs kept now."""
    with _lock:
        return len(_kept)


def evictions() -> int:
    """Programs dropped to stay within the limit since the process started."""
    return _evictions


def _mark_evicted(owner: Any, key: Any) -> None:
    mark = (id(owner), key)
    with _lock:
        _evicted[mark] = weakref.ref(owner, lambda _: _evicted.pop(mark, None))


def take_evicted(owner: Any, key: Any = None) -> bool:
    """Whether eviction dropped `owner`'s program (`keep_attribute`), or its entry at `key` (`keep_item`),
    since it was compiled; the mark goes, as the caller is compiling it again."""
    with _lock:
        reference = _evicted.pop((id(owner), key), None)
    return reference is not None and reference() is owner


def evicted_diff() -> str:
    """The diff of a recompile of a program that eviction dropped."""
    return EVICTED_DIFF.format(limit=_limit)


def drop_all() -> None:
    """Drop every kept program from its owner's cache (not counted as evictions)."""
    with _lock:
        entries = list(_kept.values())
        _kept.clear()
        _evicted.clear()
    for reference, forget in entries:
        if reference() is not None:
            forget()
