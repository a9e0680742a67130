"""`torch.compile(model, backend="tpu")`: Dynamo graphs lowered through AOTAutograd to XLA programs.

`register()` (called when `tputrace.backend` is imported) makes `"tpu"` the backend `torch.compile(model)`
uses for tpu tensors when no backend is named (`inductor_route.py`), and a Dynamo backend once
`torch._dynamo` is imported (importing Dynamo takes seconds; torch.compile imports it). Each FX graph
Dynamo captures goes through AOTAutograd with core ATen decompositions; each forward, backward or
inference graph becomes one XLA program per concrete input signature, built from the same ATen
lowerings as eager ops. `mode` is accepted as Inductor accepts it; `options={"shape_buckets": ...}`
pads dynamic dims to buckets (see `settings.py` and `buckets.py`).

While a trace is recorded, every Dynamo frame compile (with its Dynamo / AOT / XLA time split),
graph break, recompile (with its guard failure), XLA compile per shape, execution and XLA fusion is
written to it.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tputrace.backend.compat import import_hooks
from tputrace.backend.compile.settings import CompileSettings

if TYPE_CHECKING:
    from tputrace.backend.compile.backend import TpuBackend

BACKEND_NAME = "tpu"
_backend: TpuBackend | None = None
_registered = False


def tpu_backend() -> TpuBackend:
    """The `"tpu"` backend (made once)."""
    global _backend
    if _backend is None:
        from tputrace.backend.compile.backend import TpuBackend
        from tputrace.backend.compile.events import events

        _backend = TpuBackend(events)
    return _backend


def register() -> None:
    """Route torch.compile's default backend for tpu graphs to `"tpu"`, and register `"tpu"` with
    Dynamo when it is imported (idempotent)."""
    global _registered
    if _registered:
        return
    from tputrace.backend.compile import inductor_route

    inductor_route.install(_call_backend)
    import_hooks.when_imported("torch._dynamo", _register_with_dynamo)
    # While numerics are recorded, tputrace's global module hooks make torch warn at every call of a compiled
    # module; inside compiled regions those hooks do nothing.
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
    _registered = True


def _call_backend(*args: Any, **kwargs: Any) -> Any:
    return tpu_backend()(*args, **kwargs)


def _register_with_dynamo(dynamo: ModuleType) -> None:
    """Make `"tpu"` a Dynamo backend, record Dynamo's compile events, keep Dynamo out of tputrace."""
    from torch._dynamo.backends.registry import register_backend

    compiler = tpu_backend()
    register_backend(compiler_fn=compiler, name=BACKEND_NAME)
    _keep_dynamo_out()
    compiler.events.install()


# Traced by Dynamo on purpose: the wrapped `nn.Module.__call__` (module paths) does nothing inside a compiled region,
# and a skipped wrapper would break the graph at every module call.
_TRACEABLE_MODULES = ("tputrace.backend.core.hooks",)


def _keep_dynamo_out() -> None:
    """Dynamo compiles the user's code, never tputrace's: a call from compiled code into tputrace (a
    tensor's `__format__`, `tputrace.annotate`) is a graph break at the user's line, and tputrace
    code running while a compiled frame is active (every eager op in a graph-break region reaches
    `__torch_dispatch__`, then the dispatcher and JAX) is not intercepted, nor is anything it calls."""
    import importlib.util
    import pkgutil
    import sys

    import torch._dynamo.trace_rules
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    from tputrace.backend.core import hooks, host_origins

    package = sys.modules["tputrace"]
    backend_package = sys.modules["tputrace.backend"]  # still being imported when Dynamo was imported first
    # Module by module: the package's directory holds the backend's, and `tputrace.backend.core.hooks` with it, in
    # an installed tree (or a symlinked checkout); only an editable install keeps the backend apart.
    # What `trace_rules.add` does for each, but with one rebuild of Dynamo's skip pattern for all, below: `add`
    # rebuilds it per name, and compiling that regex of every skipped path is most of this function's time.
    for module in pkgutil.iter_modules(package.__path__):
        spec = importlib.util.find_spec(f"tputrace.{module.name}") if module.name != "backend" else None
        if spec is not None and spec.origin is not None:
            torch._dynamo.trace_rules.SKIP_DIRS.append(torch._dynamo.trace_rules._strip_init_py(spec.origin))
    # The backend's files one by one (its subpackages hold the traceable modules beside the others).
    for name, path in _backend_files(os.path.dirname(backend_package.__file__)):
        if name not in _TRACEABLE_MODULES:
            torch._dynamo.trace_rules.SKIP_DIRS.append(path)
    torch._dynamo.trace_rules.SKIP_DIRS.append(package.__file__)  # `tputrace.step`, `tputrace.annotate`: the file alone
    torch._dynamo.trace_rules._recompile_re()
    skip_all = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    for name, module in list(sys.modules.items()):
        if (name == "tputrace" or name.startswith("tputrace.")) and name not in _TRACEABLE_MODULES and module is not None:
            for code in _module_code(module):
                set_code_exec_strategy(code, skip_all)
    # The host makers' wrapper (`host_origins`) is traced through when compiled code calls a maker, but is never a
    # frame of its own to compile: one called in a graph break's eager code (autograd's `ones_like` for a compiled
    # function's `loss.backward()`) would be a graph break at the wrapper.
    set_code_exec_strategy(host_origins.wrapper_code(), _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
    # So is the wrapped `nn.Module.__call__` (module paths): `torch.compile(module)` calls it as its top frame.
    set_code_exec_strategy(hooks.module_call_code(), _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))


def _backend_files(root: str) -> list[tuple[str, str]]:
    """(module name, file) of each module under the backend's folder but its own `__init__.py`, read from
    the folder (Dynamo may be imported while the backend is: nothing here is imported)."""
    files = []
    for directory, _, names in os.walk(root):
        for file_name in names:
            if file_name.endswith(".py") and not (directory == root and file_name == "__init__.py"):
                path = os.path.join(directory, file_name)
                parts = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                files.append((".".join(["tputrace.backend", *parts]), path))
    return files


def _module_code(module: object) -> list:
    """The code objects of the functions and methods a module defines (nested functions included)."""
    import types

    codes: list[types.CodeType] = []

    def add(code: types.CodeType) -> None:
        codes.append(code)
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                add(constant)

    def visit(value: object) -> None:
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            for accessor in (value.fget, value.fset, value.fdel):
                if accessor is not None:
                    visit(accessor)
            return
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType) and getattr(value, "__module__", None) == module.__name__:
            add(code)

    for value in list(vars(module).values()):
        if isinstance(value, type) and value.__module__ == module.__name__:
            for member in list(vars(value).values()):
                visit(member)
        else:
            visit(value)
    return codes


__all__ = ["BACKEND_NAME", "CompileSettings", "register", "tpu_backend"]
