"""Finding a recorded source file on this machine: at its recorded path, or under a source root (a trace
recorded on a TPU VM can be read next to a checkout of the same code elsewhere), preferring a copy whose
content is the one the run saw (`source_files`)."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from tputrace.source_digests import SourceDigest, digest_file


def source_candidates(recorded: str, roots: Sequence[str | os.PathLike[str]]) -> Iterator[Path]:
    """The files that may be `recorded` here, in order: the recorded path when it is absolute, then the
    recorded path's trailing parts under each root, longest first; only those that are regular files."""
    recorded_path = Path(recorded)
    if recorded_path.is_absolute() and recorded_path.is_file():
        yield recorded_path
    parts = [part for part in recorded_path.parts if part not in ("/", "")]
    for root in roots:
        root_path = Path(root)
        for start in range(len(parts)):
            candidate = root_path.joinpath(*parts[start:])
            if candidate.is_file():
                yield candidate


def copy_as_run_saw(recorded: str, roots: Sequence[str | os.PathLike[str]], seen: Collection[SourceDigest]) -> Path | None:
    """The first candidate for `recorded` whose content is one of `seen` (the digests the run recorded for
    it), or None when none is."""
    for candidate in source_candidates(recorded, roots):
        if digest_file(candidate) in seen:
            return candidate
    return None
