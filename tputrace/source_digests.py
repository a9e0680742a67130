"""Content digests of source files: the recorder notes each user file as the run saw it, so a viewer
can tell a file that changed since (its lines may no longer match the trace's line numbers)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

MAX_DIGESTED_BYTES = 64 * 1024 * 1024  # larger files are not hashed (nor shown by the TUI)


@dataclass(frozen=True)
class SourceDigest:
    """A file's SHA-256 (hex) and size in bytes."""

    sha256: str
    size: int


def digest_bytes(content: bytes) -> SourceDigest:
    return SourceDigest(hashlib.sha256(content).hexdigest(), len(content))


def digest_file(path: str | Path) -> SourceDigest | None:
    """The digest of the file at `path`, or None when it is not a readable regular file or too large."""
    try:
        file_path = Path(path)
        if not file_path.is_file() or file_path.stat().st_size > MAX_DIGESTED_BYTES:
            return None
        return digest_bytes(file_path.read_bytes())
    except OSError:
        return None
