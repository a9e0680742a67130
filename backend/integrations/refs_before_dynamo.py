"""torch's reference kernels run without importing Dynamo until something else imports it.

torch wraps its Python references (`torch._refs.add`, the meta kernel of `aten.add`; the
decompositions the backend runs for `decompose` ops) in `torch._compile._disable_dynamo`, whose first
call imports Dynamo (~3.5 s here, with Inductor) to build and cache the function's
`torch._dynamo.disable` form. The backend's meta-shape inference calls such a kernel at a script's
first op. Until Dynamo is imported no frame can be traced, so that form would only call the function:
`install()` caches the function itself as its form, and as `torch._dynamo` finishes importing (before
anything can trace) takes those entries out again, so each wrapper then builds its real form as in
stock torch. Only wrappers reachable from torch's reference, prims, decomposition and meta modules are
seeded; any other (`torch.optim`'s, which also imports Dynamo in every `step()`) is left as it is.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Iterator

import torch
import torch._compile
import torch._decomp

from tputrace.backend.compat import import_hooks

_CACHED_FORM = "__dynamo_disable"  # the attribute `_disable_dynamo`'s wrapper caches the disabled form in
_SCANNED_MODULES = ("torch._refs", "torch._prims", "torch._prims_common", "torch._decomp", "torch._meta_registrations")


def _identity() -> None:
    """A function to wrap once, to learn the code object every `_disable_dynamo` wrapper shares."""


_WRAPPER_CODE = torch._compile._disable_dynamo(_identity).__code__
_seeded: list[types.FunctionType] = []


def install() -> None:
    """Seed the wrappers of torch's references with their functions, if Dynamo is not imported yet."""
    if "torch._dynamo" in sys.modules or _seeded:
        return
    for function in _wrapped_functions(_roots()):
        if _CACHED_FORM not in function.__dict__:
            setattr(function, _CACHED_FORM, function)
            _seeded.append(function)
    import_hooks.when_imported("torch._dynamo", _remove_seeds)


def _roots() -> Iterator[object]:
    """The module-level values of torch's reference, prims, decomposition and meta modules, and every
    function in torch's decomposition tables."""
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(_SCANNED_MODULES):
            yield from list(vars(module).values())
    for table in torch._decomp.global_decomposition_table.values():
        yield from table.values()


def _wrapped_functions(roots: Iterable[object]) -> list[types.FunctionType]:
    """The functions `_disable_dynamo` wraps, found by following `__wrapped__` and closures from `roots`
    (a reference's wrapper sits under its out= and type-promotion wrappers)."""
    found: dict[int, types.FunctionType] = {}
    visited: set[int] = set()
    pending = list(roots)
    while pending:
        value = pending.pop()
        if not isinstance(value, types.FunctionType) or id(value) in visited:
            continue
        visited.add(id(value))
        cells = dict(zip(value.__code__.co_freevars, value.__closure__ or ()))
        if value.__code__ is _WRAPPER_CODE:
            function = cells["fn"].cell_contents
            if isinstance(function, types.FunctionType):
                found[id(function)] = function
        pending.append(getattr(value, "__wrapped__", None))
        for cell in cells.values():
            try:
                pending.append(cell.cell_contents)
            except ValueError:  # a cell not filled yet
                continue
    return list(found.values())


def _remove_seeds(dynamo: types.ModuleType) -> None:
    """Dynamo is imported: each wrapper builds its `torch._dynamo.disable` form at its next call."""
    for function in _seeded:
        if function.__dict__.get(_CACHED_FORM) is function:
            delattr(function, _CACHED_FORM)
    _seeded.clear()
