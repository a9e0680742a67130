"""The layer contract of the distribution, checked on the source of every module with `ast` (imports at module
level, inside functions and under `if TYPE_CHECKING:` all count; nothing is imported).

Layers, bottom to top; a layer imports only the layers below it:

1. The trace format: `tputrace.schema` and `tputrace.store` import from the distribution only each other and
   leaf utilities (modules outside every layer that import nothing from the distribution, such as
   `tputrace.wording`).
2. `tputrace.derived` (figures and models computed once for every view) imports only schema, store, derived
   and leaf utilities; `tputrace.analysis` the same and derived. Derived never imports analysis.
3. Views: `tputrace.tui` and `tputrace.viewers` never import `tputrace.backend`, `tputrace.recording`,
   torch or jax; the TUI never imports plotly and the viewers never import textual.
4. Nothing of the trace side (schema, store, derived, analysis, views) imports torch, jax or jaxlib.

Recording side: the backend (`tputrace.backend`) imports from the rest of the distribution only
`tputrace.recording.interface`, `tputrace.schema`, `tputrace.sourceloc` and `tputrace.settings`.

Everywhere: no import cycle among the distribution's modules, and no module over 600 lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from product_modules import ImportStatement, ProductModule, imports_of, product_module_of, product_modules

MAX_MODULE_LINES = 600
LAYERED_PACKAGES = (
    "tputrace.schema",
    "tputrace.store",
    "tputrace.derived",
    "tputrace.analysis",
    "tputrace.tui",
    "tputrace.viewers",
    "tputrace.cli",
    "tputrace.backend",
    "tputrace.recording",
)
TORCH_AND_JAX = ("torch", "jax", "jaxlib")
BACKEND_MAY_IMPORT = ("tputrace.recording.interface", "tputrace.schema", "tputrace.sourceloc", "tputrace.settings",
                      "tputrace.performance_warnings")


def within(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def modules_in(*packages: str) -> list[ProductModule]:
    return [module for name, module in product_modules().items() if within(name, *packages)]


def product_imports(modules: Iterable[ProductModule]) -> Iterator[tuple[ImportStatement, str]]:
    """Each import of one of the distribution's modules by another, with the module imported."""
    for module in modules:
        for statement in imports_of(module):
            imported = product_module_of(statement.target)
            if imported is not None and imported != module.name:
                yield statement, imported


def leaf_utilities() -> set[str]:
    """Modules outside every layer that import nothing from the distribution: any layer may use them."""
    return {
        name
        for name, module in product_modules().items()
        if name != "tputrace" and not within(name, *LAYERED_PACKAGES) and not any(product_imports([module]))
    }


def imports_outside(importers: Iterable[ProductModule], allowed: Iterable[str]) -> list[str]:
    allowed = tuple(allowed)
    return [str(statement) for statement, imported in product_imports(importers) if not within(imported, *allowed)]


def third_party_imports(importers: Iterable[ProductModule], forbidden: Iterable[str]) -> list[str]:
    forbidden = tuple(forbidden)
    return [
        str(statement)
        for module in importers
        for statement in imports_of(module)
        if product_module_of(statement.target) is None and statement.top_level in forbidden
    ]


def test_the_distribution_is_found() -> None:
    names = set(product_modules())
    for expected in ("tputrace.schema", "tputrace.store.reader", "tputrace.analysis", "tputrace.backend", "tputrace.tui",
                     "tputrace.viewers", "tputrace.cli.main"):
        assert expected in names, f"{expected} is not among the modules found: the package-dir mapping changed?"


def test_the_trace_format_imports_nothing_above_it() -> None:
    violations = imports_outside(
        modules_in("tputrace.schema", "tputrace.store"), ("tputrace.schema", "tputrace.store", *leaf_utilities())
    )
    assert not violations, "schema/store may import only schema, store and leaf utilities:\n" + "\n".join(violations)


