"""Which files of a recorded traceback are the user's: not an installed library's and not tputrace's own.

A traceback may come from another machine, so tputrace's own frames are told by their paths' tails: a folder named
`tputrace` or `backend` followed by one of this distribution's module or package names (a user's project cloned into
a folder named `tputrace`, such as its `examples/`, stays the user's).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

LIBRARY_PATH_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3")


def _module_names(folder: Path) -> set[str]:
    """The names of a package folder's modules and subpackages."""
    if not folder.is_dir():
        return set()
    return {entry.stem if entry.suffix == ".py" else entry.name for entry in folder.iterdir()
            if entry.suffix == ".py" or (entry / "__init__.py").is_file()}


@cache
def _own_path() -> re.Pattern[str]:
    package = Path(__file__).resolve().parent
    backend = package / "backend" if (package / "backend").is_dir() else package.parent / "backend"
    alternatives = [f"/{folder}/(?:{'|'.join(sorted(map(re.escape, names)))})(?:/|\\.py$)"
                    for folder, names in (("tputrace", _module_names(package)), ("backend", _module_names(backend))) if names]
    return re.compile("|".join(alternatives) or r"(?!)")


def is_library_file(file: str) -> bool:
    """Whether a traceback's file belongs to an installed package or the Python standard library."""
    normalized = file.replace("\\", "/")
    return any(part in normalized for part in LIBRARY_PATH_PARTS)


def is_own_file(file: str) -> bool:
    """Whether a traceback's file is one of tputrace's own modules (its recorder, CLI or tpu backend)."""
    return _own_path().search(file.replace("\\", "/")) is not None


def is_user_file(file: str) -> bool:
    """Whether a traceback's file is the user's: not library or tputrace code, nor generated code other than `exec`'d
    text."""
    if file.startswith("<"):
        return file in ("<string>", "<stdin>")
    return not is_library_file(file) and not is_own_file(file)
