"""Forked processes in a trace: which ranks are processes forked from another one, not distributed ranks.

A process forked under `tputrace run` records into a trace of its own under a rank number of its
own; when the recording ends its rows are merged into the parent's trace. The child's file says
where it came from in `meta.forked_from`; a merged trace lists every forked rank in `meta.forks`.
Both are JSON. Standard library only: the trace reader uses this.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

FORKED_FROM_META_KEY = "forked_from"
FORKS_META_KEY = "forks"
FORKS_DIR_SUFFIX = ".forks"


@dataclass(frozen=True)
class ForkOrigin:
    """A forked process's rank in the trace, its pid, and the rank and pid of the process it was forked from."""

    rank: int
    pid: int
    parent_rank: int
    parent_pid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def fork_origins(meta: Mapping[str, str]) -> dict[int, ForkOrigin]:
    """The forked ranks a trace's `meta` names (its own `forked_from` and a merge's `forks`), by rank."""
    origins: dict[int, ForkOrigin] = {}
    forked_from = meta.get(FORKED_FROM_META_KEY)
    if forked_from:
        origin = ForkOrigin(**json.loads(forked_from))
        origins[origin.rank] = origin
    forks = meta.get(FORKS_META_KEY)
    if forks:
        for fields in json.loads(forks):
            origin = ForkOrigin(**fields)
            origins[origin.rank] = origin
    return origins


def forks_meta(origins: Mapping[int, ForkOrigin]) -> str:
    """`meta.forks` of a merged trace."""
    return json.dumps([asdict(origins[rank]) for rank in sorted(origins)])


def forks_dir(trace_path: str | Path) -> Path:
    """Where the processes forked during a recording keep their own traces until the merge: `<trace>.forks/`."""
    path = Path(trace_path)
    return path.with_name(path.name.removesuffix(".tptrace") + FORKS_DIR_SUFFIX)
