"""Which files of a recorded traceback are the user's: not an installed library's and not tputrace's own.

A file that exists on this machine is told by where it is: under the standard library or an installed packages
folder (a library's), under tputrace's package or its backend (tputrace's own), else the user's, whatever its name (a
user's `backend/ops.py` or `functional.py`). A traceback may come from another machine, so for a file not here
tputrace's own frames are told by their paths' tails: a folder named `tputrace` or `backend` followed by one of this
distribution's module or package names (a user's project cloned into a folder named `tputrace`, such as its
`examples/`, stays the user's), and a library's by a `site-packages`, `dist-packages` or `lib/python3` folder.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
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


@cache
def _local_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The folders on this machine whose files are a library's, and those that are tputrace's own, each ending in a
    separator."""
    package = Path(__file__).resolve().parent
    own = {package, package / "backend", package.parent / "backend"}
    installed = (entry for entry in sys.path if os.path.basename(entry.rstrip(os.sep)) in ("site-packages", "dist-packages"))
    library = {Path(folder).resolve() for folder in (*(sysconfig.get_paths().get(name) for name in
                                                       ("stdlib", "platstdlib", "purelib", "platlib")), *installed)
               if folder}
    return (tuple(str(folder) + os.sep for folder in library),
            tuple(str(folder) + os.sep for folder in own if folder.is_dir()))


def _local_kind(file: str) -> str | None:
    """"library", "own" or "user" for a file on this machine, by where it is; None for a file not here."""
    if not os.path.isabs(file) or not os.path.isfile(file):
        return None
    path = os.path.realpath(file)
    library, own = _local_roots()
    if path.startswith(own):
        return "own"
    return "library" if path.startswith(library) else "user"


def is_library_file(file: str) -> bool:
    """Whether a traceback's file belongs to an installed package or the Python standard library."""
    kind = _local_kind(file)
    if kind is not None:
        return kind == "library"
    normalized = file.replace("\\", "/")
    return any(part in normalized for part in LIBRARY_PATH_PARTS)


def is_own_file(file: str) -> bool:
    """Whether a traceback's file is one of tputrace's own modules (its recorder, CLI or tpu backend)."""
    kind = _local_kind(file)
    if kind is not None:
        return kind == "own"
    return _own_path().search(file.replace("\\", "/")) is not None


def is_user_file(file: str) -> bool:
    """Whether a traceback's file is the user's: not library or tputrace code, nor generated code other than `exec`'d
    text."""
    if file.startswith("<"):
        return file in ("<string>", "<stdin>")
    return not is_library_file(file) and not is_own_file(file)
