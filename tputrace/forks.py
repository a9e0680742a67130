"""Child processes in a trace: which ranks are processes a recorded process forked or started, not
distributed ranks.

A process forked under `tputrace run`, or started by it as a fresh interpreter that uses the tpu
(multiprocessing's spawn and forkserver children, a Python command), records into a trace of its own
under a rank number of its own; when the recording ends its rows are merged into the parent's trace.
The child's file says where it came from in `meta.forked_from`; a merged trace lists every such rank
in `meta.forks`. Both are JSON. Standard library only: the trace reader uses this.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

FORKED_FROM_META_KEY = "forked_from"
FORKS_META_KEY = "forks"
FORKS_DIR_SUFFIX = ".forks"
# How a child process began: os.fork (and multiprocessing's fork start method), multiprocessing's
# spawn or forkserver start method, or a Python command the script ran (subprocess, os.exec*).
START_METHODS = ("fork", "spawn", "forkserver", "command")


@dataclass(frozen=True)
class ForkOrigin:
    """A child process's rank in the trace, its pid, the rank and pid of the recorded process it came
    from (its nearest recorded ancestor), and how it began (one of `START_METHODS`)."""

    rank: int
    pid: int
    parent_rank: int
    parent_pid: int
    start_method: str = "fork"

    def to_json(self) -> str:
        return json.dumps(_json_fields(self))

    @classmethod
    def from_fields(cls, values: Mapping[str, object]) -> ForkOrigin:
        """From its JSON object; keys this version does not know are ignored."""
        known = {field.name for field in fields(cls)}
        return cls(**{name: value for name, value in values.items() if name in known})  # type: ignore[arg-type]


_STARTED_BY = {
    "fork": "forked from",
    "spawn": "spawned by",
    "forkserver": "started through a forkserver by",
    "command": "started as a command by",
}


def started_by(origin: ForkOrigin) -> str:
    """How the child began, for a sentence: 'forked from', 'spawned by', ... (then the parent)."""
    return _STARTED_BY.get(origin.start_method, f"started ({origin.start_method}) by")


def _json_fields(origin: ForkOrigin) -> dict[str, object]:
    """The JSON object of an origin; a fork's leaves out `start_method`, as traces before it had none."""
    values = asdict(origin)
    if origin.start_method == "fork":
        del values["start_method"]
    return values


def fork_origins(meta: Mapping[str, str]) -> dict[int, ForkOrigin]:
    """The forked ranks a trace's `meta` names (its own `forked_from` and a merge's `forks`), by rank."""
    origins: dict[int, ForkOrigin] = {}
    forked_from = meta.get(FORKED_FROM_META_KEY)
    if forked_from:
        origin = ForkOrigin.from_fields(json.loads(forked_from))
        origins[origin.rank] = origin
    forks = meta.get(FORKS_META_KEY)
    if forks:
        for values in json.loads(forks):
            origin = ForkOrigin.from_fields(values)
            origins[origin.rank] = origin
    return origins


def forks_meta(origins: Mapping[int, ForkOrigin]) -> str:
    """`meta.forks` of a merged trace."""
    return json.dumps([_json_fields(origins[rank]) for rank in sorted(origins)])


def forks_dir(trace_path: str | Path) -> Path:
    """Where the processes forked during a recording keep their own traces until the merge: `<trace>.forks/`."""
    path = Path(trace_path)
    return path.with_name(path.name.removesuffix(".tptrace") + FORKS_DIR_SUFFIX)
