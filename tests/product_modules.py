"""The modules of the tputrace distribution, found from the source folders that pyproject.toml's `package-dir`
maps, and the imports each one makes (at module level and inside functions), read with `ast` so that
nothing is imported."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ProductModule:
    name: str
    path: Path

    @property
    def package(self) -> str:
        """The package that a relative import in this module starts from."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]

    @property
    def line_count(self) -> int:
        return len(self.path.read_text(encoding="utf-8").splitlines())


@dataclass(frozen=True)
class ImportStatement:
    """One name an import statement binds: `target` is the absolute dotted name (`tputrace.store.reader`,
    `tputrace.store.reader.open_trace`, `torch.nn`), `line` where the statement is."""

    importer: ProductModule
    target: str
    line: int

    @property
    def top_level(self) -> str:
        return self.target.partition(".")[0]

    def __str__(self) -> str:
        return f"{self.importer.name} imports {self.target} ({self.importer.path.relative_to(REPO_ROOT)}:{self.line})"


def package_dirs() -> dict[str, Path]:
    """Package name -> source folder, as pyproject.toml's [tool.setuptools] package-dir maps them."""
    with open(REPO_ROOT / "pyproject.toml", "rb") as file:
        mapping = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    return {package: REPO_ROOT / folder for package, folder in mapping.items()}


@cache
def product_modules() -> dict[str, ProductModule]:
    """Every module of the distribution by its dotted name. A folder mapped to its own package (backend/ as
    tputrace.backend) is read only under that name."""
    folders = package_dirs()
    mapped = set(folders.values())
    modules: dict[str, ProductModule] = {}
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            if any(parent in mapped and parent != folder for parent in path.parents):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            modules[name] = ProductModule(name, path)
    return modules


def imports_of(module: ProductModule) -> Iterator[ImportStatement]:
    """Every import in the module's source, wherever it is (module level, functions, `if TYPE_CHECKING:`)."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield ImportStatement(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                yield ImportStatement(module, f"{source}.{alias.name}" if alias.name != "*" else source, node.lineno)


def product_module_of(target: str) -> str | None:
    """The distribution's module that an imported name lives in (the longest dotted prefix that is one), or
    None for a name from outside the distribution."""
    modules = product_modules()
    name = target
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None
