"""The import contract of the store and the recording, read from the source (every import, those inside
functions included): the backend reaches the recording only through its interface, the event sink and
the store never import the backend, torch or jax, and neither package has an import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {"tputrace.backend": REPO_ROOT / "backend", "tputrace": REPO_ROOT / "tputrace"}


def _module_files(package: str) -> dict[str, Path]:
    """Module name -> file, for the modules of `package` (a folder of PACKAGE_DIRS or below one)."""
    for root_name, root_dir in sorted(PACKAGE_DIRS.items(), key=lambda item: -len(item[0])):
        if package == root_name or package.startswith(root_name + "."):
            folder = root_dir.joinpath(*package.removeprefix(root_name).strip(".").split(".")) if package != root_name else root_dir
            break
    files = {}
    for path in folder.rglob("*.py"):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join([package, *parts])] = path
    return files


def _imported_names(module: str, path: Path) -> set[str]:
    """Every module name `path` imports, at any level; `from a import b` counts as both `a` and `a.b`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def _imports_of(package: str) -> dict[str, set[str]]:
    return {module: _imported_names(module, path) for module, path in _module_files(package).items()}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_backend_reaches_the_recording_only_through_its_interface() -> None:
    reaching = {  # (the package itself, `from tputrace.recording import interface`, imports nothing)
        module: sorted(name for name in names if _within(name, "tputrace.recording")
                        and name != "tputrace.recording" and not _within(name, "tputrace.recording.interface"))
        for module, names in _imports_of("tputrace.backend").items()
    }
    assert {module: names for module, names in reaching.items() if names} == {}
    assert "tputrace.recording.interface" in _imports_of("tputrace.backend")["tputrace.backend.hooks"]


def test_the_store_imports_no_layer_above_it() -> None:
    above = ("tputrace.backend", "tputrace.recording", "tputrace.analysis", "torch", "jax")
    found = {module: sorted(name for name in names if any(_within(name, prefix) for prefix in above))
             for module, names in _imports_of("tputrace.store").items()}
    assert {module: names for module, names in found.items() if names} == {}


@pytest.mark.parametrize("module", ["tputrace.recording.interface", "tputrace.recording.recorder", "tputrace.recording.executions"])
def test_the_event_sink_never_imports_the_backend_or_the_lifecycle(module: str) -> None:
    sink = ("tputrace.recording.interface", "tputrace.recording.recorder", "tputrace.recording.executions")
    names = _imported_names(module, _module_files("tputrace.recording")[module])
    found = sorted(name for name in names
                   if any(_within(name, prefix) for prefix in ("tputrace.backend", "torch", "jax"))
                   or (_within(name, "tputrace.recording") and name != "tputrace.recording"
                       and not any(_within(name, member) for member in sink)))
    assert found == []


@pytest.mark.parametrize("package", ["tputrace.store", "tputrace.recording"])
def test_no_import_cycle(package: str) -> None:
    imports = _imports_of(package)
    graph = {module: {name for name in names if name in imports and name != module} for module, names in imports.items()}
    finished: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in finished:
            return None
        for dependency in sorted(graph[module]):
            found = cycle_from(dependency, [*path, module])
            if found is not None:
                return found
        finished.add(module)
        return None

    cycles = [cycle for module in sorted(graph) if (cycle := cycle_from(module, [])) is not None]
    assert cycles == []