def test_derived_data_imports_only_the_trace_format() -> None:
    violations = imports_outside(
        modules_in("tputrace.derived"), ("tputrace.schema", "tputrace.store", "tputrace.derived", *leaf_utilities())
    )
    assert not violations, "derived may import only schema, store, derived and leaf utilities:\n" + "\n".join(violations)


def test_analysis_imports_only_the_trace_format_and_derived_data() -> None:
    allowed = ("tputrace.schema", "tputrace.store", "tputrace.derived", "tputrace.analysis", *leaf_utilities())
    violations = imports_outside(modules_in("tputrace.analysis"), allowed)
    assert not violations, (
        "analysis may import only schema, store, derived, analysis and leaf utilities:\n" + "\n".join(violations)
    )


def test_views_never_import_the_backend_or_recording() -> None:
    views = modules_in("tputrace.tui", "tputrace.viewers")
    violations = [
        str(statement)
        for statement, imported in product_imports(views)
        if within(imported, "tputrace.backend", "tputrace.recording")
    ]
    violations += third_party_imports(views, TORCH_AND_JAX)
    assert not violations, "views never import the backend, recording, torch or jax:\n" + "\n".join(violations)


def test_the_tui_never_imports_plotly_and_the_viewers_never_textual() -> None:
    violations = third_party_imports(modules_in("tputrace.tui"), ["plotly"])
    violations += third_party_imports(modules_in("tputrace.viewers"), ["textual"])
    assert not violations, "the TUI never imports plotly, the viewers never textual:\n" + "\n".join(violations)


def test_the_trace_side_never_imports_torch_or_jax() -> None:
    trace_side = modules_in(
        "tputrace.schema", "tputrace.store", "tputrace.derived", "tputrace.analysis", "tputrace.tui", "tputrace.viewers"
    )
    violations = third_party_imports(trace_side, TORCH_AND_JAX)
    assert not violations, "the trace side never imports torch, jax or jaxlib:\n" + "\n".join(violations)


def test_the_backend_imports_only_the_recording_interface_and_leaf_utilities() -> None:
    violations = imports_outside(modules_in("tputrace.backend"), ("tputrace.backend", *BACKEND_MAY_IMPORT))
    assert not violations, (
        f"the backend may import from the rest of tputrace only {', '.join(BACKEND_MAY_IMPORT)}:\n"
        + "\n".join(violations)
    )


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = lowest[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = lowest[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                elif successor in on_stack:
                    lowest[node] = min(lowest[node], index[successor])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowest[parent] = min(lowest[parent], lowest[node])
            if lowest[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def shortest_loop(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """The shortest chain of imports from `start` back to itself inside one cycle's members."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node] & members):
                if successor == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(previous[chain[-1]])
                    return [*reversed(chain), start]
                if successor not in previous:
                    previous[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{start} is on no loop inside {sorted(members)}")


def test_import_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert shortest_loop(graph, "a", {"a", "b", "c"}) == ["a", "b", "c", "a"]


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {name: set() for name in product_modules()}
    edges: dict[tuple[str, str], ImportStatement] = {}
    for statement, imported in product_imports(product_modules().values()):
        graph[statement.importer.name].add(imported)
        edges.setdefault((statement.importer.name, imported), statement)
    messages = []
    for cycle in import_cycles(graph):
        loop = shortest_loop(graph, cycle[0], set(cycle))
        steps = "\n    ".join(str(edges[importer, imported]) for importer, imported in zip(loop, loop[1:]))
        messages.append(f"{len(cycle)} modules in a cycle ({', '.join(cycle)}); one loop:\n    {steps}")
    assert not messages, "import cycles (function-level imports count):\n" + "\n".join(messages)


def test_no_module_over_600_lines() -> None:
    long = [f"{module.name} ({module.path.name}): {module.line_count} lines" for module in product_modules().values()
            if module.line_count > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(sorted(long))
