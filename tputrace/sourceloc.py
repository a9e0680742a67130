"""Which code is the user's: frames outside the standard library, installed packages, console-script
launchers (the environment's `bin`), tputrace, torch and jax."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import re
import sys
import sysconfig
from pathlib import Path
from types import CodeType

from tputrace.store.columns import line_character_offset

_LIBRARY_MODULES = ("torch", "jax", "jaxlib", "numpy", "transformers")
# The directory of the tputrace package (its modules' frames are not the user's).
TPUTRACE_DIR = os.path.dirname(os.path.abspath(__file__))


def backend_dir() -> str | None:
    """The directory `tputrace.backend` is installed in (found without importing it), or None."""
    spec = importlib.util.find_spec("tputrace.backend")
    return None if spec is None or spec.origin is None else os.path.dirname(spec.origin)


_INSTALL_DIR_NAMES = ("site-packages", "dist-packages")


@functools.cache
def installed_package_dirs() -> tuple[str, ...]:
    """Where installed packages live, each ending in a separator: this environment's site-packages, and every
    site-packages or dist-packages directory on `sys.path` (a base environment's, the user's, one added by a `.pth`
    file or `PYTHONPATH`)."""
    directories = {sysconfig.get_paths()[name] for name in ("purelib", "platlib")}
    directories.update(entry for entry in sys.path if os.path.basename(entry.rstrip(os.sep)) in _INSTALL_DIR_NAMES)
    return tuple(sorted(os.path.abspath(directory).rstrip(os.sep) + os.sep for directory in directories if directory))


@functools.cache
def _library_roots_cached(module_files: tuple[str, ...]) -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib")}
    roots.update(installed_package_dirs())
    roots.update(_launcher_dirs())
    package_dir = Path(__file__).resolve().parent
    roots.add(str(package_dir))
    roots.add(str(package_dir.parent / "backend"))
    for module_file in module_files:
        roots.add(str(Path(module_file).resolve().parent))
    return tuple(sorted(root.rstrip("/") + "/" for root in roots if root))


def _launcher_dirs() -> set[str]:
    """Where console scripts such as the `tputrace` launcher live (the environment's and the user's
    `bin`): the launcher's module frame is below everything `tputrace run` does, the exit flush included."""
    directories = {sysconfig.get_path("scripts")}
    try:
        directories.add(sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user")))
    except (KeyError, ValueError):  # no user scheme on this platform
        pass
    return directories


def library_roots() -> tuple[str, ...]:
    """Directories whose code is not the user's (recomputed when torch/jax get imported)."""
    module_files = tuple(
        module.__file__ for name in _LIBRARY_MODULES if (module := sys.modules.get(name)) is not None and getattr(module, "__file__", None)
    )
    backend = backend_dir()
    if backend is not None:
        module_files += (os.path.join(backend, "__init__.py"),)
    return _library_roots_cached(module_files)


def is_user_file(filename: str, roots: tuple[str, ...]) -> bool:
    if filename.startswith("<"):
        return filename in ("<string>", "<stdin>")
    return not os.path.abspath(filename).startswith(roots)


# Packages whose frames are never a library's that the user called: torch (its own code runs every op), the
# numerics libraries under the backend, and tputrace.
_FRAMEWORK_MODULES = ("torch", "jax", "jaxlib", "numpy")


@functools.cache
def is_third_party_library(filename: str) -> bool:
    """Whether `filename` is an installed package's (`installed_package_dirs`) other than torch, jax and numpy, and not tputrace's:
    a library the user's code calls into, such as Transformers' Trainer."""
    path = os.path.abspath(filename)
    if filename.startswith("<") or path.startswith(TPUTRACE_DIR + os.sep):
        return False
    if not path.startswith(installed_package_dirs()):
        return False
    frameworks = tuple(
        os.path.dirname(os.path.abspath(module.__file__)) + os.sep
        for name in _FRAMEWORK_MODULES if (module := sys.modules.get(name)) is not None and getattr(module, "__file__", None)
    )
    backend = backend_dir()
    return not path.startswith(frameworks + ((backend + os.sep,) if backend else ()))


def first_user_location(skip: int = 1) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame in the user's code, or None."""
    roots = library_roots()
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename, roots):
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


_TRACEBACK_ENTRY = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)', re.MULTILINE)


def last_user_location(stack_trace: str | None) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost user frame in a formatted stack (innermost last, as an
    FX node's `stack_trace` holds the lines torch.compile traced), or None."""
    if not stack_trace:
        return None
    roots = library_roots()
    for entry in reversed(list(_TRACEBACK_ENTRY.finditer(stack_trace))):
        if is_user_file(entry["file"], roots):
            return entry["file"], int(entry["line"]), entry["function"]
    return None


def call_columns(code: CodeType, instruction_offset: int, line: int) -> tuple[int | None, int | None, int | None]:
    """(col, end_line, end_col) of the instruction at byte offset `instruction_offset` (a frame's `f_lasti`)
    that starts on `line`: 0-based character offsets, `col` on `line` and `end_col` (exclusive) on
    `end_line`. `code.co_positions()` counts UTF-8 bytes; each is converted on its line's text, and stays a
    byte offset when the file cannot be read (code from `<string>`). All None when the interpreter keeps
    no positions (`-X no_debug_ranges`)."""
    position = next(itertools.islice(code.co_positions(), instruction_offset // 2, None), None)
    if position is None:
        return None, None, None
    start_line, end_line, col, end_col = position
    if start_line != line or col is None:
        return None, None, None
    if end_line is None or end_col is None:
        return line_character_offset(code.co_filename, line, col), None, None
    return (line_character_offset(code.co_filename, line, col), end_line,
            line_character_offset(code.co_filename, end_line, end_col))


def dynamo_line(code: CodeType, instruction_offset: int, line: int) -> int:
    """The user's line for an instruction of `code` at `line`: `line` itself, unless `code` is bytecode that
    torch.compile (Dynamo) generated for a function with a graph break and `line` is the function's `def`
    line. Dynamo stamps the instructions it adds (calling the first graph, rebuilding the values the break
    needs, such as formatting the f-string of a `print`) with that line; they serve the instruction where the
    graph broke, the next one on a line of its own."""
    if line != code.co_firstlineno or not _is_dynamo_code(code):
        return line
    for start, _, next_line in code.co_lines():
        if start > instruction_offset and next_line is not None and next_line != line:
            return next_line
    return line


def _is_dynamo_code(code: CodeType) -> bool:
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    original_codes = getattr(dynamo_utils, "orig_code_map", None)
    return original_codes is not None and code in original_codes
