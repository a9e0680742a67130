"""Adapting a module when something first imports it.

The backend patches torch subsystems that cost seconds to import (Dynamo, export, AOTAutograd) and
that only torch.compile, torch.export or a HOP's trace use. `when_imported` applies such a patch
right after the module's own code has run, before any other code can read what it patches, so
`import tputrace.backend` does not load them and the result is the same as patching them at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

Callback = Callable[[ModuleType], None]

_callbacks: dict[str, list[Callback]] = {}


def when_imported(name: str, callback: Callback) -> None:
    """Call `callback(module)` once module `name` is imported: now if it already is."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _callbacks.setdefault(name, []).append(callback)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _run_callbacks(name: str, module: ModuleType) -> None:
    parent_name, _, child_name = name.rpartition(".")
    if parent_name:
        setattr(sys.modules[parent_name], child_name, module)  # what the import does next; callbacks may read `parent.child`
    for callback in _callbacks.pop(name, []):
        callback(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a watched module with the finders after it, and makes its loader run the callbacks
    once the module has executed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _callbacks:
            return None
        following = sys.meta_path[sys.meta_path.index(self) + 1 :]
        for finder in following:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    _call_after_exec(spec.loader, fullname)
                return spec
        return None


def _call_after_exec(loader: importlib.abc.Loader, name: str) -> None:
    """Wrap this loader object's `exec_module` (a module's own loader: file loaders are one per module)."""
    execute = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        execute(module)
        _run_callbacks(name, module)

    loader.exec_module = exec_module  # type: ignore[method-assign]
