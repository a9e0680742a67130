"""Which recorded process a process descends from, and the rank it records under.

Each recording process says who it is in the environment (`PARENT_ENV`: its trace, ranks, pid, mode,
script), so that every process started below it knows its nearest recorded ancestor. A child
recording claims the first free rank `root_rank + world_size * k` (k = 1, 2, ...) with a claim file
in `<trace>.forks/`, so the children of different ranks of an `--nproc` run never share a rank
number. Standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tputrace.recording.interface import PARENT_ENV

if TYPE_CHECKING:
    from tputrace.recording.recorder import Recorder

_CLAIM_SUFFIX = ".claim"


@dataclass(frozen=True)
class ParentRecording:
    """The recorded process a child descends from, as the environment carries it."""

    trace: str | None  # the root's trace, where children's traces are merged (None: --no-trace)
    root_rank: int
    world_size: int
    rank: int
    pid: int
    mode: str
    script: str
    argv: list[str]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ParentRecording:
        return cls(**json.loads(text))


def describe(recorder: Recorder) -> ParentRecording:
    """`recorder` as the processes it starts see it."""
    return ParentRecording(
        trace=recorder.fork_root,
        root_rank=recorder.root_rank,
        world_size=recorder.world_size,
        rank=recorder.rank,
        pid=recorder.pid,
        mode=recorder.mode,
        script=recorder.script,
        argv=recorder.argv,
    )


def export(recorder: Recorder) -> None:
    """Tell the processes started from now on that `recorder` is their nearest recorded ancestor."""
    os.environ[PARENT_ENV] = describe(recorder).to_json()


def inherited() -> ParentRecording | None:
    """The nearest recorded ancestor this process's environment names, or None."""
    parent_json = os.environ.get(PARENT_ENV)
    return None if parent_json is None else ParentRecording.from_json(parent_json)


def forget_parent() -> str | None:
    """Drop the inherited description (a root recording starts); returns it, for `restore`."""
    return os.environ.pop(PARENT_ENV, None)


def restore(previous: str | None) -> None:
    """Put back what `forget_parent` returned, once a root recording has stopped."""
    if previous is None:
        os.environ.pop(PARENT_ENV, None)
    else:
        os.environ[PARENT_ENV] = previous


def claim_rank(directory: Path, root_rank: int, world_size: int) -> int:
    """The first rank `root_rank + world_size * k` (k >= 1) no other child process has claimed.

    The claim file holds this process's pid (`claimed_rank` reads it)."""
    directory.mkdir(exist_ok=True)
    multiple = 1
    while True:
        rank = root_rank + world_size * multiple
        try:
            claim = os.open(directory / f"rank{rank}{_CLAIM_SUFFIX}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            multiple += 1
            continue
        try:
            os.write(claim, str(os.getpid()).encode())
        finally:
            os.close(claim)
        return rank


def claimed_rank(directory: Path, pid: int) -> int | None:
    """The rank process `pid` claimed in `directory` (the latest, if its pid was reused), or None."""
    ranks = []
    for claim in directory.glob(f"rank*{_CLAIM_SUFFIX}"):
        try:
            claimed_by = claim.read_text()
        except OSError:
            continue
        if claimed_by == str(pid):
            ranks.append(int(claim.name.removeprefix("rank").removesuffix(_CLAIM_SUFFIX)))
    return max(ranks, default=None)
